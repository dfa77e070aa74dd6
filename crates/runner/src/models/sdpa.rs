//! Which attention kernel a layer uses for a given query length, dtype and
//! backend, and the explicit (matmul + softmax) form MLX's fused kernel is
//! replaced by where the fused kernel is slow.
//!
//! Why: on CUDA, MLX 0.32's fused attention sends more than one query row in
//! bf16/f16 to cuDNN, which builds a new graph for every new key length
//! (~50 ms each, measured on an H200, `../shared/reference/mlx-cuda.md`). A
//! speculative verify (`k + 1` rows, one round longer each time), the MTP
//! head's multi-row flushes and every prefill chunk of a new length paid it.
//! One query row goes to MLX's own vector kernel at any key length, and Metal
//! has a vector kernel for short queries, so the fused op stays there.

use std::cell::{Cell, RefCell};

use mlx_tensor::{Array, Dtype, fast, ops};

use crate::error::Result;
use crate::models::short_sdpa;

/// How attention over more than one query row is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionPath {
    /// The best measured path for the backend: fused except for multi-row
    /// bf16/f16 attention on CUDA, which runs [`AttentionPath::Short`] where
    /// its kernels apply and [`AttentionPath::Explicit`] elsewhere.
    #[default]
    Auto,
    /// Always MLX's fused `scaled_dot_product_attention`.
    Fused,
    /// Always the explicit form for more than one query row.
    Explicit,
    /// Our two CUDA kernels for a few bf16 query rows (`short_sdpa.rs`),
    /// the explicit form where they do not apply.
    Short,
    /// The fused kernel over the whole preallocated cache buffer with a mask,
    /// so the key length only changes when the buffer grows (256 slots).
    /// Kept for measurement; see docs/bench.
    Padded,
    /// Our CPU kernel for any number of query rows (`ops::attention_rows_cpu`) on
    /// the CPU, MLX's fused attention elsewhere. What `auto` picks on the CPU.
    CpuRows,
}

impl AttentionPath {
    /// Parses `auto`, `fused`, `explicit`, `short`, `padded`, `cpu-rows`.
    pub fn parse(s: &str) -> Option<AttentionPath> {
        Some(match s {
            "auto" => AttentionPath::Auto,
            "fused" => AttentionPath::Fused,
            "explicit" => AttentionPath::Explicit,
            "short" => AttentionPath::Short,
            "padded" => AttentionPath::Padded,
            "cpu-rows" => AttentionPath::CpuRows,
            _ => return None,
        })
    }
}

/// Queries, live keys, keys and dtype of a causal bias.
type BiasShape = (i32, i32, i32, Dtype);

thread_local! {
    /// This thread's choice (MLX work runs on one thread; tests set their own).
    static PATH: Cell<Option<AttentionPath>> = const { Cell::new(None) };
    /// The causal mask of the last explicit attention: every layer of one
    /// forward shares its query and key lengths, so they share one node.
    static MASK: RefCell<Option<(BiasShape, Array)>> = const { RefCell::new(None) };
    static BUCKETS: crate::switch::Flag = const { Cell::new(None) };
}

/// Turns shape buckets on or off for this thread's later forwards (default:
/// on CUDA only, unless `MTP_SHAPE_BUCKETS=0`; `MTP_SHAPE_BUCKETS=1` forces
/// them elsewhere, for tests).
///
/// Why: on CUDA the first call of every new matmul shape costs milliseconds
/// (~4 ms per row count, up to 20 ms for an attention score matmul, measured
/// on an H200, docs/gpu.md session 13), so every prompt of a new length paid
/// ~80 ms of first calls before its first token. With buckets a prefill
/// chunk is padded to a power-of-two row count (the padding rewound after
/// the forward, see `Target::prefill_chunk`) and explicit attention pads its
/// keys to a power of two (masked), so the shapes repeat across lengths.
pub fn set_shape_buckets(on: bool) {
    crate::switch::set(&BUCKETS, on);
}

/// Whether this thread pads multi-row shapes to buckets (see [`set_shape_buckets`]).
pub fn shape_buckets() -> bool {
    crate::switch::get(&BUCKETS, "MTP_SHAPE_BUCKETS", on_cuda())
}

