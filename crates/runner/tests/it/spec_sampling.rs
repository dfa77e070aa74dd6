//! Sampled losslessness of MTP speculative decoding end to end on tiny-mtp: the
//! distribution of the first two generated tokens over many seeded runs matches
//! plain decoding (two-sample chi-squared), at temperature 1 and with top-p 0.9,
//! while plain decoding at temperature 1 against 0.7 (the control) is rejected.
//!
//! Seeds: speculative runs use seeds `0..N`, plain runs `1_000_000..1_000_000 + N`
//! (independent samples), the control's temperature-0.7 runs `2_000_000..`.
//! N = [`RUNS`] per arm; α = [`ALPHA`]; categories seen fewer than 10 times in
//! both arms together are pooled into one cell.
// The measured figures are reported on stderr (`-- --nocapture` shows them).
#![allow(clippy::print_stderr)]

use crate::common;
use crate::common::Generate;
use crate::common::chi2;

use std::path::PathBuf;

use runner::DepthPolicy;
use runner::{FinishReason, GenerateOptions, LoadedModel, SamplingOptions, Session};

/// Runs per arm.
pub(crate) const RUNS: u64 = 1000;
/// Significance level: losslessness must not be rejected at it, the control must be.
pub(crate) const ALPHA: f64 = 1e-3;
/// Marks "generation ended at EOS" in place of a second token.
const ENDED: u32 = u32::MAX;

fn tiny() -> LoadedModel {
    common::load(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-mtp"))
}

/// A short prompt (cheap prefill) whose continuation is uncertain: the start of a
/// document (id 0), then `import`.
fn prompt(m: &LoadedModel) -> Vec<u32> {
    let mut ids = vec![0];
    ids.extend(m.tokenizer.encode("import", false).unwrap());
    ids
}

/// The first two generated tokens of `runs` seeded runs of `m` starting at
/// `seed0` (shared with the trained MoE model's test, `moe_model.rs`).
/// Depth 2 with a 3-token budget: the first round drafts two tokens, so both
/// positions go through the chain rule's accept / residual path.
pub(crate) fn first_pairs(
    m: &LoadedModel,
    sampling: &SamplingOptions,
    speculative: bool,
    seed0: u64,
    runs: u64,
) -> Vec<(u32, u32)> {
    let prompt = prompt(m);
    let mut drafted = 0;
    let pairs = (seed0..seed0 + runs)
        .map(|seed| {
            let opts = GenerateOptions {
                max_tokens: 3,
                sampling: SamplingOptions {
                    seed: Some(seed),
                    ..sampling.clone()
                },
                depth: DepthPolicy::Fixed(2),
                ..GenerateOptions::default()
            };
            let mut s = if speculative {
                Session::with_mtp(m.model.as_ref()).unwrap()
            } else {
                Session::new(m.model.as_ref())
            };
            let g = s.run(&m.tokenizer, &prompt, &opts).unwrap();
            s.offset();
            if let Some(st) = &g.speculation {
                drafted += st.drafted;
            }
            let t = &g.token_ids;
            match (t.len(), g.finish) {
                (0, FinishReason::Eos) => (ENDED, ENDED),
                (1, FinishReason::Eos) => (t[0], ENDED),
                (n, _) if n >= 2 => (t[0], t[1]),
                other => panic!("unexpected generation {other:?}: {t:?}"),
            }
        })
        .collect();
    if speculative {
        assert!(
            drafted as u64 >= runs,
            "speculative runs drafted only {drafted} tokens"
        );
    }
    pairs
}

pub(crate) fn report(name: &str, a: &[(u32, u32)], b: &[(u32, u32)]) -> chi2::Homogeneity {
    let h = chi2::two_sample(a, b, 10);
    let distinct: std::collections::BTreeSet<_> = a.iter().chain(b).collect();
    eprintln!(
        "{name}: chi2 = {:.2}, df = {}, p = {:.3e} ({} distinct pairs, {} cells after pooling, n = {} + {})",
        h.statistic,
        h.df,
        h.p_value,
        distinct.len(),
        h.cells,
        a.len(),
        b.len()
    );
    // A test with a handful of cells would say little about the distribution.
    assert!(h.df >= 5, "{name}: only {} cells after pooling", h.cells);
    h
}

pub(crate) fn assert_lossless(h: &chi2::Homogeneity, name: &str) {
    assert!(
        h.p_value > ALPHA,
        "{name}: speculative first-two-token distribution differs from plain \
         (chi2 {:.2}, df {}, p {:.3e} < α {ALPHA})",
        h.statistic,
        h.df,
        h.p_value
    );
}

/// Temperature 1, and the control, which shares the plain temperature-1 sample:
/// the same test between plain decoding at temperature 1 and 0.7 must reject.
#[test]
fn speculation_is_lossless_at_temperature_one_and_the_control_rejects() {
    let m = tiny();
    let t1 = SamplingOptions::default();
    let spec = first_pairs(&m, &t1, true, 0, RUNS);
    let plain = first_pairs(&m, &t1, false, 1_000_000, RUNS);
    assert_lossless(&report("temperature 1", &spec, &plain), "temperature 1");

    let t07 = SamplingOptions {
        temperature: 0.7,
        ..SamplingOptions::default()
    };
    let cold = first_pairs(&m, &t07, false, 2_000_000, RUNS);
    let h = report("control: plain T=1 vs plain T=0.7", &plain, &cold);
    assert!(
        h.p_value < ALPHA,
        "control not rejected: chi2 {:.2}, df {}, p {:.3e}",
        h.statistic,
        h.df,
        h.p_value
    );
}

#[test]
fn speculation_is_lossless_with_top_p() {
    let m = tiny();
    let top_p = SamplingOptions {
        top_p: 0.9,
        ..SamplingOptions::default()
    };
    let spec = first_pairs(&m, &top_p, true, 0, RUNS);
    let plain = first_pairs(&m, &top_p, false, 1_000_000, RUNS);
    let name = "temperature 1, top-p 0.9";
    assert_lossless(&report(name, &spec, &plain), name);
}

/// The helper's p-values against tabulated chi-squared critical values (tolerance 1e-3).
#[test]
fn chi_squared_helper_matches_tables() {
    for (x, df, p) in [
        (3.841, 1, 0.05),
        (18.307, 10, 0.05),
        (6.635, 1, 0.01),
        (29.588, 10, 0.001),
    ] {
        let got = chi2::survival(x, df);
        assert!(
            (got - p).abs() < 1e-3 * p.max(0.01),
            "Q({x}, {df}) = {got}, want {p}"
        );
    }
    // Identical samples: statistic 0; disjoint ones: p ≈ 0.
    let a: Vec<u32> = (0..400).map(|i| i % 4).collect();
    assert_eq!(chi2::two_sample(&a, &a, 10).statistic, 0.0);
    let b: Vec<u32> = (0..400).map(|i| 4 + i % 4).collect();
    assert!(chi2::two_sample(&a, &b, 10).p_value < 1e-100);
}
