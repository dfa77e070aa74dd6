//! Model families: the [`Model`] seam and its registry, the shared layers,
//! and the multi-token-prediction heads built from them.

pub(crate) mod attention;
pub(crate) mod cpu_fused;
pub(crate) mod delta_kernel;
pub(crate) mod dispatch;
pub(crate) mod gated_attention;
pub(crate) mod gated_delta;
pub(crate) mod glm4_moe;
pub(crate) mod heads_kernel;
pub(crate) mod kernel_check;
pub(crate) mod layers;
pub(crate) mod llama;
pub(crate) mod mla;
pub(crate) mod moe;
pub(crate) mod mtp;
pub(crate) mod qwen3_5;
pub(crate) mod qwen3_next;
pub(crate) mod registry;
pub(crate) mod rope;
pub(crate) mod sdpa;
pub(crate) mod short_sdpa;
pub(crate) mod skinny;
pub(crate) mod swiglu;
pub(crate) mod trunk_ends;

pub use registry::Model;

/// Random arrays and their comparison, for the layer tests of this module.
#[cfg(test)]
pub(crate) mod test_arrays {
    use mlx_tensor::{Array, Dtype, random};

    /// A standard-normal f32 array of `shape` from `seed`.
    pub(crate) fn rand(shape: &[i32], seed: u64) -> Array {
        random::normal(shape, Dtype::Float32, &random::key(seed).unwrap()).unwrap()
    }

    /// Max |a - b| over two arrays of the same size.
    pub(crate) fn max_diff(a: &Array, b: &Array) -> f32 {
        let (a, b) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }
}
