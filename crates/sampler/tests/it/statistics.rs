//! Statistical tests of speculative acceptance: the emitted tokens follow the
//! target distribution, the acceptance rate is `Σ min(p, q)`, and a wrong
//! verifier is caught.
//!
//! Set-up: for each case a host RNG (seeded by the case) draws target rows
//! `p_0..p_{k+1}` and draft rows `q_0..q_k` over a vocabulary of 10 to 32
//! tokens (Dirichlet(1) weights with about a quarter of the entries zeroed, so
//! supports differ). [`ROUNDS`] = 100 000 independent chains run as round A
//! (target rows `p_0..p_k`, drafts from `q_0..q_{k-1}`); round B (rows
//! `p_1..p_{k+1}`, drafts from `q_1..q_k`) is what would run next when round
//! A rejects its first draft. The first emitted token is A's first; the
//! second is A's second when A accepted a draft, else B's first. With
//! context-free target rows they must follow `p_0`, `p_1` and `p_0 ⊗ p_1`.
//!
//! Each is checked with Pearson's chi-squared test (cells with an expected
//! count below 5 pooled; zero-probability tokens must never appear); a test
//! passes when its p-value is above [`ALPHA`] = 1e-3 (computed in
//! `support/chi2.rs`). Device randomness comes from `KeyStream::new(seed)`
//! with the seed of each case; all outcomes are deterministic for a seed.
//! The control ("accept iff the draft is the target's argmax, else sample
//! the target", at temperature 1) must fail the same first-token test.

use crate::support;

use mlx_tensor::{Array, Dtype, eval};
use sampler::{Distribution, KeyStream, Result, accept_batch};
use support::chi2::{self, Fit};
use support::{Rng, dist};

/// Chains per case.
const ROUNDS: usize = 100_000;
/// Chains per device call (bounds memory: `CHUNK × (k + 1) × V` floats per array).
const CHUNK: usize = 25_000;
/// Significance level of every chi-squared test.
const ALPHA: f64 = 1e-3;

/// One random problem instance.
struct Instance {
    k: usize,
    v: usize,
    /// `k + 2` target rows, as the device sees them (f32, widened).
    p: Vec<Vec<f64>>,
    /// `k + 1` draft rows.
    q: Vec<Vec<f64>>,
}

