//! MLX's fused kernels: RMSNorm, rotary embeddings, scaled dot-product attention.

use crate::error::check;
use crate::ffi::sys;
use crate::{Array, Result};

/// RMSNorm over the last axis, `x / rms(x) * weight`.
#[track_caller]
pub fn rms_norm(x: &Array, weight: Option<&Array>, eps: f32) -> Result<Array> {
    match weight {
        Some(w) => check(sys::rms_norm(x.raw(), w.raw(), eps)).map(Array::wrap),
        None => check(sys::rms_norm_noweight(x.raw(), eps)).map(Array::wrap),
    }
}

/// Rotary embedding of the first `dims` features of the last axis, positions
/// `offset, offset + 1, ...` along the second-to-last axis.
#[track_caller]
pub fn rope(
    x: &Array,
    dims: i32,
    traditional: bool,
    base: f32,
    scale: f32,
    offset: i32,
) -> Result<Array> {
    check(sys::rope(x.raw(), dims, traditional, base, scale, offset)).map(Array::wrap)
}

/// Rotary embedding with explicit inverse frequencies (`dims / 2` of them),
/// as used by Llama 3 style frequency scaling.
#[track_caller]
pub fn rope_with_freqs(
    x: &Array,
    dims: i32,
    traditional: bool,
    scale: f32,
    offset: i32,
    freqs: &Array,
) -> Result<Array> {
    check(sys::rope_freqs(
        x.raw(),
        dims,
        traditional,
        scale,
        offset,
        freqs.raw(),
    ))
    .map(Array::wrap)
}

/// The attention mask handed to [`scaled_dot_product_attention`].
#[derive(Debug, Clone, Copy)]
pub enum Mask<'a> {
    /// No mask: every query sees every key.
    None,
    /// Causal, aligned at the end: query `i` of `L` sees keys `0..=S-L+i`.
    Causal,
    /// An explicit boolean (true = keep) or additive float mask, broadcast to `[B, H, L, S]`.
    Array(&'a Array),
}

/// `softmax(q kᵀ · scale + mask) v` with `q: [B, Hq, L, D]`, `k, v: [B, Hkv, S, D]`;
/// grouped-query attention when `Hq` is a multiple of `Hkv`.
#[track_caller]
pub fn scaled_dot_product_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f32,
    mask: Mask<'_>,
) -> Result<Array> {
    match mask {
        Mask::None => check(sys::sdpa(q.raw(), k.raw(), v.raw(), scale, false)).map(Array::wrap),
        Mask::Causal => check(sys::sdpa(q.raw(), k.raw(), v.raw(), scale, true)).map(Array::wrap),
        Mask::Array(m) => {
            check(sys::sdpa_masked(q.raw(), k.raw(), v.raw(), scale, m.raw())).map(Array::wrap)
        }
    }
}
