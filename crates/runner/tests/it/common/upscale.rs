//! The check both upscale tests make (tests/it/upscale.rs, upscale_moe.rs):
//! an upscale computes what its source computes, in logits and in greedy
//! output, plain and MTP.

#![allow(clippy::print_stderr)]

use std::path::Path;

use mlx_tensor::Array;
use mtp_draft::DraftHead;
use runner::{DepthPolicy, LoadedModel, SpecStats};

use super::parity::{greedy, heldout_prompts, plain, speculative};

/// Greedy tokens per prompt compared.
const TOKENS: usize = 40;

/// Every padding logit must sit at least this far below the row's smallest real logit.
const PAD_MARGIN: f32 = 1000.0;

/// Row-major `[rows, cols]` logits of every position of `ids` (trunk), and of the
/// MTP head fed the trunk's hiddens and the next tokens.
pub(crate) fn logits(m: &LoadedModel, ids: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let model = m.model.as_ref();
    let mut caches = model.new_caches();
    let t = Array::from_slice(ids, &[ids.len() as i32]).unwrap();
    let h = model.forward(&t, &mut caches).unwrap();
    let trunk = model.unembed(&h).unwrap().to_vec::<f32>().unwrap();
    let mut head = model.mtp_head().expect("the model has an MTP head");
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
fn check_rows(
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
        diff = diff.max(super::max_abs_diff(a, &b[..v]));
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

/// Loads the model in `src` and its upscale in `out`, which must have the
/// `(hidden, vocab)` widths, and asserts that the upscale computes what the
/// source computes: on the first held-out prompt the real logits (trunk and
/// MTP head) within `tol`, the padding ones [`PAD_MARGIN`] below; on the
/// first two, [`TOKENS`] greedy tokens the same, plain and MTP at depth 3 and
/// auto, with the same speculation figures at depth 3 (auto chooses depths
/// from measured times). `what` names the upscale in the printed figures.
/// Returns the source's speculation figures at depth 3, one per prompt.
pub(crate) fn assert_same_function(
    what: &str,
    src: &Path,
    out: &Path,
    (hidden, vocab): (usize, usize),
    tol: f32,
) -> Vec<SpecStats> {
    let src = super::load(src);
    let up = super::load(out);
    assert_eq!(up.model.config().hidden_size, hidden);
    assert_eq!(up.model.vocab_size(), vocab);

    let prompts = heldout_prompts(&src);
    let vv = (src.model.vocab_size(), vocab);
    let (a, b) = (logits(&src, &prompts[0]), logits(&up, &prompts[0]));
    let (trunk_diff, trunk_pad) = check_rows("trunk", &a.0, &b.0, vv, tol);
    let (mtp_diff, mtp_pad) = check_rows("mtp head", &a.1, &b.1, vv, tol);
    eprintln!(
        "{what}: {} positions; max |diff| trunk {trunk_diff:.2e}, mtp {mtp_diff:.2e}; \
         highest padding logit trunk {trunk_pad:.0}, mtp {mtp_pad:.0}",
        prompts[0].len()
    );

    let mut fixed_3 = Vec::new();
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
            fixed_3.push(s);
        }
    }
    fixed_3
}
