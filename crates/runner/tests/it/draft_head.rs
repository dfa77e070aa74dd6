//! How the MTP head drafts (`LoadOptions::draft_quant`, a quantized head;
//! `LoadOptions::draft_vocab`, a vocabulary subset) on the bundled models
//! (f32, CPU): greedy speculative output equals plain decoding, the head's
//! logits really change (and stay close, or are the full head's on the
//! subset), sampled output keeps the target's distribution, and a model
//! without a head loads and decodes as before.
// The measured figures are reported on stderr (`-- --nocapture` shows them).
#![allow(clippy::print_stderr)]

use crate::common;
use crate::common::parity::{Totals, greedy, heldout_prompts, plain, same_as_plain, speculative};
use crate::moe_model::argmax;
use crate::mtp_layouts::head_logits;
use crate::spec_sampling::{ALPHA, RUNS, assert_lossless, first_pairs, report};

use std::path::PathBuf;

use mlx_tensor::Array;
use runner::{
    DepthPolicy, DraftHeadSetup, DraftQuant, DraftVocab, LoadOptions, LoadedModel, QuantParams,
    SamplingOptions,
};

fn bundled(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name)
}

/// `models/<name>` in f32 with the draft head at `q`.
fn load(name: &str, q: DraftQuant) -> LoadedModel {
    load_with(name, q, DraftVocab::Off)
}

/// `models/<name>` in f32 with the draft head at `q` over the vocabulary `v`.
fn load_with(name: &str, q: DraftQuant, v: DraftVocab) -> LoadedModel {
    let opts = LoadOptions {
        draft_quant: q,
        draft_vocab: v,
        ..LoadOptions::default()
    };
    runner::load(&bundled(name), opts, |_, _| {}).expect("bundled model loads")
}

/// Tokens generated per greedy parity case.
const TOKENS: usize = 80;

/// Greedy MTP at depth 3 with the head at `q` is plain decoding of the
/// full-precision model token for token, on the first `prompts` held-out
/// prompts; returns the summed speculation figures.
fn greedy_parity(name: &str, q: DraftQuant, prompts: usize) -> Totals {
    greedy_parity_with(name, q, DraftVocab::Off, prompts)
}

/// [`greedy_parity`] with the head drafting over the vocabulary `v`.
fn greedy_parity_with(name: &str, q: DraftQuant, v: DraftVocab, prompts: usize) -> Totals {
    let full = load(name, DraftQuant::Off);
    let quantized = load_with(name, q, v);
    let mut t = Totals::default();
    for (p, prompt) in heldout_prompts(&full).iter().take(prompts).enumerate() {
        let want = plain(&full, prompt, &greedy(TOKENS, DepthPolicy::Fixed(0)));
        let got = speculative(&quantized, prompt, &greedy(TOKENS, DepthPolicy::Fixed(3)));
        t.add(same_as_plain(
            &format!("{name} {q:?} {v:?} prompt {p}"),
            &got,
            &want,
        ));
    }
    eprint!("{name} {q:?} {v:?}: ");
    t.report(DepthPolicy::Fixed(3));
    assert!(
        t.drafted > 0 && t.accepted > 0,
        "{name} {q:?} {v:?}: drafted {}, accepted {}",
        t.drafted,
        t.accepted
    );
    t
}

/// Measured on tiny-mtp over 4 prompts x 80 tokens at depth 3 (acceptance,
/// accepted over drafted): full precision 0.688 (214/311), q8 0.659
/// (211/320), q4 0.704 (216/307). The bound: a quantized head keeps at least
/// 0.8 of the full head's acceptance (measured 0.96 and 1.02).
#[test]
fn greedy_speculation_with_a_quantized_head_equals_plain_decoding() {
    let full = greedy_parity("tiny-mtp", DraftQuant::Off, 4);
    for bits in [8, 4] {
        let q = greedy_parity("tiny-mtp", DraftQuant::Bits(bits), 4);
        assert!(
            q.acceptance() >= 0.8 * full.acceptance(),
            "q{bits} acceptance {:.3} against {:.3} in full precision",
            q.acceptance(),
            full.acceptance()
        );
    }
}

/// The Qwen3.5 head's gated-attention block is quantized too (its MoE
/// feed-forward, in the MoE model, kept as it is): greedy parity on two
/// prompts each. Measured acceptance at q4: hybrid 0.391 (86/220), MoE 0.720
/// (108/150).
#[test]
fn greedy_parity_holds_for_the_hybrid_and_moe_heads_at_q4() {
    for name in ["tiny-hybrid-mtp", "tiny-moe-mtp"] {
        greedy_parity(name, DraftQuant::Bits(4), 2);
    }
}

