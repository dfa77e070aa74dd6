//! Statistics of speculative decoding, reported under `speculation` in `--json`.

use crate::drafter::DraftMethod;

/// What one round did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RoundOutcome {
    /// Draft tokens proposed (0 for a plain step).
    pub(crate) drafted: usize,
    /// Draft tokens accepted.
    pub(crate) accepted: usize,
    /// Tokens to emit, in order: the accepted drafts, then the next token;
    /// cut after an end-of-sequence token.
    pub(crate) emitted: Vec<u32>,
    /// Wall time of the round in seconds.
    pub(crate) seconds: f64,
}

/// Figures of one speculative generation.
#[derive(Debug, Clone, PartialEq)]
pub struct SpecStats {
    /// The drafter.
    pub method: DraftMethod,
    /// Rounds run (plain steps included).
    pub rounds: usize,
    /// Draft tokens proposed.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// Tokens emitted (accepted drafts plus one per round).
    pub emitted: usize,
    /// `drafted_at[i]`: rounds that drafted position `i + 1`.
    pub drafted_at: Vec<usize>,
    /// `accepted_at[i]`: rounds that accepted position `i + 1`.
    pub accepted_at: Vec<usize>,
    /// The depth of every round, in order.
    pub depth_over_time: Vec<usize>,
}

impl SpecStats {
    /// Empty statistics for `method`.
    pub fn new(method: DraftMethod) -> SpecStats {
        SpecStats {
            method,
            rounds: 0,
            drafted: 0,
            accepted: 0,
            emitted: 0,
            drafted_at: Vec::new(),
            accepted_at: Vec::new(),
            depth_over_time: Vec::new(),
        }
    }

    /// Adds one round.
    pub(crate) fn record(&mut self, round: &RoundOutcome) {
        self.rounds += 1;
        self.drafted += round.drafted;
        self.accepted += round.accepted;
        self.emitted += round.emitted.len();
        self.depth_over_time.push(round.drafted);
        if self.drafted_at.len() < round.drafted {
            self.drafted_at.resize(round.drafted, 0);
            self.accepted_at.resize(round.drafted, 0);
        }
        for i in 0..round.drafted {
            self.drafted_at[i] += 1;
            if i < round.accepted {
                self.accepted_at[i] += 1;
            }
        }
    }

    /// Accepted over drafted (0 when nothing was drafted).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// Acceptance of each draft position.
    pub fn per_position_acceptance(&self) -> Vec<f64> {
        self.drafted_at
            .iter()
            .zip(&self.accepted_at)
            .map(|(&d, &a)| if d == 0 { 0.0 } else { a as f64 / d as f64 })
            .collect()
    }

    /// `histogram[d]`: rounds run at draft depth `d` (depth 0: plain steps),
    /// up to the deepest depth used.
    pub fn depth_histogram(&self) -> Vec<usize> {
        let deepest = self.depth_over_time.iter().max().map_or(0, |&d| d + 1);
        let mut h = vec![0; deepest];
        for &d in &self.depth_over_time {
            h[d] += 1;
        }
        h
    }

    /// Tokens committed per round.
    pub fn mean_accepted_length(&self) -> f64 {
        if self.rounds == 0 {
            0.0
        } else {
            self.emitted as f64 / self.rounds as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(drafted: usize, accepted: usize) -> RoundOutcome {
        RoundOutcome {
            drafted,
            accepted,
            emitted: vec![0; accepted + 1],
            seconds: 0.0,
        }
    }

    #[test]
    fn figures_follow_the_rounds() {
        let mut s = SpecStats::new(DraftMethod::Mtp);
        s.record(&round(3, 3));
        s.record(&round(3, 1));
        s.record(&round(0, 0));
        assert_eq!((s.rounds, s.drafted, s.accepted, s.emitted), (3, 6, 4, 7));
        assert_eq!(s.per_position_acceptance(), vec![1.0, 0.5, 0.5]);
        assert!((s.acceptance_rate() - 4.0 / 6.0).abs() < 1e-12);
        assert!((s.mean_accepted_length() - 7.0 / 3.0).abs() < 1e-12);
        assert_eq!(s.depth_over_time, vec![3, 3, 0]);
        assert_eq!(s.depth_histogram(), vec![1, 0, 0, 2]);
        assert_eq!(
            SpecStats::new(DraftMethod::Mtp).depth_histogram(),
            Vec::<usize>::new()
        );
    }
}
