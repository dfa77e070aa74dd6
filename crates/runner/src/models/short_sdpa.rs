//! Causal attention of a few query rows on CUDA in bf16 as two kernels: each
//! block attends one KV head's query rows over one chunk of keys (an online
//! softmax in f32), then one thread per output element combines the chunks.
//!
//! Why: on CUDA a verify (`k + 1` rows) and an MTP flush cannot use MLX's
//! fused attention in bf16 (cuDNN builds a graph per key length, see
//! `sdpa.rs`), and the explicit form costs about twelve graph nodes per layer
//! (scale, grouped reshapes and their copies, two matmuls, the bias, the
//! softmax, the output transpose and its copy). A decode round on CUDA is
//! bound by the host dispatching those nodes (about 5 µs each at the 8B shape
//! on an H200), so this path takes three: the two kernels and a free reshape.
//! The kernels read `q`, `k`, `v` through their strides, so the cache's live
//! view is attended in place, and write the output already in `[1, L, Hq, D]`.

use mlx_tensor::fast::{CudaKernel, CudaLaunch};
use mlx_tensor::{Array, Dtype};

use crate::error::Result;

/// The most query rows the kernels take (verify rows and MTP flushes are far
/// fewer; prefill chunks stay on the other paths).
pub(crate) const MAX_ROWS: i32 = 16;
/// Keys per block: the chunk count grows with the key length, so a long
/// cache spreads over the GPU's multiprocessors; a chunk's keys and values
/// fit in static shared memory (32 KiB at the widest head, 256).
const CHUNK: i32 = 32;
/// Warps per block (each takes every `WARPS`-th query row of its KV head).
const WARPS: i32 = 8;

const PARTIAL: CudaKernel<'static> = CudaKernel {
    name: "mtp_sdpa_rows_part",
    source: PARTIAL_SOURCE,
    inputs: &["q", "k", "v"],
    outputs: &["part", "stats"],
    row_contiguous: false,
};

/// Block `(c, h)`: KV head `h`, keys `c·CHUNK ..` of `k, v: [1, Hkv, S, D]`,
/// first staged in shared memory by the whole block (many loads in flight,
/// instead of one key's latency per step of every warp); warp `w` then takes
/// query rows `r = w, w + WARPS, ..` of the `G·L` rows of that head (`q: [1,
/// Hq, L, D]`, head `h·G + r / L`, row `r % L`, which sees keys up to
/// `S - L + r % L`). Lane `t` holds features `t + 32e`. Writes the unnormalised sum
/// `part[c, hq, l, :]` and `stats[c, hq, l] = (max, sum of exp)`; a chunk the
/// row cannot see gives `(-inf, 0)` and zeros. NVRTC has no standard
/// library: only CUDA's intrinsics.
const PARTIAL_SOURCE: &str = r#"
  constexpr int D = 32 * FPL;
  __shared__ __nv_bfloat16 ks[CHUNK * D];
  __shared__ __nv_bfloat16 vs[CHUNK * D];
  const int h = blockIdx.y;
  const int c = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int nwarps = blockDim.x >> 5;
  const int Hq = q_shape[1];
  const int L = q_shape[2];
  const int Hkv = k_shape[1];
  const int S = k_shape[2];
  const int G = Hq / Hkv;
  const int j0 = c * CHUNK;
  const int n = (j0 + CHUNK < S) ? CHUNK : S - j0;
  const __nv_bfloat16* kh = k + h * k_strides[1] + j0 * k_strides[2];
  const __nv_bfloat16* vh = v + h * v_strides[1] + j0 * v_strides[2];
  for (int t = threadIdx.x; t < n * D; t += blockDim.x) {
    const int jj = t / D;
    const int dd = t - jj * D;
    ks[t] = kh[jj * k_strides[2] + dd * k_strides[3]];
    vs[t] = vh[jj * v_strides[2] + dd * v_strides[3]];
  }
  __syncthreads();
  const float scale = __int_as_float(SCALE_BITS);
  const float neg_inf = -__int_as_float(0x7f800000);
  for (int r = warp; r < G * L; r += nwarps) {
    const int gi = r / L;
    const int l = r - gi * L;
    const int hq = h * G + gi;
    const __nv_bfloat16* qr = q + hq * q_strides[1] + l * q_strides[2];
    float qv[FPL];
    float acc[FPL];
    #pragma unroll
    for (int e = 0; e < FPL; ++e) {
      qv[e] = __bfloat162float(qr[(lane + 32 * e) * q_strides[3]]) * scale;
      acc[e] = 0.0f;
    }
    const int seen = S - L + l + 1 - j0;
    const int end = (n < seen) ? n : seen;
    float m = neg_inf;
    float den = 0.0f;
    for (int jj = 0; jj < end; ++jj) {
      float s = 0.0f;
      #pragma unroll
      for (int e = 0; e < FPL; ++e) s += qv[e] * __bfloat162float(ks[jj * D + lane + 32 * e]);
      #pragma unroll
      for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffff, s, off);
      const float mn = fmaxf(m, s);
      const float corr = expf(m - mn);
      const float p = expf(s - mn);
      den = den * corr + p;
      #pragma unroll
      for (int e = 0; e < FPL; ++e) acc[e] = acc[e] * corr + p * __bfloat162float(vs[jj * D + lane + 32 * e]);
      m = mn;
    }
    const size_t row = ((size_t)c * Hq + hq) * L + l;
    #pragma unroll
    for (int e = 0; e < FPL; ++e) part[row * D + lane + 32 * e] = acc[e];
    if (lane == 0) {
      stats[row * 2] = m;
      stats[row * 2 + 1] = den;
    }
  }
