//! One CUDA kernel that turns an attention layer's q, k, v projections into
//! the heads attention and the KV cache take: the per-head q/k RMSNorm, RoPE
//! at the cache's offset and the move to heads-first `[1, H, L, D]`, for
//! every query row at once.
//!
//! Why: a decode step on CUDA is bound by the host encoding MLX's graph
//! nodes (about 3–6 µs each at the 8B shape on an H200; a plain step's 1,053
//! nodes took 5.3 ms to dispatch in a traced process against ~5 ms of device
//! work), and between them the ops path spends seven nodes per layer here: two
//! norms, three transposes, two RoPEs; this kernel is one. For two or
//! more rows it also costs device time: the norms cannot read a slice of the
//! fused q/k/v product in place, so MLX copies q and k first. A kernel trace
//! of an 8B verify of 5 rows (`docs/gpu.md`, session 15) put those norms,
//! copies and RoPEs at 32 of a layer's 172 µs, against 18 of 130 µs for a
//! one-row step. The kernel reads q, k, v through their strides.
//!
//! Numerics follow MLX's kernels: the norm's `x · rsqrt(mean(x²) + eps)` is
//! rounded to the dtype, multiplied by the weight in the dtype, then rotated
//! in f32 with MLX's angle (`scale · position · base^(−2i/d)`, or `1 /
//! period` with a frequency table) and rounded once more. Only the order of
//! the sum of squares differs from MLX's norm. Every row is computed by the
//! same code whatever the row count, so a verify row equals the plain step's
//! bit for bit, which greedy parity needs.
//!
//! Taken on CUDA for 2–16 rows of bf16, f16 and f32 heads of width 32 or a
//! multiple of 64 up to 256 (a lane then holds both features of each RoPE
//! pair, or at 32 its partner lane does) with RoPE over the whole head and no
//! YaRN attention scale;
//! anything else takes the ops path. `MTP_FUSED_HEADS=0` turns it off.
//!
//! Why not one row or a prefill chunk: measured on an H200 in bf16 with the
//! kernel for every row count (alternating processes, `docs/gpu.md` session
//! 15), one-row steps got slower (plain 8b 152 / 181 against 179 / 186
//! tokens/s, 1.7b 231 / 225 against 238 / 236: a custom kernel costs MLX more
//! host time to encode than the seven cheap nodes it replaces, and a single
//! row needs no copies), and the first prefill of a new length got dearer (a
//! 600-token prompt after a 1,000-token one: 136–584 against 70 ms at 8b,
//! 140 against 63–66 at 1.7b; not explained). Verify rounds gained: depth 4
//! at 8b 284 / 283 against 248 / 266, at 1.7b 348 / 367 against 343 / 324,
//! tiny 989 against 833 tokens/s.

use std::cell::Cell;

use mlx_tensor::fast::{CudaKernel, CudaLaunch};
use mlx_tensor::{Array, Dtype};

use crate::error::Result;
use crate::models::layers::RmsNorm;
use crate::models::rope::Rope;

const KERNEL: CudaKernel<'static> = CudaKernel {
    name: "mtp_heads",
    source: SOURCE,
    inputs: &["q", "k", "v", "qw", "kw", "off", "fr"],
    outputs: &["qo", "ko", "vo"],
    row_contiguous: false,
};

