//! Reproducible sampling under a seed, whatever the speculation setting.
//!
//! Random keys come from a counter-based [`sampler::KeyStream`], so a run's
//! keys depend only on the seed and on the sequence of draws. Under a fixed
//! depth (or without speculation) that sequence is fixed by the seed, and so
//! is the output. Under the auto depth it is not: the controller picks each
//! round's depth from measured wall times, and the depth decides which
//! positions are drafted and verified (one key for the acceptance, the
//! drafter's keys) and which are sampled as a bonus token. Keying draws by
//! position instead would not help: a token sampled as a bonus and the same
//! position drafted and accepted are different random experiments with the
//! same distribution, so different depths give different (equally valid)
//! texts.
//!
//! So with an explicit seed and sampling (temperature > 0) the depth
//! controller is fed a fixed cost model, [`modelled_cost`], instead of the
//! wall time: its choices then depend only on the acceptance it observes,
//! which the seed determines, and `--seed N` gives the same text run after
//! run under every `--speculative` and `--draft-tokens` setting (each setting
//! its own text; greedy output is the same under all of them anyway). Runs
//! without a seed, and greedy runs, keep the measured timings (fastest).
//!
//! robust2 owns this file; the call sites are the two `depth.record` lines in
//! `generate.rs`, marked `robust2:`.

use sampler::Options;

/// Cost of one drafted token relative to a plain step (a draft-head step
/// plus one more verify row); the depth controller's own prior slope.
pub(crate) const DRAFT_COST: f64 = 0.2;

/// Whether `sampling` asks for reproducible randomness (a seed, and sampling
/// that uses it).
pub(crate) fn reproducible(sampling: &Options) -> bool {
    sampling.seed.is_some() && !sampling.is_greedy()
}

/// The cost of a round of depth `drafted` in units of a plain step.
pub(crate) fn modelled_cost(drafted: usize) -> f64 {
    1.0 + DRAFT_COST * drafted as f64
}

/// The cost sample the depth controller records for a round of depth
/// `drafted` that took `seconds`: the wall time, or under
/// [`reproducible`] sampling the [`modelled_cost`].
pub(crate) fn round_cost(seconds: f64, drafted: usize, sampling: &Options) -> f64 {
    #[cfg(feature = "testing")]
    let seconds = PERTURB
        .with(|p| p.get())
        .map_or(seconds, |f| f(drafted, seconds));
    if reproducible(sampling) {
        modelled_cost(drafted)
    } else {
        seconds
    }
}

/// A timing perturbation: `(drafted, seconds) -> seconds`.
#[cfg(feature = "testing")]
type Perturb = fn(usize, f64) -> f64;

#[cfg(feature = "testing")]
thread_local! {
    static PERTURB: std::cell::Cell<Option<Perturb>> = const { std::cell::Cell::new(None) };
}

/// Runs `body` with every measured round time on this thread replaced by
/// `perturb(drafted, seconds)`: a test hook that makes the timings as noisy
/// as a loaded machine, or steers the controller.
#[cfg(feature = "testing")]
pub fn with_perturbed_timings<T>(perturb: Perturb, body: impl FnOnce() -> T) -> T {
    PERTURB.with(|p| p.set(Some(perturb)));
    let out = body();
    PERTURB.with(|p| p.set(None));
    out
}
