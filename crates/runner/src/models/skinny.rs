//! `x @ W.T` for a few rows of `x` on CUDA, reading each weight byte once
//! for all rows, on the tensor cores: on by default on CUDA (compute
//! capability 8.0 or later: bf16 `mma.sync`) for 2–8 rows
//! (verify rows, MTP flushes) over weights of at most
//! [`DEFAULT_MAX_MIB`] MiB; MLX's matmul takes the rest.
//!
//! Why it exists: MLX 0.32's CUDA matmul has its own GEMV kernel for one row
//! and sends two or more rows to cuBLASLt. cuBLASLt costs the host about
//! 20 µs a call (MLX makes its descriptors and asks for a heuristic on every
//! call; a custom kernel costs a few µs), and a verify has four products a
//! layer: at the 8B shape on an H200 the host's encoding of a synced 5-row
//! verify took 5.2–5.7 ms with cuBLASLt against 2.7 with this kernel for
//! every product (docs/gpu.md, session 16).
//!
//! Why the cap: the unembedding (151,936 × 4,096 at the 8B shape, one
//! product a verify, so its host cost does not count) reads no faster
//! through the kernel than through cuBLAS (H100, 5 rows: 445 µs with
//! cuBLAS, 431 / 486 µs with load schemes 0 / 3); every decoder layer's
//! product, up to the 8B shape's 192 MiB gate/up weight, reads faster
//! through it (scheme 3 against cuBLAS, µs: q/k/v 22.6 / 36.9, o 20.6 /
//! 34.8, gate/up 71.1 / 76.8, down 40.2 / 48.5; `scale-bench --rows-time`,
//! docs/gpu.md session 23), and costs the host a few µs where cuBLASLt
//! costs ~20. Up to session 22 the cap was 64 MiB, from whole synced
//! verifies on an H200 that read slower with the kernel for every product
//! (9.8 ms with cuBLASLt, 10.2 with the kernel, a kernel without the load
//! schemes); the products themselves were first timed in session 23.
//! `MTP_ROWS_KERNEL=0` turns it off, `MTP_ROWS_KERNEL_MAX_MIB=N|all` moves
//! the cap, `MTP_ROWS_VARIANT=0..7` picks the load scheme (see [`SOURCE`];
//! default [`DEFAULT_VARIANT`]), `MTP_ROWS_KERNEL_ONE=1` gives it one-row
//! products too (measured below MLX's GEMV: off).
//!
//! How: a warp computes 16 output features for all rows (up to 8) with
//! `mma.sync.m16n8k16` (bf16 in, f32 accumulate): the 16 weight rows are the
//! MMA's A operand, the input rows its B operand (rows past `ROWS` are
//! zeros). The sum over `k` does not care in which order the 16 `k` slots of
//! one MMA are filled, so each lane loads 8 consecutive weights (16 bytes)
//! of its two weight rows and 8 of its input row and feeds them to two MMAs
//! (slots {2t, 2t+1, 2t+8, 2t+9} ← k = 8t..8t+3 and 8t+4..8t+7): every load
//! is a full 16-byte vector and a warp's load covers 64 contiguous bytes of
//! each of its 16 weight rows. The `WARPS` warps of a block split `K`
//! (interleaved 32-wide chunks, four chunks' twelve 16-byte loads in flight
//! per lane) and add their partial sums in shared memory.
//!
//! History: on an H200 (cf88cf0, 8B shape) it is within bf16 rounding of
//! cuBLAS (relative 4.6e-3 at most) and reads some multi-row shapes faster
//! (4096×4096 at 2 rows: 1.67 against 1.12 TB/s), but its one row reads
//! below MLX's GEMV: a warp's load spans 16 weight rows (the MMA's A layout)
//! where a GEMV streams one. The first kernel here (one warp per output
//! feature, f32 FMAs, each lane re-reading every input row from L1 per
//! weight vector) lost to cuBLAS from three rows on.

use std::cell::Cell;

use mlx_tensor::fast::{CudaKernel, CudaLaunch};
use mlx_tensor::{Array, Dtype};

use crate::error::Result;

/// The most rows the kernel takes (the MMA's eight B columns).
pub(crate) const MAX_ROWS: i32 = 8;

