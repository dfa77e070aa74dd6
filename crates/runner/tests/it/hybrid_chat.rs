//! Rewinds that recurrent layers cannot take directly, on the trained Qwen3.5
//! hybrid (`models/tiny-hybrid-mtp`, f32 compute, greedy):
//!
//! - a multi-turn [`Conversation`] (what `mtp-runner chat --script` runs)
//!   whose replies re-tokenize differently from the tokens generated (a stop
//!   string cuts the text short of them), and a restart of the chat (same
//!   system message, the caches kept), with MTP and plain sessions: no turn
//!   fails, the restart replays the system prefix from fresh caches (no
//!   point lies that far back), and every turn equals a cold plain run token
//!   for token;
//! - a stored prefix entry restored into a fresh MTP session, then MTP
//!   generation (its boundary re-run needs the state one token back, which
//!   the entry carries): equal to a cold run, nothing replayed;
//! - [`Session::rewind_to`] to offsets with and without a restore point
//!   (one and a few tokens back, the prompt's end, inside the prompt, 0),
//!   then a continuation: the committed tokens are the prefix and the
//!   continuation equals a cold run.
// Per-turn figures go to stderr (`-- --nocapture`).
#![allow(clippy::print_stderr)]

use crate::common;
use crate::common::Generate;

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use common::parity::{greedy, heldout_prompts};
use runner::Conversation;
use runner::DepthPolicy;
use runner::{GenerateOptions, LoadedModel, Session, Tokenizer};
use runner::{PrefixCache, ReuseSource};

fn model() -> LoadedModel {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-hybrid-mtp");
    common::load(&dir)
}

fn session(m: &LoadedModel, mtp: bool) -> Session<'_> {
    if mtp {
        Session::with_mtp(m.model.as_ref()).unwrap()
    } else {
        Session::new(m.model.as_ref())
    }
}

/// A cold plain run of `prompt`.
fn cold(m: &LoadedModel, tok: &Tokenizer, prompt: &[u32], o: &GenerateOptions) -> Vec<u32> {
    Session::new(m.model.as_ref())
        .run(tok, prompt, o)
        .unwrap()
        .token_ids
}

const LINES: [&str; 5] = [
    "Write a function that adds two numbers.",
    "Now make it print the result.",
    "def main():",
    "Add a docstring.",
    "import os",
];

/// The turn before which the chat starts over.
const RESTART: usize = 3;

#[test]
fn chat_turns_that_retokenize_differently_equal_cold_runs() {
    let m = model();
    let cancel = AtomicBool::new(false);
    for mtp in [true, false] {
        let mut o = greedy(24, DepthPolicy::Fixed(3));
        // The reply's text stops short of the tokens generated (they are
        // committed up to the stop), so the next prompt leaves the session's
        // tokens inside the reply.
        o.stop = vec!["\n".into()];
        let mut chat = Conversation::new(
            session(&m, mtp),
            &m.tokenizer,
            Some("You write Python."),
            16 << 20,
        )
        .unwrap();
        let (mut diverged, mut replayed) = (0, 0);
        // Each turn's figures also show how many tokens were forwarded again.
        let mut held = 0;
        for (i, line) in LINES.iter().enumerate() {
            if i == RESTART {
                chat.reset();
            }
            let t = chat.say(line, &o, &cancel, |_| {}).unwrap();
            chat.session().offset();
            if i > 0 && i != RESTART && t.reused_tokens < held {
                diverged += 1;
            }
            if i == RESTART {
                assert!(
                    t.reused_tokens > 0,
                    "mtp {mtp}: the system prefix is reused"
                );
                assert_eq!(t.replayed_tokens, t.reused_tokens, "mtp {mtp}: from 0");
            }
            replayed += t.replayed_tokens;
            let want = cold(&m, chat.tokenizer(), &t.prompt, &o);
            assert_eq!(
                t.generation.token_ids, want,
                "mtp {mtp} turn {}: differs from a cold run",
                t.index
            );
            eprintln!(
                "mtp {mtp} turn {}: prompt {} reused {} replayed {} ({:?}), held {held}, {} tokens, {:?}",
                t.index,
                t.prompt.len(),
                t.reused_tokens,
                t.replayed_tokens,
                t.source,
                t.generation.token_ids.len(),
                t.generation.finish
            );
            held = chat.session().committed().len();
        }
        assert!(
            diverged > 0,
            "mtp {mtp}: no turn left the session's tokens inside the reply"
        );
        eprintln!(
            "mtp {mtp}: {diverged} turns diverged inside the reply, {replayed} tokens replayed"
        );
    }
}

#[test]
fn a_restored_prefix_entry_then_mtp_equals_a_cold_run() {
    let m = model();
    let prompts = heldout_prompts(&m);
    for (p, depth) in [DepthPolicy::Fixed(3), DepthPolicy::default()]
        .into_iter()
        .enumerate()
    {
        let o = greedy(32, depth);
        let mut a = Session::with_mtp(m.model.as_ref()).unwrap();
        a.run(&m.tokenizer, &prompts[p], &o).unwrap();
        let mut cache = PrefixCache::new(16 << 20);
        assert!(cache.store(&a).unwrap());
        let mut next = a.committed().to_vec();
        next.extend(m.tokenizer.encode("\n\ndef main():\n", false).unwrap());

        let mut b = Session::with_mtp(m.model.as_ref()).unwrap();
        let r = cache.prepare(&mut b, &next).unwrap();
        assert_eq!(r.source, ReuseSource::Stored, "prompt {p}");
        assert_eq!(r.tokens, a.committed().len(), "prompt {p}");
        assert_eq!(r.replayed, 0, "prompt {p}");
        let g = b.run(&m.tokenizer, &next[r.tokens..], &o).unwrap();
        b.offset();
        assert_eq!(
            g.token_ids,
            cold(&m, &m.tokenizer, &next, &o),
            "prompt {p} at {depth:?}"
        );
        assert!(
            g.speculation.unwrap().accepted > 0,
            "prompt {p}: no drafts accepted"
        );
    }
}

#[test]
fn rewind_to_any_offset_then_continue_equals_a_cold_run() {
    let m = model();
    let prompt = &heldout_prompts(&m)[2];
    let more = m.tokenizer.encode("\n# done\n", false).unwrap();
    let o = greedy(24, DepthPolicy::Fixed(3));
    for mtp in [true, false] {
        let mut first: Option<Vec<u32>> = None;
        for back in [1, 2, 5, 24, 30, 60, usize::MAX] {
            let mut s = session(&m, mtp);
            s.run(&m.tokenizer, prompt, &o).unwrap();
            let held = s.committed().to_vec();
            if let Some(f) = &first {
                assert_eq!(&held, f, "mtp {mtp}: the first call is deterministic");
            }
            first = Some(held.clone());
            let n = held.len().saturating_sub(back);
            s.rewind_to(n).unwrap();
            assert_eq!(s.committed(), &held[..n], "mtp {mtp} rewound to {n}");
            s.offset();
            let g = s.run(&m.tokenizer, &more, &o).unwrap();
            let mut full = held[..n].to_vec();
            full.extend(&more);
            assert_eq!(
                g.token_ids,
                cold(&m, &m.tokenizer, &full, &o),
                "mtp {mtp}: continuation after a rewind to {n} of {}",
                held.len()
            );
        }
    }
}