/// Whether a forward over `caches` may run over a bucketed row count:
/// shape buckets are on and every cache rewinds by offset, so the padding's
/// positions are dropped by moving the offset back (a prefill chunk, an MTP
/// flush).
pub(crate) fn pads_over(caches: &[Box<dyn kvcache::Cache>]) -> bool {
    shape_buckets() && caches.iter().all(|c| c.rewinds_by_offset())
}

/// Chunks of at most this many rows keep their length: the verify and
/// draft-flush row counts, each built once by the warm-up (`generate/warm.rs`).
pub(crate) const UNBUCKETED_ROWS: usize = 8;

/// The longest MTP flush padded to a bucket: the default prefill chunk
/// (`session::PREFILL_CHUNK`, held equal by a const assertion there); longer flushes keep
/// their length.
pub(crate) const FLUSH_BUCKET_CAP: usize = 2048;

/// The row count a prefill chunk of `rows` rows is padded to under buckets:
/// above [`UNBUCKETED_ROWS`], the next power of two or, from 384 on, three
/// quarters of one (16, 32, ..., 256, 384, 512, 768, 1024, 1536, 2048, ...),
/// at most `cap` (the chunk size) and never fewer than `rows`. The
/// half-octave steps keep the padding of a long chunk under a third of it
/// (on an H200 a 600-token prompt at the 8B shape took 49 ms padded to 1,024
/// rows against 36 ms unpadded, docs/gpu.md).
pub(crate) fn row_bucket(rows: usize, cap: usize) -> usize {
    if rows <= UNBUCKETED_ROWS {
        return rows;
    }
    let p = rows.next_power_of_two();
    let bucket = if p >= 512 && rows <= p / 4 * 3 {
        p / 4 * 3
    } else {
        p
    };
    bucket.min(cap).max(rows)
}

/// The key count explicit attention pads `keys` to under buckets: the next
/// power of two, at least 256.
pub(crate) fn key_bucket(keys: usize) -> usize {
    keys.next_power_of_two().max(256)
}

/// Sets the attention path for this thread's later forwards. The default is
/// `MTP_ATTENTION` from the environment (`auto`, `fused`, `explicit`,
/// `short`, `padded`), else [`AttentionPath::Auto`].
pub fn set_attention_path(path: AttentionPath) {
    PATH.with(|p| p.set(Some(path)));
}

/// This thread's attention path (see [`set_attention_path`]).
pub fn attention_path() -> AttentionPath {
    PATH.with(|p| match p.get() {
        Some(path) => path,
        None => {
            let path = std::env::var("MTP_ATTENTION")
                .ok()
                .and_then(|s| {
                    let path = AttentionPath::parse(&s);
                    if path.is_none() {
                        tracing::warn!(
                            value = %s,
                            "MTP_ATTENTION is not one of auto, fused, explicit, short, padded, \
                             cpu-rows: using auto"
                        );
                    }
                    path
                })
                .unwrap_or_default();
            p.set(Some(path));
            path
        }
    })
}

/// Scores `[heads, L, S]` in f32 above which the explicit form is not worth
/// its memory and the fused kernel is used even on CUDA (a long prefill chunk
/// over a long prefix; one graph build there is small against the chunk).
const EXPLICIT_SCORE_BYTES: usize = 512 << 20;

/// What `attend` does for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    Fused,
    Explicit,
    Short,
    Padded,
    CpuRows,
}

/// The query shape one attention call sees: rows, heads, KV heads, head
/// width, and the key length after the cache update.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) rows: i32,
    pub(crate) keys: i32,
    pub(crate) heads: i32,
    pub(crate) kv_heads: i32,
    pub(crate) head_dim: i32,
}

/// The kernel for one attention call of shape `s` in `dtype`.
pub(crate) fn choose(s: Shape, dtype: Dtype) -> Kernel {
    let path = attention_path();
    if matches!(path, AttentionPath::Auto | AttentionPath::CpuRows) && cpu_rows_applies(s) {
        return Kernel::CpuRows;
    }
    if s.rows <= 1 {
        return Kernel::Fused;
    }
    let short = || short_sdpa::applies(s.rows, s.heads, s.kv_heads, s.head_dim, dtype);
    match path {
        AttentionPath::Fused | AttentionPath::CpuRows => Kernel::Fused,
        AttentionPath::Explicit => Kernel::Explicit,
        AttentionPath::Short if short() => Kernel::Short,
        AttentionPath::Short => Kernel::Explicit,
        AttentionPath::Padded => Kernel::Padded,
        AttentionPath::Auto => {
            let half = matches!(dtype, Dtype::Bfloat16 | Dtype::Float16);
            let keys = if shape_buckets() {
                key_bucket(s.keys as usize)
            } else {
                s.keys as usize
            };
            let bytes = 4 * s.heads as usize * s.rows as usize * keys;
            if short() {
                Kernel::Short
            } else if half && on_cuda() && bytes <= EXPLICIT_SCORE_BYTES {
                Kernel::Explicit
            } else {
                Kernel::Fused
            }
        }
    }
}

