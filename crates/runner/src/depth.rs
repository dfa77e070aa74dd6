//! Choosing the draft depth per round: fixed, or the depth that maximises
//! expected committed tokens per second.
//!
//! The auto controller keeps two models. Acceptance (`depth/acceptance.rs`):
//! the conditional rate `a_i` of each draft position (accepted given that
//! drafts `1..i` were), from decayed counts of the rounds that reached it, so
//! it follows the text. Cost (`depth/cost.rs`): the median of the recent wall
//! times of each depth, a least-squares line `c0 + c1·d` through the drafting
//! depths so a depth not yet tried is extrapolated rather than assumed bad
//! (a measured depth's cost leaves the line for its own median as far as the
//! median's departure stands out of the timing noise: real curves bend, as a
//! kernel chosen by row count does), and for depth 0 (the pipelined plain loop, measured on its own) the
//! drafter's catch-up per plain token; what a return to drafting costs
//! whatever the plain stretch before it is a separate figure, charged to
//! leaving plain (spread over [`PROBE_MAX`] rounds) and to the spacing of
//! probes from settled plain. Each round takes
//! `argmax_d E[committed | d] / cost(d)` with
//! `E[committed | d] = 1 + Σ_{j≤d} Π_{i≤j} a_i` (the bonus or replacement
//! token always commits), so speculation switches itself off when it does not
//! pay. Every few rounds it probes a neighbour of the best depth (one deeper,
//! then one shallower; from plain, the drafting depth the model rates best;
//! from a drafting depth, plain once its samples are [`PLAIN_STALE_ROUNDS`]
//! old and it is not far behind, or [`PLAIN_THIN_ROUNDS`] old and only the
//! seeding's few, for five timed tokens) so stale estimates
//! get refreshed; a probe of a depth with fewer than three
//! cost samples runs until it has three, so one dear round (a first use of
//! the depth's shapes on a GPU) does not stand for the depth; the interval doubles
//! while probes leave the choice alone and resets when the choice moves (a
//! session's next request keeps the interval reached). Once plain is
//! settled, a probe also waits until its modelled excess over plain is at
//! most 2 % of the time since the last one, so where drafting costs far more
//! than it commits, auto stays near plain's speed.
//! Each decision is logged at `debug` level and each round at `trace` level
//! (target `runner::depth`).

mod acceptance;
mod cost;
#[cfg(test)]
mod sim;

use acceptance::{Acceptance, expected_committed};
use cost::CostModel;

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

/// The drafting depth measured first (capped by the policy's max): the
/// cheapest one; the cost line's prior slope extrapolates deeper ones.
const SEED_DEPTH: usize = 1;
/// Timings kept at the seed depth, then at depth 0, before modelling: a
/// median of three survives one stalled round.
const SEED_ROUNDS: usize = 3;
/// How much dearer than modelled a round must be to be held back as a stall
/// (see [`DepthController::record`]).
const STALL_FACTOR: f64 = 3.0;
/// The same for a depth's first timed round, whose cost the model only
/// extrapolates: a first round still paying for shapes built on first use
/// (1.8× the depth's cost, traced on an H100) would otherwise be the
/// depth's only sample, fix the cost line's slope through it, and keep
/// every deeper depth condemned for the rest of the request.
const FIRST_STALL_FACTOR: f64 = 1.5;
/// Rounds after which plain's cost samples are stale while drafting is the
/// choice: the next shallower probe then measures plain for six rounds (five
/// timed tokens, most of a cost window) instead of probing one shallower. Plain is
/// otherwise sampled only while it is the choice, and a fresh process's
/// first plain tokens (1.0-1.4 ms against 0.80 at its median on an H100,
/// tiny-mtp f32, shapes still being built) stood for plain from then on:
/// auto drafted at depth 2 for the rest of the process, at 0.77 × plain.
const PLAIN_STALE_ROUNDS: u64 = 2 * PROBE_MAX;
/// Only while plain's modelled throughput is at least this share of the
/// best depth's: where drafting is far ahead (2× plain at the 8B shape), a
/// refresh of plain would cost about 4 % of the rounds for nothing.
const PLAIN_STALE_NEAR: f64 = 0.75;
/// Plain cost samples below which a stale plain is measured afresh however
/// far behind it is modelled: the seeding rounds' three samples, taken as
/// a fresh process builds its first shapes (2.0 ms a token on an H100,
/// tiny-mtp f32, against 1.07 at the process's median), put plain at half
/// the best depth's throughput, out of [`PLAIN_STALE_NEAR`]'s reach, for
/// the rest of the process. One refresh fills the window past this. Such
/// samples are stale after [`PLAIN_THIN_ROUNDS`]: the first shapes are
/// built by then.
const PLAIN_THIN: usize = cost::WINDOW / 2 + 1;
const PLAIN_THIN_ROUNDS: u64 = PROBE_MAX / 2;
/// Rounds between probes right after the choice moved, and the cap the
/// interval doubles up to while probes leave it alone.
const PROBE_MIN: u64 = 8;
const PROBE_MAX: u64 = 64;
/// The most of its time settled plain decoding spends on probing drafting
/// depths: where a drafted round costs several plain tokens' time, a probe
/// waits longer than [`PROBE_MAX`] rounds (a GPU process whose draft steps
/// ran at half speed lost ~10 % against plain to probes every 64 tokens;
/// see `depth/sim.rs`). Only settled plain: elsewhere a probe may be what
/// corrects a wrong rating, which the budget would trust.
const PROBE_BUDGET: f64 = 0.02;

