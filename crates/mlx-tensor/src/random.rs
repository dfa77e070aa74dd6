//! Random numbers from explicit keys: no hidden global generator.
//!
//! A key is a `uint32[2]` array. Draws with the same key give the same numbers;
//! [`split`] derives independent keys.

use crate::error::check;
use crate::ffi::sys;
use crate::{Array, Dtype, Result};

/// A key from a seed.
#[track_caller]
pub fn key(seed: u64) -> Result<Array> {
    check(sys::random_key(seed)).map(Array::wrap)
}

/// `num` new keys (shape `[num, 2]`) derived from `key`.
#[track_caller]
pub fn split(key: &Array, num: i32) -> Result<Array> {
    check(sys::random_split(key.raw(), num)).map(Array::wrap)
}

/// Splits a key into two: `(next_key, subkey)`.
#[track_caller]
pub fn split2(key: &Array) -> Result<(Array, Array)> {
    let keys = split(key, 2)?;
    let a = keys.slice_axis(0, 0, 1)?.reshape(&[2])?;
    let b = keys.slice_axis(0, 1, 2)?.reshape(&[2])?;
    Ok((a, b))
}

/// Uniform samples in `[0, 1)`.
#[track_caller]
pub fn uniform(shape: &[i32], dtype: Dtype, key: &Array) -> Result<Array> {
    check(sys::random_uniform(shape, dtype.code(), key.raw())).map(Array::wrap)
}

/// Standard normal samples.
#[track_caller]
pub fn normal(shape: &[i32], dtype: Dtype, key: &Array) -> Result<Array> {
    check(sys::random_normal(shape, dtype.code(), key.raw())).map(Array::wrap)
}

/// Booleans that are true with probability `p` (element-wise).
#[track_caller]
pub fn bernoulli(p: &Array, key: &Array) -> Result<Array> {
    check(sys::random_bernoulli(p.raw(), key.raw())).map(Array::wrap)
}

/// One index per row, drawn from the unnormalised log-probabilities along `axis`.
#[track_caller]
pub fn categorical(logits: &Array, axis: i32, key: &Array) -> Result<Array> {
    check(sys::random_categorical(logits.raw(), axis, key.raw())).map(Array::wrap)
}

/// `n` independent indices per row.
#[track_caller]
pub fn categorical_n(logits: &Array, axis: i32, n: i32, key: &Array) -> Result<Array> {
    check(sys::random_categorical_n(logits.raw(), axis, n, key.raw())).map(Array::wrap)
}
