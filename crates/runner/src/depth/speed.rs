//! The host's speed: a factor that every round shares and that drifts.
//!
//! A round's log wall time is modelled as `s + f + μ_d + ε`:
//! - `s`, the host's slow drift (a shared machine's load, its clocks): an
//!   AR(1) over tens of rounds;
//! - `f`, its fast wobble: an AR(1) over a few rounds;
//! - `μ_d`, depth `d`'s own log cost, nearly constant;
//! - `ε`, white noise.
//!
//! A Kalman filter over `(s, f, μ_0, …, μ_max)` splits each round's surprise
//! between the host and the depth by how well each is known. Once a depth
//! has been measured, a run of dearer rounds at it is mostly the host, so
//! depths measured at different times are compared as if measured together,
//! and a probe is compared with the rounds just before it. The cost model
//! (`depth/cost.rs`) keeps each sample divided by the host's slowness
//! predicted for its round and gives costs at the slowness now; the depths'
//! costs themselves stay the model's medians.
//!
//! The wobble's share of the fast noise is measured, not assumed: it is
//! the lag-one covariance of consecutive rounds' departures over their
//! variance (over [`FAST_PERSIST`]). Where rounds are independent (timing
//! noise that does not persist) the share is 0 and the wobble stays 0, so
//! a lone dear round is not carried into the next one's sample.
//!
//! Measured on the replay of tiny-mtp's CPU rounds (`depth/sim.rs`, 40
//! seeds, auto over the best fixed depth), with the filter against
//! without: 0.967 / 0.966 under fast drifting noise (±30 %, lag-one 0.7),
//! 0.972 / 0.961, 0.979 / 0.973 and 0.969 / 0.964 with slow spells as
//! well, 0.955 / 0.960 under independent ±50 % noise. On the CPU bench
//! (tiny f32, 10 passes, runs in the order off, on, on, off; on with a slow
//! persistence of 0.95) auto spent
//! 249 and 601 of about 3,500 rounds at depths 4-6 with it against 1,006
//! and 661 without; its throughput over the best fixed depth (0.996 and
//! 0.974 against 0.980 and 1.056) was inside the runs' noise.

/// Lag-one persistence of the host's slow drift, per observed round.
const PERSIST: f64 = 0.99;
/// Stationary standard deviation of the slow drift (log time): a shared
/// 2-core CPU's requests differ by 0.08-0.13.
const DRIFT_SD: f64 = 0.1;
/// Lag-one persistence of the fast wobble: the 2-core CPU's round times
/// have a lag-one correlation of 0.67, an H100's 0.47-0.60.
const FAST_PERSIST: f64 = 0.7;
/// The largest share of the fast noise's variance given to the wobble.
const MAX_FAST_SHARE: f64 = 0.95;
/// Per-round variance added to every depth's own log cost.
const COST_DRIFT_VAR: f64 = 1e-6;
/// The smallest variance of a round's fast noise assumed.
const MIN_NOISE_VAR: f64 = 1e-4;
/// The fast noise's variance assumed before any round (a relative standard
/// deviation of 0.3).
const PRIOR_FAST_VAR: f64 = 0.09;
/// Rounds the fast noise's moments are averaged over.
const FAST_ROUNDS: f64 = 32.0;
/// Innovations are clipped to this many of their standard deviations, so
/// one stall moves the estimates by a bounded step.
const CLIP: f64 = 2.5;
/// Departures are clipped to this many standard deviations of the fast
/// noise before they are folded into its moments.
const DEPARTURE_CLIP: f64 = 4.0;
/// Host states before the depths' costs.
const HOST: usize = 2;

/// The filter: the mean and covariance of `(s, f, μ_0, …, μ_max)`.
#[derive(Debug, Clone)]
pub(crate) struct Speed {
    x: Vec<f64>,
    p: Vec<Vec<f64>>,
    /// `seen[d]`: depth `d` has had a round.
    seen: Vec<bool>,
    /// The fast noise's variance (a round's departure from its depth's
    /// cost at the slow drift), the covariance of consecutive departures,
    /// the rounds they average over, and the last departure.
    fast_var: f64,
    fast_cov: f64,
    fast_n: f64,
    last: Option<f64>,
    /// Off (`MTP_DEPTH_SPEED=0`): the host is taken as steady.
    on: bool,
}

impl Speed {
    /// A steady host (known) and unknown costs for depths `0..=max`.
    /// `MTP_DEPTH_SPEED=0` turns the filter off (A/B runs).
    pub(crate) fn new(max: usize) -> Speed {
        Speed::with(
            max,
            std::env::var("MTP_DEPTH_SPEED").map_or(true, |v| v != "0"),
        )
    }

    /// [`Speed::new`], on or off (a steady host, always).
    pub(crate) fn with(max: usize, on: bool) -> Speed {
        let n = max + 1 + HOST;
        Speed {
            x: vec![0.0; n],
            p: vec![vec![0.0; n]; n],
            seen: vec![false; max + 1],
            fast_var: PRIOR_FAST_VAR,
            fast_cov: 0.0,
            fast_n: 0.0,
            last: None,
            on,
        }
    }