/// The share of a request's acceptance evidence the next request of the
/// same session starts with: about ten rounds' worth, so a new text takes
/// over within a few rounds while the first choices are already informed.
const CARRIED_ACCEPTANCE: f64 = 0.3;

/// What an auto controller learned in one request, for the next request of
/// the same session: the round costs are the model's on this machine and
/// carry over whole; the acceptance carries over at [`CARRIED_ACCEPTANCE`]
/// of its weight. A session's later requests then skip the seeding rounds
/// and start at the depth the last one found best.
#[derive(Debug, Clone)]
pub(crate) struct Learned {
    policy: DepthPolicy,
    acceptance: Acceptance,
    cost: CostModel,
    best: usize,
    /// The probe interval reached: a settled choice stays settled, rather
    /// than each request probing again after [`PROBE_MIN`] rounds.
    probe_every: u64,
    /// Rounds recorded, and the round of plain's newest cost sample.
    rounds: u64,
    plain_at: u64,
}

/// Why a depth was chosen (logged with each decision).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reason {
    Fixed,
    Seed,
    Best,
    Probe,
}

/// The per-request depth controller.
#[derive(Debug, Clone)]
pub(crate) struct DepthController {
    policy: DepthPolicy,
    acceptance: Acceptance,
    cost: CostModel,
    /// The depth with the best modelled throughput at the last decision.
    best: usize,
    /// Rounds since the last probe, and the rounds to wait for the next.
    since_probe: u64,
    probe_every: u64,
    /// Whether the next probe goes one deeper (else one shallower).
    probe_up: bool,
    /// Whether the last probe from plain went to the drafting depth the
    /// model rates best (else to depth 1).
    probe_far: bool,
    /// The depth of a probe still running and its rounds left after this one.
    probe: Option<(usize, usize)>,
    /// The depth of the last recorded round (`None` before the first).
    last: Option<usize>,
    /// Plain rounds since the last drafted one.
    plain_run: usize,
    /// `held[d]`: the last depth-`d` round was held back as a stall.
    held: Vec<bool>,
    /// Rounds recorded (over the session's requests), and the round of
    /// plain's newest cost sample.
    rounds: u64,
    plain_at: u64,
}

impl DepthController {
    /// A controller for `policy`.
    pub(crate) fn new(policy: DepthPolicy) -> DepthController {
        DepthController::with_window(policy, cost::WINDOW)
    }

    /// A controller for `policy` that starts from what an earlier request of
    /// the same session learned, when it ran under the same policy.
    pub(crate) fn resume(policy: DepthPolicy, learned: Option<&Learned>) -> DepthController {
        let mut d = DepthController::new(policy);
        if let Some(l) = learned.filter(|l| l.policy == policy) {
            d.acceptance = l.acceptance.carried(CARRIED_ACCEPTANCE);
            d.cost = l.cost.clone();
            d.best = l.best;
            d.probe_every = l.probe_every;
            d.rounds = l.rounds;
            d.plain_at = l.plain_at;
        }
        d
    }

