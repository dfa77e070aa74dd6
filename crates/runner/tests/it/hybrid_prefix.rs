//! Prefix reuse with MTP on the Qwen3.5 hybrid fixture: a five-turn ChatML
//! script where each prompt extends the session's committed tokens. Every
//! turn reuses a longer prefix (recurrent layers cannot rewind, so reuse is
//! the live session at its end),
//! its greedy output equals a cold run of the whole prompt, and the caches
//! afterwards equal the cold run's within 1e-4 (the warm run computes the
//! prefix in other chunks).

use crate::common::Generate;
use crate::writer;

use kvcache::Cache;
use runner::DepthPolicy;
use runner::{GenerateOptions, LoadedModel, SamplingOptions, Session};
use runner::{PrefixCache, ReuseSource};

/// Largest accepted difference between warm and cold cache contents.
const CACHE_TOL: f32 = 1e-4;

fn opts() -> GenerateOptions {
    GenerateOptions {
        max_tokens: 20,
        sampling: SamplingOptions::greedy(),
        depth: DepthPolicy::Fixed(3),
        ..GenerateOptions::default()
    }
}

fn max_diff(a: &[Box<dyn Cache>], b: &[Box<dyn Cache>]) -> f32 {
    let mut worst = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.offset(), y.offset());
        for (p, q) in x.live().unwrap().iter().zip(y.live().unwrap()) {
            let (p, q) = (p.to_vec::<f32>().unwrap(), q.to_vec::<f32>().unwrap());
            for (u, v) in p.iter().zip(&q) {
                worst = worst.max((u - v).abs());
            }
        }
    }
    worst
}

fn user(m: &LoadedModel, text: &str) -> Vec<u32> {
    let s = format!("<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n");
    m.tokenizer.encode(&s, false).unwrap()
}

#[test]
fn multi_turn_script_reuses_a_growing_prefix_and_matches_cold_runs() {
    let m = writer::load();
    let model = m.model.as_ref();
    let mut warm = Session::with_mtp(model).unwrap();
    let mut cache = PrefixCache::new(64 << 20);
    let end_of_turn = m.tokenizer.encode("<|im_end|>\n", false).unwrap();
    let mut history = m
        .tokenizer
        .encode("<|im_start|>system\nYou tell stories.<|im_end|>\n", false)
        .unwrap();
    let lines = [
        "Tell me about a cat.",
        "What did it eat?",
        "And then?",
        "Where did it sleep?",
        "How does it end?",
    ];
    let mut last_reused = 0;
    for (turn, line) in lines.iter().enumerate() {
        let mut prompt = history.clone();
        prompt.extend(user(&m, line));
        let reuse = cache.prepare(&mut warm, &prompt).unwrap();
        let g = warm
            .run(&m.tokenizer, &prompt[reuse.tokens..], &opts())
            .unwrap();
        cache.store(&warm).unwrap();

        let mut cold = Session::with_mtp(model).unwrap();
        let c = cold.run(&m.tokenizer, &prompt, &opts()).unwrap();
        assert_eq!(
            g.token_ids, c.token_ids,
            "turn {turn} differs from a cold run"
        );
        assert_eq!(warm.committed(), cold.committed());
        let d = max_diff(warm.caches(), cold.caches());
        assert!(d <= CACHE_TOL, "turn {turn}: target caches differ by {d}");
        let d = max_diff(warm.draft_caches(), cold.draft_caches());
        assert!(d <= CACHE_TOL, "turn {turn}: draft caches differ by {d}");
        if turn > 0 {
            assert_eq!(reuse.source, ReuseSource::Live, "turn {turn}");
            assert!(
                reuse.tokens > last_reused,
                "turn {turn}: reused {} after {last_reused}",
                reuse.tokens
            );
        }
        last_reused = reuse.tokens;
        // The next prompt extends what the session holds (its reply, then
        // the end of the turn), as a chat template does.
        history = warm.committed().to_vec();
        history.extend(&end_of_turn);
    }
}