    /// The host's log slowness for rounds to come: its slow drift.
    pub(crate) fn log_slowness(&self) -> f64 {
        PERSIST * self.x[0]
    }

    /// The host's whole log slowness predicted for the next round.
    pub(crate) fn log_slowness_next(&self) -> f64 {
        PERSIST * self.x[0] + FAST_PERSIST * self.x[1]
    }

    /// The wobble's share of the fast noise, as measured.
    fn fast_share(&self) -> f64 {
        (self.fast_cov / self.fast_var.max(MIN_NOISE_VAR) / FAST_PERSIST).clamp(0.0, MAX_FAST_SHARE)
    }

    /// Takes a depth-`depth` round of `seconds`.
    pub(crate) fn observe(&mut self, depth: usize, seconds: f64) {
        let j = depth + HOST;
        if !self.on || j >= self.x.len() || !(seconds > 0.0 && seconds.is_finite()) {
            return;
        }
        let n = self.x.len();
        let fast = self.fast_var.max(MIN_NOISE_VAR);
        let share = self.fast_share();
        let r = fast * (1.0 - share);
        let phi = [PERSIST, FAST_PERSIST];
        let q = [
            DRIFT_SD * DRIFT_SD * (1.0 - PERSIST * PERSIST),
            fast * share * (1.0 - FAST_PERSIST * FAST_PERSIST),
        ];
        // Predict: the host's states decay towards 0 and gain their innovations.
        for h in 0..HOST {
            self.x[h] *= phi[h];
            for i in 0..n {
                self.p[h][i] *= phi[h];
                self.p[i][h] *= phi[h];
            }
            self.p[h][h] += q[h];
        }
        for i in HOST..n {
            self.p[i][i] += COST_DRIFT_VAR;
        }
        let y = seconds.ln();
        if !self.seen[depth] {
            // A depth's first round says nothing about the host: its cost is
            // the round over the host's slowness now, as uncertain as both.
            self.seen[depth] = true;
            self.x[j] = y - self.x[0] - self.x[1];
            let host: Vec<f64> = (0..n).map(|i| self.p[0][i] + self.p[1][i]).collect();
            for (i, c) in host.iter().enumerate() {
                self.p[j][i] = -c;
                self.p[i][j] = -c;
            }
            self.p[j][j] = host[0] + host[1] + r;
            return;
        }
        self.measure_fast_noise(y - self.x[0] - self.x[j]);
        // Update with `y = s + f + μ_depth + ε`.
        let ph: Vec<f64> = (0..n)
            .map(|i| self.p[i][0] + self.p[i][1] + self.p[i][j])
            .collect();
        let s = ph[0] + ph[1] + ph[j] + r;
        let bound = CLIP * s.sqrt();
        let v = (y - self.x[0] - self.x[1] - self.x[j]).clamp(-bound, bound);
        for (x, k) in self.x.iter_mut().zip(&ph) {
            *x += k / s * v;
        }
        for (a, row) in self.p.iter_mut().enumerate() {
            for (b, cell) in row.iter_mut().enumerate() {
                *cell -= ph[a] * ph[b] / s;
            }
        }
    }

    /// Folds one round's departure `e` from its depth's cost at the slow
    /// drift into the fast noise's variance and lag-one covariance.
    fn measure_fast_noise(&mut self, e: f64) {
        let cap = DEPARTURE_CLIP * self.fast_var.max(MIN_NOISE_VAR).sqrt();
        let e = e.clamp(-cap, cap);
        self.fast_n = (self.fast_n + 1.0).min(FAST_ROUNDS);
        self.fast_var += (e * e - self.fast_var) / self.fast_n;
        if let Some(last) = self.last {
            self.fast_cov += (e * last - self.fast_cov) / self.fast_n;
        }
        self.last = Some(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_host_is_left_alone() {
        let mut s = Speed::new(2);
        for i in 0..40 {
            let d = 1 + i % 2;
            s.observe(d, 0.010 + 0.002 * d as f64);
        }
        assert_eq!(s.log_slowness_next(), 0.0);
    }

    #[test]
    fn a_wobble_is_measured_before_it_is_carried_over() {
        // Independent noise (here alternating ±20%): consecutive rounds
        // are anti-correlated, no share goes to the wobble, and the next
        // round is predicted with none of this one's.
        let mut s = Speed::new(1);
        for i in 0..64 {
            s.observe(1, if i % 2 == 0 { 0.012 } else { 0.008 });
        }
        assert_eq!(s.fast_share(), 0.0);
        assert_eq!(s.x[1], 0.0);
        // Noise that persists (runs of four rounds ±20%): most of it.
        let mut s = Speed::new(1);
        for i in 0..64 {
            s.observe(1, if (i / 4) % 2 == 0 { 0.012 } else { 0.008 });
        }
        assert!(s.fast_share() > 0.5, "{}", s.fast_share());
        // Control: turned off, nothing moves.
        let mut s = Speed::with(1, false);
        for i in 0..64 {
            s.observe(1, if (i / 4) % 2 == 0 { 0.012 } else { 0.008 });
        }
        assert_eq!((s.fast_share(), s.log_slowness_next()), (0.0, 0.0));
    }
}
