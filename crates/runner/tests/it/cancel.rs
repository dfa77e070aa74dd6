//! Stopping: EOS, max tokens, stop strings and cancellation leave the caches consistent.

use crate::common;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

use runner::testing::Arch;
use runner::{FinishReason, GenerateOptions, SamplingOptions, Session};

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampling: SamplingOptions::greedy(),
        ..GenerateOptions::default()
    }
}

#[test]
fn cancellation_leaves_offset_equal_to_committed_tokens() {
    let (_dir, m) = common::fixture(Arch::Llama);
    let prompt = m.tokenizer.encode("cancel me", false).unwrap();
    for cancel_after in [1usize, 3, 7] {
        let cancel = AtomicBool::new(false);
        let pieces = Cell::new(0usize);
        let mut s = Session::new(m.model.as_ref());
        let g = s
            .generate(&m.tokenizer, &prompt, &greedy(100), &cancel, |_| {
                pieces.set(pieces.get() + 1);
                if pieces.get() >= cancel_after {
                    cancel.store(true, Ordering::Relaxed);
                }
            })
            .unwrap();
        if g.finish == FinishReason::Cancelled {
            assert!(g.stats.generated_tokens < 100);
        }
        // The invariant the next request relies on.
        assert_eq!(s.offset(), s.committed().len());
        assert_eq!(&s.committed()[..prompt.len()], &prompt[..]);
        let gen_committed = &s.committed()[prompt.len()..];
        assert!(gen_committed.len() <= g.token_ids.len() + 1);
        assert_eq!(gen_committed, &g.token_ids[..gen_committed.len()]);
        assert!(
            g.token_ids.len() <= cancel_after + 3,
            "{} tokens after cancelling at {cancel_after}",
            g.token_ids.len()
        );
    }
}

#[test]
fn cancelled_before_start_generates_nothing() {
    let (_dir, m) = common::fixture(Arch::Qwen3);
    let prompt: Vec<u32> = (1..20).collect();
    let cancel = AtomicBool::new(true);
    let mut s = Session::new(m.model.as_ref());
    let g = s
        .generate(&m.tokenizer, &prompt, &greedy(10), &cancel, |_| {})
        .unwrap();
    assert_eq!(g.finish, FinishReason::Cancelled);
    assert!(g.token_ids.is_empty());
    assert_eq!(s.offset(), s.committed().len());
}

#[test]
fn max_tokens_is_exact_and_pipelined_equals_unpipelined() {
    let (_dir, m) = common::fixture(Arch::Qwen2);
    let prompt = m.tokenizer.encode("abc", false).unwrap();
    let stop = AtomicBool::new(false);
    let mut s = Session::new(m.model.as_ref());
    let g = s
        .generate(&m.tokenizer, &prompt, &greedy(9), &stop, |_| {})
        .unwrap();
    if g.finish == FinishReason::Length {
        assert_eq!(g.stats.generated_tokens, 9);
        // The 9th token was sampled but never forwarded.
        assert_eq!(s.offset(), prompt.len() + 8);
    }
    // A penalty turns pipelining off (the history must see each token first); with a
    // neutral penalty the tokens must be the same.
    let mut o = greedy(9);
    o.sampling.repeat_penalty = 1.0 + f32::EPSILON;
    let mut s2 = Session::new(m.model.as_ref());
    let g2 = s2
        .generate(&m.tokenizer, &prompt, &o, &stop, |_| {})
        .unwrap();
    assert_eq!(g.token_ids, g2.token_ids);
    assert_eq!(s.offset(), s2.offset());
}

#[test]
fn eos_ends_generation_and_is_not_in_the_output() {
    let dir = common::write(&runner::testing::Fixture::new(Arch::Llama), 4);
    let m = common::load(dir.path());
    let prompt = m.tokenizer.encode("x", false).unwrap();
    let stop = AtomicBool::new(false);
    let g = Session::new(m.model.as_ref())
        .generate(&m.tokenizer, &prompt, &greedy(8), &stop, |_| {})
        .unwrap();
    let eos = g.token_ids[2];
    let first = g.token_ids.iter().position(|&t| t == eos).unwrap();
    // Declare that token an EOS in config.json and reload.
    let path = dir.path().join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["eos_token_id"] = serde_json::json!([eos]);
    std::fs::write(&path, v.to_string()).unwrap();
    let m = common::load(dir.path());
    let mut s = Session::new(m.model.as_ref());
    let g2 = s
        .generate(&m.tokenizer, &prompt, &greedy(8), &stop, |_| {})
        .unwrap();
    assert_eq!(g2.finish, FinishReason::Eos);
    assert_eq!(g2.token_ids, g.token_ids[..first]);
    assert_eq!(g2.stats.generated_tokens, first + 1);
    assert_eq!(s.offset(), s.committed().len());
    // The EOS is never committed, although the pipelined loop forwarded it.
    assert_eq!(
        s.committed(),
        [prompt.clone(), g2.token_ids.clone()].concat()
    );
}

#[test]
fn stop_string_cuts_the_text() {
    let (_dir, m) = common::fixture(Arch::Llama);
    let prompt = m.tokenizer.encode("x", false).unwrap();
    let stop = AtomicBool::new(false);
    // Find what greedy produces, then declare its 3rd token the EOS via a stop on ids.
    let mut s = Session::new(m.model.as_ref());
    let g = s
        .generate(&m.tokenizer, &prompt, &greedy(6), &stop, |_| {})
        .unwrap();
    assert!(g.token_ids.len() >= 3);
    let text = g.text.clone();
    // Stop string: the text of the first three tokens' last piece ends generation there.
    let third = m.tokenizer.decode(&g.token_ids[..3]).unwrap();
    if !third.is_empty() {
        let mut o = greedy(6);
        o.stop = vec![third.clone()];
        let mut s2 = Session::new(m.model.as_ref());
        let g2 = s2
            .generate(&m.tokenizer, &prompt, &o, &stop, |_| {})
            .unwrap();
        assert_eq!(g2.finish, FinishReason::Stop);
        assert!(text.starts_with(&third));
        assert_eq!(g2.text, text[..text.find(&third).unwrap()]);
        assert_eq!(s2.offset(), s2.committed().len());
    }
}
