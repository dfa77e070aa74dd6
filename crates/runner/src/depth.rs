//! Choosing the draft depth per round: fixed, or the depth that maximises
//! expected committed tokens per second.
//!
//! After a round that drafted `k` tokens and accepted `a`, position `i ≤ k`
//! counts as drafted and, when `i ≤ a`, as accepted; the round's wall time is
//! the cost of depth `k`. Both are exponential moving averages, so the choice
//! follows the text as it changes. With per-position acceptance `α_i` the
//! expected tokens of a depth-`k` round are `1 + Σ_{i≤k} Π_{j≤i} α_j` (the
//! bonus or replacement token is always emitted); the controller picks the
//! `k` with the most expected tokens per second of measured (or, for a depth
//! not yet tried, extrapolated) cost. Depth 0 is plain decoding; while at 0 it
//! probes one depth deeper than the best now and then, so stale estimates
//! (a depth that once looked bad, or plain decoding) get refreshed.

/// How deep to draft.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DepthPolicy {
    /// Always this many draft tokens (capped by the remaining budget).
    Fixed(usize),
    /// Per round, the depth in `0..=max` with the best expected throughput.
    Auto {
        /// Deepest depth considered.
        max: usize,
    },
}

impl Default for DepthPolicy {
    fn default() -> Self {
        DepthPolicy::Auto { max: 6 }
    }
}

/// Weight of the newest observation in the cost averages.
const DECAY: f64 = 0.1;
/// Per-round decay of the acceptance counts (a window of about 30 rounds).
const COUNT_DECAY: f64 = 0.97;
/// Acceptance assumed for a position before it was drafted, and its weight
/// in rounds: one unlucky round must not rule a depth out for good.
const PRIOR_ACCEPT: f64 = 0.6;
const PRIOR_WEIGHT: f64 = 2.0;
/// Rounds between probes of the depth one deeper than the best.
const PROBE_EVERY: u64 = 16;
/// Rounds whose wall time is not used (first-use allocations and caches).
const WARMUP_ROUNDS: u64 = 2;

/// The per-request depth controller.
#[derive(Debug, Clone)]
pub struct DepthController {
    policy: DepthPolicy,
    /// `accept[i]`: decayed (accepted, drafted) counts of draft position `i + 1`.
    accept: Vec<(f64, f64)>,
    /// `cost[k]`: moving wall time in seconds of a depth-`k` round.
    cost: Vec<Option<f64>>,
    rounds_since_probe: u64,
    /// Rounds recorded so far; the first ones pay one-off set-up costs.
    recorded: u64,
}

impl DepthController {
    /// A controller for `policy`.
    pub fn new(policy: DepthPolicy) -> DepthController {
        let max = match policy {
            DepthPolicy::Fixed(n) => n,
            DepthPolicy::Auto { max } => max,
        };
        DepthController {
            policy,
            accept: vec![(0.0, 0.0); max],
            cost: vec![None; max + 1],
            rounds_since_probe: 0,
            recorded: 0,
        }
    }

    /// The policy it follows.
    pub fn policy(&self) -> DepthPolicy {
        self.policy
    }

    /// Per-position acceptance estimates (prior where unmeasured).
    pub fn acceptance(&self) -> Vec<f64> {
        self.accept
            .iter()
            .map(|&(hit, n)| (hit + PRIOR_ACCEPT * PRIOR_WEIGHT) / (n + PRIOR_WEIGHT))
            .collect()
    }

    /// Expected emitted tokens of a depth-`k` round.
    pub fn expected_tokens(&self, k: usize) -> f64 {
        let mut total = 1.0;
        let mut run = 1.0;
        for a in self.acceptance().into_iter().take(k) {
            run *= a;
            total += run;
        }
        total
    }