/// Warp `(head, l)` of the `Hq + 2·Hkv` heads (q's, then k's, then v's) of
/// row `l`; lane `t` holds features `t + 32e`. `q, k, v: [1, L, H, D]`
/// through their strides, `HQ` and `HKV` heads from head `0`, `KOFF` and
/// `VOFF` of their arrays (one fused projection viewed as `[1, L, HQ + 2·HKV,
/// D]` can be all three); `qw`, `kw` the norm weights (`QN`, `KN` say whether
/// they are used), `off` the cache offset, `fr` the per-pair periods when
/// `FREQS`. Floats arrive as their bits (`*_BITS`): templates are integers.
/// `TB` names the dtype: 1 bf16, 2 f16, 0 f32. NVRTC has no standard library.
const SOURCE: &str = r#"
  constexpr int EPL = D / 32;
  const int lane = threadIdx.x & 31;
  const int head = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 5);
  const int l = blockIdx.y;
  const int L = q_shape[1];
  const int Hq = HQ;
  const int Hkv = HKV;
  if (head >= Hq + 2 * Hkv) return;
  auto get = [](const auto* p, long long i) -> float {
    if constexpr (TB == 1) return __bfloat162float(p[i]);
    else if constexpr (TB == 2) return __half2float(p[i]);
    else return p[i];
  };
  auto put = [](auto* p, long long i, float f) {
    if constexpr (TB == 1) p[i] = __float2bfloat16(f);
    else if constexpr (TB == 2) p[i] = __float2half(f);
    else p[i] = f;
  };
  auto rnd = [](float f) -> float {
    if constexpr (TB == 1) return __bfloat162float(__float2bfloat16(f));
    else if constexpr (TB == 2) return __half2float(__float2half(f));
    else return f;
  };
  float x[EPL];
  if (head >= Hq + Hkv) {
    const int h = head - Hq - Hkv;
    const long long base = (long long)l * v_strides[1] + (long long)(h + VOFF) * v_strides[2];
    #pragma unroll
    for (int e = 0; e < EPL; ++e) {
      put(vo, ((long long)h * L + l) * D + lane + 32 * e, get(v, base + (long long)(lane + 32 * e) * v_strides[3]));
    }
    return;
  }
  const bool isq = head < Hq;
  const int h = isq ? head : head - Hq;
  if (isq) {
    const long long base = (long long)l * q_strides[1] + (long long)h * q_strides[2];
    #pragma unroll
    for (int e = 0; e < EPL; ++e) x[e] = get(q, base + (long long)(lane + 32 * e) * q_strides[3]);
  } else {
    const long long base = (long long)l * k_strides[1] + (long long)(h + KOFF) * k_strides[2];
    #pragma unroll
    for (int e = 0; e < EPL; ++e) x[e] = get(k, base + (long long)(lane + 32 * e) * k_strides[3]);
  }
  if (isq ? QN : KN) {
    float ss = 0.0f;
    #pragma unroll
    for (int e = 0; e < EPL; ++e) ss += x[e] * x[e];
    #pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss / (float)D + __int_as_float(EPS_BITS));
    #pragma unroll
    for (int e = 0; e < EPL; ++e) {
      const float w = isq ? get(qw, lane + 32 * e) : get(kw, lane + 32 * e);
      x[e] = rnd(w * rnd(x[e] * inv));
    }
  }
  // RoPE, half-split: feature i < D/2 pairs with i + D/2.
  float pr[EPL];
  if constexpr (EPL == 1) {
    pr[0] = __shfl_xor_sync(0xffffffffu, x[0], 16);
  } else {
    #pragma unroll
    for (int e = 0; e < EPL; ++e) pr[e] = x[(e + EPL / 2) % EPL];
  }
  const float pos = __int_as_float(SCALE_BITS) * (float)(off[0] + l);
  constexpr int HALF = D / 2;
  #pragma unroll
  for (int e = 0; e < EPL; ++e) {
    const int i = lane + 32 * e;
    const bool first = i < HALF;
    const int i1 = first ? i : i - HALF;
    float inv_freq;
    if constexpr (FREQS) {
      inv_freq = (float)(1.0 / (double)fr[i1]);
    } else {
      inv_freq = exp2f(-((float)i1 / (float)HALF) * __int_as_float(LOG2BASE_BITS));
    }
    const float theta = pos * inv_freq;
    const float c = cosf(theta);
    const float s = sinf(theta);
    x[e] = first ? x[e] * c - pr[e] * s : pr[e] * s + x[e] * c;
  }
  #pragma unroll
  for (int e = 0; e < EPL; ++e) {
    const long long o = ((long long)h * L + l) * D + lane + 32 * e;
    if (isq) put(qo, o, x[e]); else put(ko, o, x[e]);
  }
"#;

/// The row counts the kernel takes: a verify's `k + 1` rows and the MTP
/// head's flushes, as the short-query attention kernels (see the module's
/// measurements for why not one row or a prefill chunk).
const MAX_ROWS: i32 = crate::models::short_sdpa::MAX_ROWS;

