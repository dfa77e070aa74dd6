//! The gated delta rule's recurrence over `L` positions as one CUDA kernel:
//! one warp per row of each value head's state, the state in registers, the
//! positions in order.
//!
//! Why: with MLX's ops the recurrence is about thirty graph nodes per
//! position and layer (`gated_delta.rs`), and a decode step on CUDA is bound
//! by the host dispatching nodes (about 4 µs each on an H200): at the MoE
//! benchmark shape (27 Gated DeltaNet layers) that is ~800 nodes per position,
//! so a verify over `k + 1` rows cost 3–7 ms more per row than one row. Here
//! it is one node per layer for any `L`, and the state after every position
//! comes out of the same kernel when a verify needs its rewind points. The
//! arithmetic is the ops path's, in f32, in the same order per position, so a
//! verify and single steps agree to the last bit of each position's sums.

use mlx_tensor::fast::{CudaKernel, CudaLaunch};
use mlx_tensor::{Array, Dtype};

use crate::error::Result;

const KERNEL: CudaKernel<'static> = CudaKernel {
    name: "mtp_gated_delta",
    source: SOURCE,
    inputs: &["q", "k", "v", "g", "beta", "state"],
    outputs: &["y", "states"],
    row_contiguous: true,
};

/// Thread `(lane, dv, hv)`: lane `t` holds state features `t + 32e` of row
/// `dv` of value head `hv` (key head `hv / (Hv / Kh)`). Per position:
/// `s *= g`, `kv = Σ s·k`, `δ = (v - kv)·β`, `s += k·δ`, `y = Σ s·q`. With
/// `ALL`, `states[t]` is the state after position `t`; without, `states[0]`
/// is the last. All f32, row-contiguous: `q, k: [1, L, Kh, Dk]`, `v: [1, L,
/// Hv, Dv]`, `g, beta: [1, L, Hv]`, `state: [1, Hv, Dv, Dk]`. NVRTC has no
/// standard library: only CUDA's intrinsics.
const SOURCE: &str = r#"
  constexpr int DK = 32 * FPL;
  const int lane = threadIdx.x;
  const int dv = blockIdx.y * blockDim.y + threadIdx.y;
  const int hv = blockIdx.z;
  const int L = v_shape[1];
  const int Hv = v_shape[2];
  const int Dv = v_shape[3];
  const int Kh = k_shape[2];
  if (dv >= Dv) return;
  const int kh = hv / (Hv / Kh);
  float s[FPL];
  const float* s0 = state + ((size_t)hv * Dv + dv) * DK;
  #pragma unroll
  for (int e = 0; e < FPL; ++e) s[e] = s0[lane + 32 * e];
  for (int t = 0; t < L; ++t) {
    const float* qt = q + ((size_t)t * Kh + kh) * DK;
    const float* kt = k + ((size_t)t * Kh + kh) * DK;
    const float gt = g[(size_t)t * Hv + hv];
    const float bt = beta[(size_t)t * Hv + hv];
    const float vt = v[((size_t)t * Hv + hv) * Dv + dv];
    float kf[FPL];
    float kv = 0.0f;
    #pragma unroll
    for (int e = 0; e < FPL; ++e) {
      kf[e] = kt[lane + 32 * e];
      s[e] = s[e] * gt;
      kv += s[e] * kf[e];
    }
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) kv += __shfl_xor_sync(0xffffffff, kv, off);
    const float delta = (vt - kv) * bt;
    float yv = 0.0f;
    #pragma unroll
    for (int e = 0; e < FPL; ++e) {
      s[e] = s[e] + kf[e] * delta;
      yv += s[e] * qt[lane + 32 * e];
    }
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1) yv += __shfl_xor_sync(0xffffffff, yv, off);
    if (lane == 0) y[((size_t)t * Hv + hv) * Dv + dv] = yv;
    if (ALL) {
      float* so = states + (((size_t)t * Hv + hv) * Dv + dv) * DK;
      #pragma unroll
      for (int e = 0; e < FPL; ++e) so[lane + 32 * e] = s[e];
    }
  }
  if (!ALL) {
    float* so = states + ((size_t)hv * Dv + dv) * DK;
    #pragma unroll
    for (int e = 0; e < FPL; ++e) so[lane + 32 * e] = s[e];
  }
"#;

thread_local! {
    static ENABLED: crate::switch::Flag = const { std::cell::Cell::new(None) };
}

/// Turns the kernel on or off for this thread's later forwards (default: on
/// CUDA, unless `MTP_DELTA_KERNEL=0`; on the H200 it matched the ops path
/// within 4.4e-4 of the logit range in f32 and passed gpu-check's enforced
/// greedy parity, docs/gpu.md).
pub fn set_delta_kernel(on: bool) {
    crate::switch::set(&ENABLED, on);
}

/// Whether a recurrence with key width `dk` goes to the kernel on this
/// backend and thread.
pub(crate) fn applies(dk: i32, dv: i32) -> bool {
    crate::switch::get(&ENABLED, "MTP_DELTA_KERNEL", true)
        && dk % 32 == 0
        && (32..=256).contains(&dk)
        && dv > 0
        && crate::models::sdpa::on_cuda()
}

/// Runs the recurrence over `q, k: [1, L, Kh, Dk]`, `v: [1, L, Hv, Dv]`,
/// `g, beta: [1, L, Hv]` from `state: [1, Hv, Dv, Dk]` (any float dtypes: the
/// kernel reads f32), keeping every position's state when `all_states`:
/// `y: [1, L, Hv, Dv]` (f32) and the states, after every position (`[L, Hv,
/// Dv, Dk]`) or only the last (`[1, Hv, Dv, Dk]`).
pub(crate) fn recurrence(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    state: &Array,
    all_states: bool,
) -> Result<(Array, Array)> {
    let f32 = |a: &Array| a.as_type(Dtype::Float32);
    let (l, hv, dv) = (v.dim(1), v.dim(2), v.dim(3));
    let dk = k.dim(3);
    let kept = if all_states { l } else { 1 };
    let launch = CudaLaunch {
        outputs: &[
            (&[1, l, hv, dv], Dtype::Float32),
            (&[kept, hv, dv, dk], Dtype::Float32),
        ],
        grid: [32, dv, hv],
        block: [32, 4, 1],
        templates: &[("FPL", dk / 32), ("ALL", i32::from(all_states))],
    };
    let inputs = [f32(q)?, f32(k)?, f32(v)?, f32(g)?, f32(beta)?, f32(state)?];
    let refs: Vec<&Array> = inputs.iter().collect();
    let mut out = KERNEL.apply(&refs, &launch)?;
    let states = out.pop().expect("two outputs");
    let y = out.pop().expect("two outputs");
    Ok((y, states))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Off CUDA the kernel is never chosen, and calling it is an error, not
    /// an abort.
    #[test]
    fn cpu_never_takes_the_kernel() {
        assert!(!applies(128, 128));
        let z = |s: &[i32]| mlx_tensor::ops::zeros(s, Dtype::Float32).unwrap();
        let r = recurrence(
            &z(&[1, 2, 1, 32]),
            &z(&[1, 2, 1, 32]),
            &z(&[1, 2, 2, 32]),
            &z(&[1, 2, 2]),
            &z(&[1, 2, 2]),
            &z(&[1, 2, 32, 32]),
            true,
        );
        assert!(r.and_then(|(y, _)| Ok(y.eval()?)).is_err());
    }
}
