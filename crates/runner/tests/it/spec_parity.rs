//! Greedy parity of MTP speculative decoding with plain decoding on the bundled
//! tiny-mtp model (f32): 20 held-out prompts × 128 tokens at depths 1–4 and auto,
//! an end-of-sequence token inside an accepted run, the budget cap on the draft
//! length, cache bookkeeping after every call, and multi-turn continuation;
//! and bf16 at depths 8 and 16.
// The measured figures are reported on stderr (`-- --nocapture` shows them).
#![allow(clippy::print_stderr)]

use crate::common;

use std::path::{Path, PathBuf};

use common::parity::{
    PARITY_TOKENS, depths, greedy, heldout_prompts, plain, run, same_as_plain, speculative, sweep,
};
use runner::DepthPolicy;
use runner::{FinishReason, LoadedModel, Session};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tiny_dir() -> PathBuf {
    root().join("models/tiny-mtp")
}

#[test]
fn greedy_speculation_equals_plain_decoding_on_heldout_prompts() {
    let m = common::load(&tiny_dir());
    let prompts = heldout_prompts(&m);
    let (totals, compared_tokens) = sweep(&m, &prompts, PARITY_TOKENS);
    for (depth, t) in depths().into_iter().zip(totals) {
        t.report(depth);
        // Drafting has to have happened for the parity to mean anything.
        assert!(
            t.drafted > 0 && t.accepted > 0,
            "{depth:?} drafted {}, accepted {}",
            t.drafted,
            t.accepted
        );
    }
    eprintln!(
        "parity: {} prompts x {} depths, {compared_tokens} tokens compared",
        prompts.len(),
        depths().len()
    );
    assert!(compared_tokens >= prompts.len() * depths().len() * PARITY_TOKENS / 2);
}

/// A copy of tiny-mtp (weights symlinked) whose config adds `eos` to the
/// end-of-sequence ids, so an EOS can be made to fall inside an accepted run.
fn with_extra_eos(eos: u32) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = tiny_dir();
    for entry in std::fs::read_dir(&src).unwrap() {
        let name = entry.unwrap().file_name();
        if name != "config.json" {
            std::os::unix::fs::symlink(src.join(&name), dir.path().join(&name)).unwrap();
        }
    }
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["eos_token_id"] = serde_json::json!([0, eos]);
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    dir
}

fn most_frequent(ids: &[u32]) -> u32 {
    let mut counts = std::collections::BTreeMap::new();
    for &t in ids {
        *counts.entry(t).or_insert(0usize) += 1;
    }
    counts
        .into_iter()
        .max_by_key(|&(t, c)| (c, std::cmp::Reverse(t)))
        .unwrap()
        .0
}

fn load(dir: &Path) -> LoadedModel {
    common::load(dir)
}

#[test]
fn eos_inside_an_accepted_run_ends_generation_and_is_not_committed() {
    // The token the model emits most often after the first few becomes an extra EOS.
    let eos = {
        let m = load(&tiny_dir());
        let prompts = heldout_prompts(&m);
        let mut ids = Vec::new();
        for prompt in &prompts[..4] {
            ids.extend(
                plain(&m, prompt, &greedy(48, DepthPolicy::Fixed(0)))
                    .token_ids
                    .into_iter()
                    .skip(4),
            );
        }
        most_frequent(&ids)
    };
    let dir = with_extra_eos(eos);
    let m = load(dir.path());
    let prompts = heldout_prompts(&m);
    let mut inside = 0;
    // Scan the prompts in order until two generations put the EOS inside an accepted run.
    for (p, prompt) in prompts.iter().enumerate() {
        if inside >= 2 {
            break;
        }
        let want = plain(&m, prompt, &greedy(64, DepthPolicy::Fixed(0)));
        for k in [3, 4] {
            let mut s = Session::with_mtp(m.model.as_ref()).unwrap();
            let got = run(&mut s, &m, prompt, &greedy(64, DepthPolicy::Fixed(k)));
            let st = same_as_plain(&format!("prompt {p} depth {k}"), &got, &want);
            if got.finish != FinishReason::Eos {
                continue;
            }
            assert!(!got.token_ids.contains(&eos) && !got.token_ids.contains(&0));
            // Every round emits its accepted drafts plus one token, except a round cut
            // at an EOS that had accepted drafts after it; the EOS itself is emitted.
            assert_eq!(st.emitted, got.token_ids.len() + 1, "prompt {p} depth {k}");
            if st.emitted < st.accepted + st.rounds {
                inside += 1;
                // `run` checked that the committed tokens end with the last id before the EOS.
                assert_eq!(s.committed().len(), prompt.len() + got.token_ids.len());
            }
        }
    }
    eprintln!("extra EOS id {eos}: {inside} generations ended at an EOS inside an accepted run");
    assert!(
        inside > 0,
        "no case put the EOS inside an accepted run (EOS id {eos})"
    );
}

