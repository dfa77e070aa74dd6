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

/// A CUDA kernel compiled at run time by MLX (`fast::cuda_kernel`, NVRTC):
/// `source` is the kernel body; each input is a `const T*` named as in
/// `inputs` (`NAME_shape`, `NAME_strides`, `NAME_ndim` in the body add those
/// of that input), each output a `T*` named as in `outputs`, and every
/// template `(name, value)` a `constexpr int`. Works only on MLX's CUDA
/// backend: elsewhere it is an `Err`.
#[derive(Debug, Clone, Copy)]
pub struct CudaKernel<'a> {
    /// Kernel name (one compiled module per name, source and template values).
    pub name: &'a str,
    /// The kernel body.
    pub source: &'a str,
    /// Names of the inputs, in call order.
    pub inputs: &'a [&'a str],
    /// Names of the outputs, in result order.
    pub outputs: &'a [&'a str],
    /// Whether inputs are made row-contiguous first (MLX copies those that
    /// are not); without it the body must index through `NAME_strides`.
    pub row_contiguous: bool,
}

/// Launch geometry and outputs of one [`CudaKernel`] call.
#[derive(Debug, Clone, Copy)]
pub struct CudaLaunch<'a> {
    /// Shape and dtype of each output.
    pub outputs: &'a [(&'a [i32], Dtype)],
    /// Total threads per axis (as in MLX: not blocks).
    pub grid: [i32; 3],
    /// Threads per block.
    pub block: [i32; 3],
    /// Compile-time integers, `(name, value)`.
    pub templates: &'a [(&'a str, i32)],
}

impl CudaKernel<'_> {
    /// Runs the kernel on `inputs` (as many as [`CudaKernel::inputs`] names)
    /// and returns its outputs.
    #[track_caller]
    pub fn apply(&self, inputs: &[&Array], launch: &CudaLaunch<'_>) -> Result<Vec<Array>> {
        let dims: Vec<i32> = launch
            .outputs
            .iter()
            .flat_map(|(s, _)| s.iter().copied())
            .collect();
        let ranks: Vec<i32> = launch.outputs.iter().map(|(s, _)| s.len() as i32).collect();
        let dtypes: Vec<u8> = launch.outputs.iter().map(|(_, d)| d.code().repr).collect();
        let (tnames, tvalues): (Vec<&str>, Vec<i32>) = launch.templates.iter().copied().unzip();
        let list = crate::array::List::new(inputs.iter().copied());
        crate::array::List {
            inner: check(sys::cuda_kernel(
                self.name,
                self.source,
                self.inputs,
                list.raw(),
                self.outputs,
                &dims,
                &ranks,
                &dtypes,
                &launch.grid,
                &launch.block,
                &tnames,
                &tvalues,
                self.row_contiguous,
            ))?,
        }
        .into_arrays()
    }
}
