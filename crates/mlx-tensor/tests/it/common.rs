//! Helpers shared by the mlx-tensor integration tests: building arrays and comparing results.
#![allow(dead_code)]

mod own_process;

pub(crate) use own_process::own_process;

use mlx_tensor::{Array, Result};

/// An f32 array from a slice (panics on a shape/data mismatch: that is a broken test).
pub(crate) fn arr(data: &[f32], shape: &[i32]) -> Array {
    Array::from_slice(data, shape).expect("test data fits its shape")
}

/// An i32 array from a slice.
pub(crate) fn iarr(data: &[i32], shape: &[i32]) -> Array {
    Array::from_slice(data, shape).expect("test data fits its shape")
}

/// Asserts `got ≈ want` element-wise within `tol` (absolute), naming the case.
pub(crate) fn assert_close(case: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(
        got.len(),
        want.len(),
        "{case}: length {} vs {}",
        got.len(),
        want.len()
    );
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol || (g.is_nan() && w.is_nan()) || g == w,
            "{case}: element {i}: got {g}, want {w} (tol {tol})\n got  {got:?}\n want {want:?}"
        );
    }
}

/// The data-driven check: evaluates `got`, then compares shape and f32 values within `tol`.
#[track_caller]
pub(crate) fn check(case: &str, got: Result<Array>, shape: &[i32], want: &[f32], tol: f32) {
    let got = got.unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_eq!(got.shape().as_slice(), shape, "{case}: shape");
    let values = got
        .to_vec::<f32>()
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_close(case, &values, want, tol);
}

/// Like [`check`] for integer results, compared exactly.
#[track_caller]
pub(crate) fn check_i(case: &str, got: Result<Array>, shape: &[i32], want: &[i64]) {
    let got = got.unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_eq!(got.shape().as_slice(), shape, "{case}: shape");
    let values = got
        .to_vec::<i64>()
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_eq!(values, want, "{case}: values");
}

/// Like [`check`] for boolean results.
#[track_caller]
pub(crate) fn check_b(case: &str, got: Result<Array>, shape: &[i32], want: &[bool]) {
    let got = got.unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_eq!(got.shape().as_slice(), shape, "{case}: shape");
    let values = got
        .to_vec::<bool>()
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_eq!(values, want, "{case}: values");
}

/// A small deterministic pseudo-random sequence (xorshift), in [-1, 1), for host-side references.
pub(crate) fn host_noise(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}