    /// What this request learned, for the session's next one (`None` under a
    /// fixed depth: there is nothing to choose).
    pub(crate) fn learned(&self) -> Option<Learned> {
        matches!(self.policy, DepthPolicy::Auto { .. }).then(|| Learned {
            policy: self.policy,
            acceptance: self.acceptance.clone(),
            cost: self.cost.clone(),
            best: self.best,
            probe_every: self.probe_every,
            rounds: self.rounds,
            plain_at: self.plain_at,
        })
    }

    /// A controller whose cost medians span the newest `window` rounds per depth.
    fn with_window(policy: DepthPolicy, window: usize) -> DepthController {
        let max = match policy {
            DepthPolicy::Fixed(n) => n,
            DepthPolicy::Auto { max } => max,
        };
        DepthController {
            policy,
            acceptance: Acceptance::new(max),
            cost: CostModel::new(max, window),
            best: 0,
            since_probe: 0,
            probe_every: PROBE_MIN,
            probe_up: true,
            probe_far: false,
            probe: None,
            last: None,
            plain_run: 0,
            held: vec![false; max + 1],
            rounds: 0,
            plain_at: 0,
        }
    }

    /// Modelled tokens per second of each depth `0..=max` (`None` before any timing).
    pub(crate) fn throughput(&self) -> Vec<Option<f64>> {
        self.throughput_from(0.0)
    }

    /// [`DepthController::throughput`] with `extra` seconds added to every
    /// drafting depth's round.
    fn throughput_from(&self, extra: f64) -> Vec<Option<f64>> {
        let e = expected_committed(&self.acceptance.rates());
        self.cost
            .costs()
            .into_iter()
            .zip(e)
            .enumerate()
            .map(|(d, (c, e))| c.map(|c| e / (c + if d > 0 { extra } else { 0.0 })))
            .collect()
    }

    /// The depth for the next round, at most `budget` (tokens the request may still add minus one).
    pub(crate) fn choose(&mut self, budget: usize) -> usize {
        let (k, reason) = match self.policy {
            DepthPolicy::Fixed(n) => (n, Reason::Fixed),
            DepthPolicy::Auto { max } => self.choose_auto(max),
        };
        let k = k.min(budget);
        if reason != Reason::Fixed && tracing::enabled!(tracing::Level::DEBUG) {
            self.log(k, reason);
        }
        k
    }

    fn choose_auto(&mut self, max: usize) -> (usize, Reason) {
        if let Some((k, left)) = self.probe {
            self.probe = left.checked_sub(1).map(|l| (k, l));
            return (k, Reason::Probe);
        }
        let seed = SEED_DEPTH.min(max);
        if self.cost.count(seed) < SEED_ROUNDS {
            return (seed, Reason::Seed);
        }
        if self.cost.count(0) < SEED_ROUNDS {
            return (0, Reason::Seed);
        }
        let throughput = self.throughput_from(self.resume_share());
        let best_of = |from: usize| best_from(&throughput, from);
        let best = best_of(0).unwrap_or(0);
        if best != self.best {
            self.best = best;
            self.probe_every = PROBE_MIN;
            self.since_probe = 0;
        }
        self.since_probe += 1;
        if self.since_probe < self.probe_every {
            return (best, Reason::Best);
        }
        // Probe a neighbour: one deeper refreshes the acceptance of the next
        // position, one shallower the cost of cheaper rounds. Until the choice
        // moves, each probe waits twice as long as the last.
        let up = (self.probe_up || best == 0) && best < max;
        let stale_plain = self.plain_is_stale(&throughput, best);
        let k = match (up, best) {
            // From plain, the drafting depth the model rates best: one
            // deeper (depth 1) may lose alone while deeper ones pay, as on
            // a launch-bound GPU where rounds cost about the same at every
            // depth, and early dear rounds may have condemned those.
            // Every other probe from plain, so depth 1's own measurements
            // keep a noisy line from luring plain away.
            (true, 0) if !self.probe_far => best_of(1).unwrap_or(1),
            (true, 0) => 1,
            (true, _) => best + 1,
            (false, 0) => best,
            (false, _) if stale_plain => 0,
            (false, _) => best - 1,
        };
        // Once plain has stayed the choice through probes up to the longest
        // interval, a probe the model rates far worse waits until it costs
        // at most `PROBE_BUDGET` of the time spent since the last one.
        let settled_plain = best == 0 && self.probe_every >= PROBE_MAX;
        if settled_plain && k != best && (self.since_probe as f64) < self.plain_probe_spacing(k) {
            return (best, Reason::Best);
        }
        self.since_probe = 0;
        self.probe_every = (self.probe_every * 2).min(PROBE_MAX);
        self.probe_up = !up;
        if k == best {
            return (best, Reason::Best);
        }
        if k == 0 && stale_plain {
            // Six rounds, five timed (a stretch's last is no sample): most of
            // the window afresh.
            self.probe = Some((0, cost::WINDOW / 2));
            return (0, Reason::Probe);
        }
        // A depth measured fewer than `SEED_ROUNDS` times is probed until it
        // has that many samples, so that its median outvotes one dear
        // round (a first use of its shapes) rather than being it. The
        // first drafted round after plain steps is not timed (see
        // `record`): one more round then.
        let rounds = SEED_ROUNDS.saturating_sub(self.cost.count(k)).max(1) + usize::from(best == 0);
        if best == 0 {
            self.probe_far = !self.probe_far;
        }
        self.probe = (rounds > 1).then(|| (k, rounds - 2));
        (k, Reason::Probe)
    }

