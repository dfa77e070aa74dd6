//! Pearson's chi-squared goodness-of-fit test, with its p-value computed here.
//!
//! The p-value is `sampler::stats::chi2_survival`, checked against tabulated
//! critical values in `tests/statistics.rs`.

/// Result of a goodness-of-fit test.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fit {
    /// Pearson's statistic.
    pub statistic: f64,
    /// Degrees of freedom (cells after pooling, minus one).
    pub df: usize,
    /// Probability of a statistic at least this large under the hypothesis.
    pub p_value: f64,
}

/// Tests observed counts against expected probabilities. Cells whose expected
/// count is below 5 are pooled into one cell (the usual validity rule); cells
/// of probability 0 must have no observations and are checked by the caller.
pub(crate) fn goodness_of_fit(observed: &[u64], probs: &[f64]) -> Fit {
    assert_eq!(
        observed.len(),
        probs.len(),
        "observed cells {} vs probabilities {}",
        observed.len(),
        probs.len()
    );
    let n: u64 = observed.iter().sum();
    let total_p: f64 = probs.iter().sum();
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let (mut pooled_o, mut pooled_e) = (0.0, 0.0);
    for (&o, &p) in observed.iter().zip(probs) {
        let e = n as f64 * p / total_p;
        if e >= 5.0 {
            cells.push((o as f64, e));
        } else {
            pooled_o += o as f64;
            pooled_e += e;
        }
    }
    if pooled_e > 0.0 {
        cells.push((pooled_o, pooled_e));
    }
    let statistic: f64 = cells.iter().map(|&(o, e)| (o - e) * (o - e) / e).sum();
    let df = cells.len().saturating_sub(1).max(1);
    Fit {
        statistic,
        df,
        p_value: survival(statistic, df),
    }
}

/// `P(X >= x)` for `X` chi-squared with `df` degrees of freedom.
pub(crate) fn survival(x: f64, df: usize) -> f64 {
    sampler::stats::chi2_survival(x, df)
}