/// A logit bias is the target's distribution too: greedy speculation under
/// a bias equals plain greedy decoding under it (the draft is biased alike,
/// or it would be rejected where the bias moves the argmax).
#[test]
fn greedy_speculation_under_a_logit_bias_equals_plain_decoding() {
    let m = load(&tiny_dir());
    let prompts = heldout_prompts(&m);
    for prompt in &prompts[..3] {
        let base = plain(&m, prompt, &greedy(48, DepthPolicy::Fixed(0)));
        let banned = most_frequent(&base.token_ids);
        let forced = (0..m.tokenizer.vocab_size() as u32)
            .find(|t| !base.token_ids.contains(t) && !m.tokenizer.eos_ids().contains(t))
            .unwrap();
        for bias in [vec![(banned, -100.0)], vec![(forced, 12.0), (banned, -5.0)]] {
            let biased = |depth| {
                let mut o = greedy(48, depth);
                o.sampling.logit_bias = bias.clone();
                o
            };
            let want = plain(&m, prompt, &biased(DepthPolicy::Fixed(0)));
            // Control: the bias changes the output.
            assert_ne!(want.token_ids, base.token_ids, "{bias:?}");
            if bias.len() == 1 {
                assert!(!want.token_ids.contains(&banned), "{bias:?}");
            }
            for depth in [DepthPolicy::Fixed(3), DepthPolicy::Auto { max: 6 }] {
                let got = speculative(&m, prompt, &biased(depth));
                assert_eq!(got.token_ids, want.token_ids, "{bias:?} at {depth:?}");
            }
        }
    }
}

#[test]
fn draft_length_is_capped_by_the_remaining_budget() {
    let m = load(&tiny_dir());
    let prompts = heldout_prompts(&m);
    for prompt in &prompts[..5] {
        for max_tokens in [1, 2, 3, 5] {
            let want = plain(&m, prompt, &greedy(max_tokens, DepthPolicy::Fixed(0)));
            let got = speculative(&m, prompt, &greedy(max_tokens, DepthPolicy::Fixed(4)));
            assert_eq!(got.token_ids, want.token_ids, "max_tokens {max_tokens}");
            assert_eq!(got.finish, want.finish);
            let s = got.speculation.unwrap();
            if got.finish == FinishReason::Length {
                assert_eq!(got.token_ids.len(), max_tokens);
                assert_eq!(
                    s.emitted, max_tokens,
                    "emitted tokens never exceed the budget"
                );
            }
            // Round r may draft at most (budget left) − 1 tokens.
            let mut left = max_tokens;
            for &d in &s.depth_over_time {
                assert!(
                    d < left,
                    "depth {d} with {left} tokens left (max_tokens {max_tokens})"
                );
                left -= 1; // at least one token per round
            }
            if max_tokens == 1 {
                assert_eq!(s.depth_over_time, vec![0], "one token: a plain step");
            }
        }
    }
}

#[test]
fn second_turn_on_a_speculative_session_equals_a_cold_plain_run() {
    let m = load(&tiny_dir());
    let prompts = heldout_prompts(&m);
    for (i, depth) in [DepthPolicy::Fixed(3), DepthPolicy::default()]
        .into_iter()
        .enumerate()
    {
        let first = &prompts[i];
        let turn2 = m.tokenizer.encode("\n\n# next\ndef ", false).unwrap();
        let opts = greedy(40, depth);
        let mut s = Session::with_mtp(m.model.as_ref()).unwrap();
        let g1 = run(&mut s, &m, first, &opts);
        assert_eq!(
            g1.finish,
            FinishReason::Length,
            "first turn should run to the budget"
        );
        // The next turn's prompt: the last generated token (not yet forwarded), then new text.
        let mut next = vec![*g1.token_ids.last().unwrap()];
        next.extend(&turn2);
        let g2 = run(&mut s, &m, &next, &opts);
        assert_eq!(
            g2.finish,
            FinishReason::Length,
            "second turn should run to the budget"
        );
        let third = run(&mut s, &m, &[*g2.token_ids.last().unwrap()], &opts);

        let mut full = first.clone();
        full.extend(&g1.token_ids);
        full.extend(&turn2);
        let cold = plain(&m, &full, &opts);
        assert_eq!(g2.token_ids, cold.token_ids, "second turn at {depth:?}");
        full.extend(&cold.token_ids);
        let cold3 = plain(&m, &full, &opts);
        assert_eq!(third.token_ids, cold3.token_ids, "third turn at {depth:?}");
    }
}

/// In bf16 on the CPU, greedy speculation at the CLI's deepest fixed depths
/// (verifies of 9 to 17 rows) equals plain decoding token for token: the
/// few-rows matmul kernel takes up to 32 rows, each summed in the order of
/// the one-row step, so a verify row's logits are the plain step's bit for
/// bit. (With 9 or more rows sent to MLX's matmul, which sums in another
/// order, the bf16 roundings parted and 'import numpy as np' diverged at
/// its 54th token at depth 8.)
#[test]
fn deep_verifies_equal_plain_decoding_in_bf16() {
    let opts = runner::LoadOptions {
        dtype: mlx_tensor::Dtype::Bfloat16,
        ..runner::LoadOptions::default()
    };
    let m = runner::load(&tiny_dir(), opts, |_, _| {}).expect("tiny-mtp loads in bf16");
    let mut prompts = heldout_prompts(&m)[..4].to_vec();
    let mut numpy = vec![0];
    numpy.extend(m.tokenizer.encode("import numpy as np", false).unwrap());
    prompts.push(numpy);
    let mut drafted = 0;
    for (i, prompt) in prompts.iter().enumerate() {
        let want = plain(&m, prompt, &greedy(100, DepthPolicy::Fixed(0)));
        for depth in [8, 16] {
            let got = speculative(&m, prompt, &greedy(100, DepthPolicy::Fixed(depth)));
            drafted += same_as_plain(&format!("prompt {i} at depth {depth}"), &got, &want).drafted;
        }
    }
    assert!(drafted > 0, "nothing was drafted");
}
