//! Property tests: residuals, acceptance outcomes and `from_logits` rows stay
//! normalised (sum 1 within 1e-5), non-negative and inside the target's support.

use crate::support;

use mlx_tensor::{Array, random};
use proptest::prelude::*;
use sampler::{Distribution, History, NO_TOKEN, Options, accept_chain};
use support::{dist, normalised, rows_of};

const TOL: f32 = 1e-5;

/// A probability row over `v` tokens with some zeros (at least one non-zero).
fn row(v: usize) -> impl Strategy<Value = Vec<f64>> {
    prop::collection::vec(prop_oneof![1 => Just(0.0), 3 => 0.01f64..1.0], v).prop_map(|mut w| {
        if w.iter().all(|&x| x == 0.0) {
            w[0] = 1.0;
        }
        normalised(&w)
    })
}

/// `n` rows over a shared random vocabulary size in 2..=16.
fn rows(
    n: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = (Vec<Vec<f64>>, Vec<Vec<f64>>)> {
    (2usize..=16, n).prop_flat_map(|(v, r)| {
        (
            prop::collection::vec(row(v), r),
            prop::collection::vec(row(v), r),
        )
    })
}

#[track_caller]
fn assert_normalised(rows: &[Vec<f32>], what: &str) {
    for (r, row) in rows.iter().enumerate() {
        assert!(
            row.iter().all(|&x| x >= 0.0),
            "{what}: row {r} has a negative entry: {row:?}"
        );
        let s: f32 = row.iter().sum();
        assert!((s - 1.0).abs() <= TOL, "{what}: row {r} sums to {s}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn residual_rows_are_distributions_on_the_target_support((p, q) in rows(1..=4)) {
        let r = dist(&p).unwrap().residual_against(&dist(&q).unwrap()).unwrap();
        let got = rows_of(&r).unwrap();
        assert_normalised(&got, "residual");
        for (i, (g, t)) in got.iter().zip(&p).enumerate() {
            for (x, (&gx, &tx)) in g.iter().zip(t).enumerate() {
                prop_assert!(tx > 0.0 || gx == 0.0, "row {}, token {}: residual {} outside the target", i, x, gx);
            }
        }
    }

    #[test]
    fn acceptance_emits_drafts_then_one_supported_token(
        (p, q) in rows(2..=5),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 4),
        seed in any::<u64>(),
    ) {
        // k + 1 target rows, k draft rows; drafted tokens are arbitrary (some
        // may have q = 0 or p = 0).
        let k = p.len() - 1;
        let v = p[0].len();
        let drafted: Vec<u32> = picks[..k].iter().map(|i| i.index(v) as u32).collect();
        let target = dist(&p).unwrap();
        let draft = dist(&q[..k]).unwrap();
        let tokens = Array::from_slice(&drafted, &[k as i32]).unwrap();
        let acc = accept_chain(&target, &draft, &tokens, &random::key(seed).unwrap()).unwrap();
        let all = acc.emitted().unwrap().to_vec::<u32>().unwrap();
        let (accepted, next) = acc.read().unwrap();
        prop_assert!(accepted <= k);
        prop_assert_eq!(&all[..accepted], &drafted[..accepted]);
        prop_assert_eq!(all[accepted], next);
        prop_assert!(all[accepted + 1..].iter().all(|&t| t == NO_TOKEN));
        for (i, &t) in drafted[..accepted].iter().enumerate() {
            prop_assert!(p[i][t as usize] > 0.0, "accepted draft {} has target probability 0", i);
        }
        prop_assert!((next as usize) < v);
        prop_assert!(p[accepted][next as usize] > 0.0, "next token {} outside target row {}", next, accepted);
    }

    #[test]
    fn logits_rows_are_distributions(
        logits in prop::collection::vec(prop::collection::vec(-8.0f32..8.0, 12), 1..=4),
        temperature in prop_oneof![Just(0.0f32), 0.05f32..3.0],
        top_k in 0usize..14,
        top_p in 0.01f32..=1.0,
        min_p in 0.0f32..0.99,
        penalties in (0.5f32..2.0, -1.0f32..1.0, -1.0f32..1.0),
        history in prop::collection::vec(0u32..12, 0..10),
    ) {
        let opts = Options {
            temperature, top_k, top_p, min_p,
            repeat_penalty: penalties.0,
            presence_penalty: penalties.1,
            frequency_penalty: penalties.2,
            ..Options::default()
        };
        let mut h = History::new(opts.repeat_last_n);
        h.commit(&history);
        let r = logits.len();
        let flat: Vec<f32> = logits.concat();
        let a = Array::from_slice(&flat, &[r as i32, 12]).unwrap();
        let chain: Vec<u32> = history.iter().rev().take(r - 1).copied().collect();
        let d = Distribution::from_logits(&a, &opts, &h, &chain).unwrap();
        let got = rows_of(&d).unwrap();
        assert_normalised(&got, "from_logits");
        if top_k > 0 && temperature > 0.0 {
            for row in &got {
                prop_assert!(row.iter().filter(|&&x| x > 0.0).count() <= top_k);
            }
        }
    }
}
