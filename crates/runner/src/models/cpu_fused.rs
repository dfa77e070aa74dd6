//! A decoder layer's small elementwise stages as one node each on the CPU:
//! RMSNorm, the attention heads' preparation (q/k norms, RoPE, the move to
//! heads-first) and SwiGLU, through `mlx_tensor::ops::{rms_norm_cpu,
//! heads_cpu, swiglu_cpu}` (our primitives in `cpp/fused_cpu.cc`).
//!
//! Why: MLX's CPU backend has no fused norm or RoPE (`fast::rms_norm` and
//! `fast::rope` run their decompositions there, the RoPE angles recomputed
//! every call), and each graph node costs the host about 5 µs
//! (`mlx-tensor/examples/dispatch-probe.rs`). A decode step of the 24-layer
//! benchmark shape was 3,306 nodes, of tiny-mtp 840: for tiny-mtp that
//! overhead was over half of a 7.6 ms step. `MTP_CPU_FUSED=0` turns these
//! off; `MTP_CPU_FUSED_HEADS=0` turns off the fused heads alone.

use std::cell::Cell;

use mlx_tensor::ops::{self, HeadsRope};
use mlx_tensor::{Array, Device, Dtype};

use crate::error::Result;
use crate::models::layers::RmsNorm;
use crate::models::rope::Rope;

thread_local! {
    /// `MTP_CPU_FUSED=0` turns the fused CPU stages off (default on).
    static ENABLED: crate::switch::Flag = const { Cell::new(None) };
    /// `MTP_CPU_FUSED_HEADS=0` turns the fused heads off (default on).
    static HEADS: crate::switch::Flag = const { Cell::new(None) };
}

/// Turns the fused CPU heads (q/k norms and RoPE as one node each) on or off
/// for this thread's later forwards (default on, unless `MTP_CPU_FUSED_HEADS=0`).
pub fn set_cpu_fused_heads(on: bool) {
    crate::switch::set(&HEADS, on);
}

/// Turns the fused CPU stages on or off for this thread's later forwards
/// (default: on, unless `MTP_CPU_FUSED=0`).
pub fn set_cpu_fused(on: bool) {
    crate::switch::set(&ENABLED, on);
}

/// Whether new work runs on the CPU with the fused stages on.
fn on() -> bool {
    mlx_tensor::default_device() == Device::Cpu
        && crate::switch::get(&ENABLED, "MTP_CPU_FUSED", true)
}

fn float(d: Dtype) -> bool {
    matches!(d, Dtype::Float32 | Dtype::Bfloat16 | Dtype::Float16)
}

/// `norm` over the last axis of `x` as one node, when it applies here.
pub(crate) fn rms_norm(norm: &RmsNorm, x: &Array) -> Result<Option<Array>> {
    let w = norm.weight();
    let fits = float(x.dtype())
        && w.dtype() == x.dtype()
        && w.ndim() == 1
        && x.ndim() >= 1
        && x.dim(-1) == w.dim(0);
    if !fits || !on() {
        return Ok(None);
    }
    Ok(Some(ops::rms_norm_cpu(x, w, norm.eps())?))
}

/// `silu(gu[..., :half]) · gu[..., half:]` as one node, when it applies here.
pub(crate) fn swiglu(gu: &Array, half: i32) -> Result<Option<Array>> {
    let fits = float(gu.dtype()) && gu.ndim() >= 1 && half > 0 && gu.dim(-1) == 2 * half;
    if !fits || !on() {
        return Ok(None);
    }
    Ok(Some(ops::swiglu_cpu(gu)?))
}

