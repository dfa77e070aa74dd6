//! Building blocks shared by the families: linear layers, RMSNorm, the SwiGLU MLP.

use mlx_tensor::{Array, fast};

use crate::error::Result;
use crate::models::skinny;
use crate::quant::{QuantParams, QuantizedTensor};
use crate::weights::{Vars, Weights};

/// The linear module at `vb`: `weight` `[output, input]` (packed with
/// `scales` and `biases` when quantized) and, when `bias`, `bias` `[output]`.
pub(crate) fn linear(
    mut vb: Vars<'_>,
    input: usize,
    output: usize,
    bias: bool,
    layout: LinearLayout,
) -> Result<Linear> {
    let quantized = vb.take_quantized(output, input)?;
    let bias = if bias {
        Some(vb.take("bias", &[output])?)
    } else {
        None
    };
    match quantized {
        Some(q) => Ok(Linear::from_quantized(q, bias)),
        None => {
            let weight = vb.take("weight", &[output, input])?;
            Ok(Linear::from_weight(&weight, bias, layout)?)
        }
    }
}

/// The RMSNorm module at `vb`: `weight` `[dim]`.
pub(crate) fn rms_norm(mut vb: Vars<'_>, dim: usize, eps: f32) -> Result<RmsNorm> {
    Ok(RmsNorm {
        weight: vb.take("weight", &[dim])?,
        eps,
    })
}

/// The embedding module at `vb`: `weight` `[vocab, hidden]` (packed when quantized).
pub(crate) fn embedding(mut vb: Vars<'_>, vocab: usize, hidden: usize) -> Result<Embedding> {
    let table = match vb.take_quantized(vocab, hidden)? {
        Some(q) => Table::Quantized(q),
        None => Table::Dense(vb.take("weight", &[vocab, hidden])?),
    };
    Ok(Embedding { table })
}

/// How linear weights are laid out for the matmul.
///
/// Measured on this CPU (2 shared cores, OpenBLAS, f32) for greedy decode
/// (M = 1) of models/tiny-mtp with `examples/decode-bench.rs`, 128 tokens,
/// interleaved runs: the transposed view gave 85-89 tokens/s, the
/// pre-transposed copy 81-83 tokens/s. BLAS takes the transpose as a flag, so
/// the view costs nothing and keeps the checkpoint's memory layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearLayout {
    /// Keep `[out, in]` and multiply by a transposed view (`x @ W.T`).
    TransposedView,
    /// Copy to `[in, out]` at load and multiply directly (`x @ Wt`).
    PreTransposed,
}

impl LinearLayout {
    /// The layout used unless asked otherwise (the faster one, see above).
    pub const DEFAULT: LinearLayout = LinearLayout::TransposedView;
}

/// `y = x @ W.T + b`, with `W` dense or affine-quantized.
#[derive(Debug, Clone)]
pub struct Linear {
    kernel: Kernel,
    bias: Option<Array>,
}

/// The weight of a [`Linear`].
#[derive(Debug, Clone)]
enum Kernel {
    /// `[in, out]`: a transposed view of the `[out, in]` weight, or a contiguous
    /// copy. `w` is the `[out, in]` weight itself when `wt` is its transposed
    /// view (the same buffer), for the few-rows kernels: ours on the CPU when
    /// `cpu_rows` (see [`takes_cpu_rows`]), the CUDA one (`models/skinny.rs`).
    /// `batched` is `wt` viewed as `[1, in, out]` on a GPU (see [`batched_view`]).
    Dense {
        wt: Array,
        w: Option<Array>,
        batched: Option<Array>,
        cpu_rows: bool,
    },
    /// The packed `[out, in]` weight, multiplied by `quantized_matmul`.
    Quantized(QuantizedTensor),
}

impl Linear {
    /// Takes `{prefix}.weight` `[out, in]` and, when `bias`, `{prefix}.bias` `[out]`.
    ///
    /// A quantized checkpoint's `{prefix}.weight`, `.scales` and `.biases` are
    /// kept packed (see [`crate::quant`]); `layout` then has no effect.
    pub fn load(
        w: &mut Weights,
        prefix: &str,
        input: usize,
        output: usize,
        bias: bool,
        layout: LinearLayout,
    ) -> Result<Linear> {
        linear(Vars::new(w, prefix), input, output, bias, layout)
    }

    /// From a `[out, in]` weight.
    pub fn from_weight(
        weight: &Array,
        bias: Option<Array>,
        layout: LinearLayout,
    ) -> mlx_tensor::Result<Linear> {
        let wt = weight.t()?;
        let (wt, w) = match layout {
            LinearLayout::TransposedView => (wt, Some(weight.clone())),
            LinearLayout::PreTransposed => (wt.contiguous()?, None),
        };
        let batched = batched_view(&wt)?;
        let cpu_rows = w.is_some() && takes_cpu_rows(weight.dtype());
        Ok(Linear {
            kernel: Kernel::Dense {
                wt,
                w,
                batched,
                cpu_rows,
            },
            bias,
        })
    }

    /// From a quantized `[out, in]` weight.
    pub fn from_quantized(weight: QuantizedTensor, bias: Option<Array>) -> Linear {
        Linear {
            kernel: Kernel::Quantized(weight),
            bias,
        }
    }