    /// Cost estimate of a depth-`k` round: measured, else a line through the
    /// measured depths (or, with only one, a verify that costs 25% more per token).
    fn cost_of(&self, k: usize) -> Option<f64> {
        if let Some(c) = self.cost[k] {
            return Some(c);
        }
        let known: Vec<(f64, f64)> = self
            .cost
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.map(|c| (i as f64, c)))
            .collect();
        match known.as_slice() {
            [] => None,
            [(k0, c0)] => Some(c0 * (1.0 + 0.25 * (k as f64 - k0)).max(0.1)),
            _ => {
                let n = known.len() as f64;
                let mx = known.iter().map(|p| p.0).sum::<f64>() / n;
                let my = known.iter().map(|p| p.1).sum::<f64>() / n;
                let sxy: f64 = known.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
                let sxx: f64 = known.iter().map(|p| (p.0 - mx).powi(2)).sum();
                let slope = if sxx > 0.0 { (sxy / sxx).max(0.0) } else { 0.0 };
                Some((my + slope * (k as f64 - mx)).max(my * 0.1))
            }
        }
    }

    /// The depth for the next round, at most `budget` (tokens the request may still add minus one).
    pub fn choose(&mut self, budget: usize) -> usize {
        let k = match self.policy {
            DepthPolicy::Fixed(n) => n,
            DepthPolicy::Auto { max } => {
                // Measure one drafted and one plain round before modelling.
                let warm = max.min(3);
                if self.cost[warm].is_none() {
                    warm
                } else if self.cost[0].is_none() {
                    0
                } else {
                    let best = (0..=max)
                        .filter_map(|k| self.cost_of(k).map(|c| (k, self.expected_tokens(k) / c)))
                        .fold((0, f64::MIN), |b, x| if x.1 > b.1 { x } else { b })
                        .0;
                    self.rounds_since_probe += 1;
                    if self.rounds_since_probe >= PROBE_EVERY && best < max {
                        // Now and then try one deeper: its cost and acceptance
                        // estimates would otherwise never be refreshed.
                        self.rounds_since_probe = 0;
                        best + 1
                    } else {
                        best
                    }
                }
            }
        };
        k.min(budget)
    }

    /// Records a finished round: `drafted` tokens proposed, `accepted` kept, `seconds` of wall time.
    pub fn record(&mut self, drafted: usize, accepted: usize, seconds: f64) {
        let ema = |old: Option<f64>, x: f64| Some(old.map_or(x, |o| o + DECAY * (x - o)));
        for (i, (hit, n)) in self.accept.iter_mut().enumerate().take(drafted) {
            *hit = *hit * COUNT_DECAY + if i < accepted { 1.0 } else { 0.0 };
            *n = *n * COUNT_DECAY + 1.0;
        }
        self.recorded += 1;
        if self.recorded > WARMUP_ROUNDS && drafted < self.cost.len() {
            self.cost[drafted] = ema(self.cost[drafted], seconds);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_depth_is_capped_by_budget() {
        let mut d = DepthController::new(DepthPolicy::Fixed(4));
        assert_eq!(d.choose(10), 4);
        assert_eq!(d.choose(2), 2);
        assert_eq!(d.choose(0), 0);
    }

    #[test]
    fn expected_tokens_follow_the_chain_rule() {
        let mut d = DepthController::new(DepthPolicy::Auto { max: 3 });
        // Position 1 always accepted, position 2 never: E(2) → 1 + 1 + 0 as
        // the prior's weight fades against ~33 decayed rounds.
        for _ in 0..400 {
            d.record(2, 1, 0.01);
        }
        let e = d.expected_tokens(2);
        assert!((e - 2.0).abs() < 0.06, "E(2) = {e}");
        // Position 3 never drafted: its prior multiplies a near-zero product.
        assert!((d.expected_tokens(3) - e).abs() < 0.05);
    }

    #[test]
    fn one_rejection_does_not_rule_a_position_out() {
        let mut d = DepthController::new(DepthPolicy::Auto { max: 2 });
        d.record(2, 1, 0.01);
        let a = d.acceptance();
        assert!(a[1] > 0.3, "position 2 after one miss: {a:?}");
    }

    #[test]
    fn auto_prefers_drafting_when_acceptance_is_high_and_verify_is_cheap() {
        let mut d = DepthController::new(DepthPolicy::Auto { max: 4 });
        for k in 0..=4 {
            for _ in 0..50 {
                // Verify of k+1 tokens costs 10 ms + 1 ms per draft; everything accepted.
                d.record(k, k, 0.010 + 0.001 * k as f64);
            }
        }
        assert_eq!(d.choose(100), 4);
    }

    #[test]
    fn auto_falls_back_to_plain_when_nothing_is_accepted() {
        let mut d = DepthController::new(DepthPolicy::Auto { max: 4 });
        for k in 0..=4 {
            for _ in 0..50 {
                d.record(k, 0, 0.010 + 0.004 * k as f64);
            }
        }
        let picks: Vec<usize> = (0..PROBE_EVERY).map(|_| d.choose(100)).collect();
        assert_eq!(
            picks.iter().filter(|&&k| k == 0).count() as u64,
            PROBE_EVERY - 1,
            "{picks:?}"
        );
        assert_eq!(
            *picks.last().unwrap(),
            1,
            "the probe tries depth 1: {picks:?}"
        );
    }
}