    /// Whether plain's cost samples are [`PLAIN_STALE_ROUNDS`] old and
    /// either fewer than [`PLAIN_THIN`] or its modelled `throughput` within
    /// [`PLAIN_STALE_NEAR`] of depth `best`'s.
    fn plain_is_stale(&self, throughput: &[Option<f64>], best: usize) -> bool {
        let at = |k: usize| throughput.get(k).copied().flatten().unwrap_or(0.0);
        let age = self.rounds - self.plain_at;
        let near = age >= PLAIN_STALE_ROUNDS && at(0) >= PLAIN_STALE_NEAR * at(best);
        near || (age >= PLAIN_THIN_ROUNDS && self.cost.count(0) < PLAIN_THIN)
    }

    /// What a drafting round pays for leaving plain: after plain rounds,
    /// the return to drafting (`CostModel::resume_cost`) spread over
    /// [`PROBE_MAX`] rounds, the most a choice is kept between probes; else
    /// 0. Where drafting and plain are within a few percent, switching back
    /// and forth would pay it each time.
    fn resume_share(&self) -> f64 {
        if self.plain_run > 0 {
            self.cost.resume_cost() / PROBE_MAX as f64
        } else {
            0.0
        }
    }

    /// Plain tokens after which a probe of drafting depth `k` costs at most
    /// [`PROBE_BUDGET`] of the time they took: the probe's two rounds over
    /// the plain time of the tokens they are expected to commit, plus what
    /// resuming drafting costs (`CostModel::resume_cost`), over a plain
    /// token's cost. Zero while either cost is unknown.
    fn plain_probe_spacing(&self, k: usize) -> f64 {
        let costs = self.cost.costs();
        let e = expected_committed(&self.acceptance.rates());
        let (Some(plain), Some(ck), Some(&ek)) = (
            costs.first().copied().flatten(),
            costs.get(k).copied().flatten(),
            e.get(k),
        ) else {
            return 0.0;
        };
        (self.cost.resume_cost() + 2.0 * (ck - ek * plain).max(0.0)) / (PROBE_BUDGET * plain)
    }

    fn log(&self, k: usize, reason: Reason) {
        let ms = |x: Option<f64>| x.map_or(f64::NAN, |c| (c * 1e5).round() / 100.0);
        let costs: Vec<f64> = self.cost.costs().into_iter().map(ms).collect();
        let tps: Vec<f64> = self
            .throughput()
            .into_iter()
            .map(|t| t.map_or(f64::NAN, |t| t.round()))
            .collect();
        let acceptance: Vec<f64> = self
            .acceptance
            .rates()
            .iter()
            .map(|a| (a * 1000.0).round() / 1000.0)
            .collect();
        tracing::debug!(
            depth = k,
            reason = ?reason,
            best = self.best,
            probe_every = self.probe_every,
            cost_ms = ?costs,
            tokens_per_s = ?tps,
            acceptance = ?acceptance,
            "draft depth"
        );
    }