thread_local! {
    /// `MTP_FUSED_HEADS=0` turns the kernel off (default on, on CUDA).
    static ENABLED: crate::switch::Flag = const { Cell::new(None) };
    /// `MTP_FUSED_QKV=0` gives the kernel the three parts of a fused q/k/v
    /// projection as sliced views (the path before [`heads_joint`]), for
    /// measurement.
    static JOINT: crate::switch::Flag = const { Cell::new(None) };
    /// `MTP_FUSED_HEADS_ONE=1` also gives the kernel one-row forwards (a
    /// plain step, a draft step), for measurement.
    static ONE_ROW: crate::switch::Flag = const { Cell::new(None) };
}

/// Turns the fused heads kernel on or off for this thread's later forwards
/// (default: on where it applies, unless `MTP_FUSED_HEADS=0`).
pub fn set_fused_heads(on: bool) {
    crate::switch::set(&ENABLED, on);
}

/// Whether the kernel computes `rows` rows of heads `d` wide: a lane holds
/// features `t + 32e`, so both features of every RoPE pair (`i`, `i + d/2`)
/// are in one lane when `d` is a multiple of 64, and in partner lanes `t`,
/// `t + 16` when `d` is 32; any other width would pair the wrong features.
/// One row only with `MTP_FUSED_HEADS_ONE=1` (see the module's doc for why
/// not by default).
fn takes(rows: i32, d: i32) -> bool {
    let rows_ok = (2..=MAX_ROWS).contains(&rows)
        || (rows == 1 && crate::switch::get(&ONE_ROW, "MTP_FUSED_HEADS_ONE", false));
    rows_ok && (d == 32 || (d % 64 == 0 && (64..=256).contains(&d)))
}

/// The template code of a dtype the kernel computes in.
fn dtype_code(d: Dtype) -> Option<i32> {
    match d {
        Dtype::Bfloat16 => Some(1),
        Dtype::Float16 => Some(2),
        Dtype::Float32 => Some(0),
        _ => None,
    }
}

/// The norm's weight when it can go to the kernel (`Some(None)`: no norm);
/// `None` when its weight's dtype is not the heads'.
fn norm_weight(n: Option<&RmsNorm>, dtype: Dtype) -> Option<Option<(&Array, f32)>> {
    match n {
        None => Some(None),
        Some(n) if n.weight().dtype() == dtype && n.weight().ndim() == 1 => {
            Some(Some((n.weight(), n.eps())))
        }
        Some(_) => None,
    }
}

/// The heads-first `(q, k, v)` `[1, H, L, D]` of `q` `[1, L, Hq, D]`, `k`, `v`
/// `[1, L, Hkv, D]` (any strides) after the q/k norms and RoPE at `offset`:
/// through the kernel where it takes them, else through MLX's ops.
pub(crate) fn heads(
    q: &Array,
    k: &Array,
    v: &Array,
    norms: (Option<&RmsNorm>, Option<&RmsNorm>),
    rope: &Rope,
    offset: usize,
) -> Result<(Array, Array, Array)> {
    if let Some(heads) = crate::models::cpu_fused::heads(q, k, v, norms, rope, offset)? {
        return Ok(heads);
    }
    match kernel(q, k, v, norms, rope, offset)? {
        Some(heads) => Ok(heads),
        None => by_ops(q, k, v, norms, rope, offset),
    }
}

/// [`heads`] through MLX's ops: each norm, the transpose, RoPE.
fn by_ops(
    q: &Array,
    k: &Array,
    v: &Array,
    norms: (Option<&RmsNorm>, Option<&RmsNorm>),
    rope: &Rope,
    offset: usize,
) -> Result<(Array, Array, Array)> {
    let first = |y: &Array, norm: Option<&RmsNorm>| -> Result<Array> {
        let y = match norm {
            Some(n) => n.forward(y)?,
            None => y.clone(),
        };
        Ok(y.transpose(&[0, 2, 1, 3])?)
    };
    Ok((
        rope.forward(&first(q, norms.0)?, offset)?,
        rope.forward(&first(k, norms.1)?, offset)?,
        first(v, None)?,
    ))
}

