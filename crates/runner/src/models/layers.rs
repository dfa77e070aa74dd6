//! Building blocks shared by the families: linear layers, RMSNorm, the SwiGLU MLP.

use mlx_tensor::{Array, fast};

use crate::error::Result;
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

/// `y = x @ W.T + b`.
#[derive(Debug, Clone)]
pub struct Linear {
    /// `[in, out]`: a transposed view of the `[out, in]` weight, or a contiguous copy.
    wt: Array,
    bias: Option<Array>,
}

impl Linear {
    /// Takes `{prefix}.weight` `[out, in]` and, when `bias`, `{prefix}.bias` `[out]`.
    pub fn load(
        w: &mut Weights,
        prefix: &str,
        input: usize,
        output: usize,
        bias: bool,
        layout: LinearLayout,
    ) -> Result<Linear> {
        let weight = w.take(&format!("{prefix}.weight"), &[output as i32, input as i32])?;
        let bias = if bias {
            Some(w.take(&format!("{prefix}.bias"), &[output as i32])?)
        } else {
            None
        };
        Ok(Linear::from_weight(&weight, bias, layout)?)
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
        Ok(Linear { wt, bias })
    }

    /// Applies the layer to `[..., in]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = x.matmul(&self.wt)?;
        Ok(match &self.bias {
            Some(b) => y.add(b)?,
            None => y,
        })
    }

    /// The arrays to evaluate at load.
    pub fn arrays(&self) -> Vec<Array> {
        std::iter::once(self.wt.clone())
            .chain(self.bias.clone())
            .collect()
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