    /// Records a finished round: `drafted` tokens proposed, `accepted` kept, `seconds` of wall time.
    ///
    /// A drafted round right after plain steps (or first in the request) is
    /// not a cost sample of its depth: it carries the drafter's catch-up over
    /// the tokens committed meanwhile (the MTP head forwards its pending
    /// pairs, a draft model its pending tokens; first of all, the prompt's).
    /// Its excess over the depth's median is charged to those plain tokens.
    ///
    /// A round over [`STALL_FACTOR`] times its depth's modelled cost is held
    /// back once: such stalls are kernels built on first use of an op or a
    /// shape (NVRTC on CUDA, pipeline states on Metal; seconds in a fresh
    /// process), and one sample would charge them to the depth for the rest
    /// of the request. A second such round in a row at that depth is a real
    /// change (a loaded machine) and counts.
    pub(crate) fn record(&mut self, drafted: usize, accepted: usize, seconds: f64) {
        self.record_round(drafted, accepted, Some(seconds));
    }

    /// Records a finished plain round whose wall time is not a sample of a
    /// plain token's cost: the last round of a plain stretch, whose read
    /// waited for a forward already dispatched while the next one was not
    /// built (the handover's drafted round builds it), so it took about
    /// the forward alone where a pipelined token also pays the host's build
    /// of the next step. Timed, such rounds made plain look up to 2.5×
    /// cheaper in short stretches (tiny-mtp bf16 on the CPU: 1.6 ms against
    /// 4.4), and auto alternated two plain rounds with one drafted round
    /// for a third of a request at 0.91 of the best fixed depth.
    pub(crate) fn record_untimed_plain(&mut self) {
        self.record_round(0, 0, None);
    }

    fn record_round(&mut self, drafted: usize, accepted: usize, seconds: Option<f64>) {
        let catch_up = drafted > 0 && self.last.is_none_or(|l| l == 0);
        self.acceptance.observe(drafted, accepted);
        if let Some(seconds) = seconds {
            self.observe_cost(drafted, accepted, seconds, catch_up);
        } else {
            tracing::trace!(drafted, accepted, "round (untimed)");
        }
        self.plain_run = if drafted == 0 { self.plain_run + 1 } else { 0 };
        self.last = Some(drafted);
        self.rounds += 1;
    }

    /// A timed round's cost sample: a catch-up's excess goes to the plain
    /// tokens before it, a first stall is held back.
    fn observe_cost(&mut self, drafted: usize, accepted: usize, seconds: f64, catch_up: bool) {
        let factor = if self.cost.count(drafted) == 0 {
            FIRST_STALL_FACTOR
        } else {
            STALL_FACTOR
        };
        let stall = self
            .cost
            .costs()
            .get(drafted)
            .copied()
            .flatten()
            .is_some_and(|c| seconds > factor * c);
        // Held back when a stall follows a round that was not held.
        let held = self.held.get_mut(drafted).is_some_and(|h| {
            let hold = stall && !*h;
            *h = hold;
            hold
        });
        tracing::trace!(
            drafted,
            accepted,
            ms = seconds * 1e3,
            catch_up,
            held,
            "round"
        );
        if catch_up {
            self.cost.observe_catch_up(drafted, self.plain_run, seconds);
        } else if !held {
            self.cost.observe(drafted, seconds);
            if drafted == 0 {
                self.plain_at = self.rounds;
            }
        }
    }
}

