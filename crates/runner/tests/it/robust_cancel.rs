//! Cancellation in the middle of a chat turn, in prefill and in decode, plain
//! and with MTP speculation: the turn ends `Cancelled` with what it had, the
//! caches hold exactly the committed tokens, and the next turn of the same
//! conversation generates what a cold session generates for its prompt.

use crate::common;

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

use kvcache::Cache;
use mlx_tensor::Array;
use runner::Conversation;
use runner::DepthPolicy;
use runner::testing::{Arch, Fixture};
use runner::{FinishReason, GenerateOptions, Model, ModelConfig, SamplingOptions, Session};

/// A model that sets `cancel` when its `at`-th forward starts (counting
/// from 1), as a Ctrl-C landing at that point would.
#[derive(Debug)]
struct CancelAt<'a> {
    inner: &'a dyn Model,
    cancel: &'a AtomicBool,
    at: Cell<usize>,
    forwards: Cell<usize>,
}

impl Model for CancelAt<'_> {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn Cache>]) -> runner::Result<Array> {
        self.forwards.set(self.forwards.get() + 1);
        if self.forwards.get() == self.at.get() {
            self.cancel.store(true, Ordering::Relaxed);
        }
        self.inner.forward(tokens, caches)
    }
    fn unembed(&self, hidden: &Array) -> runner::Result<Array> {
        self.inner.unembed(hidden)
    }
    fn new_caches(&self) -> Vec<Box<dyn Cache>> {
        self.inner.new_caches()
    }
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn mtp_head(&self) -> Option<Box<dyn mtp_draft::DraftHead>> {
        self.inner.mtp_head()
    }
}

/// A random-weight Qwen3 with an MTP head and a ChatML template.
fn mtp_fixture() -> (tempfile::TempDir, runner::LoadedModel) {
    let fx = Fixture {
        mtp: true,
        ..Fixture::new(Arch::Qwen3)
    };
    let dir = common::write(&fx, 11);
    let m = common::load(dir.path());
    (dir, m)
}

fn opts() -> GenerateOptions {
    GenerateOptions {
        max_tokens: 24,
        sampling: SamplingOptions::greedy(),
        // Small chunks, so a prompt is several prefill forwards.
        prefill_chunk: 8,
        // Random MTP weights: a fixed depth drafts even when drafts do not pay.
        depth: DepthPolicy::Fixed(3),
        ..GenerateOptions::default()
    }
}

fn session<'m>(model: &'m dyn Model, speculative: bool) -> Session<'m> {
    if speculative {
        Session::with_mtp(model).expect("the fixture has an MTP head")
    } else {
        Session::new(model)
    }
}

/// Where turn 1 is cancelled.
#[derive(Debug, Clone, Copy)]
enum At {
    /// When the n-th forward starts (prefill chunks come first).
    Forward(usize),
    /// When the n-th piece of text has been streamed.
    Piece(usize),
}

/// Runs turn 1 cancelled `at`, then turn 2, and compares turn 2 with a cold
/// session on the same prompt.
fn check(speculative: bool, at: At) {
    let (_dir, m) = mtp_fixture();
    let cancel = AtomicBool::new(false);
    let model = CancelAt {
        inner: m.model.as_ref(),
        cancel: &cancel,
        at: Cell::new(match at {
            At::Forward(n) => n,
            At::Piece(_) => 0,
        }),
        forwards: Cell::new(0),
    };
    let mut chat = Conversation::new(session(&model, speculative), &m.tokenizer, None, 0).unwrap();
    let long = "Write a long story about a lighthouse keeper and the sea. ".repeat(2);
    let mut pieces = 0;
    let t1 = chat
        .say(&long, &opts(), &cancel, |_| {
            pieces += 1;
            if matches!(at, At::Piece(n) if n == pieces) {
                cancel.store(true, Ordering::Relaxed);
            }
        })
        .unwrap();
    assert_eq!(t1.generation.finish, FinishReason::Cancelled, "{at:?}");
    match at {
        At::Forward(_) => assert!(t1.generation.token_ids.is_empty(), "{at:?}"),
        At::Piece(n) => assert!(
            (n..opts().max_tokens).contains(&t1.generation.token_ids.len()),
            "{at:?}: {} tokens",
            t1.generation.token_ids.len()
        ),
    }
    let s = chat.session();
    assert_eq!(s.offset(), s.committed().len());
    assert_eq!(
        &t1.prompt[..s.committed().len().min(t1.prompt.len())],
        &s.committed()[..s.committed().len().min(t1.prompt.len())],
        "the caches hold a prefix of the prompt and the reply"
    );
    assert_eq!(
        mlx_tensor::live_pins(),
        0,
        "pins left by the cancelled turn"
    );
    // The reply so far is in the history.
    assert_eq!(chat.messages().len(), 2);
    assert_eq!(chat.messages()[1].content, t1.generation.text);

    // Turn 2 in the same conversation, not cancelled.
    cancel.store(false, Ordering::Relaxed);
    model.at.set(0);
    let t2 = chat.say("And then?", &opts(), &cancel, |_| {}).unwrap();
    assert_ne!(t2.generation.finish, FinishReason::Cancelled);
    assert!(t2.reused_tokens > 0, "the live caches are reused");
    // Cold: a fresh session of the same kind on the whole prompt.
    let mut cold = session(m.model.as_ref(), speculative);
    let g = cold
        .generate(chat.tokenizer(), &t2.prompt, &opts(), &cancel, |_| {})
        .unwrap();
    assert_eq!(
        t2.generation.token_ids, g.token_ids,
        "speculative {speculative}, cancelled {at:?}: turn 2 differs from a cold run"
    );
    assert_eq!(t2.generation.finish, g.finish);
    drop(chat);
    drop(cold);
    assert_eq!(mlx_tensor::live_pins(), 0);
}

#[test]
fn cancel_in_prefill_then_the_next_turn_equals_a_cold_run() {
    // The prompt is dozens of tokens in chunks of 8: forward 3 is inside prefill.
    check(false, At::Forward(3));
    check(true, At::Forward(3));
}

#[test]
fn cancel_in_decode_then_the_next_turn_equals_a_cold_run() {
    check(false, At::Piece(3));
    check(true, At::Piece(3));
}
