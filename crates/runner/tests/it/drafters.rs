//! The drafters behind the one speculative loop: greedy parity of the draft
//! model (models/tiny-draft) and of n-gram prompt lookup with plain decoding
//! on models/tiny-mtp (f32), multi-turn sessions, and the tokenizer check
//! that guards a draft model.

use crate::common;
use crate::common::Generate;

use std::path::{Path, PathBuf};

use runner::DepthPolicy;
use runner::testing::{Arch, Fixture, tokenizer_json};
use runner::{
    Error, GenerateOptions, Generation, LoadOptions, LoadedModel, SamplingOptions, Session,
};
use runner::{NgramOptions, load_draft};

pub(crate) fn model_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name)
}

pub(crate) fn greedy(max_tokens: usize, depth: DepthPolicy) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampling: SamplingOptions::greedy(),
        depth,
        ..GenerateOptions::default()
    }
}

/// Prompts of the tiny models' training domain; the repeated ones give prompt
/// lookup something to find.
pub(crate) const PROMPTS: &[&str] = &[
    "Once upon a time, there was a little girl named Lily.",
    "The cat sat on the mat. The dog sat on the rug. The cat sat on the",
    "Tom and Sam went to the park. Tom and Sam played with a ball. Tom and Sam",
    "One day, a big red bird",
];

/// The bundled target and draft model (they share one tokenizer).
fn tiny_target_and_draft() -> (LoadedModel, LoadedModel) {
    let target_dir = model_dir("tiny-mtp");
    let m = common::load(&target_dir);
    let draft = load_draft(
        &model_dir("tiny-draft"),
        &target_dir,
        &m.tokenizer,
        LoadOptions::default(),
    )
    .expect("tiny-draft shares tiny-mtp's tokenizer");
    (m, draft)
}

pub(crate) fn prompt_ids(m: &LoadedModel, text: &str) -> Vec<u32> {
    // Documents start after `<|endoftext|>` (id 0), as in training.
    let mut ids = vec![0];
    ids.extend(m.tokenizer.encode(text, false).expect("prompt encodes"));
    ids
}

pub(crate) fn generate(
    s: &mut Session<'_>,
    m: &LoadedModel,
    prompt: &[u32],
    opts: &GenerateOptions,
) -> Generation {
    let g = s.run(&m.tokenizer, prompt, opts).expect("generation runs");
    assert_eq!(s.offset(), s.committed().len());
    g
}

/// Runs every prompt through a fresh session from `make` at each depth and
/// checks the ids equal plain greedy decoding; returns the summed speculation
/// figures (drafted, accepted).
pub(crate) fn check_parity<'m>(
    m: &'m LoadedModel,
    method: &str,
    make: &dyn Fn() -> Session<'m>,
    depths: &[DepthPolicy],
) -> (usize, usize) {
    let (mut drafted, mut accepted) = (0, 0);
    for text in PROMPTS {
        let prompt = prompt_ids(m, text);
        let plain = generate(
            &mut Session::new(m.model.as_ref()),
            m,
            &prompt,
            &greedy(48, DepthPolicy::Fixed(0)),
        );
        for &depth in depths {
            let mut s = make();
            let g = generate(&mut s, m, &prompt, &greedy(48, depth));
            let spec = common::parity::same_as_plain(
                &format!("{method} at {depth:?} on {text:?}"),
                &g,
                &plain,
            );
            assert_eq!(spec.method.as_str(), method);
            drafted += spec.drafted;
            accepted += spec.accepted;
        }
    }
    (drafted, accepted)
}

pub(crate) const DEPTHS: [DepthPolicy; 4] = [
    DepthPolicy::Fixed(1),
    DepthPolicy::Fixed(3),
    DepthPolicy::Fixed(6),
    DepthPolicy::Auto { max: 6 },
];

#[test]
fn draft_model_greedy_equals_plain() {
    let (m, draft) = tiny_target_and_draft();
    let make = || Session::with_draft_model(m.model.as_ref(), draft.model.as_ref());
    let (drafted, accepted) = check_parity(&m, "draft-model", &make, &DEPTHS);
    // The draft model was really used, and agrees with the target at times.
    assert!(
        drafted > 100 && accepted > drafted / 10,
        "drafted {drafted}, accepted {accepted}"
    );
}

#[test]
fn ngram_greedy_equals_plain() {
    let m = common::load(&model_dir("tiny-mtp"));
    let make = || Session::with_ngram(m.model.as_ref(), NgramOptions::default());
    let (drafted, accepted) = check_parity(&m, "ngram", &make, &DEPTHS);
    assert!(
        drafted > 20 && accepted > 0,
        "drafted {drafted}, accepted {accepted}"
    );
}

