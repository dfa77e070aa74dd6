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

#![allow(clippy::print_stderr)]

use crate::common;
use crate::widen;

use std::path::PathBuf;

use common::parity::{greedy, heldout_prompts, plain, speculative};
use mlx_tensor::Array;
use mtp_draft::DraftHead;
use runner::DepthPolicy;
use runner::LoadedModel;

/// Largest accepted |upscale − source| of a real logit, f32. The widened
/// matmuls sum the same products plus exact zeros, in other blocks, and the
/// norms see the bias channel's 2^-32 in their sum of squares: differences
/// are a few f32 ulps of the logits (|logit| ≲ 30; 1.3e-5 measured).
const LOGIT_TOL: f32 = 1e-4;

/// Greedy tokens per prompt compared.
const TOKENS: usize = 40;

/// Every padding logit must sit at least this far below the row's smallest real logit.
const PAD_MARGIN: f32 = 1000.0;

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

/// Row-major `[rows, cols]` logits of every position of `ids` (trunk), and of the
/// MTP head fed the trunk's hiddens and the next tokens.
pub(crate) fn logits(m: &LoadedModel, ids: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let model = m.model.as_ref();
    let mut caches = model.new_caches();
    let t = Array::from_slice(ids, &[ids.len() as i32]).unwrap();
    let h = model.forward(&t, &mut caches).unwrap();
    let trunk = model.unembed(&h).unwrap().to_vec::<f32>().unwrap();
    let mut head = model.mtp_head().expect("tiny-mtp has an MTP head");
    let l = ids.len() as i32;
    let next = Array::from_slice(&ids[1..], &[l - 1]).unwrap();
    let o = head
        .forward(&next, &h.slice_axis(0, 0, l - 1).unwrap(), 0)
        .unwrap();
    let mtp = head.unembed(&o.out).unwrap().to_vec::<f32>().unwrap();
    (trunk, mtp)
}

/// Compares `[rows, v]` source logits with `[rows, v2]` upscale logits: the real
/// columns within `tol`, the padding columns [`PAD_MARGIN`] below.
/// Returns the largest difference and the highest padding logit.
pub(crate) fn check_rows(
    what: &str,
    src: &[f32],
    up: &[f32],
    (v, v2): (usize, usize),
    tol: f32,
) -> (f32, f32) {
    let rows = src.len() / v;
    assert_eq!(up.len(), rows * v2, "{what}: logits shape");
    let (mut diff, mut pad_max) = (0f32, f32::NEG_INFINITY);
    for r in 0..rows {
        let (a, b) = (&src[r * v..(r + 1) * v], &up[r * v2..(r + 1) * v2]);
        diff = diff.max(common::max_abs_diff(a, &b[..v]));
        let real_min = a.iter().copied().fold(f32::INFINITY, f32::min);
        let pad = b[v..].iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert!(
            pad < real_min - PAD_MARGIN,
            "{what} row {r}: a padding logit {pad} is not {PAD_MARGIN} below the smallest real logit {real_min}"
        );
        pad_max = pad_max.max(pad);
    }
    assert!(
        diff <= tol,
        "{what}: |upscale - source| reaches {diff} (tolerance {tol})"
    );
    (diff, pad_max)
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

    let src = common::load(&tiny_dir());
    let up = common::load(&out);
    assert_eq!(up.model.config().hidden_size, SHAPE.hidden);
    assert_eq!(up.model.vocab_size(), SHAPE.vocab);

    let prompts = heldout_prompts(&src);
    let (v, v2) = (src.model.vocab_size(), SHAPE.vocab);
    let (a, b) = (logits(&src, &prompts[0]), logits(&up, &prompts[0]));
    let (trunk_diff, trunk_pad) = check_rows("trunk", &a.0, &b.0, (v, v2), LOGIT_TOL);
    let (mtp_diff, mtp_pad) = check_rows("mtp head", &a.1, &b.1, (v, v2), LOGIT_TOL);
    eprintln!(
        "upscale: {} positions; max |diff| trunk {trunk_diff:.2e}, mtp {mtp_diff:.2e}; \
         highest padding logit trunk {trunk_pad:.0}, mtp {mtp_pad:.0}",
        prompts[0].len()
    );

    // Greedy output, plain and MTP at depth 3 and auto; the speculation figures at depth 3.
    for (p, prompt) in prompts.iter().take(2).enumerate() {
        let want = plain(&src, prompt, &greedy(TOKENS, DepthPolicy::Fixed(0)));
        let got = plain(&up, prompt, &greedy(TOKENS, DepthPolicy::Fixed(0)));
        assert_eq!(got.token_ids, want.token_ids, "prompt {p}: plain output");
        for depth in [DepthPolicy::Fixed(3), DepthPolicy::default()] {
            let want = speculative(&src, prompt, &greedy(TOKENS, depth));
            let got = speculative(&up, prompt, &greedy(TOKENS, depth));
            assert_eq!(
                got.token_ids, want.token_ids,
                "prompt {p} {depth:?}: MTP output"
            );
            let (s, u) = (want.speculation.unwrap(), got.speculation.unwrap());
            assert!(s.drafted > 0, "prompt {p} {depth:?}: nothing was drafted");
            // Auto picks depths from measured round times, which differ with the size.
            if depth != DepthPolicy::Fixed(3) {
                continue;
            }
            assert_eq!(
                (u.drafted, u.accepted, u.rounds),
                (s.drafted, s.accepted, s.rounds),
                "prompt {p} {depth:?}: speculation figures"
            );
            assert_eq!(
                u.per_position_acceptance(),
                s.per_position_acceptance(),
                "prompt {p} {depth:?}: acceptance per draft position"
            );
        }
    }
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