    /// True when the weight is quantized.
    pub fn is_quantized(&self) -> bool {
        matches!(self.kernel, Kernel::Quantized(_))
    }

    /// A copy with the weight affine-quantized to `p` (the bias kept as it
    /// is), for the draft head's own cheaper copy of a layer; `None` when the
    /// layer is already quantized or its input width is not a multiple of
    /// `p.group_size` (MLX's kernels need whole groups).
    pub(crate) fn quantized_copy(&self, p: QuantParams) -> Result<Option<Linear>> {
        let Kernel::Dense { wt, w, .. } = &self.kernel else {
            return Ok(None);
        };
        let input = wt.dim(0);
        if input <= 0 || input % p.group_size as i32 != 0 {
            return Ok(None);
        }
        let weight = match w {
            Some(w) => w.clone(),
            None => wt.t()?,
        };
        let q = QuantizedTensor::quantize(&weight, p)?;
        Ok(Some(Linear::from_quantized(q, self.bias.clone())))
    }

    /// Output features (rows of the `[out, in]` weight).
    pub(crate) fn output_width(&self) -> i32 {
        match &self.kernel {
            Kernel::Dense { wt, .. } => wt.dim(1),
            Kernel::Quantized(q) => q.weight.dim(0),
        }
    }

    /// A copy computing only the outputs `ids` (`[N]` integer, in that
    /// order): the weight's rows (and bias entries) gathered into new
    /// arrays, dense or quantized as the layer is.
    pub(crate) fn output_rows(&self, ids: &Array) -> Result<Linear> {
        let bias = match &self.bias {
            Some(b) => Some(b.take(ids, 0)?),
            None => None,
        };
        Ok(match &self.kernel {
            Kernel::Dense { wt, w, .. } => {
                let weight = match w {
                    Some(w) => w.take(ids, 0)?,
                    None => wt.take(ids, 1)?.t()?,
                };
                Linear::from_weight(&weight, bias, LinearLayout::TransposedView)?
            }
            Kernel::Quantized(q) => Linear::from_quantized(q.map(|a| Ok(a.take(ids, 0)?))?, bias),
        })
    }

    /// One layer computing `parts` side by side (their outputs concatenated):
    /// the weights, and biases, stacked along the output axis, so one matmul
    /// reads them instead of one per part. `None` when the parts cannot share
    /// a kernel: dense and quantized mixed, different quantization or dtype,
    /// or a bias on some parts only.
    pub(crate) fn concat(parts: &[&Linear]) -> Result<Option<Linear>> {
        let bias = match parts.iter().filter(|p| p.bias.is_some()).count() {
            0 => None,
            n if n == parts.len() => {
                let b: Vec<Array> = parts.iter().filter_map(|p| p.bias.clone()).collect();
                Some(mlx_tensor::ops::concatenate(&b, 0)?)
            }
            _ => return Ok(None),
        };
        let dense: Option<Vec<(&Array, Option<&Array>)>> = parts
            .iter()
            .map(|p| match &p.kernel {
                Kernel::Dense { wt, w, .. } => Some((wt, w.as_ref())),
                Kernel::Quantized(_) => None,
            })
            .collect();
        if let Some(d) = dense {
            if d.iter().any(|(wt, _)| wt.dtype() != d[0].0.dtype()) {
                return Ok(None);
            }
            return Ok(Some(match d.iter().map(|(_, w)| w.cloned()).collect() {
                // Every part keeps its `[out, in]` weight: stack those rows.
                Some(ws) => {
                    let ws: Vec<Array> = ws;
                    let w = mlx_tensor::ops::concatenate(&ws, 0)?;
                    Linear::from_weight(&w, bias, LinearLayout::TransposedView)?
                }
                // Pre-transposed `[in, out]` parts: stack their columns.
                None => {
                    let wts: Vec<Array> = d.iter().map(|(wt, _)| (*wt).clone()).collect();
                    let wt = mlx_tensor::ops::concatenate(&wts, 1)?;
                    Linear::from_weight(&wt.t()?, bias, LinearLayout::PreTransposed)?
                }
            }));
        }
        let q: Option<Vec<&QuantizedTensor>> = parts
            .iter()
            .map(|p| match &p.kernel {
                Kernel::Quantized(q) => Some(q),
                Kernel::Dense { .. } => None,
            })
            .collect();
        let Some(q) = q else { return Ok(None) };
        let params = q[0].params;
        if q.iter()
            .any(|t| t.params != params || t.scales.dtype() != q[0].scales.dtype())
        {
            return Ok(None);
        }
        let parts: Vec<QuantizedTensor> = q.iter().map(|t| (*t).clone()).collect();
        let joint = QuantizedTensor::join(&parts, |v| mlx_tensor::ops::concatenate(v, 0))?;
        Ok(Some(Linear::from_quantized(joint, bias)))
    }

