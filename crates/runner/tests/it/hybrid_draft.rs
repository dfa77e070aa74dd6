//! A draft model with recurrent (Gated DeltaNet) layers behind
//! `--draft-model`: its caches rewind after every rejected draft from the
//! snapshots its proposal scheduled, so greedy speculation equals plain
//! greedy token for token (f32) with a KV target and with a hybrid target.
// The measured figures are reported on stderr (`-- --nocapture` shows them).
#![allow(clippy::print_stderr)]

use crate::common;
use crate::drafters::{DEPTHS, PROMPTS, check_parity, generate, greedy, model_dir, prompt_ids};

use runner::{DepthPolicy, LoadOptions, LoadedModel, Session, load_draft};

/// The bundled `target` with the bundled `draft` (all share one tokenizer).
fn pair(target: &str, draft: &str) -> (LoadedModel, LoadedModel) {
    let target_dir = model_dir(target);
    let m = common::load(&target_dir);
    let d = load_draft(
        &model_dir(draft),
        &target_dir,
        &m.tokenizer,
        LoadOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{draft} drafts for {target}: {e}"));
    (m, d)
}

/// Two different models, so drafts are rejected every few tokens: each
/// rejection rewinds the hybrid draft model's recurrent state (before the
/// fix, the first one failed with `SnapshotMissing`). Checked at depths 1,
/// 3, 6 and auto over four prompts, 48 tokens each; some drafts must be
/// accepted (the draft model was really used) and many rejected.
#[test]
fn hybrid_draft_model_greedy_equals_plain() {
    for (target, draft) in [
        ("tiny-mtp", "tiny-hybrid-mtp"),
        ("tiny-hybrid-mtp", "tiny-moe-mtp"),
    ] {
        let (m, d) = pair(target, draft);
        assert!(
            d.model.new_caches().iter().any(|c| !c.rewinds_by_offset()),
            "{draft} has recurrent layers"
        );
        let make = || Session::with_draft_model(m.model.as_ref(), d.model.as_ref());
        let (drafted, accepted) = check_parity(&m, "draft-model", &make, &DEPTHS);
        eprintln!("{draft} drafting for {target}: accepted {accepted} of {drafted}");
        assert!(accepted > 0, "{draft} for {target}: nothing accepted");
        assert!(
            drafted - accepted > 50,
            "{draft} for {target}: only {} rejections of {drafted} drafts",
            drafted - accepted
        );
    }
}

/// A second request on the same session: the hybrid draft model keeps its
/// state across the turn (its caches stand at the committed tokens after
/// the last round's rewind) and catches up with the new prompt.
#[test]
fn hybrid_draft_model_sessions_continue_across_requests() {
    let (m, d) = pair("tiny-mtp", "tiny-hybrid-mtp");
    let opts = greedy(24, DepthPolicy::Fixed(3));
    let first = prompt_ids(&m, PROMPTS[0]);
    let second = m.tokenizer.encode(" She liked to", false).unwrap();
    let mut plain = Session::new(m.model.as_ref());
    let mut spec = Session::with_draft_model(m.model.as_ref(), d.model.as_ref());
    for prompt in [&first, &second] {
        let a = generate(&mut plain, &m, prompt, &opts);
        let b = generate(&mut spec, &m, prompt, &opts);
        assert_eq!(a.token_ids, b.token_ids, "turn with prompt {prompt:?}");
        let s = b.speculation.expect("speculative statistics");
        assert!(s.drafted > s.accepted, "no rejection this turn: {s:?}");
    }
}
