//! `--seed` is reproducible under the auto depth, whatever the timings: with
//! a seed and sampling the depth controller is fed the modelled cost
//! (`runner::seeded`), so timings perturbed to favour no drafting or deep
//! drafting give the same text. The control: without a seed (the same
//! fallback seed, so the same keys) the same perturbations steer the
//! controller to different depths.

use crate::common;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use runner::testing::with_perturbed_timings;
use runner::{
    DepthPolicy, GenerateOptions, Generation, LoadedModel, SamplingOptions, Session, Speculation,
};

fn tiny() -> LoadedModel {
    common::load(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-mtp"))
}

/// Drafted rounds look a hundred times dearer than plain steps.
fn drafting_is_slow(drafted: usize, seconds: f64) -> f64 {
    if drafted > 0 {
        seconds * 100.0
    } else {
        seconds
    }
}

/// Drafted rounds look almost free.
fn drafting_is_cheap(drafted: usize, seconds: f64) -> f64 {
    if drafted > 0 {
        seconds * 0.01
    } else {
        seconds * 10.0
    }
}

fn run(m: &LoadedModel, seed: Option<u64>, perturb: fn(usize, f64) -> f64) -> Generation {
    let prompt = m.tokenizer.encode("import numpy as np\n", true).unwrap();
    let opts = GenerateOptions {
        max_tokens: 96,
        sampling: SamplingOptions {
            temperature: 0.8,
            seed,
            ..SamplingOptions::default()
        },
        fallback_seed: 11,
        depth: DepthPolicy::default(),
        ..GenerateOptions::default()
    };
    let mut s = Session::open(m.model.as_ref(), Speculation::Mtp, None).unwrap();
    with_perturbed_timings(perturb, || {
        s.generate(
            &m.tokenizer,
            &prompt,
            &opts,
            &AtomicBool::new(false),
            |_| {},
        )
        .unwrap()
    })
}

fn depths(g: &Generation) -> Vec<usize> {
    g.speculation.as_ref().unwrap().depth_over_time.clone()
}

#[test]
fn a_seed_gives_the_same_text_under_auto_depth_whatever_the_timings() {
    let m = tiny();
    let a = run(&m, Some(5), drafting_is_slow);
    let b = run(&m, Some(5), drafting_is_cheap);
    let c = run(&m, Some(5), |_, s| s);
    assert_eq!(
        a.token_ids, b.token_ids,
        "seeded text under perturbed timings"
    );
    assert_eq!(a.token_ids, c.token_ids, "seeded text under real timings");
    assert_eq!(
        depths(&a),
        depths(&b),
        "the depth choices do not see the timings"
    );
    assert!(
        depths(&a).iter().any(|&d| d > 0),
        "the modelled costs draft: {:?}",
        depths(&a)
    );

    // Control: unseeded (same fallback keys), the perturbations do steer the depth.
    let slow = run(&m, None, drafting_is_slow);
    let cheap = run(&m, None, drafting_is_cheap);
    assert_ne!(
        depths(&slow),
        depths(&cheap),
        "without a seed the controller follows the (perturbed) timings"
    );
}