    /// Applies the layer to `[..., in]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let few = match &self.kernel {
            Kernel::Dense {
                w: Some(w),
                cpu_rows,
                ..
            } => few_rows(x, w, *cpu_rows).map(|(rows, on)| (w, rows, on)),
            _ => None,
        };
        let y = match &self.kernel {
            // Our CPU kernel takes the leading axes as they are (no reshape nodes).
            _ if let Some((w, _, RowsKernel::Cpu)) = few
                && x.ndim() >= 2 =>
            {
                mlx_tensor::ops::rows_matmul_t(x, w)?
            }
            // The CUDA kernel reads `x` as its rows whatever the leading axes
            // and writes `[..., out]` (no reshape nodes either).
            _ if let Some((w, _, RowsKernel::Cuda)) = few => skinny::matmul_t(x, w)?,
            _ if let Some((w, rows, RowsKernel::Cpu)) = few => {
                let mut shape = x.shape().to_vec();
                *shape.last_mut().expect("rank ≥ 1") = w.dim(0);
                mlx_tensor::ops::rows_matmul_t(&x.reshape(&[rows, x.dim(-1)])?, w)?
                    .reshape(&shape)?
            }
            Kernel::Dense {
                batched: Some(b), ..
            } if x.ndim() == 3 && x.dim(0) == 1 => x.matmul(b)?,
            Kernel::Dense { wt, .. } if widens_on_cpu(x, wt) => {
                use mlx_tensor::Dtype;
                x.as_type(Dtype::Float32)?
                    .matmul(&wt.as_type(Dtype::Float32)?)?
                    .as_type(x.dtype())?
            }
            Kernel::Dense { wt, .. } => x.matmul(wt)?,
            Kernel::Quantized(q) => q.matmul_t(x)?,
        };
        Ok(match &self.bias {
            Some(b) => y.add(b)?,
            None => y,
        })
    }

    /// The arrays to evaluate at load.
    pub fn arrays(&self) -> Vec<Array> {
        let mut v = match &self.kernel {
            Kernel::Dense { wt, batched, .. } => {
                let mut v = vec![wt.clone()];
                v.extend(batched.iter().cloned());
                v
            }
            Kernel::Quantized(q) => q.arrays(),
        };
        v.extend(self.bias.clone());
        v
    }
}

/// Whether a `[out, in]` weight of `dtype` goes to our few-rows CPU kernel
/// ([`mlx_tensor::ops::rows_matmul_t`]) for inputs of up to
/// [`mlx_tensor::ops::ROWS_MATMUL_MAX_ROWS`] rows: on a CPU default device,
/// for the float dtypes it computes.
///
/// Why: OpenBLAS (MLX's CPU matmul) packs the whole weight into panels for a
/// product of two or more rows, and takes that path for one row too once the
/// weight is large; MLX widens bf16 operands to f32 copies first. The kernel
/// streams each weight row once into every input row. Measured on this 2-core
/// x86-64 host (`cargo run --release -p mlx-tensor --example gemm -- --k 1024
/// --n 6144 --m 1,5,8`, median µs, MLX matmul against the kernel): f32 1 / 5 /
/// 8 rows 2,364 / 4,079 / 4,418 against 796 / 1,808 / 2,508; bf16 1 / 5 rows
/// 15,382 / 20,521 against 499 / 1,306. Every row is summed in the same order whatever
/// the row count, so a verify row equals the plain step's product bit for bit.
fn takes_cpu_rows(dtype: mlx_tensor::Dtype) -> bool {
    use mlx_tensor::Dtype;
    mlx_tensor::default_device() == mlx_tensor::Device::Cpu
        && matches!(dtype, Dtype::Float32 | Dtype::Bfloat16 | Dtype::Float16)
}

/// The largest weight whose f32 copy [`widens_on_cpu`] makes for one
/// product (a transient of this many bytes per matmul node in flight).
const WIDEN_MAX_BYTES: usize = 512 << 20;

/// Whether a bf16 or f16 product of more rows than our few-rows kernel takes
/// (a prefill chunk, an MTP flush span) runs in f32 on the CPU: `x` and `wt`
/// widened, MLX's f32 matmul (OpenBLAS), the product rounded back.
///
/// Why: MLX's CPU matmul in bf16 is not BLAS but a loop whose cost grows
/// with the rows: `examples/gemm.rs --k 256 --n 1536 --weights 6 --m
/// 8,16,64`, median µs, bf16 9,095 / 16,506 / 75,128 against f32 1,532 /
/// 1,188 / 2,597, and tiny-mtp's 1,000-token prompt took 8.1 s to its first
/// token in bf16 against 0.41 s in f32. The widened product accumulates in
/// f32 and rounds once, as our few-rows kernel does. Weights whose f32 copy
/// would pass [`WIDEN_MAX_BYTES`] (a large vocabulary's unembedding) keep
/// MLX's path.
fn widens_on_cpu(x: &Array, wt: &Array) -> bool {
    use mlx_tensor::Dtype;
    mlx_tensor::default_device() == mlx_tensor::Device::Cpu
        && matches!(x.dtype(), Dtype::Bfloat16 | Dtype::Float16)
        && wt.dtype() == x.dtype()
        && wt.size() * 4 <= WIDEN_MAX_BYTES
}

