//! [`Experts`]: the routed experts of one MoE layer as stacked `[E, out, in]`
//! weights (dense or quantized), applied with MLX's `gather_mm` /
//! `gather_qmm` (quantized stacks on the CPU: our rows kernel,
//! `quant::cpu_gather_rows_takes`), and their three checkpoint layouts.
//!
//! | writer | tensors under `{layer}.mlp` |
//! | --- | --- |
//! | Hugging Face hub / transformers 5 in memory | `experts.gate_up_proj` `[E, 2I, H]`, `experts.down_proj` `[E, H, I]` |
//! | transformers `save_pretrained`, older exports | `experts.{e}.{gate,up,down}_proj.weight` (`[I, H]`, `[I, H]`, `[H, I]`), packed when quantized |
//! | mlx-lm | `switch_mlp.{gate,up,down}_proj.weight` `[E, I, H]` ... (+ `.scales`, `.biases` when quantized) |
//!
//! Per-expert tensors are stacked once at load (one `stack` per projection,
//! evaluated with the model), quantized ones stay quantized; the fused hub
//! tensor is used as it is (one `gather_mm` gives gate and up side by side).

use mlx_tensor::{Array, Device, Dtype, default_device, ops};

use crate::error::{Error, Result};
use crate::quant::QuantizedTensor;
use crate::weights::Vars;

fn on_cpu() -> bool {
    default_device() == Device::Cpu
}

/// One projection of every expert: `y = x @ W[e].T`.
#[derive(Debug, Clone)]
enum Stack {
    /// `[E, in, out]`: a transposed view of the stored `[E, out, in]`.
    Dense(Array),
    /// Packed `[E, out, in]`.
    Quantized(QuantizedTensor),
}

impl Stack {
    fn dense(w: &Array) -> Result<Stack> {
        Ok(Stack::Dense(w.swapaxes(-1, -2)?))
    }

    /// `x[i] @ W[experts[i]].T` over the leading axes (broadcast as `gather_mm` does).
    fn apply(&self, x: &Array, experts: &Array, sorted: bool) -> Result<Array> {
        Ok(match self {
            Stack::Dense(wt) if x.dtype() != Dtype::Float32 && on_cpu() => {
                // MLX's CPU `gather_mm` takes float32 only ("[GatherMM::eval]
                // Currently only supports float32"): compute in f32 there.
                let f = |a: &Array| a.as_type(Dtype::Float32);
                ops::gather_mm(&f(x)?, &f(wt)?, None, Some(experts), sorted)?.as_type(x.dtype())?
            }
            Stack::Dense(wt) => ops::gather_mm(x, wt, None, Some(experts), sorted)?,
            Stack::Quantized(q) => {
                let stack = ops::QuantizedStack {
                    w: &q.weight,
                    scales: &q.scales,
                    biases: q.biases.as_ref(),
                    group_size: q.params.group_size as i32,
                    bits: q.params.bits as i32,
                    mode: q.params.mode,
                };
                if crate::quant::cpu_gather_rows_takes(x, q) {
                    ops::quant_gather_rows_matmul_t(x, stack, experts)?
                } else {
                    ops::gather_qmm(x, stack, None, Some(experts), true, sorted)?
                }
            }
        })
    }

    fn arrays(&self) -> Vec<Array> {
        match self {
            Stack::Dense(w) => vec![w.clone()],
            Stack::Quantized(q) => q.arrays(),
        }
    }

    #[cfg(test)]
    fn is_quantized(&self) -> bool {
        matches!(self, Stack::Quantized(_))
    }
}

/// Gate and up projections: fused (hub) or separate.
#[derive(Debug, Clone)]
enum GateUp {
    /// Gate in the first `I` outputs, up in the last `I`.
    Fused(Stack),
    Split {
        gate: Stack,
        up: Stack,
    },
}

/// The routed experts of one layer: SwiGLU `down(silu(gate(x)) · up(x))` per expert.
#[derive(Debug, Clone)]
pub(crate) struct Experts {
    gate_up: GateUp,
    down: Stack,
    intermediate: i32,
}

impl Experts {
    /// Loads the experts under `mlp` (the layer's `mlp` view) in whichever
    /// layout the checkpoint holds, for `e` experts of inner width `inter`
    /// over hidden width `h`.
    pub(crate) fn load(mlp: &mut Vars<'_>, e: usize, h: usize, inter: usize) -> Result<Experts> {
        let intermediate = inter as i32;
        if mlp.contains("experts.gate_up_proj") {
            let gu = mlp.take("experts.gate_up_proj", &[e, 2 * inter, h])?;
            let down = mlp.take("experts.down_proj", &[e, h, inter])?;
            return Ok(Experts {
                gate_up: GateUp::Fused(Stack::dense(&gu)?),
                down: Stack::dense(&down)?,
                intermediate,
            });
        }
        let load = if mlp.contains("switch_mlp.gate_proj.weight") {
            stacked
        } else if mlp.contains("experts.0.gate_proj.weight") {
            per_expert
        } else {
            return Err(Error::InvalidConfig {
                path: "config.json".into(),
                key: "num_experts",
                message: format!(
                    "declares {e} experts, but `{}` holds none: expected \
                     `experts.gate_up_proj` + `experts.down_proj`, \
                     `experts.{{e}}.{{gate,up,down}}_proj.weight` or \
                     `switch_mlp.{{gate,up,down}}_proj.weight`",
                    mlp.prefix()
                ),
            });
        };
        Ok(Experts {
            gate_up: GateUp::Split {
                gate: load(mlp, "gate_proj", e, inter, h)?,
                up: load(mlp, "up_proj", e, inter, h)?,
            },
            down: load(mlp, "down_proj", e, h, inter)?,
            intermediate,
        })
    }

