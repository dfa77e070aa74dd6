//! Repeat, presence and frequency penalties, the `repeat_last_n` window, and
//! chain-aware penalties for speculative rows. Expected logits are worked out
//! by hand; rows are compared at temperature 1 through a host softmax
//! (tolerance 1e-6 absolute).

use crate::support;

use mlx_tensor::Array;
use sampler::{Distribution, Error, History, Options, Result};
use support::{assert_close, rows_of, softmax};

const TOL: f64 = 1e-6;
const LOGITS: [f64; 5] = [2.0, -2.0, 1.0, 0.5, 0.0];

/// Distribution rows of `logits` (one row per entry) with `history` and
/// `chain`, compared row by row with softmax of `expected` logits.
#[track_caller]
fn check(
    opts: Options,
    history: &[u32],
    chain: &[u32],
    logits: &[[f64; 5]],
    expected: &[[f64; 5]],
) {
    let mut h = History::new(opts.repeat_last_n.max(8));
    h.commit(history);
    let before = h.clone();
    let flat: Vec<f32> = logits.iter().flatten().map(|&x| x as f32).collect();
    let got = (|| -> Result<Vec<Vec<f32>>> {
        let a = Array::from_slice(&flat, &[logits.len() as i32, 5])?;
        rows_of(&Distribution::from_logits(&a, &opts, &h, chain)?)
    })()
    .expect("distribution builds");
    assert_eq!(got.len(), expected.len(), "rows");
    for (r, (g, e)) in got.iter().zip(expected).enumerate() {
        let what = format!("row {r}, history {history:?}, chain {chain:?}, {opts:?}");
        assert_close(g, &softmax(e), TOL, &what);
    }
    assert_eq!(
        h, before,
        "building a distribution must not change the history"
    );
}

fn with(f: impl FnOnce(&mut Options)) -> Options {
    let mut o = Options::default();
    f(&mut o);
    o
}

#[test]
fn repeat_penalty_divides_positive_and_multiplies_negative_logits() {
    // Seen {0, 1} (1 twice, but the repeat penalty applies once per token).
    let o = with(|o| o.repeat_penalty = 2.0);
    check(
        o.clone(),
        &[0, 1, 1],
        &[],
        &[LOGITS],
        &[[1.0, -4.0, 1.0, 0.5, 0.0]],
    );
    // A logit of exactly 0 stays 0.
    check(o, &[4], &[], &[LOGITS], &[LOGITS]);
}

#[test]
fn presence_penalty_subtracts_once_per_seen_token() {
    let o = with(|o| o.presence_penalty = 0.5);
    check(o, &[0, 1, 1], &[], &[LOGITS], &[[1.5, -2.5, 1.0, 0.5, 0.0]]);
}

#[test]
fn frequency_penalty_subtracts_per_occurrence() {
    let o = with(|o| o.frequency_penalty = 0.5);
    check(o, &[0, 1, 1], &[], &[LOGITS], &[[1.5, -3.0, 1.0, 0.5, 0.0]]);
}

#[test]
fn penalties_combine_repeat_first() {
    // Token 1 (seen twice): -2 × 2 − 0.25 − 2 × 0.5 = −5.25; token 0: 2 / 2 − 0.25 − 0.5.
    let o = with(|o| {
        o.repeat_penalty = 2.0;
        o.presence_penalty = 0.25;
        o.frequency_penalty = 0.5;
    });
    check(
        o,
        &[0, 1, 1],
        &[],
        &[LOGITS],
        &[[0.25, -5.25, 1.0, 0.5, 0.0]],
    );
}

#[test]
fn only_the_last_repeat_last_n_tokens_count() {
    let o = with(|o| {
        o.frequency_penalty = 1.0;
        o.repeat_last_n = 2;
    });
    // History 0, 2, 1, 1: the window is 1, 1.
    check(
        o.clone(),
        &[0, 2, 1, 1],
        &[],
        &[LOGITS],
        &[[2.0, -4.0, 1.0, 0.5, 0.0]],
    );
    // A zero window turns the penalties off.
    let off = Options {
        repeat_last_n: 0,
        ..o
    };
    check(off, &[0, 2, 1, 1], &[], &[LOGITS], &[LOGITS]);
}

