//! Causal attention of a few query rows on CUDA in bf16 as two kernels: each
//! block attends one KV head's query rows over one chunk of 32 keys (one key
//! per lane, the chunk's softmax in f32), then one thread per output element
//! combines the chunks.
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
//!
//! History: the first partial kernel (session 9) gave each lane features,
//! not keys, so every key cost the warp a five-step shuffle reduction and two
//! exponentials in one dependent chain: a 5-row 8B layer's attention took
//! 26 µs of device time against 7 for MLX's one-row kernel (session 15's
//! trace).

use mlx_tensor::fast::{CudaKernel, CudaLaunch};
use mlx_tensor::{Array, Dtype};

use crate::error::Result;

/// The most query rows the kernels take (verify rows and MTP flushes are far
/// fewer; prefill chunks stay on the other paths).
pub(crate) const MAX_ROWS: i32 = 16;
/// Keys per block, one per lane (the partial kernel relies on it): the chunk
/// count grows with the key length, so a long cache spreads over the GPU's
/// multiprocessors; a chunk's keys and values, with each warp's query and
/// probabilities, fit in static shared memory (41.5 KiB at the widest head,
/// 256).
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
/// first staged in shared memory by the whole block (many loads in flight),
/// the keys' rows padded by one 32-bit word so that lane `j` reading key `j`
/// hits its own bank. Warp `w` then takes query rows `r = w, w + WARPS, ..`
/// of the `G·L` rows of that head (`q: [1, Hq, L, D]`, head `h·G + r / L`,
/// row `r % L`, which sees keys up to `S - L + r % L`), one key per lane:
/// lane `j` computes the whole score of key `j`, the warp takes the chunk's
/// max and sum of exponentials in one reduction each, and lane `t` then sums
/// the values of features `t + 32e` weighted by the probabilities (read back
/// from shared memory). Writes the unnormalised sum `part[c, hq, l, :]` and
/// `stats[c, hq, l] = (max, sum of exp)`; a chunk the row cannot see gives
/// `(-inf, 0)` and zeros. NVRTC has no standard library: only CUDA's
/// intrinsics.
const PARTIAL_SOURCE: &str = r#"
  constexpr int D = 32 * FPL;
  constexpr int KP = D + 2;
  __shared__ __nv_bfloat16 ks[CHUNK * KP];
  __shared__ __nv_bfloat16 vs[CHUNK * D];
  __shared__ float qs[MAXW][D];
  __shared__ float ps[MAXW][CHUNK];
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
    ks[jj * KP + dd] = kh[jj * k_strides[2] + dd * k_strides[3]];
    vs[t] = vh[jj * v_strides[2] + dd * v_strides[3]];
  }
  __syncthreads();
  const float scale = __int_as_float(SCALE_BITS);
  const float neg_inf = -__int_as_float(0x7f800000);
  float* qw = qs[warp];
  float* pw = ps[warp];
  const __nv_bfloat16* kr = ks + lane * KP;
  for (int r = warp; r < G * L; r += nwarps) {
    const int gi = r / L;
    const int l = r - gi * L;
    const int hq = h * G + gi;
    const __nv_bfloat16* qr = q + hq * q_strides[1] + l * q_strides[2];
    #pragma unroll
    for (int e = 0; e < FPL; ++e) qw[lane + 32 * e] = __bfloat162float(qr[(lane + 32 * e) * q_strides[3]]) * scale;
    __syncwarp();
    const int seen = S - L + l + 1 - j0;
    const int end = (n < seen) ? n : seen;
    float s = neg_inf;
    if (lane < end) {
      float a0 = 0.0f;
      float a1 = 0.0f;
      #pragma unroll 8
      for (int d = 0; d < D; d += 2) {
        a0 += qw[d] * __bfloat162float(kr[d]);
        a1 += qw[d + 1] * __bfloat162float(kr[d + 1]);
      }
      s = a0 + a1;
    }
    float m = s;
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, off));
    const float p = (lane < end) ? expf(s - m) : 0.0f;
    float den = p;
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) den += __shfl_xor_sync(0xffffffff, den, off);
    pw[lane] = p;
    __syncwarp();
    float acc[FPL];
    #pragma unroll
    for (int e = 0; e < FPL; ++e) acc[e] = 0.0f;
    for (int jj = 0; jj < end; ++jj) {
      const float pj = pw[jj];
      #pragma unroll
      for (int e = 0; e < FPL; ++e) acc[e] += pj * __bfloat162float(vs[jj * D + lane + 32 * e]);
    }
    const size_t row = ((size_t)c * Hq + hq) * L + l;
    #pragma unroll
    for (int e = 0; e < FPL; ++e) part[row * D + lane + 32 * e] = acc[e];
    if (lane == 0) {
      stats[row * 2] = m;
      stats[row * 2 + 1] = den;
    }
    // The next row overwrites this warp's query and probabilities.
    __syncwarp();
  }
