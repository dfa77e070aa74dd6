//! Two-sample chi-squared homogeneity test over categorical samples; the
//! p-value is `sampler::stats::chi2_survival` (shared with the sampler's
//! acceptance statistics).

use std::collections::BTreeMap;
use std::hash::Hash;

/// Result of a two-sample test.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Homogeneity {
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
pub(crate) fn two_sample<T: Ord + Hash + Clone>(
    a: &[T],
    b: &[T],
    min_combined: u64,
) -> Homogeneity {
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
pub(crate) fn survival(x: f64, df: usize) -> f64 {
    runner::sampler::stats::chi2_survival(x, df)
}
