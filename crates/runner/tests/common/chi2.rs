//! Two-sample chi-squared homogeneity test over categorical samples (a copy of the
//! p-value code of `crates/sampler/tests/support/chi2.rs`, which test binaries of
//! another crate cannot import).
//!
//! The p-value is the chi-squared survival function `Q(df / 2, x / 2)` (the
//! regularised upper incomplete gamma function), by its power series below
//! `a + 1` and a Lentz continued fraction above (Numerical Recipes §6.2), with
//! `ln Γ` from the Lanczos approximation (g = 7, 9 terms).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::hash::Hash;

/// Result of a two-sample test.
#[derive(Debug, Clone, Copy)]
pub struct Homogeneity {
    /// Pearson's statistic of the 2 × K table.
    pub statistic: f64,
    /// Degrees of freedom (cells after pooling, minus one).
    pub df: usize,
    /// Probability of a statistic at least this large when both samples come
    /// from one distribution.
    pub p_value: f64,
    /// Cells kept after pooling (the pooled rest included).
    pub cells: usize,
}

/// Tests whether samples `a` and `b` come from the same categorical distribution.
/// Categories whose combined count is below `min_combined` are pooled into one
/// cell, so every expected count is at least about `min_combined / 2` for equal
/// sample sizes (use 10 for the usual "expected ≥ 5" rule).
pub fn two_sample<T: Ord + Hash + Clone>(a: &[T], b: &[T], min_combined: u64) -> Homogeneity {
    assert!(
        !a.is_empty() && !b.is_empty(),
        "samples of {} and {}",
        a.len(),
        b.len()
    );
    let mut counts: BTreeMap<T, (u64, u64)> = BTreeMap::new();
    for x in a {
        counts.entry(x.clone()).or_default().0 += 1;
    }
    for x in b {
        counts.entry(x.clone()).or_default().1 += 1;
    }
    let mut cells: Vec<(u64, u64)> = Vec::new();
    let mut pooled = (0, 0);
    for (_, (ca, cb)) in counts {
        if ca + cb >= min_combined {
            cells.push((ca, cb));
        } else {
            pooled = (pooled.0 + ca, pooled.1 + cb);
        }
    }
    if pooled.0 + pooled.1 > 0 {
        cells.push(pooled);
    }
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let n = na + nb;
    let mut statistic = 0.0;
    for &(ca, cb) in &cells {
        let col = (ca + cb) as f64;
        for (o, rows) in [(ca as f64, na), (cb as f64, nb)] {
            let e = rows * col / n;
            statistic += (o - e) * (o - e) / e;
        }
    }
    let df = cells.len().saturating_sub(1).max(1);
    Homogeneity {
        statistic,
        df,
        p_value: survival(statistic, df),
        cells: cells.len(),
    }
}

/// `P(X >= x)` for `X` chi-squared with `df` degrees of freedom.
pub fn survival(x: f64, df: usize) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    upper_gamma_q(df as f64 / 2.0, x / 2.0)
}

fn upper_gamma_q(a: f64, x: f64) -> f64 {
    if x < a + 1.0 {
        1.0 - lower_series(a, x)
    } else {
        upper_fraction(a, x)
    }
}

/// `P(a, x)` by its series.
fn lower_series(a: f64, x: f64) -> f64 {
    let (mut term, mut sum, mut ap) = (1.0 / a, 1.0 / a, a);
    for _ in 0..10_000 {
        ap += 1.0;
        term *= x / ap;
        sum += term;
        if term.abs() < sum.abs() * 1e-15 {
            break;
        }
    }
    sum * (-x + a * x.ln() - ln_gamma(a)).exp()
}

/// `Q(a, x)` by its continued fraction (modified Lentz).
fn upper_fraction(a: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let mut b = x + 1.0 - a;
    let mut c = 1.0 / TINY;
    let mut d = 1.0 / b;
    let mut h = d;
    for i in 1..10_000 {
        let an = -(i as f64) * (i as f64 - a);
        b += 2.0;
        d = an * d + b;
        if d.abs() < TINY {
            d = TINY;
        }
        c = b + an / c;
        if c.abs() < TINY {
            c = TINY;
        }
        d = 1.0 / d;
        let delta = d * c;
        h *= delta;
        if (delta - 1.0).abs() < 1e-15 {
            break;
        }
    }
    (-x + a * x.ln() - ln_gamma(a)).exp() * h
}

/// `ln Γ(x)` for `x > 0` (Lanczos, g = 7).
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x) Γ(1 − x) = π / sin(πx).
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut s = G[0];
    for (i, &g) in G.iter().enumerate().skip(1) {
        s += g / (x + i as f64);
    }
    let t = x + 7.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + s.ln()
}
