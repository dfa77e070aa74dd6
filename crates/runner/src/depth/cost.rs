//! The cost of a round per draft depth: medians of recent wall times, and a
//! line `c0 + c1·d` through the drafting depths so unseen depths are
//! extrapolated. A measured depth's cost is the line moved towards its own
//! median by as much as the median's departure stands out of the timing
//! noise (pooled over the depths): the line alone mis-models a curve that
//! bends (traced on tiny-mtp's CPU rounds, depths 3-5 sit 1-6 ms under the
//! line through depths 1 and 6, which kept auto off its best depths), and
//! the median alone chases noise on a depth sampled a few times.
//!
//! Depth 0 runs the pipelined plain loop (the next forward is dispatched
//! before the host reads the current token), so it is its own measurement and
//! not a point of the line: a drafted round always waits for its forward.
//! Its cost also carries the drafter's upkeep: the tokens of a plain stretch
//! are forwarded through the draft model in one catch-up when drafting
//! resumes (the MTP head is fed span by span during the stretch, in the
//! plain tokens' own time), a cost per plain token that speculation-off
//! would not pay. The catch-up round also pays a fixed part, whatever the
//! stretch's length, which the line through the catch-ups' excess tells
//! apart ([`CostModel::resume_cost`]).

use std::collections::VecDeque;

/// A sample over this many times its window's median is a stall.
pub(crate) const STALL_FACTOR: f64 = 3.0;
/// Wall times kept per depth. The median of a window shrugs off a stall of
/// the shared host; a short window follows a load that changes.
pub(crate) const WINDOW: usize = 9;
/// Extra cost of one draft depth as a fraction of the cost of a plain step,
/// assumed until two depths are measured: a draft-head step plus one more
/// row in the verify forward.
const PRIOR_SLOPE: f64 = 0.2;
/// Weight of that prior slope against the measured spread of depths
/// (in samples × depth²): about one sample one depth away.
const PRIOR_SLOPE_WEIGHT: f64 = 1.0;

/// The newest samples of one quantity, summarised by their median.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    /// Oldest first; at most `cap`.
    samples: VecDeque<f64>,
    cap: usize,
}

impl Window {
    /// An empty window of `cap` samples.
    pub(crate) fn new(cap: usize) -> Window {
        assert!(cap > 0, "window of {cap} samples");
        Window {
            samples: VecDeque::with_capacity(cap),
            cap,
        }
    }

    /// Adds a sample, dropping the oldest when full (non-finite ones are ignored).
    pub(crate) fn push(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        if self.samples.len() == self.cap {
            self.samples.pop_front();
        }
        self.samples.push_back(x);
    }

    /// Samples held.
    pub(crate) fn len(&self) -> usize {
        self.samples.len()
    }

    /// The median of the samples within [`STALL_FACTOR`] of the plain
    /// median of all, if any sample is held. Stalls only ever slow a round down (a
    /// kernel built on first use, the host busy elsewhere), so a sample
    /// several times the typical one is a stall, not the depth's cost. (Not
    /// the fastest sample as the yardstick: a pipelined plain token whose
    /// forward finished during the previous read is nearly free.)
    pub(crate) fn median(&self) -> Option<f64> {
        let typical = middle(self.samples.iter().copied().collect())?;
        let v: Vec<f64> = self
            .samples
            .iter()
            .copied()
            .filter(|&x| x <= STALL_FACTOR * typical)
            .collect();
        middle(v)
    }

    /// The spread of the samples the median keeps, relative to it: 1.4826
    /// times their median absolute deviation over the median (a standard
    /// deviation that one stall does not inflate). `None` when empty.
    pub(crate) fn spread(&self) -> Option<f64> {
        let m = self.median()?;
        let dev: Vec<f64> = self
            .samples
            .iter()
            .filter(|&&x| x <= STALL_FACTOR * m)
            .map(|&x| (x - m).abs())
            .collect();
        Some(1.4826 * middle(dev)? / m)
    }
}

