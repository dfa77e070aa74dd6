//! Per-position conditional acceptance of drafts: `a_i`, the chance that
//! draft `i` is accepted given that drafts `1..i` were.

/// Per-observation decay of a position's counts: about the last 30 rounds
/// that reached it weigh, so the estimates follow the text as it changes.
const DECAY: f64 = 0.97;
/// Pseudo-rounds of the prior of each position: one unlucky round must not
/// rule a position out.
const PRIOR_WEIGHT: f64 = 2.0;
/// Prior acceptance of position 1. A deeper position's prior is the estimate
/// of the one before it, so an unreached depth is extrapolated, not feared.
const PRIOR_FIRST: f64 = 0.6;

/// Decayed counts of the rounds that reached each draft position.
#[derive(Debug, Clone)]
pub(crate) struct Acceptance {
    /// `counts[i]`: (accepted, reached) of draft position `i + 1`.
    counts: Vec<(f64, f64)>,
}

impl Acceptance {
    /// No observations of positions `1..=max`.
    pub(crate) fn new(max: usize) -> Acceptance {
        Acceptance {
            counts: vec![(0.0, 0.0); max],
        }
    }

    /// A round drafted `drafted` tokens and accepted the first `accepted`.
    /// Positions `1..=accepted + 1` were reached (the first rejection ends
    /// the chain); positions past it say nothing about their conditional rate.
    pub(crate) fn observe(&mut self, drafted: usize, accepted: usize) {
        assert!(
            accepted <= drafted,
            "accepted {accepted} of {drafted} drafts"
        );
        let reached = drafted.min(accepted + 1).min(self.counts.len());
        for (i, (hit, n)) in self.counts.iter_mut().enumerate().take(reached) {
            *hit = *hit * DECAY + if i < accepted { 1.0 } else { 0.0 };
            *n = *n * DECAY + 1.0;
        }
    }

    /// The same estimates at `weight` (in `0..=1`) of their evidence: what a
    /// next request starts from, whose text may differ.
    pub(crate) fn carried(&self, weight: f64) -> Acceptance {
        Acceptance {
            counts: self
                .counts
                .iter()
                .map(|&(hit, n)| (hit * weight, n * weight))
                .collect(),
        }
    }

    /// `a_1, a_2, ...`: the conditional rate of each position, shrunk towards
    /// the rate of the position before it.
    pub(crate) fn rates(&self) -> Vec<f64> {
        let mut prior = PRIOR_FIRST;
        self.counts
            .iter()
            .map(|&(hit, n)| {
                prior = (hit + prior * PRIOR_WEIGHT) / (n + PRIOR_WEIGHT);
                prior
            })
            .collect()
    }
}

/// `E[committed | depth d]` for `d = 0..=rates.len()`: `1 + Σ_{j≤d} Π_{i≤j} a_i`
/// (the bonus or replacement token always commits).
pub(crate) fn expected_committed(rates: &[f64]) -> Vec<f64> {
    let mut out = Vec::with_capacity(rates.len() + 1);
    let (mut total, mut run) = (1.0, 1.0);
    out.push(total);
    for a in rates {
        run *= a;
        total += run;
        out.push(total);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejection_is_not_counted_against_the_positions_after_it() {
        let mut a = Acceptance::new(3);
        for _ in 0..200 {
            // Position 1 always accepted, position 2 always rejected:
            // position 3 is never reached.
            a.observe(3, 1);
        }
        let r = a.rates();
        assert!(r[0] > 0.97, "a_1 = {r:?}");
        // The prior (a_1 with weight 2 against ~33 decayed rounds) keeps a_2 near 0.055.
        assert!(r[1] < 0.07, "a_2 = {r:?}");
        assert_eq!(a.counts[2], (0.0, 0.0), "position 3 was never reached");
        // Unreached: inherits a_2.
        assert!((r[2] - r[1]).abs() < 1e-12, "{r:?}");
    }

    #[test]
    fn conditional_rates_are_not_products() {
        // Each draft accepted with probability 0.5 given its prefix, as a
        // deterministic interleaved pattern: accepted counts 0, 1, 2, 3 in
        // ratio 4:2:1:1. The unconditional rate of position 3 would be 1/8.
        let mut a = Acceptance::new(3);
        for _ in 0..40 {
            for acc in [0, 1, 0, 2, 0, 1, 0, 3] {
                a.observe(3, acc);
            }
        }
        let r = a.rates();
        // Tolerance: the decay's recency tilt is 1/1.97 - 1/2 ≈ 0.008.
        for (i, x) in r.iter().enumerate() {
            assert!((x - 0.5).abs() < 0.02, "a_{} = {x} ({r:?})", i + 1);
        }
    }

    #[test]
    fn expected_committed_follows_the_chain_rule() {
        let e = expected_committed(&[0.5, 0.5, 1.0]);
        // Exact in binary floating point.
        assert_eq!(e, vec![1.0, 1.5, 1.75, 2.0]);
    }

    #[test]
    fn one_rejection_does_not_rule_a_position_out() {
        let mut a = Acceptance::new(2);
        a.observe(2, 1);
        let r = a.rates();
        assert!(r[1] > 0.3, "position 2 after one miss: {r:?}");
    }
}