    /// Applies the chosen experts: `x` `[R, H]`, `experts` `[R, k]` → `[R, k, H]`.
    ///
    /// One row gathers straight from the broadcast row. Several rows (a
    /// verify of `k + 1` rows, a prefill chunk) are repeated `k` times and
    /// sorted by expert, so that each expert's rows form one contiguous
    /// matmul (`sorted_indices`, as mlx-lm's `SwitchGLU`), and put back in
    /// row order at the end.
    pub(crate) fn forward(&self, x: &Array, experts: &Array) -> Result<Array> {
        let (rows, k, h) = (x.dim(0), experts.dim(1), x.dim(1));
        if rows == 1 {
            let xb = x.reshape(&[1, 1, 1, h])?;
            let y = self.swiglu(&xb, experts, false)?;
            return Ok(y.reshape(&[1, k, h])?);
        }
        let flat = experts.reshape(&[rows * k])?;
        let order = flat.argsort(0)?;
        let back = order.argsort(0)?;
        let row_of = order.floor_divide(&Array::from_int(k as i64, order.dtype())?)?;
        let xs = x.take(&row_of, 0)?.reshape(&[rows * k, 1, h])?;
        let y = self.swiglu(&xs, &flat.take(&order, 0)?, true)?;
        Ok(y.take(&back, 0)?.reshape(&[rows, k, h])?)
    }

    fn swiglu(&self, x: &Array, experts: &Array, sorted: bool) -> Result<Array> {
        let (g, u) = match &self.gate_up {
            GateUp::Fused(s) => {
                let gu = s.apply(x, experts, sorted)?;
                let i = self.intermediate;
                (gu.slice_axis(-1, 0, i)?, gu.slice_axis(-1, i, 2 * i)?)
            }
            GateUp::Split { gate, up } => (
                gate.apply(x, experts, sorted)?,
                up.apply(x, experts, sorted)?,
            ),
        };
        self.down.apply(&g.silu()?.multiply(&u)?, experts, sorted)
    }

    /// True when the expert weights are quantized.
    #[cfg(test)]
    pub(crate) fn is_quantized(&self) -> bool {
        self.down.is_quantized()
    }

    /// The arrays to evaluate at load.
    pub(crate) fn arrays(&self) -> Vec<Array> {
        let mut v = match &self.gate_up {
            GateUp::Fused(s) => s.arrays(),
            GateUp::Split { gate, up } => [gate.arrays(), up.arrays()].concat(),
        };
        v.extend(self.down.arrays());
        v
    }
}

/// mlx-lm's `switch_mlp.{name}`: one `[E, out, input]` tensor (or quantized triple).
fn stacked(mlp: &mut Vars<'_>, name: &str, e: usize, out: usize, input: usize) -> Result<Stack> {
    let mut p = mlp.pp("switch_mlp");
    let mut p = p.pp(name);
    if let Some(q) = p.take_quantized_stack(&[e], out, input)? {
        return Ok(Stack::Quantized(q));
    }
    Stack::dense(&p.take("weight", &[e, out, input])?)
}

/// `experts.{0..e}.{name}`: `e` matrices stacked with one `stack` per tensor.
fn per_expert(mlp: &mut Vars<'_>, name: &str, e: usize, out: usize, input: usize) -> Result<Stack> {
    let mut experts = mlp.pp("experts");
    let mut dense = Vec::new();
    let mut quantized = Vec::new();
    for i in 0..e {
        let mut p = experts.pp(i);
        let mut p = p.pp(name);
        match p.take_quantized(out, input)? {
            Some(q) => quantized.push(q),
            None => dense.push(p.take("weight", &[out, input])?),
        }
    }
    if !dense.is_empty() && !quantized.is_empty() {
        return Err(Error::TensorDtype {
            name: experts.path(&format!("*.{name}.weight")),
            dtype: format!(
                "mixed: {} experts quantized and {} dense; quantize every expert alike",
                quantized.len(),
                dense.len()
            ),
        });
    }
    if dense.is_empty() {
        let params = quantized[0].params;
        if let Some(q) = quantized.iter().find(|q| q.params != params) {
            return Err(Error::TensorDtype {
                name: experts.path(&format!("*.{name}.weight")),
                dtype: format!(
                    "experts quantized differently ({params:?} and {:?}); quantize every \
                     expert alike",
                    q.params
                ),
            });
        }
        let q = QuantizedTensor::join(&quantized, |v| ops::stack(v, 0))?;
        drop(quantized);
        evaluated(experts.is_dry(), &q.arrays())?;
        return Ok(Stack::Quantized(q));
    }
    let w = ops::stack(&dense, 0)?;
    drop(dense);
    evaluated(experts.is_dry(), std::slice::from_ref(&w))?;
    Stack::dense(&w)
}

/// Evaluates a freshly stacked projection at once (unless the weights are
/// placeholders), so that its per-expert sources are freed now: a load then
/// holds at most one projection twice, not every layer's experts.
fn evaluated(dry: bool, arrays: &[Array]) -> Result<()> {
    if !dry {
        mlx_tensor::eval(arrays)?;
    }
    Ok(())
}