/// The largest weight, in MiB, the kernel takes unless
/// `MTP_ROWS_KERNEL_MAX_MIB` says otherwise (see the module's doc).
pub const DEFAULT_MAX_MIB: u64 = 256;

/// Output features per block (the MMA's sixteen A rows).
const FEATURES: i32 = 16;

/// Input features per chunk (two MMAs of 16).
const CHUNK: i32 = 32;

const KERNEL: CudaKernel<'static> = CudaKernel {
    name: "mtp_rows_mma_t",
    source: SOURCE,
    inputs: &["x", "w"],
    outputs: &["y"],
    row_contiguous: true,
};

/// `y[m, n] = Σ_k x[m, k] · w[n, k]` for `ROWS` rows; `x`, `w` bf16,
/// `K % 32 == 0`, `N % 16 == 0`; one block of `WARPS` warps per 16 features.
/// Lane (g, t) = (lane / 4, lane % 4) holds weight rows n0 + g and
/// n0 + g + 8 and input row g; its accumulators are y[2t, n0 + g],
/// y[2t + 1, n0 + g], y[2t, n0 + g + 8], y[2t + 1, n0 + g + 8].
const SOURCE: &str = r#"
  const int K = w_shape[1];
  const int N = w_shape[0];
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int n0 = blockIdx.x * 16;
  const int chunks = K >> 5;
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
  const bool live = g < ROWS;
  // VARIANT bit 0: weight loads ask L2 for 256 bytes and skip L1; bit 1:
  // each warp takes one contiguous span of chunks (not every WARPS-th);
  // bit 2: eight chunks' loads in flight per lane (not four).
  const bool hint = (VARIANT & 1) != 0;
  const bool span = (VARIANT & 2) != 0;
  constexpr int U = (VARIANT & 4) ? 8 : 4;
  const int per = (chunks + WARPS - 1) / WARPS;
  const int step = span ? 1 : WARPS;
  const int begin = span ? warp * per : warp;
  const int end = span ? min(chunks, begin + per) : chunks;
  const uint4* w_lo = reinterpret_cast<const uint4*>(w + (size_t)(n0 + g) * K + t * 8);
  const uint4* w_hi = reinterpret_cast<const uint4*>(w + (size_t)(n0 + g + 8) * K + t * 8);
  const uint4* xr = reinterpret_cast<const uint4*>(x + (size_t)(live ? g : 0) * K + t * 8);
  auto ldw = [hint](const uint4* p) -> uint4 {
    if (hint) {
      uint4 r;
      asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                   : "l"(p));
      return r;
    }
    return __ldg(p);
  };
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  auto mma = [&c](unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  };
  // One 32-wide chunk: two MMAs over the lane's 8 weights of each row.
  auto feed = [&](const uint4& a, const uint4& b, uint4 v) {
    if (!live) v = zero;
    mma(a.x, b.x, a.y, b.y, v.x, v.y);
    mma(a.z, b.z, a.w, b.w, v.z, v.w);
  };
  int j = begin;
  for (; j + (U - 1) * step < end; j += U * step) {
    // U chunks' loads issued before any MMA waits on them.
    uint4 a[U], b[U], v[U];
    #pragma unroll
    for (int u = 0; u < U; ++u) {
      a[u] = ldw(w_lo + (size_t)(j + u * step) * 4);
      b[u] = ldw(w_hi + (size_t)(j + u * step) * 4);
      v[u] = __ldg(xr + (size_t)(j + u * step) * 4);
    }
    #pragma unroll
    for (int u = 0; u < U; ++u) feed(a[u], b[u], v[u]);
  }
  for (; j < end; j += step) {
    feed(ldw(w_lo + (size_t)j * 4), ldw(w_hi + (size_t)j * 4), __ldg(xr + (size_t)j * 4));
  }
  __shared__ float part[WARPS][4][32];
  #pragma unroll
  for (int i = 0; i < 4; ++i) part[warp][i][lane] = c[i];
  __syncthreads();
  if (threadIdx.x < 128) {
    const int i = threadIdx.x >> 5;
    const int l = threadIdx.x & 31;
    float s = 0.0f;
    #pragma unroll
    for (int q = 0; q < WARPS; ++q) s += part[q][i][l];
    const int m = 2 * (l & 3) + (i & 1);
    const int n = n0 + (l >> 2) + ((i >> 1) << 3);
    if (m < ROWS) y[(size_t)m * N + n] = __float2bfloat16(s);
  }