/// The heads-first `(q, k, v)` of `q` `[1, L, Hq, D]`, `k`, `v` `[1, L,
/// Hkv, D]` after the optional q/k norms and `rope` at `offset`: a node for
/// q, one for k, v a transposed view (as the ops path), when it applies here
/// (see `heads_kernel::heads` for the other paths) and is turned on.
///
/// With ~60 fewer nodes a layer, the host builds the MTP head's draft chain
/// (several lazy steps in one graph) ahead of the stream thread that runs
/// it, and MLX's own cache update then copied the head's whole KV buffer at
/// most steps: it writes in place only when nothing else holds the buffer,
/// and the CPU encoder holds an attention's inputs until that attention has
/// run (on tiny-mtp a long speculative run's peak rose 7 MiB over plain
/// decoding's, `tests/it/spec_memory.rs`). The cache writes on the CPU go
/// through `ops::kv_write_cpu` since, which tells those queued reads of the
/// rows below from other holders, and the attention reads the cache's
/// buffers in place (`ops::attention_rows_cpu_cached`), so the chain
/// updates the buffer in place again.
pub(crate) fn heads(
    q: &Array,
    k: &Array,
    v: &Array,
    norms: (Option<&RmsNorm>, Option<&RmsNorm>),
    rope: &Rope,
    offset: usize,
) -> Result<Option<(Array, Array, Array)>> {
    let dtype = q.dtype();
    let d = q.dim(-1);
    let rank4 = |a: &Array| a.ndim() == 4 && a.dim(0) == 1 && a.dim(-1) == d && a.dtype() == dtype;
    let weight = |n: Option<&RmsNorm>| match n {
        None => true,
        Some(n) => n.weight().dtype() == dtype && n.weight().ndim() == 1 && n.weight().dim(0) == d,
    };
    if rope.is_interleaved() {
        return Ok(None);
    }
    let terms = rope.cpu_terms();
    let Ok(offset) = i32::try_from(offset) else {
        return Ok(None);
    };
    let fits = float(dtype)
        && rank4(q)
        && rank4(k)
        && weight(norms.0)
        && weight(norms.1)
        && terms.dims >= 2
        && terms.dims % 2 == 0
        && terms.dims <= d
        && offset.checked_add(q.dim(1)).is_some();
    if !fits || !on() || !crate::switch::get(&HEADS, "MTP_CPU_FUSED_HEADS", true) {
        return Ok(None);
    }
    let rope = HeadsRope { offset, ..terms };
    let one = |x: &Array, n: Option<&RmsNorm>| -> Result<Array> {
        Ok(ops::heads_cpu(x, n.map(|n| (n.weight(), n.eps())), rope)?)
    };
    Ok(Some((
        one(q, norms.0)?,
        one(k, norms.1)?,
        v.transpose(&[0, 2, 1, 3])?,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RopeScaling;
    use crate::models::test_arrays::{max_diff, rand};

    /// With the fused stages on, a layer's heads, norms and SwiGLU equal
    /// MLX's ops path within f32 rounding (RoPE angles at position ~1,000
    /// carry ~1e-4 rad of f32 error either way) for every RoPE scaling, a
    /// partial rotation and YaRN's attention scale, on strided slices of one
    /// projection; and the fused norm is one node.
    // Long: one case table of every RoPE scaling, then the norm and SwiGLU checks.
    #[test]
    fn fused_stages_equal_the_ops_path_for_every_rope() {
        let yarn = RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: 1.2,
            truncate: true,
        };
        let llama3 = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        };
        let linear = RopeScaling::Linear { factor: 2.0 };
        let d = 64;
        let fused = rand(&[1, 3, 8 * d], 9);
        let part = |lo: i32, n: i32| {
            fused
                .slice_axis(2, lo * d, (lo + n) * d)
                .unwrap()
                .reshape(&[1, 3, n, d])
                .unwrap()
        };
        let (q, k, v) = (part(0, 4), part(4, 2), part(6, 2));
        let (qn, kn) = (
            RmsNorm::from_parts(rand(&[d], 3), 1e-6),
            RmsNorm::from_parts(rand(&[d], 4), 1e-6),
        );
        for (scaling, rotated) in [
            (RopeScaling::None, 64),
            (RopeScaling::None, 16),
            (linear, 64),
            (yarn.clone(), 64),
            (yarn, 32),
            (llama3, 64),
        ] {
            let rope = Rope::new(rotated, 1_000_000.0, &scaling).unwrap();
            let run = |on: bool| {
                set_cpu_fused(on);
                set_cpu_fused_heads(on);
                let out = crate::models::heads_kernel::heads(
                    &q,
                    &k,
                    &v,
                    (Some(&qn), Some(&kn)),
                    &rope,
                    997,
                )
                .unwrap();
                set_cpu_fused(true);
                out
            };
            let (got, want) = (run(true), run(false));
            let case = format!("{scaling:?}, {rotated} of {d} rotated");
            for (g, w) in [(&got.0, &want.0), (&got.1, &want.1), (&got.2, &want.2)] {
                assert_eq!(g.shape(), w.shape(), "{case}");
                assert!(max_diff(g, w) < 2e-3, "{case}: {}", max_diff(g, w));
            }
            assert_eq!(max_diff(&got.2, &want.2), 0.0, "{case}: v is only moved");
        }
        let x = rand(&[1, 5, 96], 5);
        let n = RmsNorm::from_parts(rand(&[96], 6), 1e-5);
        x.eval().unwrap();
        n.weight().eval().unwrap();
        let gu = rand(&[1, 5, 192], 7);
        set_cpu_fused(false);
        let (n_ops, g_ops) = (
            n.forward(&x).unwrap(),
            crate::models::swiglu::swiglu(&gu, 96).unwrap(),
        );
        set_cpu_fused(true);
        let (n_fused, g_fused) = (
            n.forward(&x).unwrap(),
            crate::models::swiglu::swiglu(&gu, 96).unwrap(),
        );
        assert!(max_diff(&n_fused, &n_ops) < 1e-5);
        assert!(max_diff(&g_fused, &g_ops) < 1e-5);
        let one_node = n.forward(&x).unwrap();
        assert_eq!(one_node.pending_nodes(), 1, "{}", one_node.pending_census());
    }
}
