//! Speculation on the Qwen3.5 hybrid fixture (f32, greedy): MTP at depths
//! 1–4 and auto and prompt lookup all equal plain decoding token for token, also when a session continues
//! over several calls (the MTP boundary re-run rewinds the recurrent layers
//! one step from a captured state). The fixture's MTP head is random, so
//! most MTP rounds reject; the rewind test covers every accepted count.

use crate::common::Generate;
use crate::writer;

use runner::DepthPolicy;
use runner::{GenerateOptions, LoadedModel, SamplingOptions, Session};

const TOKENS: usize = 48;

fn opts(depth: DepthPolicy) -> GenerateOptions {
    GenerateOptions {
        max_tokens: TOKENS,
        sampling: SamplingOptions::greedy(),
        depth,
        ..GenerateOptions::default()
    }
}

fn prompts(m: &LoadedModel) -> Vec<Vec<u32>> {
    [
        "Once upon a time",
        "The little dog ran to the park and",
        "A",
    ]
    .iter()
    .map(|p| m.tokenizer.encode(p, false).unwrap())
    .collect()
}

/// Generates each prompt in turn on one session (each call continues the
/// last), returning every call's tokens.
fn script(
    m: &LoadedModel,
    mut s: Session<'_>,
    prompts: &[Vec<u32>],
    o: &GenerateOptions,
) -> Vec<Vec<u32>> {
    prompts
        .iter()
        .map(|p| {
            let g = s.run(&m.tokenizer, p, o).unwrap();
            s.offset();
            g.token_ids
        })
        .collect()
}

#[test]
fn greedy_speculation_equals_plain() {
    let m: &'static LoadedModel = Box::leak(Box::new(writer::load()));
    let model = m.model.as_ref();
    assert!(
        model.mtp_head().is_some(),
        "the fixture carries mtp.* tensors"
    );
    let ps = prompts(m);
    let plain = script(m, Session::new(model), &ps, &opts(DepthPolicy::Fixed(1)));
    let cases: Vec<(&str, DepthPolicy)> = vec![
        ("mtp", DepthPolicy::Fixed(1)),
        ("mtp", DepthPolicy::Fixed(2)),
        ("mtp", DepthPolicy::Fixed(3)),
        ("mtp", DepthPolicy::Fixed(4)),
        ("mtp", DepthPolicy::default()),
        ("ngram", DepthPolicy::Fixed(3)),
    ];
    for (name, depth) in cases {
        let s = match name {
            "mtp" => Session::with_mtp(model).unwrap(),
            _ => Session::with_ngram(model, Default::default()),
        };
        let got = script(m, s, &ps, &opts(depth));
        assert_eq!(
            got, plain,
            "{name} at {depth:?} differs from plain decoding"
        );
    }
}
