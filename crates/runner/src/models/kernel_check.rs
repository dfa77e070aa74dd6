//! Our CUDA kernels against MLX's own ops on the running device, each with
//! the tolerance it must meet: what `gpu-check` enforces and `scale-bench`
//! reports before it measures.
//!
//! Why here: the kernels are chosen by default on CUDA (the fused heads and
//! the short-query attention for verify rows and MTP flushes, the few-rows
//! matmul for small weights), and
//! none of them runs on a CPU, so only the device can show they compute what
//! the ops they replace compute. Tolerances are relative to the largest
//! magnitude of the ops' output.

use mlx_tensor::{Array, Dtype};

use crate::error::Result;

/// One kernel's agreement with the ops it replaces, in one dtype.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelCheck {
    /// The kernel (`fused-heads`, `rows-matmul`, `short-attention`).
    pub kernel: &'static str,
    /// The dtype it was run in (`f32`, `bf16`).
    pub dtype: &'static str,
    /// Worst `max |kernel − ops| ÷ max |ops|` over the check's shapes
    /// (infinite when an output was missing or not finite).
    pub rel_err: f32,
    /// The largest `rel_err` that passes.
    pub tolerance: f32,
}

impl KernelCheck {
    /// Whether the kernel is within its tolerance (a NaN never is).
    pub fn passed(&self) -> bool {
        self.rel_err <= self.tolerance
    }
}

/// The fused heads kernel in f32: only the norm's summation order differs.
const HEADS_F32_TOLERANCE: f32 = 1e-4;
/// In bf16 that order can move a rounding by one unit (2^-8 of a value).
const HEADS_BF16_TOLERANCE: f32 = 2e-2;
/// The few-rows matmul in bf16: summation order and one output rounding.
const ROWS_BF16_TOLERANCE: f32 = 2e-2;
/// The short-query attention in bf16 against f32 attention: one output
/// rounding (2^-8 of a value) and the f32 softmax's order (session 15:
/// 1.8e-3 to 2.8e-3).
const SHORT_ATTENTION_BF16_TOLERANCE: f32 = 1.5e-2;
/// SwiGLU in bf16 against MLX's ops, which round to bf16 after each op
/// where the kernel rounds once: a few units of 2^-8.
const SWIGLU_BF16_TOLERANCE: f32 = 2e-2;

/// `max |got − want| ÷ max |want|`, both read as f32; infinite when the
/// lengths differ, `got` is not all finite or `want` is all zeros (a
/// check must never pass on what it could not compare).
pub fn rel_err(got: &Array, want: &Array) -> Result<f32> {
    let got = got.as_type(Dtype::Float32)?.to_vec::<f32>()?;
    let want = want.as_type(Dtype::Float32)?.to_vec::<f32>()?;
    Ok(rel_err_of(&got, &want))
}

fn rel_err_of(got: &[f32], want: &[f32]) -> f32 {
    let range = want.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let diff = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    // `f32::max` passes a NaN over, so finiteness is checked on its own.
    let finite = got.iter().all(|v| v.is_finite());
    if got.len() == want.len() && finite && diff.is_finite() && range > 0.0 {
        diff / range
    } else {
        f32::INFINITY
    }
}

/// Runs every kernel's check on the default device; empty where none of
/// them runs (no CUDA).
pub fn kernel_checks() -> Result<Vec<KernelCheck>> {
    let mut out = Vec::new();
    if let Some((f32_err, bf16_err)) = super::heads_kernel::self_check()? {
        out.push(KernelCheck {
            kernel: "fused-heads",
            dtype: "f32",
            rel_err: f32_err,
            tolerance: HEADS_F32_TOLERANCE,
        });
        out.push(KernelCheck {
            kernel: "fused-heads",
            dtype: "bf16",
            rel_err: bf16_err,
            tolerance: HEADS_BF16_TOLERANCE,
        });
    }
    if let Some(err) = super::skinny::self_check()? {
        out.push(KernelCheck {
            kernel: "rows-matmul",
            dtype: "bf16",
            rel_err: err,
            tolerance: ROWS_BF16_TOLERANCE,
        });
    }
    if let Some(err) = super::swiglu::self_check()? {
        out.push(KernelCheck {
            kernel: "swiglu",
            dtype: "bf16",
            rel_err: err,
            tolerance: SWIGLU_BF16_TOLERANCE,
        });
    }
    if let Some(err) = super::short_sdpa::self_check()? {
        out.push(KernelCheck {
            kernel: "short-attention",
            dtype: "bf16",
            rel_err: err,
            tolerance: SHORT_ATTENTION_BF16_TOLERANCE,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without CUDA no kernel runs, so nothing is reported
    /// (never a check that did not run).
    #[test]
    fn a_cpu_reports_no_kernel() {
        if !crate::models::sdpa::on_cuda() {
            assert!(kernel_checks().unwrap().is_empty());
        }
    }

    /// The relative error: the worst difference over the largest magnitude,
    /// and never a pass on what could not be compared.
    #[test]
    fn rel_err_compares_only_what_it_can() {
        assert_eq!(rel_err_of(&[1.0, 2.5], &[1.0, 2.0]), 0.25);
        assert_eq!(rel_err_of(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert_eq!(rel_err_of(&[1.0], &[1.0, 2.0]), f32::INFINITY);
        assert_eq!(rel_err_of(&[f32::NAN, 2.0], &[1.0, 2.0]), f32::INFINITY);
        assert_eq!(rel_err_of(&[0.0], &[0.0]), f32::INFINITY);
        let a = Array::from_slice(&[1.0f32, -4.0], &[2]).unwrap();
        let b = Array::from_slice(&[1.5f32, -4.0], &[2]).unwrap();
        assert_eq!(rel_err(&b, &a).unwrap(), 0.125);
    }

    /// A check passes up to its tolerance, and an error that is not a
    /// number (a NaN output) never passes.
    #[test]
    fn passes_within_its_tolerance_only() {
        let c = |rel_err| KernelCheck {
            kernel: "k",
            dtype: "bf16",
            rel_err,
            tolerance: 1e-2,
        };
        assert!(c(0.0).passed() && c(1e-2).passed());
        assert!(!c(1.1e-2).passed() && !c(f32::INFINITY).passed() && !c(f32::NAN).passed());
    }
}
