//! `cargo xtask upscale` preserves the function: a small upscale of the
//! bundled tiny-mtp (hidden 512 → 640, 6 → 8 layers, 8/4 → 12/4 heads, so the
//! query group grows from 2 to 3, intermediate 1536 → 1792, vocabulary 8192 →
//! 8256) gives, in f32, the source's logits within [`LOGIT_TOL`] (trunk and MTP
//! head), padding logits far below every real one, and token-for-token the
//! same greedy output, plain and MTP (depth 3 and auto), with the same
//! acceptance at depth 3 (auto chooses depths from measured times).
//!
//! The widening code is xtask's own file, included here so the test runs the
//! very code the GPU bundle runs, without a second copy.

use crate::common::upscale::assert_same_function;
use crate::widen;

use std::path::PathBuf;

/// Largest accepted |upscale − source| of a real logit, f32. The widened
/// matmuls sum the same products plus exact zeros, in other blocks, and the
/// norms see the bias channel's 2^-32 in their sum of squares: differences
/// are a few f32 ulps of the logits (|logit| ≲ 30; 1.3e-5 measured).
const LOGIT_TOL: f32 = 1e-4;

const SHAPE: widen::Shape = widen::Shape {
    hidden: 640,
    intermediate: 1792,
    layers: 8,
    heads: 12,
    kv_heads: 4,
    vocab: 8256,
};

fn tiny_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-mtp")
}

#[test]
fn an_upscale_computes_what_its_source_computes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("up");
    let summary = widen::upscale(&tiny_dir(), &SHAPE, &out, widen::OutDtype::F32, 64 << 20)
        .expect("tiny-mtp upscales");
    assert!(summary.exact_qk, "f32 storage scales q/k exactly");
    assert_eq!(summary.bias_channel, Some(512));
    assert!(
        summary.files.len() > 1,
        "a 64 MiB shard limit splits the upscale"
    );

    assert_same_function(
        "upscale",
        &tiny_dir(),
        &out,
        (SHAPE.hidden, SHAPE.vocab),
        LOGIT_TOL,
    );
}

#[test]
fn bad_shapes_are_errors_that_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let check = |shape: widen::Shape, want: &str| {
        let err = widen::upscale(
            &tiny_dir(),
            &shape,
            &dir.path().join("x"),
            widen::OutDtype::Bf16,
            1 << 30,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains(want), "{err:?} should contain {want:?}");
    };
    check(
        widen::Shape {
            hidden: 256,
            ..SHAPE
        },
        "hidden=256 is smaller",
    );
    check(
        widen::Shape {
            heads: 16,
            kv_heads: 16,
            ..SHAPE
        },
        "below the source's group of 2",
    );
    check(
        widen::Shape {
            hidden: 512,
            ..SHAPE
        },
        "spare hidden channel",
    );
    check(widen::Shape { heads: 13, ..SHAPE }, "multiple of kv_heads");
    assert!(
        widen::parse_shape("9b")
            .unwrap_err()
            .to_string()
            .contains("24l, 1.7b, 8b, 0.6b")
    );
    assert_eq!(
        widen::parse_shape("hidden=640,intermediate=1792,layers=8,heads=12,kv_heads=4,vocab=8256")
            .unwrap(),
        SHAPE
    );
}
