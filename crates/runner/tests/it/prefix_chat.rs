//! Prefix reuse with the draft caches kept right: multi-turn chat against
//! cold runs, divergence at the last cached token, an EOS stripped at the
//! boundary, the byte budget and LRU order, and pins released after cancel.
//!
//! Output comparisons are exact (greedy, f32, speculation on); cache
//! contents are compared within 1e-4 absolute, since a warm run computes the
//! prefix in other chunks than a cold one.

use crate::common;
use crate::common::Generate;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use kvcache::Cache;
use runner::Conversation;
use runner::DepthPolicy;
use runner::{GenerateOptions, LoadOptions, LoadedModel, Session, Tokenizer};
use runner::{PrefixCache, ReuseSource};

const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/tiny-mtp");
/// Largest absolute difference accepted between warm and cold cache contents.
const CACHE_TOL: f32 = 1e-4;

fn tiny() -> LoadedModel {
    runner::load(Path::new(TINY), LoadOptions::default(), |_, _| {}).expect("tiny-mtp loads")
}

fn greedy(max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        depth: DepthPolicy::Fixed(3),
        ..GenerateOptions::default()
    }
}

fn no_cancel() -> AtomicBool {
    AtomicBool::new(false)
}

/// Output of a fresh speculative session on the whole prompt.
fn cold(m: &LoadedModel, tok: &Tokenizer, prompt: &[u32], opts: &GenerateOptions) -> Vec<u32> {
    let mut s = Session::with_mtp(m.model.as_ref()).unwrap();
    s.run(tok, prompt, opts).unwrap().token_ids
}

fn max_diff(a: &[Box<dyn Cache>], b: &[Box<dyn Cache>]) -> f32 {
    assert_eq!(a.len(), b.len());
    let mut worst = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.offset(), y.offset(), "cache offsets differ");
        for (p, q) in x.live().unwrap().iter().zip(y.live().unwrap()) {
            let (p, q) = (p.to_vec::<f32>().unwrap(), q.to_vec::<f32>().unwrap());
            worst = worst.max(common::max_abs_diff(&p, &q));
        }
    }
    worst
}

/// Generates `prompt` on a warm session and on a cold one: same tokens, and
/// the same target and draft caches afterwards (a stale boundary pair would
/// leave the draft caches different).
fn check_warm_equals_cold(
    m: &LoadedModel,
    warm: &mut Session<'_>,
    tok: &Tokenizer,
    prompt: &[u32],
    reused: usize,
    opts: &GenerateOptions,
) -> Vec<u32> {
    let g = warm.run(tok, &prompt[reused..], opts).unwrap();
    let mut c = Session::with_mtp(m.model.as_ref()).unwrap();
    let gc = c.run(tok, prompt, opts).unwrap();
    assert_eq!(
        g.token_ids, gc.token_ids,
        "warm run (reused {reused}) != cold"
    );
    assert_eq!(warm.committed(), c.committed());
    let d = max_diff(warm.draft_caches(), c.draft_caches());
    assert!(d <= CACHE_TOL, "draft caches differ by {d}");
    let d = max_diff(warm.caches(), c.caches());
    assert!(d <= CACHE_TOL, "target caches differ by {d}");
    g.token_ids
}

#[test]
fn five_turn_chat_reuses_a_growing_prefix_and_matches_cold_runs() {
    let m = tiny();
    let opts = greedy(24);
    let session = Session::with_mtp(m.model.as_ref()).unwrap();
    let mut chat = Conversation::new(session, &m.tokenizer, Some("You tell stories."), 64 << 20)
        .expect("tiny-mtp has a ChatML template");
    let lines = [
        "Tell me about a cat.",
        "What did the cat eat?",
        "And then?",
        "Where did it sleep?",
        "How does the story end?",
    ];
    let mut last_reused = 0;
    for (i, line) in lines.iter().enumerate() {
        let turn = chat.say(line, &opts, &no_cancel(), |_| {}).unwrap();
        assert_eq!(turn.index, i + 1);
        let want = cold(&m, chat.tokenizer(), &turn.prompt, &opts);
        assert_eq!(
            turn.generation.token_ids, want,
            "turn {} differs from a cold run",
            turn.index
        );
        assert!(turn.reused_tokens < turn.prompt.len());
        if i > 0 {
            assert!(
                turn.reused_tokens > last_reused,
                "turn {}: reused {} after {}",
                turn.index,
                turn.reused_tokens,
                last_reused
            );
            assert_eq!(turn.source, ReuseSource::Live);
        }
        last_reused = turn.reused_tokens;
        assert!(chat.prefix_cache().bytes() <= chat.prefix_cache().budget());
    }
}

/// A prompt of `n` ordinary ids (past the three special tokens), from `seed`.
fn ids(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| 3 + (i * 37 + seed * 11) % 190)
        .collect()
}

#[test]
fn divergence_at_the_last_cached_token_drops_the_boundary_pair() {
    let m = tiny();
    let opts = greedy(8);
    let mut s = Session::with_mtp(m.model.as_ref()).unwrap();
    s.generate(&m.tokenizer, &ids(20, 1), &opts, &no_cancel(), |_| {})
        .unwrap();
    let held = s.committed().to_vec();
    let c = held.len();
    let mut prompt = held[..c - 1].to_vec();
    prompt.push(if held[c - 1] == 5 { 6 } else { 5 });
    prompt.extend([40, 41, 42]);

    // Through the trie, into a fresh session.
    let mut cache = PrefixCache::new(64 << 20);
    assert!(cache.store(&s).unwrap());
    let mut fresh = Session::with_mtp(m.model.as_ref()).unwrap();
    let r = cache.prepare(&mut fresh, &prompt).unwrap();
    assert_eq!((r.tokens, r.source), (c - 1, ReuseSource::Stored));
    assert!(fresh.draft_caches().iter().all(|d| d.offset() == c - 2));
    check_warm_equals_cold(&m, &mut fresh, &m.tokenizer, &prompt, r.tokens, &opts);

    // The live session, rewound.
    let n = s.reuse_prefix(&prompt).unwrap();
    assert_eq!(n, c - 1);
    assert_eq!(s.caches()[0].offset(), c - 1);
    assert!(s.draft_caches().iter().all(|d| d.offset() == c - 2));
    check_warm_equals_cold(&m, &mut s, &m.tokenizer, &prompt, n, &opts);
}