/// `wt` `[in, out]` viewed as `[1, in, out]` (the same buffer) on a GPU;
/// `None` on the CPU.
///
/// Why: MLX's `matmul` of a `[1, L, in]` input by a 2-D weight flattens the
/// input and unflattens the product, two graph nodes around every matmul
/// (a third of an 8B step's 1,629 nodes, measured on an H200), and each node
/// costs host time to dispatch; a decode step on CUDA is bound by that host
/// time. With a 3-D weight the same product is one batched matmul node that
/// MLX runs with the same kernel (GEMV for one row).
fn batched_view(wt: &Array) -> mlx_tensor::Result<Option<Array>> {
    if mlx_tensor::default_device() != mlx_tensor::Device::Gpu {
        return Ok(None);
    }
    Ok(Some(wt.expand_dims(&[0])?))
}

/// Which few-rows kernel takes a product (see [`few_rows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RowsKernel {
    /// [`mlx_tensor::ops::rows_matmul_t`].
    Cpu,
    /// `models/skinny.rs`.
    Cuda,
}

/// The row count of `x` `[..., in]`, and the kernel, when a few-rows kernel
/// takes its product with `w` `[out, in]`: ours on the CPU when the layer
/// chose it at load (`cpu_rows`), else the CUDA one when it applies.
fn few_rows(x: &Array, w: &Array, cpu_rows: bool) -> Option<(i32, RowsKernel)> {
    let k = x.dim(-1);
    if x.ndim() == 0 || k <= 0 || x.dtype() != w.dtype() || w.ndim() != 2 || w.dim(1) != k {
        return None;
    }
    let rows = i32::try_from(x.size() / k as usize).ok()?;
    if cpu_rows {
        return (1..=mlx_tensor::ops::ROWS_MATMUL_MAX_ROWS)
            .contains(&rows)
            .then_some((rows, RowsKernel::Cpu));
    }
    skinny::applies(rows, w.dim(0), k, x.dtype()).then_some((rows, RowsKernel::Cuda))
}

/// `l` quantized to `p` (see [`Linear::quantized_copy`]), or `l` itself when it cannot be.
pub(crate) fn quantized_or_same(l: &Linear, p: QuantParams) -> Result<Linear> {
    Ok(l.quantized_copy(p)?.unwrap_or_else(|| l.clone()))
}

/// A token embedding table, dense or affine-quantized (mlx-lm quantizes it too).
#[derive(Debug, Clone)]
pub struct Embedding {
    table: Table,
}

#[derive(Debug, Clone)]
enum Table {
    /// `[V, H]`.
    Dense(Array),
    /// Packed `[V, H]`; rows are dequantized after the lookup.
    Quantized(QuantizedTensor),
}

impl Embedding {
    /// Takes `{prefix}.weight` `[vocab, hidden]` (packed with scales and biases when quantized).
    pub fn load(w: &mut Weights, prefix: &str, vocab: usize, hidden: usize) -> Result<Embedding> {
        embedding(Vars::new(w, prefix), vocab, hidden)
    }

    /// From a dense `[vocab, hidden]` table.
    pub fn from_dense(table: Array) -> Embedding {
        Embedding {
            table: Table::Dense(table),
        }
    }

    /// True when the table is quantized.
    pub fn is_quantized(&self) -> bool {
        matches!(self.table, Table::Quantized(_))
    }

    /// Rows `tokens` (`[L]` ids) of the table: `[L, hidden]` in the compute dtype.
    pub fn forward(&self, tokens: &Array) -> Result<Array> {
        match &self.table {
            Table::Dense(t) => Ok(t.take(tokens, 0)?),
            Table::Quantized(q) => q.rows(tokens),
        }
    }

    /// The tied unembedding `x @ E.T` over the same arrays (quantized stays quantized).
    pub fn as_linear(&self, layout: LinearLayout) -> Result<Linear> {
        Ok(match &self.table {
            Table::Dense(t) => Linear::from_weight(t, None, layout)?,
            Table::Quantized(q) => Linear::from_quantized(q.clone(), None),
        })
    }

    /// The arrays to evaluate at load.
    pub fn arrays(&self) -> Vec<Array> {
        match &self.table {
            Table::Dense(t) => vec![t.clone()],
            Table::Quantized(q) => q.arrays(),
        }
    }
}

/// RMSNorm with a learned scale.
#[derive(Debug, Clone)]
pub(crate) struct RmsNorm {
    weight: Array,
    eps: f32,
}

impl RmsNorm {
    /// Takes `{name}` of shape `[dim]`.
    pub(crate) fn load(w: &mut Weights, name: &str, dim: usize, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: w.take(name, &[dim as i32])?,
            eps,
        })
    }

    /// Normalises the last axis.
    pub(crate) fn forward(&self, x: &Array) -> Result<Array> {
        if let Some(y) = crate::models::cpu_fused::rms_norm(self, x)? {
            return Ok(y);
        }
        Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }

    /// A norm of `weight` `[dim]` and `eps`.
    pub(crate) fn from_parts(weight: Array, eps: f32) -> RmsNorm {
        RmsNorm { weight, eps }
    }

    /// The learned scale, `[dim]`.
    pub(crate) fn weight(&self) -> &Array {
        &self.weight
    }

    /// The epsilon under the square root.
    pub(crate) fn eps(&self) -> f32 {
        self.eps
    }

    /// The same norm with `1` added to its weight: how a zero-centred
    /// checkpoint norm (`x · (1 + w)`) is loaded, once.
    pub(crate) fn shifted_by_one(&self) -> Result<RmsNorm> {
        let one = Array::scalar(1.0, self.weight.dtype())?;
        Ok(RmsNorm {
            weight: self.weight.add(&one)?,
            eps: self.eps,
        })
    }
}