"#;

const COMBINE: CudaKernel<'static> = CudaKernel {
    name: "mtp_sdpa_rows_combine",
    source: COMBINE_SOURCE,
    inputs: &["part", "stats"],
    outputs: &["y"],
    row_contiguous: true,
};

/// `y[0, l, hq, d] = Σ_c e^(m_c - M) part[c, hq, l, d] / Σ_c e^(m_c - M) s_c`,
/// one thread per output element (chunk 0 holds key 0, which every row
/// sees, so `M` is finite).
const COMBINE_SOURCE: &str = r#"
  const int C = part_shape[0];
  const int Hq = part_shape[1];
  const int L = part_shape[2];
  const int D = part_shape[3];
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)L * Hq * D) return;
  const int d = (int)(i % D);
  const int hq = (int)((i / D) % Hq);
  const int l = (int)(i / ((size_t)D * Hq));
  float top = -__int_as_float(0x7f800000);
  for (int c = 0; c < C; ++c) top = fmaxf(top, stats[(((size_t)c * Hq + hq) * L + l) * 2]);
  float num = 0.0f;
  float den = 0.0f;
  for (int c = 0; c < C; ++c) {
    const size_t row = ((size_t)c * Hq + hq) * L + l;
    const float w = expf(stats[row * 2] - top);
    num += w * part[row * D + d];
    den += w * stats[row * 2 + 1];
  }
  y[i] = __float2bfloat16(num / den);
"#;

/// Whether `rows` query rows of `heads` heads over `kv_heads` KV heads of
/// width `head_dim` in `dtype` go to these kernels on this backend.
pub(crate) fn applies(rows: i32, heads: i32, kv_heads: i32, head_dim: i32, dtype: Dtype) -> bool {
    (2..=MAX_ROWS).contains(&rows)
        && dtype == Dtype::Bfloat16
        && head_dim % 32 == 0
        && (32..=256).contains(&head_dim)
        && kv_heads > 0
        && heads % kv_heads == 0
        && crate::models::sdpa::on_cuda()
}

/// `softmax(q kᵀ · scale + causal) v` for bf16 `q: [1, Hq, L, D]` over the
/// live keys and values `k, v: [1, Hkv, S, D]` (`S ≥ L`, the last `L` keys
/// are the queries' own; any strides), returned as `[1, L, Hq·D]`.
pub fn attend(q: &Array, k: &Array, v: &Array, scale: f32) -> Result<Array> {
    let (hq, l, d) = (q.dim(1), q.dim(2), q.dim(3));
    let (hkv, s) = (k.dim(1), k.dim(2));
    let chunks = (s + CHUNK - 1) / CHUNK;
    let warps = WARPS.min(hq / hkv * l);
    let templates = [
        ("FPL", d / 32),
        ("CHUNK", CHUNK),
        ("SCALE_BITS", scale.to_bits() as i32),
    ];
    let partial = CudaLaunch {
        outputs: &[
            (&[chunks, hq, l, d], Dtype::Float32),
            (&[chunks, hq, l, 2], Dtype::Float32),
        ],
        grid: [32 * warps * chunks, hkv, 1],
        block: [32 * warps, 1, 1],
        templates: &templates,
    };
    let parts = PARTIAL.apply(&[q, k, v], &partial)?;
    let total = l * hq * d;
    let combine = CudaLaunch {
        outputs: &[(&[1, l, hq, d], Dtype::Bfloat16)],
        grid: [total, 1, 1],
        block: [256, 1, 1],
        templates: &[],
    };
    let y = COMBINE.apply(&[&parts[0], &parts[1]], &combine)?.remove(0);
    Ok(y.reshape(&[1, l, hq * d])?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Off CUDA the kernels are never chosen, and calling them is an error
    /// (MLX's CPU build has no CUDA backend), not an abort.
    #[test]
    fn cpu_never_takes_the_kernels() {
        assert!(!applies(4, 8, 2, 64, Dtype::Bfloat16));
        let q = mlx_tensor::ops::zeros(&[1, 8, 4, 64], Dtype::Bfloat16).unwrap();
        let k = mlx_tensor::ops::zeros(&[1, 2, 9, 64], Dtype::Bfloat16).unwrap();
        assert!(
            attend(&q, &k, &k, 0.125)
                .and_then(|y| Ok(y.eval()?))
                .is_err()
        );
    }
}
