//! [`Ffn`]: a decoder layer's feed-forward part, a dense SwiGLU MLP or a
//! mixture-of-experts block, and the pre-norm residual block around it.

use mlx_tensor::Array;

use crate::error::Result;
use crate::models::layers::{Mlp, RmsNorm};
use crate::models::moe_local::MoeBlock;

/// The feed-forward part of one decoder layer.
#[derive(Debug, Clone)]
pub(crate) enum Ffn {
    /// A SwiGLU MLP (`mlp.{gate,up,down}_proj`).
    Dense(Mlp),
    /// Routed experts and a shared expert.
    Moe(MoeBlock),
}

impl Ffn {
    /// Applies it to `x` `[..., H]`.
    pub(crate) fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Ffn::Dense(m) => m.forward(x),
            Ffn::Moe(m) => m.forward(x),
        }
    }

    /// The arrays to evaluate at load.
    pub(crate) fn arrays(&self) -> Vec<Array> {
        match self {
            Ffn::Dense(m) => m.arrays(),
            Ffn::Moe(m) => m.arrays(),
        }
    }
}

/// One pre-norm decoder block: `h = x + mixer(input_norm(x))`, then
/// `h + ffn(post_norm(h))`.
pub(crate) fn ffn_block(
    x: &Array,
    input_norm: &RmsNorm,
    mixer: impl FnOnce(&Array) -> Result<Array>,
    post_norm: &RmsNorm,
    ffn: &Ffn,
) -> Result<Array> {
    let h = x.add(&mixer(&input_norm.forward(x)?)?)?;
    Ok(h.add(&ffn.forward(&post_norm.forward(&h)?)?)?)
}