"#;

thread_local! {
    /// `MTP_ROWS_KERNEL=0` turns the kernel off for 2–8 rows.
    static ENABLED: crate::switch::Flag = const { Cell::new(None) };
    /// `MTP_ROWS_KERNEL_ONE=1` also gives it one-row products (the plain
    /// step's GEMVs), for measurement against MLX's own GEMV.
    static ONE_ROW: crate::switch::Flag = const { Cell::new(None) };
    /// The largest weight (bytes) the kernel takes: `Some(None)` is no cap.
    static MAX_BYTES: Cell<Option<Option<u64>>> = const { Cell::new(None) };
    /// `MTP_ROWS_RESHAPE=1` gives the kernel a forward's input reshaped to
    /// `[M, K]` and reshapes its output back (the graph before
    /// [`matmul_t`] took any leading axes), for measurement.
    static RESHAPE: crate::switch::Flag = const { Cell::new(None) };
    /// The kernel's load scheme (`MTP_ROWS_VARIANT`, 0–7; see [`SOURCE`]).
    static VARIANT: Cell<Option<i32>> = const { Cell::new(None) };
}

/// The load scheme on this thread: `MTP_ROWS_VARIANT` (0–7), default
/// [`DEFAULT_VARIANT`].
fn variant() -> i32 {
    crate::switch::get_parsed(
        &VARIANT,
        "MTP_ROWS_VARIANT",
        |raw| match raw.map(str::trim) {
            None => Some(DEFAULT_VARIANT),
            Some(s) => s.parse::<i32>().ok().filter(|v| (0..8).contains(v)),
        },
        DEFAULT_VARIANT,
        "a load scheme from 0 to 7",
    )
}

/// The load scheme the kernel runs unless `MTP_ROWS_VARIANT` says
/// otherwise: 3 (the L2 hint and a contiguous span per warp), the fastest
/// over the 8B shape's layer products at 2 and 5 rows on an H100
/// (306.6 µs for the four against 330.9 with scheme 0 and 398.7 with MLX's
/// matmul; docs/gpu.md session 23).
pub(crate) const DEFAULT_VARIANT: i32 = 3;

/// Caps, on this thread, the weights the few-rows kernel takes at `mib`
/// MiB (`None`: no cap), over `MTP_ROWS_KERNEL_MAX_MIB` (default
/// [`DEFAULT_MAX_MIB`]). A product over a small weight is bound by the
/// host's cost of encoding it (cuBLASLt's descriptors and heuristic, about
/// 20 µs a call on an H200 against a few for a custom kernel), a product
/// over a large one by the device's read of the weight, where cuBLAS reads
/// faster than this kernel.
pub fn set_rows_kernel_max_mib(mib: Option<u64>) {
    MAX_BYTES.with(|c| c.set(Some(mib.map(|m| m << 20))));
}

/// The cap in bytes on this thread: what [`set_rows_kernel_max_mib`]
/// stored, else `MTP_ROWS_KERNEL_MAX_MIB` (a whole number of MiB, or `all`;
/// anything else keeps the default, with a warning).
fn max_bytes() -> Option<u64> {
    crate::switch::get_parsed(
        &MAX_BYTES,
        "MTP_ROWS_KERNEL_MAX_MIB",
        parse_max_mib,
        Some(DEFAULT_MAX_MIB << 20),
        "a whole number of MiB or `all`",
    )
}

/// The cap from its variable: unset is the default, `all` no cap, a whole
/// number of MiB that many bytes; `None` for anything else (the caller
/// warns).
fn parse_max_mib(raw: Option<&str>) -> Option<Option<u64>> {
    match raw.map(str::trim) {
        None => Some(Some(DEFAULT_MAX_MIB << 20)),
        Some("all") => Some(None),
        Some(s) => s.parse::<u64>().ok().map(|m| Some(m << 20)),
    }
}

/// Turns the few-rows CUDA kernel on or off for this thread's later forwards
/// of 2–8 rows (default: on, unless `MTP_ROWS_KERNEL=0`).
pub fn set_rows_kernel(on: bool) {
    crate::switch::set(&ENABLED, on);
}