/// Several linear layers over one input: one matmul over their stacked
/// weights when they can share a kernel ([`Linear::concat`]), its output split
/// back per part; else the parts one by one.
#[derive(Debug, Clone)]
pub(crate) enum FusedLinear {
    /// The stacked layer and each part's output width.
    Joint { linear: Linear, widths: Vec<i32> },
    /// Parts that could not be stacked.
    Separate(Vec<Linear>),
}

impl FusedLinear {
    /// `parts` with output widths `widths`, stacked when they can be.
    pub(crate) fn new(parts: Vec<Linear>, widths: Vec<i32>) -> Result<FusedLinear> {
        debug_assert_eq!(parts.len(), widths.len());
        let refs: Vec<&Linear> = parts.iter().collect();
        Ok(match Linear::concat(&refs)? {
            Some(linear) => FusedLinear::Joint { linear, widths },
            None => FusedLinear::Separate(parts),
        })
    }

    /// Each part applied to `x` `[..., in]`, in order.
    pub(crate) fn forward(&self, x: &Array) -> Result<Vec<Array>> {
        match self.joint_product(x)? {
            Some((y, widths)) => split_widths(&y, widths),
            None => match self {
                FusedLinear::Separate(parts) => parts.iter().map(|p| p.forward(x)).collect(),
                FusedLinear::Joint { .. } => unreachable!("a joint layer has a joint product"),
            },
        }
    }

    /// The stacked product `[..., Σ widths]` of `x` and the parts' widths
    /// when the parts are stacked (their outputs side by side, in order;
    /// [`split_widths`] cuts it into them); `None` for parts that could not
    /// be.
    pub(crate) fn joint_product(&self, x: &Array) -> Result<Option<(Array, &[i32])>> {
        match self {
            FusedLinear::Joint { linear, widths } => Ok(Some((linear.forward(x)?, widths))),
            FusedLinear::Separate(_) => Ok(None),
        }
    }

    /// A copy with every part quantized to `p` (see [`Linear::quantized_copy`]);
    /// `None` when no part could be.
    pub(crate) fn quantized_copy(&self, p: QuantParams) -> Result<Option<FusedLinear>> {
        Ok(match self {
            FusedLinear::Joint { linear, widths } => {
                linear.quantized_copy(p)?.map(|linear| FusedLinear::Joint {
                    linear,
                    widths: widths.clone(),
                })
            }
            FusedLinear::Separate(parts) => {
                let mut any = false;
                let mut out = Vec::with_capacity(parts.len());
                for part in parts {
                    match part.quantized_copy(p)? {
                        Some(q) => {
                            any = true;
                            out.push(q);
                        }
                        None => out.push(part.clone()),
                    }
                }
                any.then_some(FusedLinear::Separate(out))
            }
        })
    }

    /// The arrays to evaluate at load.
    pub(crate) fn arrays(&self) -> Vec<Array> {
        match self {
            FusedLinear::Joint { linear, .. } => linear.arrays(),
            FusedLinear::Separate(parts) => parts.iter().flat_map(|p| p.arrays()).collect(),
        }
    }
}

/// `y` `[..., Σ widths]` cut along its last axis into parts of `widths`, in order.
pub(crate) fn split_widths(y: &Array, widths: &[i32]) -> Result<Vec<Array>> {
    let mut lo = 0;
    widths
        .iter()
        .map(|w| {
            let part = y.slice_axis(-1, lo, lo + w)?;
            lo += w;
            Ok(part)
        })
        .collect()
}

/// The SwiGLU MLP: `down(silu(gate(x)) * up(x))`, the gate and up
/// projections stacked into one matmul when they can be (see
/// [`FusedLinear`] and `models/swiglu.rs`).
#[derive(Debug, Clone)]
pub(crate) struct Mlp {
    gate_up: FusedLinear,
    inter: i32,
    down: Linear,
}

impl Mlp {
    /// The MLP module at `vb`: `{gate,up,down}_proj`, with biases when `bias`
    /// (Llama's `mlp_bias`).
    pub(crate) fn new(
        mut vb: Vars<'_>,
        hidden: usize,
        inter: usize,
        bias: bool,
        layout: LinearLayout,
    ) -> Result<Mlp> {
        let gate = linear(vb.pp("gate_proj"), hidden, inter, bias, layout)?;
        let up = linear(vb.pp("up_proj"), hidden, inter, bias, layout)?;
        let w = inter as i32;
        Ok(Mlp {
            gate_up: FusedLinear::new(vec![gate, up], vec![w, w])?,
            inter: w,
            down: linear(vb.pp("down_proj"), inter, hidden, bias, layout)?,
        })
    }

