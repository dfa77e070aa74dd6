//! Building blocks shared by the families: linear layers, RMSNorm, the SwiGLU MLP.

use mlx_tensor::{Array, fast};

use crate::error::Result;
use crate::quant::QuantizedTensor;
use crate::weights::Weights;

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
    /// `[in, out]`: a transposed view of the `[out, in]` weight, or a contiguous copy.
    Dense(Array),
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
        let quantized = w.take_quantized(prefix, output, input)?;
        let bias = if bias {
            Some(w.take(&format!("{prefix}.bias"), &[output as i32])?)
        } else {
            None
        };
        match quantized {
            Some(q) => Ok(Linear::from_quantized(q, bias)),
            None => {
                let weight = w.take(&format!("{prefix}.weight"), &[output as i32, input as i32])?;
                Ok(Linear::from_weight(&weight, bias, layout)?)
            }
        }
    }

    /// From a `[out, in]` weight.
    pub fn from_weight(
        weight: &Array,
        bias: Option<Array>,
        layout: LinearLayout,
    ) -> mlx_tensor::Result<Linear> {
        let wt = weight.t()?;
        let wt = match layout {
            LinearLayout::TransposedView => wt,
            LinearLayout::PreTransposed => wt.contiguous()?,
        };
        Ok(Linear {
            kernel: Kernel::Dense(wt),
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

    /// Applies the layer to `[..., in]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = match &self.kernel {
            Kernel::Dense(wt) => x.matmul(wt)?,
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
            Kernel::Dense(wt) => vec![wt.clone()],
            Kernel::Quantized(q) => q.arrays(),
        };
        v.extend(self.bias.clone());
        v
    }
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
        let table = match w.take_quantized(prefix, vocab, hidden)? {
            Some(q) => Table::Quantized(q),
            None => {
                Table::Dense(w.take(&format!("{prefix}.weight"), &[vocab as i32, hidden as i32])?)
            }
        };
        Ok(Embedding { table })
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
pub struct RmsNorm {
    weight: Array,
    eps: f32,
}

impl RmsNorm {
    /// Takes `{name}` of shape `[dim]`.
    pub fn load(w: &mut Weights, name: &str, dim: usize, eps: f32) -> Result<RmsNorm> {
        Ok(RmsNorm {
            weight: w.take(name, &[dim as i32])?,
            eps,
        })
    }

    /// Normalises the last axis.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        Ok(fast::rms_norm(x, Some(&self.weight), self.eps)?)
    }

    /// The same norm with `1` added to its weight: how a zero-centred
    /// checkpoint norm (`x · (1 + w)`) is loaded, once.
    pub fn shifted_by_one(&self) -> Result<RmsNorm> {
        let one = Array::scalar(1.0, self.weight.dtype())?;
        Ok(RmsNorm {
            weight: self.weight.add(&one)?,
            eps: self.eps,
        })
    }
}

/// The SwiGLU MLP: `down(silu(gate(x)) * up(x))`.
#[derive(Debug, Clone)]
pub struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    /// Takes `{prefix}.{gate,up,down}_proj.weight`.
    pub fn load(
        w: &mut Weights,
        prefix: &str,
        hidden: usize,
        inter: usize,
        layout: LinearLayout,
    ) -> Result<Mlp> {
        Ok(Mlp {
            gate: Linear::load(
                w,
                &format!("{prefix}.gate_proj"),
                hidden,
                inter,
                false,
                layout,
            )?,
            up: Linear::load(
                w,
                &format!("{prefix}.up_proj"),
                hidden,
                inter,
                false,
                layout,
            )?,
            down: Linear::load(
                w,
                &format!("{prefix}.down_proj"),
                inter,
                hidden,
                false,
                layout,
            )?,
        })
    }

    /// The arrays to evaluate at load.
    pub fn arrays(&self) -> Vec<Array> {
        [&self.gate, &self.up, &self.down]
            .iter()
            .flat_map(|l| l.arrays())
            .collect()
    }

    /// Applies the MLP.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let g = self.gate.forward(x)?.silu()?;
        let u = self.up.forward(x)?;
        self.down.forward(&g.multiply(&u)?)
    }
}