/// The MTP head's logits for `ids` (`mtp_layouts::head_logits`) and the
/// trunk's own logits over the same rows.
fn logits(m: &LoadedModel, ids: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let model = m.model.as_ref();
    let a = Array::from_slice(ids, &[ids.len() as i32]).unwrap();
    let hidden = model.forward(&a, &mut model.new_caches()).unwrap();
    let trunk = model.unembed(&hidden).unwrap().to_vec::<f32>().unwrap();
    (head_logits(m, ids), trunk)
}

/// What the quantized head's logits do against the full head's, over every
/// row of `prompts` held-out prompts: max |Δ| and that over the full
/// logits' range (max − min), the share of rows with the same top-1 token.
#[derive(Debug)]
struct HeadDiff {
    max_abs: f32,
    relative: f32,
    top1_agree: f64,
    /// Rows compared (shown in the report).
    #[allow(dead_code)]
    rows: usize,
}

fn head_diff(name: &str, bits: u32, prompts: usize) -> HeadDiff {
    let full = load(name, DraftQuant::Off);
    let quantized = load(name, DraftQuant::Bits(bits));
    let vocab = full.model.vocab_size();
    let (mut max_abs, mut range, mut agree, mut rows) = (0f32, 0f32, 0, 0);
    for ids in heldout_prompts(&full).iter().take(prompts) {
        let (want, trunk) = logits(&full, ids);
        let (got, q_trunk) = logits(&quantized, ids);
        // The trunk keeps its weights: the verify reads full precision.
        assert_eq!(trunk, q_trunk, "{name} q{bits}: trunk logits changed");
        max_abs = max_abs.max(common::max_abs_diff(&want, &got));
        let (lo, hi) = want
            .iter()
            .fold((f32::MAX, f32::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        range = range.max(hi - lo);
        for (w, g) in want.chunks(vocab).zip(got.chunks(vocab)) {
            agree += usize::from(argmax(w) == argmax(g));
            rows += 1;
        }
    }
    let d = HeadDiff {
        max_abs,
        relative: max_abs / range,
        top1_agree: agree as f64 / rows as f64,
        rows,
    };
    eprintln!("{name} q{bits} head against full precision: {d:?}");
    d
}

/// Measured on tiny-mtp, 4 prompts (375 rows, logits' range about 37): q4
/// max |Δ| 1.93 (0.052 of the range), top-1 agreement 0.928; q8 0.113
/// (0.0031), 0.995. tiny-hybrid-mtp at q4, 2 prompts (188 rows): 3.50
/// (0.082), 0.904. The bounds leave at least 2x margin on the relative
/// error and several points on agreement; a head left in full precision
/// gives |Δ| = 0 (the same arrays, the same kernels) and fails the first.
#[test]
fn a_quantized_head_drafts_different_but_close_logits() {
    let q4 = head_diff("tiny-mtp", 4, 4);
    assert!(q4.max_abs > 0.1, "q4 head logits unchanged: {q4:?}");
    assert!(q4.relative < 0.2, "q4 head logits too far: {q4:?}");
    assert!(q4.top1_agree > 0.8, "q4 head top-1: {q4:?}");
    let q8 = head_diff("tiny-mtp", 8, 4);
    assert!(q8.max_abs > 1e-2, "q8 head logits unchanged: {q8:?}");
    assert!(
        q8.max_abs < q4.max_abs,
        "q8 is no closer than q4: {q8:?} {q4:?}"
    );
    assert!(q8.top1_agree > 0.95, "q8 head top-1: {q8:?}");
    // The gated block of the Qwen3.5 head.
    let hybrid = head_diff("tiny-hybrid-mtp", 4, 2);
    assert!(hybrid.max_abs > 0.1, "hybrid q4 head unchanged: {hybrid:?}");
    assert!(hybrid.relative < 0.2, "hybrid q4 head too far: {hybrid:?}");
    assert!(hybrid.top1_agree > 0.8, "hybrid q4 head top-1: {hybrid:?}");
}

/// A head drafting over the 1,024 lowest ids (and the special tokens) of
/// the 8,192 keeps greedy parity on three families, with lower acceptance
/// where the target picks tokens outside the subset. Measured acceptance at
/// depth 3: tiny-mtp 0.405 (174/430; 0.688 over the whole vocabulary),
/// tiny-moe-mtp 0.477 (94/197), tiny-hybrid-mtp 0.345 (80/232).
#[test]
fn greedy_parity_holds_for_a_head_over_a_vocabulary_subset() {
    let v = DraftVocab::Top(1024);
    greedy_parity_with("tiny-mtp", DraftQuant::Off, v, 4);
    for name in ["tiny-moe-mtp", "tiny-hybrid-mtp"] {
        greedy_parity_with(name, DraftQuant::Off, v, 2);
    }
}

/// Over a subset the head's logits are the full head's on the subset's ids
/// (the same rows, gathered: within 1e-4 in f32) and −∞ everywhere else;
/// load reports the subset, and the trunk keeps its whole unembedding.
#[test]
fn a_head_over_a_subset_keeps_its_logits_there_and_drafts_nothing_else() {
    let full = load("tiny-mtp", DraftQuant::Off);
    let sub = load_with("tiny-mtp", DraftQuant::Off, DraftVocab::Top(1024));
    let ids = sub
        .draft_head
        .vocab
        .clone()
        .expect("load reports the subset");
    assert!(ids.len() >= 1024 && ids.len() < 1100, "{} ids", ids.len());
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    assert!(full.draft_head.is_plain());
    let vocab = full.model.vocab_size();
    let inside: Vec<bool> = (0..vocab as u32)
        .map(|t| ids.binary_search(&t).is_ok())
        .collect();
    for prompt in heldout_prompts(&full).iter().take(2) {
        let (want, trunk) = logits(&full, prompt);
        let (got, sub_trunk) = logits(&sub, prompt);
        assert_eq!(trunk, sub_trunk, "trunk logits changed");
        for (w, g) in want.chunks(vocab).zip(got.chunks(vocab)) {
            for (t, ((&w, &g), &inside)) in w.iter().zip(g).zip(&inside).enumerate() {
                if inside {
                    assert!((w - g).abs() <= 1e-4, "token {t}: {g} against {w}");
                } else {
                    assert_eq!(g, f32::NEG_INFINITY, "token {t} outside the subset");
                }
            }
        }
    }
}

/// Seeds, sample size and α as in `spec_sampling`: speculative runs with a
/// q4 head drafting over the 1,024 lowest ids use seeds `0..RUNS`, plain
/// runs of the full model `1_000_000..`; the first two tokens'
/// distributions must not differ at α. Both changes to the draft
/// distribution `q` are covered: coarser weights, and zero probability
/// outside the subset (where the target's share is sampled from the
/// residual alone). The control (the same speculative sample against plain
/// at temperature 0.7, seeds `2_000_000..`) must differ. Measured: p = 0.18
/// (chi2 44.7, df 37), control p = 3.1e-20.
/// About 130 s on the 2-core CI machine in the dev profile (MLX's quantized
/// matmul is slower on this CPU than the dense rows kernel).
#[test]
fn sampled_speculation_with_a_q4_subset_head_keeps_the_target_distribution() {
    let full = load("tiny-mtp", DraftQuant::Off);
    let head = load_with("tiny-mtp", DraftQuant::Bits(4), DraftVocab::Top(1024));
    assert!(head.draft_head.quant.is_some() && head.draft_head.vocab.is_some());
    let t1 = SamplingOptions::default();
    let spec = first_pairs(&head, &t1, true, 0, RUNS);
    let plain = first_pairs(&full, &t1, false, 1_000_000, RUNS);
    let name = "q4 head over 1,024 ids, temperature 1";
    assert_lossless(&report(name, &spec, &plain), name);
    let t07 = SamplingOptions {
        temperature: 0.7,
        ..SamplingOptions::default()
    };
    let cold = first_pairs(&full, &t07, false, 2_000_000, RUNS);
    let h = report("control: q4 subset spec T=1 vs plain T=0.7", &spec, &cold);
    assert!(h.p_value < ALPHA, "control not rejected: {h:?}");
}

/// A family without an MTP head has nothing to quantize: loading with q4
/// succeeds, `adapt_draft_head` says so, and decoding is unchanged.
#[test]
fn a_model_without_a_head_loads_with_q4_and_decodes_as_before() {
    let p = DraftHeadSetup {
        quant: Some(QuantParams::affine(64, 4)),
        vocab: Some(vec![0, 1, 2]),
    };
    let mut q = load("tiny-draft", DraftQuant::Bits(4));
    assert!(q.model.mtp_head().is_none());
    assert!(
        q.draft_head.is_plain(),
        "nothing was set up: {:?}",
        q.draft_head
    );
    assert!(!q.model.adapt_draft_head(&p).unwrap());
    let full = load("tiny-draft", DraftQuant::Off);
    for prompt in heldout_prompts(&full).iter().take(2) {
        let opts = greedy(32, DepthPolicy::Fixed(0));
        let want = plain(&full, prompt, &opts);
        let got = plain(&q, prompt, &opts);
        assert_eq!(got.token_ids.len(), 32);
        assert_eq!(got.token_ids, want.token_ids);
    }
    // A model with a head reports that it quantized it.
    let mut mtp = load("tiny-mtp", DraftQuant::Off);
    assert!(mtp.model.adapt_draft_head(&p).unwrap());
}