/// Whether our CPU attention takes shape `s`: new work runs on the CPU, and
/// the head width is within `ops::attention_rows_cpu`'s limit.
///
/// Why: MLX's CPU backend runs its fused attention as separate ops (BLAS
/// GEMMs that copy and pack the cache's key slice every call, a scalar
/// exponential per score); on tiny-mtp a decode step at 640 keys cost
/// 2.2 ms more than at 2 keys. One row goes to our kernel too, so a verify
/// row's attention equals the one-row step's bit for bit. Prefill chunks go
/// to it as well: MLX builds a chunk's whole `rows × keys` score matrix and
/// exponentiates it a score at a time (the 24l shape's 1,208-token prompt
/// took 22.6 s to its first token through MLX, 9.6 s through ours).
fn cpu_rows_applies(s: Shape) -> bool {
    mlx_tensor::default_device() == mlx_tensor::Device::Cpu
        && s.rows >= 1
        && (1..=ops::ATTENTION_ROWS_MAX_DIM).contains(&s.head_dim)
        && s.kv_heads > 0
        && s.heads % s.kv_heads == 0
}

/// True when new work runs on MLX's CUDA backend and the GPU has bf16
/// tensor-core MMA (compute capability 8.0 or later: Ampere on), which the
/// few-rows kernel (`models/skinny.rs`) needs. MLX's CUDA wheels also run
/// on 7.5 (Turing), where that kernel would not compile.
pub(crate) fn on_cuda_sm80() -> bool {
    static CAPABILITY: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    on_cuda()
        && CAPABILITY
            .get_or_init(|| mlx_tensor::gpu_compute_capability().ok().flatten())
            .is_some_and(|c| c >= 80)
}

/// True when new work runs on MLX's CUDA backend (a GPU that is not Metal).
pub(crate) fn on_cuda() -> bool {
    // Whether the loaded library has a GPU does not change; the default device can.
    static GPU: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    !cfg!(target_os = "macos")
        && mlx_tensor::default_device() == mlx_tensor::Device::Gpu
        && *GPU.get_or_init(mlx_tensor::gpu_available)
}

/// `softmax(q kᵀ · scale + causal) v` for `q: [1, Hq, L, D]` over `k, v:
/// [1, Hkv, S, D]` (`S ≥ L`, the last `L` keys are the queries' own), grouped
/// by reshaping instead of repeating the keys. The softmax runs in f32.
/// Under [`shape_buckets`] the keys are padded with zeros to
/// the key bucket (`key_bucket`) and the padding masked out.
pub fn explicit(q: &Array, k: &Array, v: &Array, scale: f32) -> Result<Array> {
    let (hq, l, d) = (q.dim(1), q.dim(2), q.dim(3));
    let (hkv, live) = (k.dim(1), k.dim(2));
    let g = hq / hkv;
    let padded = if shape_buckets() {
        key_bucket(live as usize) as i32
    } else {
        live
    };
    let (k, v) = if padded > live {
        let pad = |a: &Array| -> Result<Array> {
            let zeros = ops::zeros(&[1, hkv, padded - live, d], a.dtype())?;
            Ok(ops::concatenate(&[a.clone(), zeros], 2)?)
        };
        (pad(k)?, pad(v)?)
    } else {
        (k.clone(), v.clone())
    };
    let s = padded;
    let q = q
        .multiply(&Array::scalar(scale, q.dtype())?)?
        .reshape(&[1, hkv, g * l, d])?;
    let scores = q
        .matmul(&k.swapaxes(-1, -2)?)?
        .reshape(&[1, hkv, g, l, s])?;
    let scores = scores.add(&causal_bias(l, live, s, scores.dtype())?)?;
    let p = scores.softmax(&[-1], true)?.reshape(&[1, hkv, g * l, s])?;
    Ok(p.matmul(&v)?.reshape(&[1, hq, l, d])?)
}