#[test]
fn speculative_rows_see_the_chain_before_them() {
    // Verification of drafts 1, 2: row 0 sees history {0}, row 1 adds 1,
    // row 2 adds 1 and 2.
    let o = with(|o| o.presence_penalty = 1.0);
    check(
        o.clone(),
        &[0],
        &[1, 2],
        &[LOGITS; 3],
        &[
            [1.0, -2.0, 1.0, 0.5, 0.0],
            [1.0, -3.0, 1.0, 0.5, 0.0],
            [1.0, -3.0, 0.0, 0.5, 0.0],
        ],
    );
    // A proposal step (one row) sees the whole chain.
    check(
        o.clone(),
        &[0],
        &[1, 2],
        &[LOGITS],
        &[[1.0, -3.0, 0.0, 0.5, 0.0]],
    );
    // No chain: every row sees only the history.
    check(o, &[0], &[], &[LOGITS; 2], &[[1.0, -2.0, 1.0, 0.5, 0.0]; 2]);
}

#[test]
fn the_window_slides_over_history_and_chain() {
    // Window 2 over history 0, 3 and chain 1, 2: rows see [0, 3], [3, 1], [1, 2].
    let o = with(|o| {
        o.frequency_penalty = 1.0;
        o.repeat_last_n = 2;
    });
    check(
        o,
        &[0, 3],
        &[1, 2],
        &[LOGITS; 3],
        &[
            [1.0, -2.0, 1.0, -0.5, 0.0],
            [2.0, -3.0, 1.0, -0.5, 0.0],
            [2.0, -3.0, 0.0, 0.5, 0.0],
        ],
    );
}

#[test]
fn commit_feeds_later_rows() {
    let o = with(|o| o.frequency_penalty = 1.0);
    let mut h = History::new(o.repeat_last_n);
    h.commit(&[4]);
    h.commit(&[4, 3]);
    let a = Array::from_slice(&LOGITS.map(|x| x as f32), &[1, 5]).unwrap();
    let got = rows_of(&Distribution::from_logits(&a, &o, &h, &[]).unwrap()).unwrap();
    assert_close(
        &got[0],
        &softmax(&[2.0, -2.0, 1.0, -0.5, -2.0]),
        TOL,
        "after commits",
    );
}

#[test]
fn a_history_shorter_than_the_window_is_an_error() -> Result<()> {
    let o = with(|o| o.presence_penalty = 1.0);
    let a = Array::from_slice(&[0.0f32; 5], &[1, 5])?;
    let err = Distribution::from_logits(&a, &o, &History::new(8), &[]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::HistoryTooShort {
                history: 8,
                repeat_last_n: 64
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("History::new(64)"), "{err}");
    Ok(())
}

#[test]
fn a_token_outside_the_vocabulary_is_an_error() -> Result<()> {
    let o = with(|o| o.presence_penalty = 1.0);
    let mut h = History::new(64);
    h.commit(&[7]);
    let a = Array::from_slice(&[0.0f32; 5], &[1, 5])?;
    let err = Distribution::from_logits(&a, &o, &h, &[]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Mismatch {
                left: 7,
                right: 5,
                ..
            }
        ),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn a_logit_bias_adds_to_its_tokens_after_the_penalties() {
    // Presence 1 on seen token 0, then +1.5 on token 1 and -3 on token 0,
    // alike on every row (two rows of a speculative chain).
    let o = with(|o| {
        o.presence_penalty = 1.0;
        o.logit_bias = vec![(1, 1.5), (0, -3.0)];
    });
    check(
        o,
        &[0],
        &[4],
        &[LOGITS, LOGITS],
        &[[-2.0, -0.5, 1.0, 0.5, 0.0], [-2.0, -0.5, 1.0, 0.5, -1.0]],
    );
}

#[test]
fn a_bad_logit_bias_is_named() -> Result<()> {
    let a = Array::from_slice(&[0.0f32; 5], &[1, 5])?;
    let h = History::new(64);
    let err = |bias: Vec<(u32, f32)>| {
        let o = with(|o| o.logit_bias = bias);
        Distribution::from_logits(&a, &o, &h, &[]).unwrap_err()
    };
    let e = err(vec![(5, 1.0)]);
    assert!(
        matches!(e, Error::BiasOutsideVocabulary { token: 5, vocab: 5 }),
        "{e:?}"
    );
    let e = err(vec![(2, 1.0), (2, -1.0)]);
    assert!(matches!(e, Error::DuplicateBias { token: 2 }), "{e:?}");
    let e = err(vec![(2, f32::NAN)]);
    assert!(e.to_string().contains("logit_bias"), "{e}");
    // Control: the same ids, once each and in range, are fine.
    let o = with(|o| o.logit_bias = vec![(2, 1.0), (4, -1.0)]);
    Distribution::from_logits(&a, &o, &h, &[])?;
    Ok(())
}
