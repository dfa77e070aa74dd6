//! `silu(gate) · up` over a joint `[..., 2·I]` gate-and-up projection: one
//! CUDA kernel there, MLX's ops elsewhere.
//!
//! Why: MLX runs `silu(g) · u` as three kernels (sigmoid, two multiplies),
//! each a graph node the host dispatches; a decode step on CUDA is bound by
//! that host time (measured on an H200: about 3 µs per kernel node, 1,629
//! nodes in an 8B step), so the MLP's elementwise tail becomes one node.
//! The gate and up halves come from one matmul ([`crate::models::layers::Mlp`]).

use mlx_tensor::fast::{CudaKernel, CudaLaunch};
use mlx_tensor::{Array, Dtype};

use crate::error::Result;

const KERNEL: CudaKernel<'static> = CudaKernel {
    name: "mtp_swiglu",
    source: SOURCE,
    inputs: &["gu"],
    outputs: &["y"],
    row_contiguous: true,
};

/// `y[r, j] = silu(gu[r, j]) · gu[r, HALF + j]` in f32 for bf16 `gu`, one
/// thread per output; the launch covers the output exactly (its block
/// divides `HALF`). NVRTC has no standard library: only CUDA's intrinsics.
const SOURCE: &str = r#"
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const size_t r = i / HALF;
  const size_t j = i - r * HALF;
  const float g = __bfloat162float(gu[r * 2 * HALF + j]);
  const float u = __bfloat162float(gu[r * 2 * HALF + HALF + j]);
  y[i] = __float2bfloat16(g / (1.0f + expf(-g)) * u);
"#;

/// `silu(gate) · up` with MLX's ops (separate gate and up projections, and
/// the joint form off CUDA).
pub(crate) fn silu_mul(gate: &Array, up: &Array) -> Result<Array> {
    Ok(gate.silu()?.multiply(up)?)
}

/// `silu(gu[..., :half]) · gu[..., half:]` for a row-contiguous `gu` whose
/// last axis is `2 · half` (the kernel for bf16 on CUDA, MLX's ops otherwise).
pub(crate) fn swiglu(gu: &Array, half: i32) -> Result<Array> {
    let dtype = gu.dtype();
    let fused = crate::models::sdpa::on_cuda()
        && dtype == Dtype::Bfloat16
        && gu.ndim() > 0
        && gu.dim(-1) == 2 * half
        && half > 0;
    if let Some(y) = crate::models::cpu_fused::swiglu(gu, half)? {
        return Ok(y);
    }
    if !fused {
        let g = gu.slice_axis(-1, 0, half)?;
        let u = gu.slice_axis(-1, half, 2 * half)?;
        return silu_mul(&g, &u);
    }
    let mut shape = gu.shape().to_vec();
    *shape.last_mut().expect("rank ≥ 1") = half;
    let total: i32 = shape.iter().product();
    // The largest power-of-two block (≤ 256) dividing `half` divides the total.
    let block = (0..=8)
        .rev()
        .map(|p| 1 << p)
        .find(|b| half % b == 0)
        .unwrap_or(1);
    let launch = CudaLaunch {
        outputs: &[(&shape, dtype)],
        grid: [total, 1, 1],
        block: [block, 1, 1],
        templates: &[("HALF", half)],
    };
    Ok(KERNEL.apply(&[gu], &launch)?.remove(0))
}

/// The kernel against MLX's ops on the default device, as the worst
/// relative error (`None` off CUDA): three inputs of one shape, so every
/// call after the first reuses the primitive built for that launch (the
/// shim's kernel reuse), two of them in one graph and one evaluated after
/// it; each must compute on its own inputs.
pub(crate) fn self_check() -> Result<Option<f32>> {
    use mlx_tensor::random;
    if !crate::models::sdpa::on_cuda() {
        return Ok(None);
    }
    let half = 1536;
    let rand = |seed: u64| -> Result<Array> {
        Ok(
            random::normal(&[1, 5, 2 * half], Dtype::Float32, &random::key(seed)?)?
                .as_type(Dtype::Bfloat16)?,
        )
    };
    let reference = |gu: &Array| -> Result<Array> {
        let g = gu.slice_axis(-1, 0, half)?;
        let u = gu.slice_axis(-1, half, 2 * half)?;
        silu_mul(&g, &u)
    };
    let (a, b, c) = (rand(11)?, rand(12)?, rand(13)?);
    let (ya, yb) = (swiglu(&a, half)?, swiglu(&b, half)?);
    mlx_tensor::eval([&ya, &yb])?;
    let yc = swiglu(&c, half)?;
    let mut worst = 0.0f32;
    for (y, gu) in [(&ya, &a), (&yb, &b), (&yc, &c)] {
        worst = worst.max(super::kernel_check::rel_err(y, &reference(gu)?)?);
    }
    Ok(Some(worst))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_tensor::random;

    /// Off CUDA the joint form is the separate gate and up halves' SwiGLU.
    #[test]
    fn joint_halves_equal_separate_swiglu() {
        let gu = random::normal(&[1, 3, 16], Dtype::Float32, &random::key(4).unwrap()).unwrap();
        let got = swiglu(&gu, 8).unwrap();
        assert_eq!(got.shape().as_slice(), &[1, 3, 8]);
        let g = gu.slice_axis(-1, 0, 8).unwrap();
        let u = gu.slice_axis(-1, 8, 16).unwrap();
        let want = g.silu().unwrap().multiply(&u).unwrap();
        let (a, b) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
        assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() <= 1e-6));
    }
}