/// A second request on the same session: the draft model must catch up with
/// the first request's tokens and the new prompt.
#[test]
fn draft_model_sessions_continue_across_requests() {
    let (m, draft) = tiny_target_and_draft();
    let opts = greedy(24, DepthPolicy::Fixed(3));
    let first = prompt_ids(&m, PROMPTS[0]);
    let second = m.tokenizer.encode(" She liked to", false).unwrap();
    let mut plain = Session::new(m.model.as_ref());
    let mut spec = Session::with_draft_model(m.model.as_ref(), draft.model.as_ref());
    for prompt in [&first, &second] {
        let a = generate(&mut plain, &m, prompt, &opts);
        let b = generate(&mut spec, &m, prompt, &opts);
        assert_eq!(a.token_ids, b.token_ids, "turn with prompt {prompt:?}");
    }
}

fn assert_mismatch(draft_dir: &Path, target_dir: &Path, m: &LoadedModel, detail: &str) {
    let err = load_draft(draft_dir, target_dir, &m.tokenizer, LoadOptions::default())
        .expect_err("a draft model with another tokenizer is refused");
    assert!(
        matches!(err, Error::DraftTokenizerMismatch { .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    let names = [
        draft_dir.display().to_string(),
        target_dir.display().to_string(),
        detail.to_owned(),
    ];
    for needle in &names {
        assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
    }
    assert!(err.is_bad_input());
}

#[test]
fn draft_model_with_another_tokenizer_is_refused() {
    // Control: the bundled pair shares a tokenizer.
    let target_dir = model_dir("tiny-mtp");
    let m = common::load(&target_dir);
    load_draft(
        &model_dir("tiny-draft"),
        &target_dir,
        &m.tokenizer,
        LoadOptions::default(),
    )
    .expect("the bundled draft model passes the check");

    // A byte-level fixture: a different vocabulary size.
    let bytes = common::write(&Fixture::new(Arch::Qwen3), 3);
    let n_fixture = runner::load(bytes.path(), LoadOptions::default(), |_, _| {})
        .unwrap()
        .tokenizer
        .vocab_size();
    assert_mismatch(
        bytes.path(),
        &target_dir,
        &m,
        &format!("{} tokens vs {n_fixture} tokens", m.tokenizer.vocab_size()),
    );

    // Same size, two ids swapped: caught by the token map, not the size.
    let fx = common::write(&Fixture::new(Arch::Qwen3), 4);
    let target_fx = common::load(fx.path());
    let swapped = common::write(&Fixture::new(Arch::Qwen3), 5);
    let mut tj = tokenizer_json();
    let vocab = tj["model"]["vocab"].as_object_mut().unwrap();
    vocab["a"] = 98.into();
    vocab["b"] = 97.into();
    std::fs::write(swapped.path().join("tokenizer.json"), tj.to_string()).unwrap();
    assert_mismatch(
        swapped.path(),
        fx.path(),
        &target_fx,
        "token \"a\" has id 97 in the target but has id 98",
    );
}

/// Sampling with penalties takes the drafters' other paths (random draws,
/// host-read chains, residual draws after a rejected one-hot draft); the
/// caches must stay level and the run must be reproducible from its seed.
#[test]
fn drafters_sample_with_penalties() {
    let (m, draft) = tiny_target_and_draft();
    let opts = GenerateOptions {
        max_tokens: 32,
        sampling: SamplingOptions {
            temperature: 0.8,
            top_p: 0.95,
            repeat_penalty: 1.1,
            seed: Some(11),
            ..SamplingOptions::default()
        },
        depth: DepthPolicy::Fixed(3),
        ..GenerateOptions::default()
    };
    let prompt = prompt_ids(&m, PROMPTS[1]);
    check_seeded(&m, &prompt, &opts, &|| {
        Session::with_draft_model(m.model.as_ref(), draft.model.as_ref())
    });
    check_seeded(&m, &prompt, &opts, &|| {
        Session::with_ngram(m.model.as_ref(), NgramOptions::default())
    });
}

/// Two runs from `make` with the same seeded options give the same tokens.
fn check_seeded<'m>(
    m: &'m LoadedModel,
    prompt: &[u32],
    opts: &GenerateOptions,
    make: &dyn Fn() -> Session<'m>,
) {
    let a = generate(&mut make(), m, prompt, opts);
    let b = generate(&mut make(), m, prompt, opts);
    let method = a.speculation.as_ref().unwrap().method;
    assert_eq!(a.token_ids, b.token_ids, "{method}: same seed, same tokens");
    assert!(!a.token_ids.is_empty(), "{method}");
}