"#;

/// The first partial kernel (session 9), kept for this session's A/B only
/// (`MTP_SHORT_SDPA_V1=1`): one key at a time per warp, lane `t` holding
/// features `t + 32e`, so every key costs a five-step shuffle reduction and
/// two exponentials on the warp's one dependent chain.
const PARTIAL_V1: CudaKernel<'static> = CudaKernel {
    name: "mtp_sdpa_rows_part_v1",
    source: PARTIAL_V1_SOURCE,
    inputs: &["q", "k", "v"],
    outputs: &["part", "stats"],
    row_contiguous: false,
};

const PARTIAL_V1_SOURCE: &str = r#"
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

thread_local! {
    /// `MTP_SHORT_SDPA_V1=1` runs the first partial kernel (measurement only).
    static V1: crate::switch::Flag = const { std::cell::Cell::new(None) };
}

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
    // The kernels read keys and values at q's width, 32 features a lane:
    // other widths would read past them or skip features (a caller that did
    // not ask `applies`, a bug).
    assert!(
        k.dim(3) == d && v.dim(3) == d && v.dim(2) == s && d % 32 == 0 && (32..=256).contains(&d),
        "short attention takes one head width, a multiple of 32 up to 256; got q {:?}, k {:?}, v {:?}",
        q.shape(),
        k.shape(),
        v.shape()
    );
    let chunks = (s + CHUNK - 1) / CHUNK;
    let warps = WARPS.min(hq / hkv * l);
    let templates = [
        ("FPL", d / 32),
        ("CHUNK", CHUNK),
        ("SCALE_BITS", scale.to_bits() as i32),
        ("MAXW", WARPS),
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
    let kernel = if crate::switch::get(&V1, "MTP_SHORT_SDPA_V1", false) {
        &PARTIAL_V1
    } else {
        &PARTIAL
    };
    let parts = kernel.apply(&[q, k, v], &partial)?;
    let total = l * hq * d;
    // Written `[1, L, Hq, D]` in memory, declared `[1, L, Hq·D]`: what the
    // output projection takes, without a reshape node.
    let combine = CudaLaunch {
        outputs: &[(&[1, l, hq * d], Dtype::Bfloat16)],
        grid: [total, 1, 1],
        block: [256, 1, 1],
        templates: &[],
    };
    Ok(COMBINE.apply(&[&parts[0], &parts[1]], &combine)?.remove(0))
}

/// The kernels against f32 attention (`sdpa::explicit`) on random bf16
/// inputs laid out as a forward hands them over (queries transposed from
/// `[1, L, H, D]`, keys and values the live part of a longer cache buffer),
/// over grouped and ungrouped heads, head widths 32 to 256 and one to 32 key
/// chunks. Returns the worst `max |kernel − f32| ÷ max |f32|`, or `None`
/// where the kernels do not run (no CUDA).
pub(crate) fn self_check() -> Result<Option<f32>> {
    use mlx_tensor::random;
    if !crate::models::sdpa::on_cuda() {
        return Ok(None);
    }
    let cases = [
        (8, 8, 2, 5, 64),
        (64, 16, 5, 1000, 64),
        (32, 16, 7, 300, 128),
        (16, 2, 3, 129, 256),
        (4, 1, 16, 40, 32),
        (12, 4, 4, 33, 96),
    ];
    let mut worst = 0.0f32;
    for (i, &(hq, hkv, l, s, d)) in cases.iter().enumerate() {
        let rnd = |shape: &[i32], j: u64| -> Result<Array> {
            let key = random::key(100 + 10 * i as u64 + j)?;
            Ok(random::normal(shape, Dtype::Bfloat16, &key)?)
        };
        let q = rnd(&[1, l, hq, d], 0)?.transpose(&[0, 2, 1, 3])?;
        let cap = (s + 255) / 256 * 256 + 256;
        let live = |a: Array| a.slice(&[0, 0, 0, 0], &[1, hkv, s, d], &[1, 1, 1, 1]);
        let k = live(rnd(&[1, hkv, cap, d], 1)?)?;
        let v = live(rnd(&[1, hkv, cap, d], 2)?)?;
        let scale = 1.0 / (d as f32).sqrt();
        let f32s = |a: &Array| a.as_type(Dtype::Float32);
        let want = crate::models::sdpa::explicit(&f32s(&q)?, &f32s(&k)?, &f32s(&v)?, scale)?
            .transpose(&[0, 2, 1, 3])?
            .reshape(&[1, l, hq * d])?;
        let got = attend(&q, &k, &v, scale)?;
        if got.shape()[..] != [1, l, hq * d] {
            return Ok(Some(f32::INFINITY));
        }
        worst = worst.max(super::kernel_check::rel_err(&got, &want)?);
    }
    Ok(Some(worst))
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