/// The fused kernel over the cache's whole buffers `k, v: [1, Hkv, C, D]` whose
/// first `live` slots are valid: query `i` of `L` sees keys `0..=live-L+i`.
pub(crate) fn padded(q: &Array, k: &Array, v: &Array, live: i32, scale: f32) -> Result<Array> {
    let (l, c) = (q.dim(2), k.dim(2));
    let cols = ops::arange(0.0, c as f64, 1.0, Dtype::Int32)?.reshape(&[1, c])?;
    let last = ops::arange((live - l) as f64, live as f64, 1.0, Dtype::Int32)?.reshape(&[l, 1])?;
    let mask = cols.less_equal(&last)?;
    Ok(fast::scaled_dot_product_attention(
        q,
        k,
        v,
        scale,
        fast::Mask::Array(&mask),
    )?)
}

/// Additive causal bias `[L, S]` over `live ≤ S` real keys (0 where query
/// `i` sees key `j ≤ live-L+i`, −∞ elsewhere, the padding keys `j ≥ live`
/// included), shared by every layer of a forward.
pub(crate) fn causal_bias(l: i32, live: i32, s: i32, dtype: Dtype) -> Result<Array> {
    MASK.with(|m| {
        if let Some((shape, a)) = m.borrow().as_ref()
            && *shape == (l, live, s, dtype)
        {
            return Ok(a.clone());
        }
        // The bias is exact in any float dtype (0 or −∞), so it is made in the scores' dtype.
        let bias = ops::tri(l, s, live - l, Dtype::Float32)?;
        let zero = Array::scalar(0.0, dtype)?;
        let neg = Array::scalar(f32::NEG_INFINITY, dtype)?;
        let bias = ops::r#where(&bias.as_type(Dtype::Bool)?, &zero, &neg)?;
        *m.borrow_mut() = Some(((l, live, s, dtype), bias.clone()));
        Ok(bias)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::test_arrays::{max_diff, rand};

    /// The explicit and padded forms equal MLX's fused causal attention
    /// (within 1e-5, f32) for query lengths 2..=7, key lengths from L up,
    /// with and without grouped heads.
    #[test]
    fn explicit_and_padded_match_fused() {
        for (hq, hkv) in [(4, 4), (8, 2), (6, 1)] {
            for l in 2..=7 {
                for s in [l, l + 1, l + 37, 300] {
                    let seed = (hq * 1000 + l * 10 + s) as u64;
                    let q = rand(&[1, hq, l, 16], seed);
                    let k = rand(&[1, hkv, s, 16], seed + 1);
                    let v = rand(&[1, hkv, s, 16], seed + 2);
                    let want =
                        fast::scaled_dot_product_attention(&q, &k, &v, 0.25, fast::Mask::Causal)
                            .unwrap();
                    let got = explicit(&q, &k, &v, 0.25).unwrap();
                    let d = max_diff(&want, &got);
                    assert!(d < 1e-5, "explicit hq={hq} hkv={hkv} L={l} S={s}: {d}");
                    // A buffer with 256-slot capacity whose tail holds garbage.
                    let cap = (s + 255) / 256 * 256;
                    let pad = |a: &Array, seed| {
                        let tail = rand(&[1, hkv, cap - s, 16], seed);
                        ops::concatenate(&[a.clone(), tail], 2).unwrap()
                    };
                    let (kp, vp) = if cap > s {
                        (pad(&k, seed + 3), pad(&v, seed + 4))
                    } else {
                        (k.clone(), v.clone())
                    };
                    let got = padded(&q, &kp, &vp, s, 0.25).unwrap();
                    let d = max_diff(&want, &got);
                    assert!(d < 1e-5, "padded hq={hq} hkv={hkv} L={l} S={s}: {d}");
                }
            }
        }
    }

    /// With buckets on, explicit attention pads its keys to a power of two
    /// and still equals the fused kernel (f32, within 1e-5): the padding is
    /// masked out, for short and prefill-sized query blocks.
    #[test]
    fn bucketed_keys_change_nothing() {
        set_shape_buckets(true);
        for (l, s) in [(2, 2), (5, 300), (20, 20), (33, 257), (64, 1000)] {
            let seed = (l * 7 + s) as u64;
            let q = rand(&[1, 8, l, 16], seed);
            let k = rand(&[1, 2, s, 16], seed + 1);
            let v = rand(&[1, 2, s, 16], seed + 2);
            let want =
                fast::scaled_dot_product_attention(&q, &k, &v, 0.25, fast::Mask::Causal).unwrap();
            let got = explicit(&q, &k, &v, 0.25).unwrap();
            let d = max_diff(&want, &got);
            assert!(d < 1e-5, "bucketed L={l} S={s}: {d}");
        }
        set_shape_buckets(false);
        let b = causal_bias(2, 3, 4, Dtype::Float32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        // Query 0 of 2 over 3 live keys of 4 sees keys 0..=1, query 1 keys 0..=2.
        let ninf = f32::NEG_INFINITY;
        assert_eq!(b, vec![0.0, 0.0, ninf, ninf, 0.0, 0.0, 0.0, ninf]);
    }

    #[test]
    fn buckets_are_half_octaves_within_the_chunk() {
        assert_eq!(row_bucket(1, 2048), 1);
        assert_eq!(row_bucket(UNBUCKETED_ROWS, 2048), UNBUCKETED_ROWS);
        assert_eq!(row_bucket(9, 2048), 16);
        assert_eq!(row_bucket(256, 2048), 256);
        assert_eq!(row_bucket(257, 2048), 384);
        assert_eq!(row_bucket(385, 2048), 512);
        assert_eq!(row_bucket(600, 2048), 768);
        assert_eq!(row_bucket(769, 2048), 1024);
        assert_eq!(row_bucket(1100, 2048), 1536);
        assert_eq!(row_bucket(1000, 1000), 1000);
        assert_eq!(row_bucket(600, 700), 700);
        assert_eq!(key_bucket(1), 256);
        assert_eq!(key_bucket(257), 512);
        assert_eq!(key_bucket(1024), 1024);
    }

    /// The shared bias is rebuilt when the shape changes (a stale one would
    /// have the wrong width or hide the wrong keys).
    #[test]
    fn causal_bias_follows_the_shape() {
        let a = causal_bias(3, 5, 5, Dtype::Float32).unwrap();
        assert_eq!(a.shape().as_slice(), &[3, 5]);
        let b = causal_bias(2, 6, 6, Dtype::Float32).unwrap();
        assert_eq!(b.shape().as_slice(), &[2, 6]);
        let v = b.to_vec::<f32>().unwrap();
        // Query 0 of 2 over 6 keys sees keys 0..=4; query 1 sees all 6.
        assert!(v[..5].iter().all(|&x| x == 0.0) && v[5] == f32::NEG_INFINITY);
        assert!(v[6..].iter().all(|&x| x == 0.0));
    }

    #[test]
    fn auto_takes_the_cpu_kernel_on_the_cpu_and_keeps_one_gpu_row_fused() {
        let shape = |rows, head_dim| Shape {
            rows,
            keys: 1000,
            heads: 32,
            kv_heads: 8,
            head_dim,
        };
        let on_cpu = mlx_tensor::default_device() == mlx_tensor::Device::Cpu;
        for rows in [1, 5, 16] {
            let want = if on_cpu {
                Kernel::CpuRows
            } else if rows == 1 {
                Kernel::Fused
            } else {
                choose(shape(rows, 128), Dtype::Bfloat16)
            };
            assert_eq!(
                choose(shape(rows, 128), Dtype::Bfloat16),
                want,
                "{rows} rows"
            );
        }
        // Any row count (a prefill chunk) is ours on the CPU; past the head
        // width limit, MLX's fused attention.
        if on_cpu {
            assert_eq!(choose(shape(17, 128), Dtype::Float32), Kernel::CpuRows);
            assert_eq!(choose(shape(512, 128), Dtype::Float32), Kernel::CpuRows);
            assert_eq!(choose(shape(4, 512), Dtype::Float32), Kernel::Fused);
            set_attention_path(AttentionPath::Fused);
            assert_eq!(choose(shape(4, 128), Dtype::Float32), Kernel::Fused);
            set_attention_path(AttentionPath::Auto);
        }
    }
}