    /// The arrays to evaluate at load.
    pub(crate) fn arrays(&self) -> Vec<Array> {
        let mut v = self.gate_up.arrays();
        v.extend(self.down.arrays());
        v
    }

    /// A copy with its projections quantized to `p` where they can be (see
    /// [`Linear::quantized_copy`]).
    pub(crate) fn quantized_copy(&self, p: QuantParams) -> Result<Mlp> {
        Ok(Mlp {
            gate_up: self
                .gate_up
                .quantized_copy(p)?
                .unwrap_or_else(|| self.gate_up.clone()),
            inter: self.inter,
            down: quantized_or_same(&self.down, p)?,
        })
    }

    /// Applies the MLP.
    pub(crate) fn forward(&self, x: &Array) -> Result<Array> {
        let h = match &self.gate_up {
            FusedLinear::Joint { linear, .. } => {
                crate::models::swiglu::swiglu(&linear.forward(x)?, self.inter)?
            }
            FusedLinear::Separate(_) => {
                let gu = self.gate_up.forward(x)?;
                crate::models::swiglu::silu_mul(&gu[0], &gu[1])?
            }
        };
        self.down.forward(&h)
    }
}

/// One pre-norm decoder block: `h = x + mixer(input_norm(x))`, then
/// `h + mlp(post_norm(h))`. Every decoder layer kind (attention, gated
/// attention, Gated DeltaNet) is this shape with its own mixer; `mlp` is a
/// dense MLP or a mixture-of-experts block.
pub(crate) fn pre_norm_block(
    x: &Array,
    input_norm: &RmsNorm,
    mixer: impl FnOnce(&Array) -> Result<Array>,
    post_norm: &RmsNorm,
    mlp: impl FnOnce(&Array) -> Result<Array>,
) -> Result<Array> {
    let h = x.add(&mixer(&input_norm.forward(x)?)?)?;
    Ok(h.add(&mlp(&post_norm.forward(&h)?)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::test_arrays::{max_diff, rand};
    use crate::quant::QuantParams;
    use mlx_tensor::{Dtype, random};

    /// On the CPU a dense layer sends 1-32 rows to the few-rows kernel and
    /// more to MLX's matmul; both agree with `x @ W.T` to float rounding (sums
    /// of ~300 unit-normal terms, |y| ~ 17: 1e-3 absolute is far above it),
    /// and every row of a several-row product equals that row alone bit for
    /// bit (what keeps a verify row equal to the plain step's product).
    #[test]
    fn cpu_rows_kernel_agrees_with_matmul_and_with_itself() {
        let w = random::normal(&[700, 300], Dtype::Float32, &random::key(1).unwrap()).unwrap();
        let layer = Linear::from_weight(&w, None, LinearLayout::TransposedView).unwrap();
        assert!(matches!(layer.kernel, Kernel::Dense { cpu_rows: true, .. }));
        let x = random::normal(&[1, 33, 300], Dtype::Float32, &random::key(2).unwrap()).unwrap();
        for rows in [1, 2, 5, 8, 9, 17, 32, 33] {
            let xs = x.slice_axis(1, 0, rows).unwrap();
            let got = layer.forward(&xs).unwrap();
            assert_eq!(got.shape().to_vec(), vec![1, rows, 700]);
            let want = xs.matmul(&w.t().unwrap()).unwrap();
            let diff = max_diff(&got, &want);
            assert!(diff < 1e-3, "{rows} rows: max diff {diff}");
            if rows <= mlx_tensor::ops::ROWS_MATMUL_MAX_ROWS {
                let last = layer
                    .forward(&x.slice_axis(1, rows - 1, rows).unwrap())
                    .unwrap();
                let in_batch = got.slice_axis(1, rows - 1, rows).unwrap();
                assert_eq!(
                    last.to_vec::<f32>().unwrap(),
                    in_batch.to_vec::<f32>().unwrap(),
                    "row {} alone vs in a {rows}-row product",
                    rows - 1
                );
            }
        }
        // A pre-transposed layer keeps MLX's matmul (no `[out, in]` weight).
        let pre = Linear::from_weight(&w, None, LinearLayout::PreTransposed).unwrap();
        assert!(matches!(
            pre.kernel,
            Kernel::Dense {
                cpu_rows: false,
                ..
            }
        ));
    }

    /// In bf16 and f16 on the CPU, a product of more rows than the few-rows
    /// kernel takes (33, 40) runs widened to f32 and rounded once: within one
    /// output rounding of the f32 product of the same (rounded) operands, and
    /// each of its rows within one rounding of that row through the few-rows
    /// kernel (which also sums in f32 and rounds once). `|y|` here reaches ~60,
    /// whose bf16 unit is 0.25 (f16's 0.03).
    #[test]
    fn a_half_precision_product_of_many_rows_runs_in_f32_on_the_cpu() {
        for (dtype, unit) in [(Dtype::Bfloat16, 0.5f32), (Dtype::Float16, 0.07)] {
            let w = random::normal(&[200, 300], Dtype::Float32, &random::key(3).unwrap())
                .unwrap()
                .as_type(dtype)
                .unwrap();
            let layer = Linear::from_weight(&w, None, LinearLayout::TransposedView).unwrap();
            let wt = w.t().unwrap();
            assert!(widens_on_cpu(
                &rand(&[1, 33, 300], 4).as_type(dtype).unwrap(),
                &wt
            ));
            for rows in [33, 40] {
                let x = random::normal(&[1, rows, 300], Dtype::Float32, &random::key(5).unwrap())
                    .unwrap()
                    .as_type(dtype)
                    .unwrap();
                let got = layer.forward(&x).unwrap();
                assert_eq!(got.dtype(), dtype);
                let f32 = |a: &Array| a.as_type(Dtype::Float32).unwrap();
                let want = f32(&x).matmul(&f32(&wt)).unwrap();
                let diff = max_diff(&f32(&got), &want);
                assert!(diff <= unit, "{dtype:?} {rows} rows: max diff {diff}");
                let one = layer.forward(&x.slice_axis(1, 3, 4).unwrap()).unwrap();
                let diff = max_diff(&f32(&one), &f32(&got.slice_axis(1, 3, 4).unwrap()));
                assert!(
                    diff <= unit,
                    "{dtype:?} row 3 alone vs among {rows}: {diff}"
                );
            }
        }
    }

    /// The stacked layer's split outputs equal each part applied alone, for
    /// dense parts in both layouts (with biases) and for quantized parts, on
    /// one row and on several; parts that cannot share a kernel stay apart.
    #[test]
    fn fused_parts_equal_the_parts_alone() {
        let x1 = rand(&[1, 1, 64], 1);
        let x3 = rand(&[1, 3, 64], 2);
        let widths = [96, 32, 32];
        let dense = |layout, bias: bool| -> Vec<Linear> {
            widths
                .iter()
                .enumerate()
                .map(|(i, &w)| {
                    let b = bias.then(|| rand(&[w], 20 + i as u64));
                    Linear::from_weight(&rand(&[w, 64], 10 + i as u64), b, layout).unwrap()
                })
                .collect()
        };
        let params = QuantParams::affine(32, 4);
        let quantized: Vec<Linear> = widths
            .iter()
            .enumerate()
            .map(|(i, &w)| {
                let q = QuantizedTensor::quantize(&rand(&[w, 64], 30 + i as u64), params).unwrap();
                Linear::from_quantized(q, None)
            })
            .collect();
        let cases = [
            ("view+bias", dense(LinearLayout::TransposedView, true)),
            ("pre", dense(LinearLayout::PreTransposed, false)),
            ("q4", quantized),
        ];
        for (name, parts) in cases {
            let fused = FusedLinear::new(parts.clone(), widths.to_vec()).unwrap();
            assert!(
                matches!(fused, FusedLinear::Joint { .. }),
                "{name}: stacked"
            );
            for x in [&x1, &x3] {
                let got = fused.forward(x).unwrap();
                for (p, g) in parts.iter().zip(&got) {
                    let d = max_diff(&p.forward(x).unwrap(), g);
                    assert!(d < 1e-4, "{name}: part differs by {d}");
                }
            }
        }
        // A bias on one part only, or dense mixed with quantized: kept apart.
        let mut mixed = dense(LinearLayout::TransposedView, false);
        mixed[1] = dense(LinearLayout::TransposedView, true).remove(1);
        let f = FusedLinear::new(mixed, widths.to_vec()).unwrap();
        assert!(matches!(f, FusedLinear::Separate(_)), "bias on some parts");
        let q = QuantizedTensor::quantize(&rand(&[32, 64], 40), params).unwrap();
        let mut kinds = dense(LinearLayout::TransposedView, false);
        kinds[2] = Linear::from_quantized(q, None);
        let f = FusedLinear::new(kinds, widths.to_vec()).unwrap();
        assert!(
            matches!(f, FusedLinear::Separate(_)),
            "dense with quantized"
        );
    }

    /// Largest |a - b| over the largest |b|: an error relative to the output's scale.
    fn relative_diff(a: &Array, b: &Array) -> f32 {
        let scale = b
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .fold(0.0f32, |m, x| m.max(x.abs()));
        max_diff(a, b) / scale
    }

    /// A quantized copy of a dense layer (either layout, bias kept) computes
    /// the dense product to the precision of its bits and really is
    /// quantized (not bit-identical); a layer it cannot quantize (input not a
    /// multiple of the group size, or already quantized) gives `None`.
    /// `output_rows(ids)` computes exactly the full layer's outputs `ids`,
    /// in their order, for both dense layouts and a quantized layer.
    #[test]
    fn output_rows_are_the_full_layers_columns() {
        let w = rand(&[96, 128], 60);
        let bias = rand(&[96], 61);
        let x = rand(&[1, 3, 128], 62);
        let ids_v: Vec<u32> = vec![95, 0, 7, 40, 41];
        let ids = Array::from_slice(&ids_v, &[5]).unwrap();
        let p = QuantParams::affine(64, 8);
        let dense = |layout| Linear::from_weight(&w, Some(bias.clone()), layout).unwrap();
        for full in [
            dense(LinearLayout::TransposedView),
            dense(LinearLayout::PreTransposed),
            dense(LinearLayout::DEFAULT)
                .quantized_copy(p)
                .unwrap()
                .unwrap(),
        ] {
            let want = full.forward(&x).unwrap().take(&ids, 2).unwrap();
            let sub = full.output_rows(&ids).unwrap();
            assert_eq!(sub.output_width(), 5);
            assert_eq!(sub.is_quantized(), full.is_quantized());
            let got = sub.forward(&x).unwrap();
            assert!(max_diff(&got, &want) < 1e-5, "{}", max_diff(&got, &want));
        }
    }

    /// On the CPU a quantized layer's product of more rows than the few-rows
    /// kernel takes (a prefill chunk) runs through it in slices: within the
    /// kernel's rounding of MLX's `quantized_matmul` (`MTP_CPU_QROWS` off), in
    /// the input's shape, and each row bit for bit that row alone (the
    /// kernel's sums do not depend on the rows beside them).
    #[test]
    fn a_quantized_product_of_many_rows_runs_in_slices_of_the_rows_kernel() {
        let w = rand(&[96, 128], 60);
        let dense = Linear::from_weight(&w, None, LinearLayout::TransposedView).unwrap();
        let p = QuantParams::affine(64, 4);
        let q = dense
            .quantized_copy(p)
            .unwrap()
            .expect("128 inputs quantize");
        let rows = 2 * mlx_tensor::ops::ROWS_MATMUL_MAX_ROWS + 5;
        let x = rand(&[1, rows, 128], 61);
        let got = q.forward(&x).unwrap();
        assert_eq!(got.shape().to_vec(), vec![1, rows, 96]);
        crate::quant::set_cpu_quant_rows(false);
        let mlx = q.forward(&x);
        crate::quant::set_cpu_quant_rows(true);
        let diff = max_diff(&got, &mlx.unwrap());
        assert!(diff < 1e-4, "sliced kernel vs quantized_matmul: {diff}");
        for r in [0, 31, 32, 33, rows - 1] {
            let alone = q.forward(&x.slice_axis(1, r, r + 1).unwrap()).unwrap();
            assert_eq!(
                alone.to_vec::<f32>().unwrap(),
                got.slice_axis(1, r, r + 1)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap(),
                "row {r} alone vs among {rows}"
            );
        }
    }

    /// Unit-normal weights and inputs, error over the output's largest |y|:
    /// measured 0.0044 at 8 bits and 0.094 at 4 bits (`[96, 128]`), 0.08 and
    /// 0.13 for the fused parts at 4 bits; the bounds below leave 2x margin
    /// and a floor that a copy left dense would not pass.
    #[test]
    fn quantized_copy_approximates_the_dense_layer() {
        let w = rand(&[96, 128], 50);
        let bias = rand(&[96], 51);
        let x = rand(&[1, 5, 128], 52);
        for layout in [LinearLayout::TransposedView, LinearLayout::PreTransposed] {
            let dense = Linear::from_weight(&w, Some(bias.clone()), layout).unwrap();
            let want = dense.forward(&x).unwrap();
            for (bits, lo, hi) in [(8, 1e-4, 0.01), (4, 1e-2, 0.25)] {
                let p = QuantParams::affine(64, bits);
                let q = dense
                    .quantized_copy(p)
                    .unwrap()
                    .expect("128 inputs quantize");
                assert!(q.is_quantized(), "{layout:?} q{bits}");
                assert!(q.bias.is_some(), "{layout:?} q{bits}: bias kept");
                let rel = relative_diff(&q.forward(&x).unwrap(), &want);
                assert!(
                    lo < rel && rel < hi,
                    "{layout:?} q{bits}: relative error {rel}"
                );
                assert!(q.quantized_copy(p).unwrap().is_none(), "already quantized");
            }
        }
        let p = QuantParams::affine(64, 4);
        let narrow =
            Linear::from_weight(&rand(&[32, 96], 53), None, LinearLayout::DEFAULT).unwrap();
        assert!(narrow.quantized_copy(p).unwrap().is_none(), "96 inputs");
        // Fused: the stacked layer is quantized as one; apart, each part that can be.
        let x = rand(&[1, 3, 128], 54);
        let parts: Vec<Linear> = [(64, 128, 55), (32, 128, 56)]
            .iter()
            .map(|&(o, i, seed)| {
                Linear::from_weight(&rand(&[o, i], seed), None, LinearLayout::DEFAULT).unwrap()
            })
            .collect();
        let joint = FusedLinear::new(parts.clone(), vec![64, 32]).unwrap();
        let separate = FusedLinear::Separate(parts.clone());
        for fused in [joint, separate] {
            let q = fused.quantized_copy(p).unwrap().expect("parts quantize");
            assert_eq!(
                std::mem::discriminant(&q),
                std::mem::discriminant(&fused),
                "same shape of fusion"
            );
            for (part, got) in parts.iter().zip(q.forward(&x).unwrap()) {
                let rel = relative_diff(&got, &part.forward(&x).unwrap());
                assert!(1e-2 < rel && rel < 0.25, "fused part: relative error {rel}");
            }
        }
        let unquantizable = FusedLinear::Separate(vec![narrow]);
        assert!(unquantizable.quantized_copy(p).unwrap().is_none());
    }
}