/// The median of `v` (`None` when empty).
fn middle(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

/// Recent round wall times per depth, and what resuming drafting after plain
/// steps costs.
#[derive(Debug, Clone)]
pub(crate) struct CostModel {
    /// `samples[d]`: the newest wall times of depth-`d` rounds in seconds.
    samples: Vec<Window>,
    /// The catch-up rounds' excess against their plain stretches' lengths.
    upkeep: Upkeep,
}

/// Decayed weighted sums over catch-up rounds of `(1, n, n², e, n·e)`, `n`
/// the plain tokens before the round and `e` its excess over its depth's
/// median, for the least-squares line `e = fixed + per_token · n`. The two
/// parts differ in kind: a per-token part (a drafter that forwards the
/// stretch's tokens when drafting resumes, as a draft model does) is a cost
/// of each plain token; a fixed part (on a GPU, a round whose graph of ops
/// is unlike the rounds' before it, built anew whatever the stretch's
/// length: 3-10 ms on an H100 at tiny-mtp, against 2.3 ms for a round) is a
/// cost of each return to drafting, which only the spacing of probes from
/// plain decides.
#[derive(Debug, Clone, Copy, Default)]
struct Upkeep {
    w: f64,
    n: f64,
    nn: f64,
    e: f64,
    ne: f64,
}

impl Upkeep {
    fn observe(&mut self, n: f64, e: f64) {
        let d = UPKEEP_DECAY;
        self.w = self.w * d + 1.0;
        self.n = self.n * d + n;
        self.nn = self.nn * d + n * n;
        self.e = self.e * d + e;
        self.ne = self.ne * d + n * e;
    }

    /// `(fixed, per_token)`, both at least 0; `(0, 0)` before a catch-up.
    /// While the stretches' lengths hardly vary (a relative spread under
    /// [`UPKEEP_SPREAD`]) the two cannot be told apart, and the whole
    /// excess is taken as fixed: taken per token, the excess of a few
    /// short stretches (seeding's three plain steps) would condemn plain
    /// for good, since only longer stretches could show otherwise; taken
    /// as fixed, a real per-token cost shows once plain's stretches
    /// lengthen (each probe interval doubles the last).
    fn parts(&self) -> (f64, f64) {
        if self.w <= 0.0 || self.n <= 0.0 {
            return (0.0, 0.0);
        }
        let (mn, me) = (self.n / self.w, self.e / self.w);
        let var = self.nn / self.w - mn * mn;
        let all_per_token = (me / mn).max(0.0);
        if var <= (UPKEEP_SPREAD * mn).powi(2) {
            return (me.max(0.0), 0.0);
        }
        let cov = self.ne / self.w - mn * me;
        let per_token = (cov / var).clamp(0.0, all_per_token);
        ((me - per_token * mn).max(0.0), per_token)
    }
}

/// Per-catch-up decay of the upkeep sums.
const UPKEEP_DECAY: f64 = 0.8;
/// The relative spread of the plain stretches' lengths below which a
/// catch-up's excess is not split into a fixed and a per-token part.
const UPKEEP_SPREAD: f64 = 0.25;
/// The relative spread of one round's time assumed until some depth holds
/// [`SPREAD_MIN_SAMPLES`] samples.
const PRIOR_SPREAD: f64 = 0.3;
/// How many standard errors (squared) a median's departure from the line
/// must reach to move the modelled cost half way to it: 2².
const SIGNIFICANCE: f64 = 4.0;
/// Samples a depth needs before its spread counts.
const SPREAD_MIN_SAMPLES: usize = 3;
/// Samples a depth needs before a catch-up at it is compared with its median.
const UPKEEP_MIN_SAMPLES: usize = 3;

impl CostModel {
    /// No samples for depths `0..=max`, keeping the newest `window` per depth.
    pub(crate) fn new(max: usize, window: usize) -> CostModel {
        CostModel {
            samples: vec![Window::new(window); max + 1],
            upkeep: Upkeep::default(),
        }
    }

    /// Records a depth-`depth` round that took `seconds`.
    pub(crate) fn observe(&mut self, depth: usize, seconds: f64) {
        if seconds <= 0.0 {
            return;
        }
        if let Some(s) = self.samples.get_mut(depth) {
            s.push(seconds);
        }
    }

    /// Records a catch-up round at `depth` that took `seconds` after `plain`
    /// plain tokens: its excess over the depth's median (see [`Upkeep`]).
    /// Ignored until the depth and plain steps have medians; the excess is
    /// capped at a plain step per token plus [`STALL_FACTOR`] rounds of the
    /// depth, so one stall cannot condemn plain.
    pub(crate) fn observe_catch_up(&mut self, depth: usize, plain: usize, seconds: f64) {
        if plain == 0 || !seconds.is_finite() || self.count(depth) < UPKEEP_MIN_SAMPLES {
            return;
        }
        let (Some(c), Some(p)) = (self.median(depth), self.median(0)) else {
            return;
        };
        let excess = (seconds - c).clamp(-c, p * plain as f64 + STALL_FACTOR * c);
        self.upkeep.observe(plain as f64, excess);
    }

    /// The drafter's upkeep per plain token, 0 before a catch-up was measured.
    pub(crate) fn upkeep(&self) -> f64 {
        self.upkeep.parts().1
    }

    /// What a return to drafting costs over its round, whatever the plain
    /// stretch before it; 0 before a catch-up was measured.
    pub(crate) fn resume_cost(&self) -> f64 {
        self.upkeep.parts().0
    }

    /// Samples held for `depth`.
    pub(crate) fn count(&self, depth: usize) -> usize {
        self.samples.get(depth).map_or(0, Window::len)
    }

    /// The median wall time of `depth`, if measured.
    pub(crate) fn median(&self, depth: usize) -> Option<f64> {
        self.samples.get(depth)?.median()
    }

    /// `(c0, c1)` of a drafted round's cost `c0 + c1·d`: a weighted least
    /// squares fit of the per-depth medians (weights: samples held), its slope
    /// shrunk towards a prior made from the first measurements and kept
    /// non-negative. `None` before anything was measured.
    pub(crate) fn line(&self) -> Option<(f64, f64)> {
        let points: Vec<(f64, f64, f64)> = (1..self.samples.len())
            .filter_map(|d| self.median(d).map(|m| (d as f64, m, self.count(d) as f64)))
            .collect();
        let plain = self.median(0);
        let Some(&(d1, m1, _)) = points.first() else {
            // Only plain steps so far: a drafted round is a plain step that
            // waits for its forward, plus the draft.
            return plain.map(|p| (p, PRIOR_SLOPE * p));
        };
        // The prior slope: a fraction of a plain step, from the plain
        // median or else from the shallowest drafted depth.
        let unit = plain.unwrap_or(m1 / (1.0 + PRIOR_SLOPE * d1));
        let prior = PRIOR_SLOPE * unit;
        let w: f64 = points.iter().map(|p| p.2).sum();
        let dm = points.iter().map(|p| p.2 * p.0).sum::<f64>() / w;
        let mm = points.iter().map(|p| p.2 * p.1).sum::<f64>() / w;
        let sxx: f64 = points.iter().map(|p| p.2 * (p.0 - dm).powi(2)).sum();
        let sxy: f64 = points.iter().map(|p| p.2 * (p.0 - dm) * (p.1 - mm)).sum();
        let slope = ((sxy + PRIOR_SLOPE_WEIGHT * prior) / (sxx + PRIOR_SLOPE_WEIGHT)).max(0.0);
        // A noisy fit must not make a round nearly free.
        let c0 = (mm - slope * dm).max(0.25 * unit);
        Some((c0, slope))
    }

    /// The relative spread of one round's wall time (a robust standard
    /// deviation over the median), pooled over the depths with enough
    /// samples, weighted by their counts.
    fn noise(&self) -> f64 {
        let (sum, n) = self
            .samples
            .iter()
            .filter(|w| w.len() >= SPREAD_MIN_SAMPLES)
            .filter_map(|w| w.spread().map(|s| (s * w.len() as f64, w.len() as f64)))
            .fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
        if n > 0.0 { sum / n } else { PRIOR_SPREAD }
    }

    /// A drafting depth's modelled cost: the line, moved towards the
    /// depth's own median by as much as the median's departure from the
    /// line stands out of its noise. A departure `δ` against a standard
    /// error `se` of the median moves it by `δ·δ²/(δ² + 4·se²)`
    /// ([`SIGNIFICANCE`]): half way at two standard errors. A curve that
    /// is not a line (kernels chosen by row count, an uneven host) is learnt
    /// where it is measured, while timing noise on a true line is pooled
    /// away by the line through every depth.
    fn bent(&self, d: usize, line: f64, noise: f64) -> f64 {
        let Some(m) = self.median(d) else {
            return line;
        };
        // The standard error of a median of n samples: √(π/2)·σ/√n.
        let se = 1.2533 * noise * line / (self.count(d) as f64).sqrt();
        let delta = m - line;
        let dd = delta * delta;
        if dd + se * se == 0.0 {
            return line;
        }
        line + delta * dd / (dd + SIGNIFICANCE * se * se)
    }

    /// The modelled cost of a depth-`depth` round: at 0 the plain median (or
    /// the line's intercept before plain was measured) plus the upkeep, else
    /// the line bent towards the depth's median ([`CostModel::bent`]).
    #[cfg(test)]
    pub(crate) fn cost(&self, depth: usize) -> Option<f64> {
        self.costs().get(depth).copied().flatten()
    }

    /// [`CostModel::cost`] of every depth `0..=max`, fitting the line once.
    pub(crate) fn costs(&self) -> Vec<Option<f64>> {
        let line = self.line();
        let noise = self.noise();
        (0..self.samples.len())
            .map(|d| match (d, line) {
                (0, _) => self
                    .median(0)
                    .or(line.map(|l| l.0))
                    .map(|c| c + self.upkeep()),
                (_, Some((c0, c1))) => {
                    let line = c0 + c1 * d as f64;
                    Some(self.bent(d, line, noise))
                }
                (_, None) => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_ignores_one_stall() {
        let mut c = CostModel::new(2, WINDOW);
        for s in [0.010, 0.011, 1.0, 0.009] {
            c.observe(1, s);
        }
        // The 1 s stall (over 3× the median) is left out: the median of
        // the other three.
        assert_eq!(c.median(1), Some(0.010));
        // Nearly free samples (a pipelined token already computed) are not
        // the yardstick: the typical 6 ms samples stay.
        let mut c = CostModel::new(2, WINDOW);
        for s in [0.006, 0.0005, 0.006, 0.0061, 0.0004] {
            c.observe(0, s);
        }
        assert_eq!(c.median(0), Some(0.006));
    }

    #[test]
    fn the_window_forgets_old_samples() {
        let mut c = CostModel::new(1, 3);
        for s in [5.0, 5.0, 5.0, 1.0, 1.0] {
            c.observe(1, s);
        }
        assert_eq!(c.count(1), 3);
        assert_eq!(c.median(1), Some(1.0));
    }

    #[test]
    fn catch_up_excess_is_shared_among_the_plain_tokens() {
        let mut c = CostModel::new(2, WINDOW);
        c.observe(0, 0.010);
        c.observe(1, 0.012);
        // Depth 1 not measured enough yet: ignored.
        c.observe_catch_up(1, 10, 0.032);
        assert_eq!(c.cost(0), Some(0.010));
        for _ in 1..UPKEEP_MIN_SAMPLES {
            c.observe(1, 0.012);
        }
        // 10 plain tokens, then a depth-1 round 20 ms over its 12 ms: one
        // stretch length, so no per-token part can be told apart.
        c.observe_catch_up(1, 10, 0.032);
        assert_eq!(c.upkeep(), 0.0);
        assert!((c.resume_cost() - 0.020).abs() < 1e-12);
        assert_eq!(c.cost(0), Some(0.010));
        // Then 30 plain tokens and 60 ms over: 2 ms a token, nothing fixed.
        c.observe_catch_up(1, 30, 0.072);
        assert!((c.upkeep() - 0.002).abs() < 1e-12, "upkeep {}", c.upkeep());
        assert!(c.resume_cost().abs() < 1e-12);
        let c0 = c.cost(0).unwrap();
        assert!((c0 - 0.012).abs() < 1e-12, "cost(0) = {c0}");
        // No plain tokens: nothing to share.
        c.observe_catch_up(1, 0, 1.0);
        assert!((c.upkeep() - 0.002).abs() < 1e-12);
        // A 1 s stall after one plain token is capped at one plain step
        // plus three rounds of the depth (46 ms over its 12 ms): it moves
        // part of the excess from the tokens to the resume, no further.
        c.observe_catch_up(1, 1, 1.0);
        let (fixed, per_token) = (c.resume_cost(), c.upkeep());
        assert!(
            per_token > 0.0 && per_token < 0.002,
            "per token {per_token}"
        );
        assert!(fixed > 0.0 && fixed < 0.046, "fixed {fixed}");
    }

    #[test]
    fn a_resume_cost_and_a_per_token_catch_up_are_told_apart() {
        // Catch-ups after stretches of 8, 16, 32 and 64 plain tokens,
        // each 6 ms plus 0.1 ms a token over a 2 ms round.
        let mut c = CostModel::new(1, WINDOW);
        c.observe(0, 0.001);
        for _ in 0..UPKEEP_MIN_SAMPLES {
            c.observe(1, 0.002);
        }
        for n in [8usize, 16, 32, 64] {
            c.observe_catch_up(1, n, 0.002 + 0.006 + 1e-4 * n as f64);
        }
        assert!(
            (c.resume_cost() - 0.006).abs() < 1e-9,
            "{}",
            c.resume_cost()
        );
        assert!((c.upkeep() - 1e-4).abs() < 1e-9, "{}", c.upkeep());
        // Plain's modelled cost carries the per-token part only.
        assert!((c.cost(0).unwrap() - 0.0011).abs() < 1e-9);
    }

    #[test]
    fn bad_timings_are_dropped() {
        let mut c = CostModel::new(1, 3);
        for s in [f64::NAN, -1.0, 0.0, f64::INFINITY] {
            c.observe(1, s);
        }
        assert_eq!(c.count(1), 0);
        assert_eq!(c.line(), None);
    }

    #[test]
    fn the_line_fits_exact_points_and_extrapolates() {
        let mut c = CostModel::new(6, WINDOW);
        for _ in 0..WINDOW {
            c.observe(0, 0.008);
            for d in 1..=3 {
                c.observe(d, 0.010 + 0.002 * d as f64);
            }
        }
        let (c0, c1) = c.line().unwrap();
        // Tolerance: the prior slope (0.2 × 8 ms = 1.6 ms, weight 1 against
        // 2 × WINDOW) moves the slope by under 0.03 ms.
        assert!((c0 - 0.010).abs() < 1e-4, "c0 = {c0}");
        assert!((c1 - 0.002).abs() < 3e-5, "c1 = {c1}");
        assert_eq!(c.cost(0), Some(0.008));
        let c6 = c.cost(6).unwrap();
        assert!((c6 - 0.022).abs() < 3e-4, "cost(6) = {c6}");
    }

    #[test]
    fn one_depth_extrapolates_with_the_prior_slope() {
        let mut c = CostModel::new(4, WINDOW);
        c.observe(0, 0.010);
        c.observe(2, 0.015);
        let costs = c.costs();
        // Slope: the prior 0.2 × 10 ms; the line passes through depth 2's median.
        let want = [0.010, 0.013, 0.015, 0.017, 0.019];
        for (d, (got, want)) in costs.iter().zip(want).enumerate() {
            let got = got.unwrap();
            assert!((got - want).abs() < 1e-12, "cost({d}) = {got}, want {want}");
        }
    }

    /// Depths 1-4 on the line `10 + 2·d` ms with relative jitter `spread`
    /// (nine evenly spaced offsets in `±spread`, so each median is exact),
    /// depth `off` moved by the factor `bend`; returns the modelled cost of
    /// `off` over the fitted line there, and over the depth's median.
    fn bent_at(off: usize, bend: f64, spread: f64) -> (f64, f64) {
        let mut c = CostModel::new(6, WINDOW);
        for i in 0..WINDOW {
            let u = -1.0 + 2.0 * i as f64 / (WINDOW - 1) as f64;
            c.observe(0, 0.010);
            for d in 1..=4 {
                let f = if d == off { bend } else { 1.0 };
                c.observe(d, (0.010 + 0.002 * d as f64) * (f + spread * u));
            }
        }
        let (c0, c1) = c.line().unwrap();
        let cost = c.cost(off).unwrap();
        (cost / (c0 + c1 * off as f64), cost / c.median(off).unwrap())
    }

    #[test]
    fn a_measured_depth_leaves_the_line_as_far_as_it_stands_out_of_the_noise() {
        // Quiet timings (±1%), depth 4 at 20% over the line: its own median.
        let (_, to_median) = bent_at(4, 1.2, 0.01);
        assert!((to_median - 1.0).abs() < 0.01, "{to_median}");
        // Noisy timings (±30%, a robust spread of 22%), depth 3 at 5% over:
        // within 1% of the line (the median's standard error is 9%).
        let (to_line, _) = bent_at(3, 1.05, 0.3);
        assert!((to_line - 1.0).abs() < 0.01, "{to_line}");
        // Control: the same 5% with quiet timings is followed.
        let (to_line, to_median) = bent_at(3, 1.05, 0.01);
        assert!(
            to_line > 1.03 && (to_median - 1.0).abs() < 0.01,
            "{to_line} {to_median}"
        );
        // Unmeasured depths stay on the line.
        let mut c = CostModel::new(6, WINDOW);
        c.observe(0, 0.010);
        c.observe(2, 0.015);
        let (c0, c1) = c.line().unwrap();
        assert!((c.cost(5).unwrap() - (c0 + 5.0 * c1)).abs() < 1e-15);
    }

    #[test]
    fn only_plain_steps_still_give_every_depth_a_cost() {
        let mut c = CostModel::new(3, WINDOW);
        assert_eq!(c.costs(), vec![None; 4]);
        c.observe(0, 0.010);
        assert!(c.costs().iter().all(Option::is_some), "{:?}", c.costs());
    }
}
