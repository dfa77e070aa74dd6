//! `x @ W.T` for a few rows of `x` on CUDA, reading the weight once: off
//! by default, kept for measurement (`MTP_ROWS_KERNEL=1`).
//!
//! Why it exists: MLX 0.32's CUDA matmul has its own GEMV kernel for one row
//! and sends two or more rows to cuBLASLt, whose GEMM for 2–8 rows of a
//! decoder-sized bf16 weight once cost about twice the one-row kernel on an
//! H200. The kernel below gives each warp one output feature: its 32 lanes
//! stream that weight row in 16-byte loads and keep one f32 sum per input row.
//! Why it is off: measured again with every other round cost cut (fused
//! layers, short-query attention; `examples/verify-probe.rs`, 8B shape bf16,
//! one call), a synced verify of 2 / 3 / 4 / 5 rows took 10.2 / 11.1 / 11.7 /
//! 13.0 ms with it and 10.4 / 10.2 / 10.1 / 10.3 ms with cuBLAS: it re-reads
//! every input row per weight chunk, so it falls behind from three rows on.

use std::cell::Cell;

use mlx_tensor::fast::{CudaKernel, CudaLaunch};
use mlx_tensor::{Array, Dtype};

use crate::error::Result;

/// The most rows the kernel takes (one f32 accumulator each per lane).
pub(crate) const MAX_ROWS: i32 = 8;

const KERNEL: CudaKernel<'static> = CudaKernel {
    name: "mtp_rows_matmul_t",
    source: SOURCE,
    inputs: &["x", "w"],
    outputs: &["y"],
    row_contiguous: true,
};

/// `y[m, n] = Σ_k x[m, k] · w[n, k]` for `ROWS` rows; `x`, `w` bf16,
/// `K % 8 == 0`. One warp per `n`; lane `l` reads `w[n, 8l + 256j ..]`.
const SOURCE: &str = r#"
  const int K = w_shape[1];
  const int N = w_shape[0];
  const int lane = threadIdx.x & 31;
  const int n = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if (n >= N) return;
  float acc[ROWS];
  #pragma unroll
  for (int m = 0; m < ROWS; ++m) acc[m] = 0.0f;
  const auto* wr = w + (size_t)n * K;
  for (int k = lane * 8; k < K; k += 256) {
    uint4 wv = *reinterpret_cast<const uint4*>(wr + k);
    const __nv_bfloat16* wp = reinterpret_cast<const __nv_bfloat16*>(&wv);
    float wf[8];
    #pragma unroll
    for (int j = 0; j < 8; ++j) wf[j] = __bfloat162float(wp[j]);
    #pragma unroll
    for (int m = 0; m < ROWS; ++m) {
      uint4 xv = *reinterpret_cast<const uint4*>(x + (size_t)m * K + k);
      const __nv_bfloat16* xp = reinterpret_cast<const __nv_bfloat16*>(&xv);
      #pragma unroll
      for (int j = 0; j < 8; ++j) acc[m] += wf[j] * __bfloat162float(xp[j]);
    }
  }
  #pragma unroll
  for (int m = 0; m < ROWS; ++m) {
    float v = acc[m];
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffff, v, off);
    if (lane == 0) y[(size_t)m * N + n] = __float2bfloat16(v);
  }
"#;

thread_local! {
    /// `MTP_ROWS_KERNEL=1` turns the kernel on (for measurement).
    static ENABLED: crate::switch::Flag = const { Cell::new(None) };
}

/// Turns the few-rows CUDA kernel on or off for this thread's later forwards
/// (default: off, unless `MTP_ROWS_KERNEL=1`).
pub fn set_rows_kernel(on: bool) {
    crate::switch::set(&ENABLED, on);
}

/// Whether the kernel may be used on this thread.
pub(crate) fn enabled() -> bool {
    crate::switch::get(&ENABLED, "MTP_ROWS_KERNEL", false)
}

/// Whether `rows` rows of width `k` in `dtype` go to the kernel on this backend.
pub(crate) fn applies(rows: i32, k: i32, dtype: Dtype) -> bool {
    (2..=MAX_ROWS).contains(&rows)
        && k % 8 == 0
        && dtype == Dtype::Bfloat16
        && crate::models::sdpa::on_cuda()
        && enabled()
}

/// `x @ w.T` for bf16 `x: [M, K]` (`2 ≤ M ≤ 8`) and a row-contiguous bf16
/// `w: [N, K]`.
pub(crate) fn matmul_t(x: &Array, w: &Array) -> Result<Array> {
    let (m, n) = (x.dim(0), w.dim(0));
    let launch = CudaLaunch {
        outputs: &[(&[m, n], x.dtype())],
        grid: [n * 32, 1, 1],
        block: [256, 1, 1],
        templates: &[("ROWS", m)],
    };
    Ok(KERNEL.apply(&[x, w], &launch)?.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without CUDA the kernel is never chosen, and calling it
    /// is an error (MLX's CPU build has no CUDA backend), not an abort.
    #[test]
    fn cpu_never_takes_the_kernel() {
        assert!(!applies(4, 1024, Dtype::Bfloat16));
        let x = mlx_tensor::ops::zeros(&[2, 16], Dtype::Bfloat16).unwrap();
        let w = mlx_tensor::ops::zeros(&[32, 16], Dtype::Bfloat16).unwrap();
        assert!(matmul_t(&x, &w).and_then(|y| Ok(y.eval()?)).is_err());
    }
}