impl Instance {
    fn new(k: usize, v: usize, seed: u64) -> Instance {
        let mut rng = Rng::new(seed);
        // Round through f32 so expectations use exactly what the device sees.
        let mut row = |_| -> Vec<f64> {
            let r = rng.distribution(v, 0.25);
            let r32: Vec<f64> = r.iter().map(|&x| f64::from(x as f32)).collect();
            let s: f64 = r32.iter().sum();
            r32.iter().map(|x| x / s).collect()
        };
        let p = (0..k + 2).map(&mut row).collect();
        let q = (0..k + 1).map(&mut row).collect();
        Instance { k, v, p, q }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Verifier {
    /// `sampler::accept_batch`.
    Exact,
    /// The broken control: accept iff the draft is the target's argmax.
    ArgmaxControl,
}

/// Host outcome of one round for a chunk of chains.
struct Round {
    accepted: Vec<u32>,
    /// `[chains, k + 1]`: accepted drafts then the next token (rest unused).
    emitted: Vec<u32>,
}

/// `rows` repeated for `chains` chains, as one distribution.
fn tiled(rows: &[Vec<f64>], chains: usize) -> Result<Distribution> {
    let (r, v) = (rows.len() as i32, rows[0].len() as i32);
    let one = dist(rows)?;
    let many = one
        .probs()
        .reshape(&[1, r, v])?
        .broadcast_to(&[chains as i32, r, v])?
        .reshape(&[chains as i32 * r, v])?;
    Distribution::from_probs(&many)
}

/// Builds one round's lazy outcome: `(packed or parts, drafted)`.
struct LazyRound {
    verifier: Verifier,
    k: usize,
    chains: usize,
    arrays: Vec<Array>,
}

fn build_round(
    p: &[Vec<f64>],
    q: &[Vec<f64>],
    chains: usize,
    verifier: Verifier,
    keys: &mut KeyStream,
) -> Result<LazyRound> {
    let k = q.len();
    let target = tiled(p, chains)?;
    let draft = tiled(q, chains)?;
    let drafted = draft
        .sample(&keys.next_key()?)?
        .reshape(&[chains as i32, k as i32])?;
    let key = keys.next_key()?;
    let arrays = match verifier {
        Verifier::Exact => vec![
            accept_batch(&target, &draft, &drafted, &key)?
                .packed()
                .clone(),
        ],
        Verifier::ArgmaxControl => {
            let v = p[0].len() as i32;
            let (c, k32) = (chains as i32, k as i32);
            let p3 = target.probs().reshape(&[c, k32 + 1, v])?;
            let best = p3.slice_axis(1, 0, k32)?.argmax(-1, false)?;
            let hits = drafted.equal(&best)?.as_type(Dtype::Float32)?;
            let accepted = hits
                .cumprod(1, false, true)?
                .sum(&[1], true)?
                .as_type(Dtype::Uint32)?;
            let fresh = target.sample(&key)?.reshape(&[c, k32 + 1])?;
            let next = fresh.take_along_axis(&accepted, 1)?;
            vec![accepted, next, drafted.as_type(Dtype::Uint32)?]
        }
    };
    Ok(LazyRound {
        verifier,
        k,
        chains,
        arrays,
    })
}

fn read_round(r: &LazyRound) -> Result<Round> {
    let w = r.k + 1;
    match r.verifier {
        Verifier::Exact => {
            let flat = r.arrays[0].to_vec::<u32>()?;
            let mut out = Round {
                accepted: Vec::with_capacity(r.chains),
                emitted: Vec::with_capacity(r.chains * w),
            };
            for row in flat.chunks_exact(r.k + 3) {
                out.accepted.push(row[0]);
                out.emitted.extend_from_slice(&row[2..]);
            }
            Ok(out)
        }
        Verifier::ArgmaxControl => {
            let accepted = r.arrays[0].to_vec::<u32>()?;
            let next = r.arrays[1].to_vec::<u32>()?;
            let drafted = r.arrays[2].to_vec::<u32>()?;
            let mut emitted = vec![0; r.chains * w];
            for c in 0..r.chains {
                let a = accepted[c] as usize;
                emitted[c * w..c * w + a].copy_from_slice(&drafted[c * r.k..c * r.k + a]);
                emitted[c * w + a] = next[c];
            }
            Ok(Round { accepted, emitted })
        }
    }
}

/// First and second emitted tokens and round A's accepted counts.
struct Samples {
    first: Vec<u32>,
    second: Vec<u32>,
    accepted: Vec<u32>,
}

fn simulate(inst: &Instance, verifier: Verifier, rounds: usize, seed: u64) -> Result<Samples> {
    let (k, w) = (inst.k, inst.k + 1);
    let mut keys = KeyStream::new(seed);
    let mut s = Samples {
        first: Vec::with_capacity(rounds),
        second: Vec::with_capacity(rounds),
        accepted: Vec::with_capacity(rounds),
    };
    let mut done = 0;
    while done < rounds {
        let chains = CHUNK.min(rounds - done);
        let a = build_round(&inst.p[..=k], &inst.q[..k], chains, verifier, &mut keys)?;
        let b = build_round(&inst.p[1..], &inst.q[1..], chains, verifier, &mut keys)?;
        // One graph run for both rounds of the chunk.
        eval(a.arrays.iter().chain(&b.arrays))?;
        let (a, b) = (read_round(&a)?, read_round(&b)?);
        for c in 0..chains {
            s.first.push(a.emitted[c * w]);
            s.second.push(if a.accepted[c] >= 1 {
                a.emitted[c * w + 1]
            } else {
                b.emitted[c * w]
            });
            s.accepted.push(a.accepted[c]);
        }
        done += chains;
    }
    Ok(s)
}

/// Chi-squared fit of `tokens` (cells `0..probs.len()`) to `probs`; panics
/// if a zero-probability cell was observed.
#[track_caller]
fn fit(tokens: impl Iterator<Item = usize>, probs: &[f64], what: &str) -> Fit {
    let mut counts = vec![0u64; probs.len()];
    for t in tokens {
        counts[t] += 1;
    }
    for (cell, (&c, &p)) in counts.iter().zip(probs).enumerate() {
        assert!(
            p > 0.0 || c == 0,
            "{what}: cell {cell} has probability 0 but {c} observations"
        );
    }
    chi2::goodness_of_fit(&counts, probs)
}

fn outer(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter()
        .flat_map(|&x| b.iter().map(move |&y| x * y))
        .collect()
}

/// The three fits (first token, second token, the pair) of a run.
fn fits(inst: &Instance, s: &Samples) -> [(String, Fit); 3] {
    let v = inst.v;
    let tag = format!("k = {}, V = {}", inst.k, v);
    [
        (
            format!("{tag}: first token"),
            fit(s.first.iter().map(|&t| t as usize), &inst.p[0], "first"),
        ),
        (
            format!("{tag}: second token"),
            fit(s.second.iter().map(|&t| t as usize), &inst.p[1], "second"),
        ),
        (
            format!("{tag}: pair"),
            fit(
                s.first
                    .iter()
                    .zip(&s.second)
                    .map(|(&a, &b)| a as usize * v + b as usize),
                &outer(&inst.p[0], &inst.p[1]),
                "pair",
            ),
        ),
    ]
}

/// The empirical acceptance rate must match `Σ min(p_i, q_i)` within 3σ.
///
/// Draft `i` is tried only when drafts `..i` were accepted; given that, it is
/// accepted with probability `α_i = Σ min(p_i, q_i)`. Over all tried drafts the
/// accepted count `A = Σ_i passed_i` has conditional mean `Σ_i α_i tried_i` and
/// variance `Σ_i α_i (1 − α_i) tried_i` (a sum of martingale increments), so
/// one z-score per case covers every position without multiplying the chance
/// of a false alarm by k. For k = 1 it is the plain `Σ min(p_0, q_0)` check.
#[track_caller]
fn check_acceptance_rate(inst: &Instance, s: &Samples) {
    let (mut accepted, mut mean, mut var, mut tried_total) = (0.0, 0.0, 0.0, 0.0);
    for i in 0..inst.k {
        let alpha: f64 = inst.p[i]
            .iter()
            .zip(&inst.q[i])
            .map(|(a, b)| a.min(*b))
            .sum();
        let tried = s.accepted.iter().filter(|&&a| a as usize >= i).count() as f64;
        let passed = s.accepted.iter().filter(|&&a| a as usize > i).count() as f64;
        accepted += passed;
        tried_total += tried;
        mean += alpha * tried;
        var += alpha * (1.0 - alpha) * tried;
    }
    let z = (accepted - mean) / var.sqrt();
    assert!(
        z.abs() <= 3.0,
        "k = {}, V = {}: acceptance {:.5} over {tried_total} tried drafts, expected \
         Σ min(p, q) (weighted by position) {:.5}: z = {z:.2}, beyond 3σ",
        inst.k,
        inst.v,
        accepted / tried_total,
        mean / tried_total,
    );
}

/// Runs `k` with each vocabulary size and checks every fit and rate.
fn check_exact(k: usize) {
    for (v, seed) in [(10, 1000 + k as u64), (32, 2000 + k as u64)] {
        let inst = Instance::new(k, v, seed);
        let s = simulate(&inst, Verifier::Exact, ROUNDS, seed).expect("simulation runs");
        for (what, f) in fits(&inst, &s) {
            assert!(
                f.p_value > ALPHA,
                "{what}: χ² = {:.1} on {} df, p = {:.2e} <= {ALPHA}",
                f.statistic,
                f.df,
                f.p_value
            );
        }
        check_acceptance_rate(&inst, &s);
    }
}

#[test]
fn k1_emitted_tokens_follow_the_target() {
    check_exact(1);
}

#[test]
fn k2_emitted_tokens_follow_the_target() {
    check_exact(2);
}

#[test]
fn k4_emitted_tokens_follow_the_target() {
    check_exact(4);
}

#[test]
fn the_argmax_control_fails_the_same_test() {
    for k in [1, 2, 4] {
        let inst = Instance::new(k, 10, 1000 + k as u64);
        let s = simulate(&inst, Verifier::ArgmaxControl, ROUNDS, 1000 + k as u64).expect("runs");
        let [(what, first), _, (pair_what, pair)] = fits(&inst, &s);
        assert!(
            first.p_value < ALPHA,
            "{what}: the control passed (χ² = {:.1} on {} df, p = {:.2e})",
            first.statistic,
            first.df,
            first.p_value
        );
        assert!(
            pair.p_value < ALPHA,
            "{pair_what}: the control passed (p = {:.2e})",
            pair.p_value
        );
    }
}

#[test]
fn seeded_runs_reproduce() {
    let inst = Instance::new(2, 16, 5);
    let run = |seed| simulate(&inst, Verifier::Exact, 5_000, seed).expect("runs");
    let (a, b, c) = (run(1), run(1), run(2));
    assert_eq!(a.first, b.first);
    assert_eq!(a.second, b.second);
    assert_eq!(a.accepted, b.accepted);
    let differing = a.first.iter().zip(&c.first).filter(|(x, y)| x != y).count();
    assert!(
        differing > 1000,
        "seeds 1 and 2 differ in only {differing} of 5000 first tokens"
    );
}

#[test]
fn chi_squared_helper_matches_tables() {
    // Critical values from standard tables (NIST/SEMATECH e-Handbook 1.3.6.7.4).
    let cases = [
        (3.841459, 1, 0.05),
        (6.634897, 1, 0.01),
        (10.827566, 1, 0.001),
        (18.307038, 10, 0.05),
        (29.588298, 10, 0.001),
        (124.342113, 100, 0.05),
        (149.449252, 100, 0.001),
        (2.0 * std::f64::consts::LN_2, 2, 0.5), // df 2: survival is exp(−x/2).
    ];
    for (x, df, p) in cases {
        let got = chi2::survival(x, df);
        assert!(
            (got - p).abs() <= 1e-5 * p.max(1e-3),
            "survival({x}, {df}) = {got}, expected {p}"
        );
    }
    assert_eq!(chi2::survival(0.0, 3), 1.0);
    // A perfect fit has statistic 0 and p-value 1; a gross misfit a tiny one.
    let perfect = chi2::goodness_of_fit(&[250, 250, 500], &[0.25, 0.25, 0.5]);
    assert!(
        perfect.statistic.abs() < 1e-12 && perfect.p_value == 1.0,
        "{perfect:?}"
    );
    let bad = chi2::goodness_of_fit(&[400, 100, 500], &[0.25, 0.25, 0.5]);
    assert!(bad.p_value < 1e-20, "{bad:?}");
}