#[test]
fn an_eos_stripped_at_the_boundary_is_reused_up_to_it() {
    let m = tiny();
    let opts = greedy(12);
    let prompt = ids(16, 2);
    let plain = cold(&m, &m.tokenizer, &prompt, &opts);
    // The first token not seen before it becomes the end of the turn.
    let k = (2..plain.len())
        .find(|&k| !plain[..k].contains(&plain[k]))
        .expect("a fresh token in the output");
    let eos = plain[k];
    let tok = m.tokenizer.with_extra_eos(&[eos]);
    let mut s = Session::with_mtp(m.model.as_ref()).unwrap();
    let g = s.run(&tok, &prompt, &opts).unwrap();
    assert_eq!(g.finish, runner::FinishReason::Eos);
    assert_eq!(g.token_ids, plain[..k]);
    let mut held = prompt.clone();
    held.extend_from_slice(&plain[..k]);
    assert_eq!(s.committed(), held, "the EOS is not committed");

    // The next turn carries the EOS as a prompt token, then more.
    let mut next = held.clone();
    next.extend([eos, 50, 51, 52]);
    let n = s.reuse_prefix(&next).unwrap();
    assert_eq!(n, held.len());
    check_warm_equals_cold(&m, &mut s, &tok, &next, n, &opts);
}

#[test]
fn the_byte_budget_holds_and_eviction_is_least_recently_used() {
    let m = tiny();
    let pins = mlx_tensor::live_pins();
    let opts = greedy(4);
    let prompts: Vec<Vec<u32>> = (0..6).map(|i| ids(24, 10 + i)).collect();
    let mut s = Session::with_mtp(m.model.as_ref()).unwrap();
    let mut sizes = Vec::new();
    let mut probe = PrefixCache::new(usize::MAX);
    for p in &prompts[..1] {
        s.rewind_to(0).unwrap();
        s.run(&m.tokenizer, p, &opts).unwrap();
        probe.store(&s).unwrap();
        sizes.push(probe.bytes());
    }
    drop(probe);
    // Room for three entries of this size (they all hold the same token count).
    let budget = sizes[0] * 3 + sizes[0] / 2;
    let mut cache = PrefixCache::new(budget);
    let stored = |cache: &mut PrefixCache, i: usize| -> bool {
        let mut f = Session::with_mtp(m.model.as_ref()).unwrap();
        cache.prepare(&mut f, &prompts[i]).unwrap().source == ReuseSource::Stored
    };
    for (i, p) in prompts.iter().enumerate() {
        s.rewind_to(0).unwrap();
        s.run(&m.tokenizer, p, &opts).unwrap();
        assert!(cache.store(&s).unwrap());
        assert!(
            cache.bytes() <= budget,
            "{} bytes > budget {budget}",
            cache.bytes()
        );
        if i == 2 {
            // Entry 0 is used now, so entry 1 is the oldest.
            assert!(stored(&mut cache, 0));
        }
    }
    assert_eq!(cache.len(), 3);
    let alive: Vec<bool> = (0..6).map(|i| stored(&mut cache, i)).collect();
    // After entries 3, 4, 5 were stored, evictions went 1, 2, 0 (0 was used after 2).
    assert_eq!(alive, [false, false, false, true, true, true]);

    // An entry larger than the budget is not stored.
    let mut small = PrefixCache::new(16);
    assert!(!small.store(&s).unwrap());
    assert!(small.is_empty());
    drop((cache, small, s));
    assert_eq!(mlx_tensor::live_pins(), pins, "pins left behind");
}

#[test]
fn pins_are_released_after_a_cancelled_turn() {
    let m = tiny();
    let pins = mlx_tensor::live_pins();
    let opts = greedy(40);
    let prompt = ids(20, 3);
    let cancel = AtomicBool::new(false);
    let mut s = Session::with_mtp(m.model.as_ref()).unwrap();
    let mut pieces = 0;
    let g = s
        .generate(&m.tokenizer, &prompt, &opts, &cancel, |_| {
            pieces += 1;
            if pieces == 3 {
                cancel.store(true, Ordering::Relaxed);
            }
        })
        .unwrap();
    assert_eq!(g.finish, runner::FinishReason::Cancelled);
    assert_eq!(mlx_tensor::live_pins(), pins, "the draft session kept pins");
    let mut cache = PrefixCache::new(64 << 20);
    assert!(cache.store(&s).unwrap());
    assert!(mlx_tensor::live_pins() > pins, "snapshots pin their arrays");
    // The cancelled session still continues exactly like a cold run.
    let mut next = s.committed().to_vec();
    next.extend([60, 61]);
    let n = cache.prepare(&mut s, &next).unwrap().tokens;
    check_warm_equals_cold(&m, &mut s, &m.tokenizer, &next, n, &opts);
    drop(cache);
    drop(s);
    assert_eq!(mlx_tensor::live_pins(), pins, "pins left behind");
}