/// Lets the few-rows kernel take one-row products too on this thread
/// (default: off, unless `MTP_ROWS_KERNEL_ONE=1`).
pub fn set_rows_kernel_one_row(on: bool) {
    crate::switch::set(&ONE_ROW, on);
}

/// Whether `rows` rows may go to the kernel on this thread.
fn enabled(rows: i32) -> bool {
    match rows {
        1 => crate::switch::get(&ONE_ROW, "MTP_ROWS_KERNEL_ONE", false),
        2..=MAX_ROWS => crate::switch::get(&ENABLED, "MTP_ROWS_KERNEL", true),
        _ => false,
    }
}

/// Whether `rows` rows of `x: [rows, k]` times a weight of `n` output
/// features, in `dtype`, go to the kernel on this backend.
pub(crate) fn applies(rows: i32, n: i32, k: i32, dtype: Dtype) -> bool {
    fits(rows, n, k, dtype)
        && crate::models::sdpa::on_cuda_sm80()
        && enabled(rows)
        && under_cap(n, k, max_bytes())
}

/// Whether an `[n, k]` bf16 weight is within the cap (`None`: no cap).
fn under_cap(n: i32, k: i32, cap: Option<u64>) -> bool {
    cap.is_none_or(|cap| n as u64 * k as u64 * 2 <= cap)
}

/// The shapes and dtype the kernel computes (see [`SOURCE`]).
fn fits(rows: i32, n: i32, k: i32, dtype: Dtype) -> bool {
    (1..=MAX_ROWS).contains(&rows)
        && n > 0
        && n % FEATURES == 0
        && k > 0
        && k % CHUNK == 0
        && dtype == Dtype::Bfloat16
}

/// Warps per block: eight (a finer split of `K`) when there are too few
/// blocks to keep every SM's loads in flight, four otherwise.
fn warps(n: i32) -> i32 {
    if n / FEATURES < 1024 { 8 } else { 4 }
}

/// `x @ w.T` for bf16 `x: [..., K]` of `M` rows in all (`1 ≤ M ≤ 8`) and a
/// row-contiguous bf16 `w: [N, K]` of a shape [`applies`] accepts; the
/// result is `[..., N]`. The kernel reads `x` as `M` contiguous rows
/// whatever its leading axes, so a forward's `[1, L, K]` goes in as it is:
/// no reshape nodes around the product (two a product, 224 of a 1.7b
/// verify's 961 graph nodes, each one more for the host to build and MLX
/// to encode).
pub(crate) fn matmul_t(x: &Array, w: &Array) -> Result<Array> {
    if x.ndim() > 2 && crate::switch::get(&RESHAPE, "MTP_ROWS_RESHAPE", false) {
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("rank > 2") = w.dim(0);
        let rows = (x.size() / x.dim(-1).max(1) as usize) as i32;
        let y = matmul_t_variant(&x.reshape(&[rows, x.dim(-1)])?, w, variant())?;
        return Ok(y.reshape(&shape)?);
    }
    matmul_t_variant(x, w, variant())
}

/// The few-rows product (`matmul_t`) with the kernel's load scheme
/// `variant` (0–7, see the kernel source `SOURCE`), for measurement.
pub fn matmul_t_variant(x: &Array, w: &Array, variant: i32) -> Result<Array> {
    let n = w.dim(0);
    let mut shape = x.shape().to_vec();
    let k = shape.pop().unwrap_or(0);
    shape.push(n);
    let m = if k > 0 {
        (x.size() / k as usize) as i32
    } else {
        0
    };
    let warps = warps(n);
    let launch = CudaLaunch {
        outputs: &[(&shape, x.dtype())],
        grid: [n / FEATURES * 32 * warps, 1, 1],
        block: [32 * warps, 1, 1],
        templates: &[("ROWS", m), ("WARPS", warps), ("VARIANT", variant & 7)],
    };
    Ok(KERNEL.apply(&[x, w], &launch)?.remove(0))
}

