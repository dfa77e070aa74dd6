//! Helpers shared by the sampler's integration tests: host-side random
//! distributions, closeness checks and a chi-squared goodness-of-fit test.
#![allow(dead_code)] // Each test binary uses a different subset.

pub(crate) mod chi2;

use mlx_tensor::Array;
use sampler::{Distribution, Result};

/// A tiny deterministic host RNG (splitmix64) for building test inputs.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `(0, 1]`.
    pub(crate) fn unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// Uniform in `0..n`.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// A random distribution over `v` tokens (Dirichlet(1) weights) with about
    /// `zero_fraction` of the entries set to 0; at least one entry stays positive.
    pub(crate) fn distribution(&mut self, v: usize, zero_fraction: f64) -> Vec<f64> {
        let keep = self.below(v);
        let w: Vec<f64> = (0..v)
            .map(|i| {
                let e = -self.unit().ln();
                if i != keep && self.unit() < zero_fraction {
                    0.0
                } else {
                    e
                }
            })
            .collect();
        let total: f64 = w.iter().sum();
        w.into_iter().map(|x| x / total).collect()
    }
}

/// A distribution from host rows (`rows.len()` rows of equal width).
pub(crate) fn dist(rows: &[Vec<f64>]) -> Result<Distribution> {
    let v = rows[0].len();
    let flat: Vec<f32> = rows.iter().flatten().map(|&x| x as f32).collect();
    Distribution::from_probs(&Array::from_slice(&flat, &[rows.len() as i32, v as i32])?)
}

/// The probabilities of `d` as host rows.
pub(crate) fn rows_of(d: &Distribution) -> Result<Vec<Vec<f32>>> {
    let v = d.vocab();
    Ok(d.probs()
        .to_vec::<f32>()?
        .chunks_exact(v)
        .map(<[f32]>::to_vec)
        .collect())
}

/// Asserts `got` equals `expected` element-wise within `tol` (absolute).
#[track_caller]
pub(crate) fn assert_close(got: &[f32], expected: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: lengths");
    for (i, (&g, &e)) in got.iter().zip(expected).enumerate() {
        assert!(
            (f64::from(g) - e).abs() <= tol,
            "{what}: element {i} is {g}, expected {e} (±{tol})\n got {got:?}\n expected {expected:?}"
        );
    }
}

/// Softmax of host logits in f64 (the hand-computed side of a check).
pub(crate) fn softmax(logits: &[f64]) -> Vec<f64> {
    let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|&x| (x - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

/// Normalises host weights to sum 1.
pub(crate) fn normalised(w: &[f64]) -> Vec<f64> {
    let s: f64 = w.iter().sum();
    w.iter().map(|x| x / s).collect()
}