/// [`heads`] through the kernel when it takes them on this backend; `None`
/// for the ops path.
fn kernel(
    q: &Array,
    k: &Array,
    v: &Array,
    norms: (Option<&RmsNorm>, Option<&RmsNorm>),
    rope: &Rope,
    offset: usize,
) -> Result<Option<(Array, Array, Array)>> {
    let rank4 = |a: &Array| a.ndim() == 4 && a.dim(0) == 1;
    if !(rank4(q) && rank4(k) && rank4(v) && k.dim(2) == v.dim(2)) {
        return Ok(None);
    }
    let heads = Heads {
        q: q.dim(2),
        kv: k.dim(2),
        k_from: 0,
        v_from: 0,
    };
    launch([q, k, v], heads, norms, rope, offset)
}

/// [`heads`] of one fused q/k/v projection `y: [1, L, (hq + 2·hkv)·D]` (q's
/// heads, then k's, then v's) through the kernel, which reads all three from
/// it: none of the three slices and three reshapes the parts would cost
/// (five graph nodes a layer more for the host to build and MLX to encode;
/// 140 of a 1.7b verify's). `None` where the kernel does not take them: the
/// caller splits `y` and goes through [`heads`].
pub(crate) fn heads_joint(
    y: &Array,
    (hq, hkv, d): (i32, i32, i32),
    norms: (Option<&RmsNorm>, Option<&RmsNorm>),
    rope: &Rope,
    offset: usize,
) -> Result<Option<(Array, Array, Array)>> {
    if y.ndim() != 3 || y.dim(0) != 1 || y.dim(2) != (hq + 2 * hkv) * d || !takes(y.dim(1), d) {
        return Ok(None);
    }
    if !crate::models::sdpa::on_cuda()
        || !crate::switch::get(&ENABLED, "MTP_FUSED_HEADS", true)
        || !crate::switch::get(&JOINT, "MTP_FUSED_QKV", true)
    {
        return Ok(None);
    }
    let y = y.reshape(&[1, y.dim(1), hq + 2 * hkv, d])?;
    let heads = Heads {
        q: hq,
        kv: hkv,
        k_from: hq,
        v_from: hq + hkv,
    };
    launch([&y, &y, &y], heads, norms, rope, offset)
}

/// Which heads of the kernel's q, k and v inputs it takes: `q` of q's from
/// head 0, `kv` of k's from `k_from` and of v's from `v_from`.
#[derive(Debug, Clone, Copy)]
struct Heads {
    q: i32,
    kv: i32,
    k_from: i32,
    v_from: i32,
}

/// The kernel over q, k, v `[1, L, H, D]` (read through their strides) and
/// the heads `h` of them, or `None` where it does not take them.
fn launch(
    [q, k, v]: [&Array; 3],
    h: Heads,
    norms: (Option<&RmsNorm>, Option<&RmsNorm>),
    rope: &Rope,
    offset: usize,
) -> Result<Option<(Array, Array, Array)>> {
    let dtype = q.dtype();
    let Some(tb) = dtype_code(dtype) else {
        return Ok(None);
    };
    let d = q.dim(-1);
    let rank4 = |a: &Array| a.ndim() == 4 && a.dim(0) == 1 && a.dim(-1) == d && a.dtype() == dtype;
    let fits = takes(q.dim(1), d)
        && rank4(q)
        && rank4(k)
        && rank4(v)
        && k.dim(1) == q.dim(1)
        && v.dim(1) == q.dim(1)
        && h.q > 0
        && h.kv > 0
        && h.q <= q.dim(2)
        && h.k_from >= 0
        && h.v_from >= 0
        && h.k_from + h.kv <= k.dim(2)
        && h.v_from + h.kv <= v.dim(2)
        && rope.whole_head(d)
        && i32::try_from(offset + q.dim(1) as usize).is_ok();
    if !fits
        || !crate::models::sdpa::on_cuda()
        || !crate::switch::get(&ENABLED, "MTP_FUSED_HEADS", true)
    {
        return Ok(None);
    }
    let (Some(qn), Some(kn)) = (norm_weight(norms.0, dtype), norm_weight(norms.1, dtype)) else {
        return Ok(None);
    };
    let (l, hq, hkv) = (q.dim(1), h.q, h.kv);
    // An input the kernel does not read (its template says so) is given an
    // array of a type its unused code still compiles for: q, or the offset.
    let (qw, q_eps) = qn.unwrap_or((q, 0.0));
    let (kw, k_eps) = kn.unwrap_or((q, 0.0));
    // Both norms of a layer share one eps (the config's); take the one in use.
    let eps = if qn.is_some() { q_eps } else { k_eps };
    if qn.is_some() && kn.is_some() && q_eps != k_eps {
        return Ok(None);
    }
    let off = Array::from_slice(&[offset as i32], &[1])?;
    let (freqs, log2_base, scale) = rope.kernel_terms();
    let fr = freqs.unwrap_or(&off);
    let warps = hq + 2 * hkv;
    let templates = [
        ("D", d),
        ("TB", tb),
        ("QN", i32::from(qn.is_some())),
        ("KN", i32::from(kn.is_some())),
        ("FREQS", i32::from(freqs.is_some())),
        ("EPS_BITS", eps.to_bits() as i32),
        ("SCALE_BITS", scale.to_bits() as i32),
        ("LOG2BASE_BITS", log2_base.to_bits() as i32),
        ("HQ", hq),
        ("HKV", hkv),
        ("KOFF", h.k_from),
        ("VOFF", h.v_from),
    ];
    let launch = CudaLaunch {
        outputs: &[
            (&[1, hq, l, d], dtype),
            (&[1, hkv, l, d], dtype),
            (&[1, hkv, l, d], dtype),
        ],
        grid: [32 * warps, l, 1],
        block: [128, 1, 1],
        templates: &templates,
    };
    let mut out = KERNEL.apply(&[q, k, v, qw, kw, &off, fr], &launch)?;
    let vo = out.pop().expect("three outputs");
    let ko = out.pop().expect("three outputs");
    let qo = out.pop().expect("three outputs");
    Ok(Some((qo, ko, vo)))
}