/// The kernel against MLX's matmul on this device, in bf16: random inputs,
/// 1–8 rows, weights from one block (16 × 32) to decoder-sized (4096 ×
/// 1024, 1024 × 4096) and an odd block count (272 × 96). Returns the worst
/// `max |kernel − matmul| ÷ max |matmul|`, or `None` where the kernel does
/// not run (no CUDA, or a GPU before compute capability 8.0). Both
/// accumulate in f32, so they part by the order of the sums and one bf16
/// rounding of the output (~4e-3 measured).
pub(crate) fn self_check() -> Result<Option<f32>> {
    use mlx_tensor::random;
    if !crate::models::sdpa::on_cuda_sm80() {
        return Ok(None);
    }
    let rand = |shape: &[i32], seed: u64| -> Result<Array> {
        Ok(random::normal(shape, Dtype::Float32, &random::key(seed)?)?.as_type(Dtype::Bfloat16)?)
    };
    let mut worst = 0.0f32;
    for (n, k) in [(16, 32), (4096, 1024), (1024, 4096), (272, 96)] {
        let w = rand(&[n, k], 7 + n as u64 * 31 + k as u64)?;
        let wt = w.t()?;
        for rows in 1..=MAX_ROWS {
            let x = rand(&[rows, k], 100 + rows as u64)?;
            let want = x.matmul(&wt)?;
            let rel = super::kernel_check::rel_err(&matmul_t(&x, &w)?, &want)?;
            // A forward's `[1, L, K]` goes in as it is and comes out `[1, L, N]`.
            let y3 = matmul_t(&x.reshape(&[1, rows, k])?, &w)?;
            let rel3 = if y3.shape()[..] == [1, rows, n] {
                super::kernel_check::rel_err(&y3.reshape(&[rows, n])?, &want)?
            } else {
                f32::INFINITY
            };
            worst = worst.max(rel).max(rel3);
        }
    }
    Ok(Some(worst))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without CUDA the kernel is never chosen, and calling it
    /// is an error (MLX's CPU build has no CUDA backend), not an abort.
    #[test]
    fn cpu_never_takes_the_kernel() {
        set_rows_kernel(true);
        set_rows_kernel_one_row(true);
        assert!(!applies(4, 4096, 1024, Dtype::Bfloat16));
        let x = mlx_tensor::ops::zeros(&[2, 32], Dtype::Bfloat16).unwrap();
        let w = mlx_tensor::ops::zeros(&[32, 32], Dtype::Bfloat16).unwrap();
        assert!(matmul_t(&x, &w).and_then(|y| Ok(y.eval()?)).is_err());
    }

    /// The shapes the kernel's indexing assumes, and no others.
    #[test]
    fn only_whole_blocks_of_bf16_rows_fit() {
        assert!(fits(1, 16, 32, Dtype::Bfloat16));
        assert!(fits(8, 151_936, 4096, Dtype::Bfloat16));
        assert!(!fits(9, 4096, 4096, Dtype::Bfloat16));
        assert!(!fits(0, 4096, 4096, Dtype::Bfloat16));
        assert!(!fits(4, 4104, 4096, Dtype::Bfloat16));
        assert!(!fits(4, 4096, 4112, Dtype::Bfloat16));
        assert!(!fits(4, 4096, 4096, Dtype::Float32));
        assert!(!fits(4, 4096, 4096, Dtype::Float16));
    }

    /// The weight-size cap: its variable in MiB, and the bytes it admits.
    #[test]
    fn the_cap_admits_weights_up_to_its_size() {
        assert_eq!(parse_max_mib(None), Some(Some(DEFAULT_MAX_MIB << 20)));
        assert_eq!(parse_max_mib(Some("all")), Some(None));
        assert_eq!(parse_max_mib(Some("64")), Some(Some(64 << 20)));
        assert_eq!(parse_max_mib(Some(" 0 ")), Some(Some(0)));
        assert_eq!(parse_max_mib(Some("big")), None);
        assert_eq!(parse_max_mib(Some("-1")), None);
        assert!(under_cap(151_936, 4096, None));
        // 8192 × 4096 bf16 is exactly 64 MiB.
        assert!(under_cap(8192, 4096, Some(64 << 20)));
        assert!(!under_cap(8208, 4096, Some(64 << 20)));
        assert!(!under_cap(16, 32, Some(0)));
        // The default takes the 8B shape's gate/up weight (192 MiB), not a
        // 151,936-row unembedding even at hidden 2,048.
        let default = Some(DEFAULT_MAX_MIB << 20);
        assert!(under_cap(24_576, 4096, default));
        assert!(!under_cap(151_936, 2048, default));
    }
}