/// The depth from `from` up with the highest modelled `throughput` (the
/// shallowest of equals; `None` when none is modelled).
fn best_from(throughput: &[Option<f64>], from: usize) -> Option<usize> {
    throughput
        .iter()
        .enumerate()
        .skip(from)
        .filter_map(|(k, t)| t.map(|t| (k, t)))
        .fold(None, |b: Option<(usize, f64)>, x| match b {
            Some(b) if b.1 >= x.1 => Some(b),
            _ => Some(x),
        })
        .map(|b| b.0)
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
    fn auto_seeds_at_depth_one_then_plain_and_skips_catch_up_rounds() {
        let mut d = DepthController::new(DepthPolicy::Auto { max: 6 });
        let mut picks = Vec::new();
        for _ in 0..2 * SEED_ROUNDS + 1 {
            let k = d.choose(100);
            picks.push(k);
            d.record(k, k, 0.01);
        }
        // The first round (the prompt's catch-up) is not timed.
        assert_eq!(picks, [1, 1, 1, 1, 0, 0, 0]);
        assert_eq!(d.cost.count(1), SEED_ROUNDS);
    }

    #[test]
    fn an_untimed_plain_round_is_plain_but_no_cost_sample() {
        let mut d = DepthController::new(DepthPolicy::Auto { max: 2 });
        // The first drafted round is the prompt's catch-up: three samples.
        for _ in 0..4 {
            d.record(1, 1, 0.02);
        }
        for _ in 0..3 {
            d.record(0, 0, 0.01);
        }
        let plain = d.cost.median(0);
        for _ in 0..5 {
            d.record_untimed_plain();
        }
        assert_eq!(d.cost.count(0), 3);
        assert_eq!(d.cost.median(0), plain);
        // Still plain steps: the next drafted round is a catch-up, no sample.
        d.record(1, 1, 0.5);
        assert_eq!(d.cost.count(1), 3);
        assert_eq!(d.cost.median(1), Some(0.02));
    }

    #[test]
    fn a_drafted_round_after_plain_steps_is_not_a_cost_sample() {
        let mut d = DepthController::new(DepthPolicy::Auto { max: 2 });
        for (k, s) in [
            (0, 0.01),
            (1, 9.0),
            (1, 0.02),
            (0, 0.01),
            (2, 9.0),
            (1, 0.02),
        ] {
            d.record(k, k, s);
        }
        assert_eq!(d.cost.median(1), Some(0.02));
        assert_eq!(d.cost.median(2), None);
    }

    #[test]
    fn a_round_far_dearer_than_modelled_is_held_back_once() {
        let mut d = DepthController::new(DepthPolicy::Auto { max: 4 });
        // Depth 1 after the prompt (a catch-up), depth 3 twice: its first
        // round paid for kernels built on first use. Depth 2's first round
        // costs about what the line predicts: a sample.
        for (k, s) in [
            (1, 5.0),
            (1, 0.02),
            (3, 2.0),
            (3, 0.03),
            (3, 0.031),
            (2, 0.025),
        ] {
            d.record(k, k, s);
        }
        assert_eq!(d.cost.count(1), 1);
        assert_eq!(d.cost.count(3), 2);
        assert_eq!(d.cost.median(3), Some(0.0305));
        assert_eq!(d.cost.count(2), 1);
        // Stalls at depth 3 again: the first is held back, a second in a
        // row counts (the machine got slower), a third is held back again.
        for s in [1.0, 1.0, 1.0] {
            d.record(3, 3, s);
        }
        assert_eq!(d.cost.count(3), 3);
    }

    #[test]
    fn a_resumed_controller_skips_the_seeding_rounds() {
        let policy = DepthPolicy::Auto { max: 4 };
        let mut d = DepthController::new(policy);
        // Depth 3 is cheap and always accepted; plain is dear.
        for (k, n) in [(1, 4), (0, 4), (3, cost::WINDOW + 2)] {
            for _ in 0..n {
                d.record(k, k, if k == 3 { 0.021 } else { 0.02 });
            }
        }
        let best = d.choose(100);
        assert!(best >= 3, "chose {best}");
        let learned = d.learned().expect("auto learns");
        let mut next = DepthController::resume(policy, Some(&learned));
        assert_eq!(next.choose(100), best, "no seeding at depth 1");
        // Another policy starts afresh; a fixed depth learns nothing.
        let mut other = DepthController::resume(DepthPolicy::Auto { max: 6 }, Some(&learned));
        assert_eq!(other.choose(100), SEED_DEPTH);
        assert!(
            DepthController::new(DepthPolicy::Fixed(2))
                .learned()
                .is_none()
        );
    }

    #[test]
    fn an_unmeasured_deeper_depth_is_tried_when_the_model_favours_it() {
        let mut d = DepthController::new(DepthPolicy::Auto { max: 6 });
        // Seeding: every draft accepted, depth 1 barely dearer than plain.
        for k in [1, 1, 1, 1, 0, 0, 0] {
            assert_eq!(d.choose(100), k);
            d.record(k, k, if k == 0 { 0.010 } else { 0.011 });
        }
        let next = d.choose(100);
        assert!(next > 1, "extrapolation should go deeper, chose {next}");
    }

    /// An auto controller (max depth 2) seeded and then run for `rounds`
    /// rounds at the fixed per-depth `cost`, every drafted round committing
    /// two tokens (the first draft always accepted, the second never); its
    /// choices.
    fn picks_at(d: &mut DepthController, cost: [f64; 3], rounds: u64) -> Vec<usize> {
        for k in [1, 1, 1, 1, 0, 0, 0] {
            d.record(k, k, cost[k]);
        }
        (0..rounds)
            .map(|_| {
                let k = d.choose(1000);
                d.record(k, k.min(1), cost[k]);
                k
            })
            .collect()
    }

    #[test]
    fn stale_plain_samples_are_measured_afresh_from_a_drafting_depth() {
        let mut d = DepthController::new(DepthPolicy::Auto { max: 2 });
        // Depth 1 at 2.4 ms a round is best (833 tokens/s), plain at 1.5 ms
        // a token (667) within reach.
        let picks = picks_at(&mut d, [1.5e-3, 2.4e-3, 2.5e-3], 3 * PLAIN_STALE_ROUNDS);
        let runs: Vec<usize> = picks
            .split(|&k| k != 0)
            .map(<[usize]>::len)
            .filter(|&n| n > 0)
            .collect();
        assert!(
            runs.contains(&(cost::WINDOW / 2 + 2)),
            "no six-round plain probe: {picks:?}"
        );
        assert!(d.cost.count(0) > 3, "{picks:?}");
        // Control: a fresh plain sample resets the clock.
        assert!(d.rounds - d.plain_at < PLAIN_STALE_ROUNDS, "{picks:?}");
    }

    #[test]
    fn thin_plain_samples_far_behind_are_measured_afresh_once() {
        let mut d = DepthController::new(DepthPolicy::Auto { max: 2 });
        // As above, but plain at 3 ms a token (333 tokens/s) is far behind
        // depth 1 (833): only the seeding's three plain samples are thin.
        let picks = picks_at(&mut d, [3.0e-3, 2.4e-3, 2.5e-3], 4 * PLAIN_STALE_ROUNDS);
        // One six-round plain probe, within the first half of the probe cap
        // and a probe interval, and none after it: plain is no longer thin
        // (one-round probes of plain from depth 1 go on as before).
        let six = cost::WINDOW / 2 + 2;
        let starts: Vec<usize> = (0..picks.len() - six)
            .filter(|&i| picks[i..i + six].iter().all(|&k| k == 0))
            .collect();
        assert_eq!(starts.len(), 1, "{picks:?}");
        assert!(
            starts[0] as u64 <= PLAIN_THIN_ROUNDS + PROBE_MAX,
            "{picks:?}"
        );
        assert!(d.cost.count(0) >= PLAIN_THIN, "{picks:?}");
    }

    #[test]
    fn a_budget_caps_an_auto_choice() {
        let mut d = DepthController::new(DepthPolicy::Auto { max: 6 });
        assert_eq!(d.choose(0), 0);
    }

    #[test]
    fn a_single_stall_does_not_move_the_choice() {
        let mut d = DepthController::new(DepthPolicy::Auto { max: 4 });
        for k in 0..=4 {
            for _ in 0..cost::WINDOW {
                d.record(k, k, 0.010 + 0.001 * k as f64);
            }
        }
        let before = d.throughput();
        // A 100x stall at the best depth.
        d.record(4, 4, 1.0);
        let after = d.throughput();
        let best = |t: &[Option<f64>]| {
            (0..t.len())
                .max_by(|&a, &b| t[a].unwrap().total_cmp(&t[b].unwrap()))
                .unwrap()
        };
        assert_eq!(best(&before), 4);
        assert_eq!(best(&after), 4, "{after:?}");
    }
}