/// The self-check's cases, `(head width, rows, scaled RoPE)`: every one a
/// shape the kernel takes (the first version also had one-row and 37-row
/// cases, which it refuses, so the whole check reported "did not run").
const SELF_CHECK_CASES: [(i32, i32, bool); 5] = [
    (64, 2, false),
    (64, 5, true),
    (128, 5, false),
    (32, 16, false),
    (128, 3, true),
];

/// The kernel against the ops path on this device: random q/k/v sliced from
/// one fused projection (so strided, as in a model), q/k norms with random
/// weights, RoPE at offset 1,000 plain and with a period table, over head
/// widths 32, 64, 128 and 2 to 16 rows, each given as the three parts and
/// as the fused projection itself ([`heads_joint`]). Returns the worst
/// `max |kernel − ops| ÷ max |ops|` per dtype (f32, then bf16), infinite
/// for a case the kernel refused; `None` where it does not run (no CUDA, or
/// `MTP_FUSED_HEADS=0`).
pub(crate) fn self_check() -> Result<Option<(f32, f32)>> {
    use mlx_tensor::random;
    let rand = |shape: &[i32], seed: u64| -> Result<Array> {
        Ok(random::normal(shape, Dtype::Float32, &random::key(seed)?)?)
    };
    if !crate::models::sdpa::on_cuda() || !crate::switch::get(&ENABLED, "MTP_FUSED_HEADS", true) {
        return Ok(None);
    }
    let mut worst = [0.0f32; 2];
    for (dtype, slot) in [(Dtype::Float32, 0), (Dtype::Bfloat16, 1)] {
        for (d, l, scaled) in SELF_CHECK_CASES {
            let (hq, hkv) = (8, 2);
            let fused =
                rand(&[1, l, (hq + 2 * hkv) * d], 11 + d as u64 + l as u64)?.as_type(dtype)?;
            let part = |lo: i32, n: i32| -> Result<Array> {
                Ok(fused
                    .slice_axis(2, lo * d, (lo + n) * d)?
                    .reshape(&[1, l, n, d])?)
            };
            let (q, k, v) = (part(0, hq)?, part(hq, hkv)?, part(hq + hkv, hkv)?);
            let norm = |seed: u64| -> Result<RmsNorm> {
                let w = rand(&[d], seed)?.as_type(dtype)?;
                Ok(RmsNorm::from_parts(w, 1e-6))
            };
            let (qn, kn) = (norm(3)?, norm(4)?);
            let scaling = if scaled {
                crate::config::RopeScaling::Llama3 {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 8192,
                }
            } else {
                crate::config::RopeScaling::None
            };
            let rope = Rope::new(d as usize, 1_000_000.0, &scaling)?;
            let offset = 1000;
            let norms = (Some(&qn), Some(&kn));
            let Some((qo, ko, vo)) = kernel(&q, &k, &v, norms, &rope, offset)? else {
                // Every case is one the kernel takes: a refusal is a failure,
                // never a check that silently did not run.
                worst[slot] = f32::INFINITY;
                continue;
            };
            let (wq, wk, wv) = by_ops(&q, &k, &v, norms, &rope, offset)?;
            let want = [wq, wk, wv];
            for (got, want) in [qo, ko, vo].iter().zip(&want) {
                worst[slot] = worst[slot].max(super::kernel_check::rel_err(got, want)?);
            }
            // The same heads read straight from the fused projection.
            let joint = if crate::switch::get(&JOINT, "MTP_FUSED_QKV", true) {
                heads_joint(&fused, (hq, hkv, d), norms, &rope, offset)?
            } else {
                Some(by_ops(&q, &k, &v, norms, &rope, offset)?)
            };
            let Some((jq, jk, jv)) = joint else {
                worst[slot] = f32::INFINITY;
                continue;
            };
            for (got, want) in [jq, jk, jv].iter().zip(&want) {
                worst[slot] = worst[slot].max(super::kernel_check::rel_err(got, want)?);
            }
        }
    }
    Ok(Some((worst[0], worst[1])))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RopeScaling;

    /// The self-check has only shapes the kernel takes, so a refusal there
    /// is a failure and never a check that did not run.
    #[test]
    fn the_self_check_only_has_cases_the_kernel_takes() {
        for (d, l, _) in SELF_CHECK_CASES {
            assert!(takes(l, d), "width {d}, {l} rows");
        }
    }

    /// The widths and row counts the kernel is given: 32 and multiples of 64
    /// up to 256 (96 or 160 would pair the wrong RoPE features), 2–16 rows.
    #[test]
    fn takes_only_the_widths_and_rows_it_computes() {
        for d in [32, 64, 128, 192, 256] {
            assert!(takes(5, d), "width {d}");
        }
        for d in [16, 48, 96, 160, 224, 320, 0] {
            assert!(!takes(5, d), "width {d}");
        }
        assert!(takes(2, 64) && takes(MAX_ROWS, 64));
        assert!(!takes(1, 64) && !takes(MAX_ROWS + 1, 64) && !takes(0, 64));
    }

    /// On a machine without CUDA this kernel is never taken, and with the
    /// fused CPU stages off [`heads`] gives the ops path's result:
    /// heads-first, normed and rotated (`models/cpu_fused.rs` tests the
    /// fused CPU stages against it).
    #[test]
    fn cpu_without_fused_stages_takes_the_ops_path() {
        use crate::models::test_arrays::{max_diff, rand};
        set_fused_heads(true);
        crate::models::cpu_fused::set_cpu_fused(false);
        let (q, kv) = (rand(&[1, 3, 4, 64], 1), rand(&[1, 3, 2, 64], 2));
        let rope = Rope::new(64, 10_000.0, &RopeScaling::None).unwrap();
        let norm = RmsNorm::from_parts(rand(&[64], 3), 1e-6);
        let norms = (Some(&norm), None);
        assert!(kernel(&q, &kv, &kv, norms, &rope, 5).unwrap().is_none());
        let (hq, hk, hv) = heads(&q, &kv, &kv, norms, &rope, 5).unwrap();
        assert_eq!(hq.shape().to_vec(), vec![1, 4, 3, 64]);
        assert_eq!(hk.shape().to_vec(), vec![1, 2, 3, 64]);
        let want_q = rope.forward(
            &norm.forward(&q).unwrap().transpose(&[0, 2, 1, 3]).unwrap(),
            5,
        );
        assert_eq!(max_diff(&hq, &want_q.unwrap()), 0.0);
        let want_k = rope
            .forward(&kv.transpose(&[0, 2, 1, 3]).unwrap(), 5)
            .unwrap();
        assert_eq!(max_diff(&hk, &want_k), 0.0);
        assert_eq!(max_diff(&hv, &kv.transpose(&[0, 2, 1, 3]).unwrap()), 0.0);
    }
}
