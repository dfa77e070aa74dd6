//! Greedy parity of MTP speculative decoding with plain decoding on the
//! trained Qwen3.5 hybrid (`models/tiny-hybrid-mtp`, f32 compute): held-out
//! prompts × 128 tokens at depths 1–4 and auto, through the same sweep as
//! tiny-mtp's parity test. Every verify rewinds the Gated DeltaNet layers
//! from the states captured in the verify forward.
// The measured figures are reported on stderr (`-- --nocapture` shows them).
#![allow(clippy::print_stderr)]

use crate::common;

use std::path::PathBuf;

use common::parity::{PARITY_TOKENS, depths, heldout_prompts, sweep};

/// Held-out prompts in the sweep (each runs plain and at 5 depths, 128 tokens).
const PROMPTS: usize = 5;

#[test]
fn greedy_speculation_equals_plain_on_the_trained_hybrid() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-hybrid-mtp");
    let m = common::load(&dir);
    assert!(m.model.mtp_head().is_some(), "tiny-hybrid-mtp has mtp.*");
    let prompts = heldout_prompts(&m);
    let (totals, compared) = sweep(&m, &prompts[..PROMPTS], PARITY_TOKENS);
    for (depth, t) in depths().into_iter().zip(totals) {
        t.report(depth);
        // A trained head (agreement 0.77) must have its drafts accepted, or
        // the parity proves nothing about the rewinds.
        assert!(
            t.acceptance() > 0.25,
            "{depth:?}: accepted {} of {} drafts",
            t.accepted,
            t.drafted
        );
    }
    eprintln!("hybrid parity: {PROMPTS} prompts x 5 depths, {compared} tokens compared");
    assert!(compared >= PROMPTS * 5 * PARITY_TOKENS / 2);
}
