//! `cargo xtask upscale` preserves a Qwen3.5-MoE's function: a small variant
//! of the `moe` construction on models/tiny-moe-mtp ([`SMALL`]: hidden 256 →
//! 512, 6 → 8 layers, attention 4/2 → 8/2 heads, Gated DeltaNet 2/4 → 4/8
//! heads, 8 experts × 4 copies with top-2 → top-8, expert width 64 → 128,
//! shared expert 256 → 384, vocabulary 8192 → 8256) gives, in f32, the
//! source's logits within [`LOGIT_TOL`] (trunk and MTP head), padding logits
//! far below every real one, and token for token the same greedy output,
//! plain and MTP (depth 3 and auto), with the same acceptance per draft
//! position at depth 3. The two all-zero layers add exactly nothing: an
//! upscale that differs only by them gives bit-identical logits.
//!
//! The widening code is xtask's own file (`xtask/src/upscale/moe.rs`).

#![allow(clippy::print_stderr)]

use crate::common;
use crate::common::upscale::{assert_same_function, logits};
use crate::widen::OutDtype;
use crate::widen_moe::{self, MoeShape};

use std::path::{Path, PathBuf};

use common::parity::heldout_prompts;
use serde_json::Value;

/// Largest accepted |upscale − source| of a real logit, f32. The widened
/// matmuls sum the same products (weights scaled by sqrt(2) and back, one
/// rounding each) plus exact zeros, and a token's expert outputs are summed
/// as 8 weighted copies instead of 2: a few f32 ulps of the logits
/// (|logit| ≲ 20; 1.9e-5 measured with mlx-lm on this construction).
const LOGIT_TOL: f32 = 2e-4;

const SMALL: MoeShape = MoeShape {
    hidden: 512,
    layers: 8,
    heads: 8,
    kv_heads: 2,
    linear_key_heads: 4,
    linear_value_heads: 8,
    expert_copies: 4,
    moe_intermediate: 128,
    shared_intermediate: 384,
    vocab: 8256,
};

fn tiny_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-moe-mtp")
}

fn config(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

#[test]
fn a_moe_upscale_computes_what_its_source_computes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("up");
    let t = std::time::Instant::now();
    let summary = widen_moe::upscale(&tiny_dir(), &SMALL, &out, OutDtype::F32, 64 << 20)
        .expect("tiny-moe-mtp upscales");
    eprintln!(
        "moe upscale: {} params, {} bytes, {} files in {:.2} s",
        summary.params,
        summary.bytes,
        summary.files.len(),
        t.elapsed().as_secs_f64()
    );
    assert_eq!(summary.bias_channel, Some(256));
    assert!(summary.files.len() > 1, "a 64 MiB shard limit splits it");
    let c = &config(&out)["text_config"];
    assert_eq!(
        (c["num_experts"].as_u64(), c["num_experts_per_tok"].as_u64()),
        (Some(32), Some(8))
    );
    assert_eq!(c["layer_types"][6], "linear_attention");
    assert_eq!(c["layer_types"][7], "linear_attention");
    assert_eq!(c["tie_word_embeddings"], false);

    let fixed_3 = assert_same_function(
        "moe upscale",
        &tiny_dir(),
        &out,
        (SMALL.hidden, SMALL.vocab),
        LOGIT_TOL,
    );
    for (p, s) in fixed_3.iter().enumerate() {
        assert!(s.accepted > 0, "prompt {p}: no draft accepted");
    }
}

#[test]
fn zero_layers_of_a_moe_upscale_add_exactly_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let six = MoeShape { layers: 6, ..SMALL };
    let (a, b) = (dir.path().join("six"), dir.path().join("eight"));
    widen_moe::upscale(&tiny_dir(), &six, &a, OutDtype::F32, 1 << 30).unwrap();
    widen_moe::upscale(&tiny_dir(), &SMALL, &b, OutDtype::F32, 1 << 30).unwrap();
    let (six, eight) = (common::load(&a), common::load(&b));
    let prompt = &heldout_prompts(&six)[1];
    let (x, y) = (logits(&six, prompt), logits(&eight, prompt));
    // The zero layers' outputs are exact zeros: the residual, hence every logit, is bit-identical.
    assert_eq!(x.0, y.0, "trunk logits with two zero layers added");
    assert_eq!(x.1, y.1, "MTP logits with two zero layers added");
}

#[test]
fn bad_moe_shapes_are_errors_that_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let check = |shape: MoeShape, want: &str| {
        let err = widen_moe::upscale(
            &tiny_dir(),
            &shape,
            &dir.path().join("x"),
            OutDtype::F32,
            1 << 30,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains(want), "{err:?} should contain {want:?}");
    };
    check(
        MoeShape {
            hidden: 128,
            ..SMALL
        },
        "hidden=128 is smaller",
    );
    check(
        MoeShape {
            expert_copies: 0,
            ..SMALL
        },
        "expert_copies=0 is smaller",
    );
    check(
        MoeShape {
            heads: 4,
            kv_heads: 4,
            ..SMALL
        },
        "below the source's group of 2",
    );
    check(
        MoeShape {
            linear_value_heads: 6,
            linear_key_heads: 4,
            ..SMALL
        },
        "linear_value_heads must be a multiple of linear_key_heads",
    );
    check(
        MoeShape {
            hidden: 256,
            ..SMALL
        },
        "spare hidden channel",
    );
    // A dense source is no Qwen3.5-MoE.
    let dense = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-mtp");
    let err = widen_moe::upscale(
        &dense,
        &SMALL,
        &dir.path().join("y"),
        OutDtype::F32,
        1 << 30,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("knows Qwen3.5-MoE"), "{err}");
    assert!(!widen_moe::is_moe_model(&dense) && widen_moe::is_moe_model(&tiny_dir()));
    let named = widen_moe::parse_shape("moe").unwrap();
    assert_eq!(
        (named.hidden, named.layers, named.expert_copies),
        (2048, 40, 8)
    );
    assert!(
        widen_moe::parse_shape("hidden=512,layers=8")
            .unwrap_err()
            .to_string()
            .contains("no `heads=`")
    );
    assert!(
        widen_moe::parse_shape("big")
            .unwrap_err()
            .to_string()
            .contains("unknown MoE shape `big`")
    );
}
