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
    /// Where that time went (all zero for a plain step).
    pub(crate) phases: Phases,
    /// Blocking host syncs the round made.
    pub(crate) syncs: u64,
}

thread_local! {
    static PROFILE_ROUNDS: crate::switch::Flag = const { std::cell::Cell::new(None) };
}

/// Makes this thread's later drafted rounds sync per phase, so their
/// statistics ([`crate::RoundTimes`]) split device time by phase; slower,
/// for measurement. Default: off, unless `MTP_PROFILE_ROUNDS=1`.
pub fn set_profile_rounds(on: bool) {
    crate::switch::set(&PROFILE_ROUNDS, on);
}

/// Whether drafted rounds on this thread sync per phase.
pub(crate) fn profiling_rounds() -> bool {
    crate::switch::get(&PROFILE_ROUNDS, "MTP_PROFILE_ROUNDS", false)
}

/// Seconds of one drafted round by phase, or summed over rounds.
///
/// By default a round syncs once, so the phases are host-side: `draft` and
/// `verify` are the time to build the draft chain and the verify/acceptance
/// graph (with any sync the drafter itself makes), `wait` is the one sync,
/// in which the device runs everything built before it, and `commit` is the
/// rewind and bookkeeping after. Profiled ([`crate::set_profile_rounds`], or
/// `MTP_PROFILE_ROUNDS=1`), the round
/// syncs after the draft and after the verify forward as well, so `draft` is
/// the draft chain's device time, `verify` the verify forward's, `wait` the
/// unembedding, sampling and acceptance; slower, for measurement.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Phases {
    /// Drafting (all draft steps).
    pub draft: f64,
    /// The verify forward.
    pub verify: f64,
    /// The wait for the device (profiled: unembedding, sampling, acceptance).
    pub wait: f64,
    /// Committing: cache rewinds, the drafter's bookkeeping.
    pub commit: f64,
}

impl Phases {
    fn add(&mut self, o: &Phases) {
        self.draft += o.draft;
        self.verify += o.verify;
        self.wait += o.wait;
        self.commit += o.commit;
    }
}

/// Round costs of one generation, summed (means: divide by `rounds`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoundTimes {
    /// Whether the rounds synced per phase ([`crate::set_profile_rounds`]).
    pub profiled: bool,
    /// Drafted rounds timed.
    pub rounds: usize,
    /// Draft steps they ran (the sum of their depths).
    pub draft_steps: usize,
    /// Their wall time in seconds.
    pub seconds: f64,
    /// Their time by phase.
    pub phases: Phases,
    /// Their blocking host syncs.
    pub syncs: u64,
    /// Plain steps (depth 0, and a drafter with nothing to propose), to
    /// compare a round with.
    pub plain_steps: usize,
    /// Their wall time in seconds.
    pub plain_seconds: f64,
}

/// [`RoundTimes`] as means per drafted round, in milliseconds (see
/// [`Phases`] for what each phase covers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RoundMeans {
    /// Wall time of a round.
    pub round: f64,
    /// Drafting, all steps.
    pub draft: f64,
    /// Drafting per draft step.
    pub draft_step: f64,
    /// The verify forward (unprofiled: building its graph).
    pub verify: f64,
    /// Waiting for the device (profiled: unembedding, sampling, acceptance).
    pub wait: f64,
    /// Rewinds and bookkeeping after the sync.
    pub commit: f64,
    /// Blocking host syncs per round.
    pub syncs: f64,
    /// A plain step of the same run, when there were any.
    pub plain_step: Option<f64>,
}

impl RoundTimes {
    /// Adds a round.
    pub(crate) fn record(&mut self, r: &RoundOutcome) {
        if r.drafted == 0 {
            self.plain_steps += 1;
            self.plain_seconds += r.seconds;
            return;
        }
        self.rounds += 1;
        self.draft_steps += r.drafted;
        self.seconds += r.seconds;
        self.phases.add(&r.phases);
        self.syncs += r.syncs;
    }

    /// Mean costs of a drafted round in milliseconds, `None` without drafted
    /// rounds: what `--json` and the benchmarks report.
    pub fn means_ms(&self) -> Option<RoundMeans> {
        if self.rounds == 0 {
            return None;
        }
        let n = self.rounds as f64;
        let ms = |x: f64| x * 1e3 / n;
        Some(RoundMeans {
            round: ms(self.seconds),
            draft: ms(self.phases.draft),
            draft_step: self.phases.draft * 1e3 / self.draft_steps.max(1) as f64,
            verify: ms(self.phases.verify),
            wait: ms(self.phases.wait),
            commit: ms(self.phases.commit),
            syncs: self.syncs as f64 / n,
            plain_step: (self.plain_steps > 0)
                .then(|| self.plain_seconds * 1e3 / self.plain_steps as f64),
        })
    }

    /// Adds another generation's sums.
    pub fn merge(&mut self, o: &RoundTimes) {
        self.profiled |= o.profiled;
        self.rounds += o.rounds;
        self.draft_steps += o.draft_steps;
        self.seconds += o.seconds;
        self.phases.add(&o.phases);
        self.syncs += o.syncs;
        self.plain_steps += o.plain_steps;
        self.plain_seconds += o.plain_seconds;
    }
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
    /// Where the rounds' time went.
    pub times: RoundTimes,
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
            times: RoundTimes {
                profiled: profiling_rounds(),
                ..RoundTimes::default()
            },
        }
    }

    /// Adds one round.
    pub(crate) fn record(&mut self, round: &RoundOutcome) {
        self.rounds += 1;
        self.drafted += round.drafted;
        self.accepted += round.accepted;
        self.emitted += round.emitted.len();
        self.depth_over_time.push(round.drafted);
        self.times.record(round);
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
            seconds: 0.01,
            phases: Phases {
                draft: 0.001,
                verify: 0.002,
                wait: 0.006,
                commit: 0.001,
            },
            syncs: 1,
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
        let t = &s.times;
        assert_eq!(
            (t.rounds, t.draft_steps, t.syncs, t.plain_steps),
            (2, 6, 2, 1)
        );
        assert!((t.phases.wait - 0.012).abs() < 1e-12 && (t.plain_seconds - 0.01).abs() < 1e-12);
        // Means per drafted round in ms: 2 rounds, 6 draft steps.
        let m = t.means_ms().expect("drafted rounds");
        assert!((m.wait - 6.0).abs() < 1e-9 && (m.draft_step - 2.0 / 6.0).abs() < 1e-9);
        assert_eq!(
            (m.syncs, m.plain_step.map(|p| p.round())),
            (1.0, Some(10.0))
        );
        assert!(RoundTimes::default().means_ms().is_none());
        assert_eq!(
            SpecStats::new(DraftMethod::Mtp).depth_histogram(),
            Vec::<usize>::new()
        );
    }
}
