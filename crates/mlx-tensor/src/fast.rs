//! MLX's fused kernels: RMSNorm, rotary embeddings, scaled dot-product attention.

use crate::error::check;
use crate::ffi::sys;
use crate::{Array, Dtype, Result};

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

/// A CUDA kernel of two inputs and one output, compiled at run time by MLX
/// (`fast::cuda_kernel`, NVRTC): `source` is the kernel body, the inputs are
/// `const T*` named `inputs[i].0` (`NAME_shape` in the body adds the shape),
/// the output is `T*` named `output`, and `template` becomes a `constexpr int`.
/// Inputs are made row-contiguous first. Works only on MLX's CUDA backend:
/// elsewhere it is an `Err`.
#[derive(Debug, Clone, Copy)]
pub struct CudaKernel<'a> {
    /// Kernel name (one compiled module per name and template value).
    pub name: &'a str,
    /// The kernel body.
    pub source: &'a str,
    /// Names of the two inputs.
    pub inputs: [&'a str; 2],
    /// Name of the output.
    pub output: &'a str,
}

/// Launch geometry and output of one [`CudaKernel`] call.
#[derive(Debug, Clone, Copy)]
pub struct CudaLaunch<'a> {
    /// Output shape.
    pub shape: &'a [i32],
    /// Output dtype.
    pub dtype: Dtype,
    /// Total threads per axis (as in MLX: not blocks).
    pub grid: [i32; 3],
    /// Threads per block.
    pub block: [i32; 3],
    /// One compile-time integer, `(name, value)`.
    pub template: (&'a str, i32),
}

impl CudaKernel<'_> {
    /// Runs the kernel on `a`, `b`.
    #[track_caller]
    pub fn apply(&self, a: &Array, b: &Array, launch: &CudaLaunch<'_>) -> Result<Array> {
        check(sys::cuda_kernel2(
            self.name,
            self.source,
            self.inputs[0],
            a.raw(),
            self.inputs[1],
            b.raw(),
            self.output,
            launch.shape,
            launch.dtype.code(),
            &launch.grid,
            &launch.block,
            launch.template.0,
            launch.template.1,
        ))
        .map(Array::wrap)
    }
}
