//! Temperature, top-k, top-p, min-p and greedy rows against hand-computed
//! probabilities (tolerance 1e-6 absolute, f32 on the device).

use crate::support;

use mlx_tensor::Array;
use sampler::{Distribution, History, Options, Result};
use support::{assert_close, normalised, rows_of};

const TOL: f64 = 1e-6;

/// Builds one row from `logits` under `opts` and compares it with `expected`.
#[track_caller]
fn check(logits: &[f64], opts: Options, expected: &[f64]) {
    let row: Vec<f32> = logits.iter().map(|&x| x as f32).collect();
    let got = (|| -> Result<Vec<f32>> {
        let a = Array::from_slice(&row, &[1, row.len() as i32])?;
        let d = Distribution::from_logits(&a, &opts, &History::new(64), &[])?;
        Ok(rows_of(&d)?.remove(0))
    })()
    .expect("distribution builds");
    assert_close(&got, expected, TOL, &format!("{opts:?} on {logits:?}"));
}

fn ln(xs: &[f64]) -> Vec<f64> {
    xs.iter().map(|x| x.ln()).collect()
}

fn with(f: impl FnOnce(&mut Options)) -> Options {
    let mut o = Options::default();
    f(&mut o);
    o
}

#[test]
fn temperature_scales_logits() {
    // Logits ln(1, 4, 16): T = 1 gives 1:4:16, T = 2 takes square roots (1:2:4),
    // T = 0.5 squares (1:16:256).
    let logits = ln(&[1.0, 4.0, 16.0]);
    check(&logits, with(|_| {}), &normalised(&[1.0, 4.0, 16.0]));
    check(
        &logits,
        with(|o| o.temperature = 2.0),
        &[1.0 / 7.0, 2.0 / 7.0, 4.0 / 7.0],
    );
    check(
        &logits,
        with(|o| o.temperature = 0.5),
        &normalised(&[1.0, 16.0, 256.0]),
    );
}

#[test]
fn top_k_keeps_the_k_largest() {
    let logits = ln(&[1.0, 2.0, 3.0, 4.0]);
    check(
        &logits,
        with(|o| o.top_k = 2),
        &[0.0, 0.0, 3.0 / 7.0, 4.0 / 7.0],
    );
    check(&logits, with(|o| o.top_k = 1), &[0.0, 0.0, 0.0, 1.0]);
    check(
        &logits,
        with(|o| o.top_k = 3),
        &[0.0, 2.0 / 9.0, 3.0 / 9.0, 4.0 / 9.0],
    );
    // k >= V is off.
    check(&logits, with(|o| o.top_k = 4), &[0.1, 0.2, 0.3, 0.4]);
    check(&logits, with(|o| o.top_k = 100), &[0.1, 0.2, 0.3, 0.4]);
    // Top-k and temperature: ln(1..4) / 0.5 gives 1:4:9:16, top 2 → 9:16.
    check(
        &logits,
        with(|o| {
            o.top_k = 2;
            o.temperature = 0.5;
        }),
        &[0.0, 0.0, 9.0 / 25.0, 16.0 / 25.0],
    );
}

#[test]
fn top_p_keeps_tokens_whose_mass_before_them_is_below_p() {
    // Sorted 0.4, 0.3, 0.2, 0.1 have exclusive cumulative mass 0, 0.4, 0.7, 0.9.
    let logits = ln(&[0.1, 0.2, 0.3, 0.4]);
    check(
        &logits,
        with(|o| o.top_p = 0.5),
        &[0.0, 0.0, 3.0 / 7.0, 4.0 / 7.0],
    );
    check(
        &logits,
        with(|o| o.top_p = 0.75),
        &[0.0, 2.0 / 9.0, 3.0 / 9.0, 4.0 / 9.0],
    );
    check(&logits, with(|o| o.top_p = 0.3), &[0.0, 0.0, 0.0, 1.0]);
    check(&logits, with(|o| o.top_p = 0.95), &[0.1, 0.2, 0.3, 0.4]);
    check(&logits, with(|o| o.top_p = 1.0), &[0.1, 0.2, 0.3, 0.4]);
}

#[test]
fn min_p_drops_tokens_below_a_fraction_of_the_largest() {
    let logits = ln(&[0.1, 0.2, 0.3, 0.4]);
    // 0.45 × 0.4 = 0.18: only 0.1 is below the floor.
    check(
        &logits,
        with(|o| o.min_p = 0.45),
        &[0.0, 2.0 / 9.0, 3.0 / 9.0, 4.0 / 9.0],
    );
    check(
        &logits,
        with(|o| o.min_p = 0.3),
        &[0.0, 2.0 / 9.0, 3.0 / 9.0, 4.0 / 9.0],
    );
    check(&logits, with(|o| o.min_p = 0.2), &[0.1, 0.2, 0.3, 0.4]);
    check(&logits, with(|o| o.min_p = 0.8), &[0.0, 0.0, 0.0, 1.0]);
}

#[test]
fn top_k_applies_before_top_p() {
    // Top-2 first gives 3/7, 4/7; then top-p 0.5 keeps only 4/7's token
    // (3/7's token has 4/7 > 0.5 before it). The other order would keep both.
    let logits = ln(&[0.1, 0.2, 0.3, 0.4]);
    let o = with(|o| {
        o.top_k = 2;
        o.top_p = 0.5;
    });
    check(&logits, o, &[0.0, 0.0, 0.0, 1.0]);
}

#[test]
fn top_p_applies_before_min_p() {
    // Top-p 0.75 keeps 0.2, 0.3, 0.4; min-p 0.6 (floor 0.24) then drops 0.2.
    let logits = ln(&[0.1, 0.2, 0.3, 0.4]);
    let o = with(|o| {
        o.top_p = 0.75;
        o.min_p = 0.6;
    });
    check(&logits, o, &[0.0, 0.0, 3.0 / 7.0, 4.0 / 7.0]);
}

#[test]
fn greedy_rows_are_one_hot_argmax() {
    let g = Options::greedy;
    check(&[0.5, 3.0, -1.0, 2.9], g(), &[0.0, 1.0, 0.0, 0.0]);
    // Ties go to the lowest index.
    check(&[1.0, 7.0, 7.0], g(), &[0.0, 1.0, 0.0]);
    // Filters do not matter at temperature 0.
    let o = Options {
        top_k: 2,
        top_p: 0.1,
        min_p: 0.5,
        ..g()
    };
    check(&[0.5, -3.0, 4.0, 2.0], o, &[0.0, 0.0, 1.0, 0.0]);
}

#[test]
fn several_rows_and_a_batch_axis() -> Result<()> {
    let logits = Array::from_slice(&[0.0f32, 1.0, 5.0, 2.0, 0.0, 0.0], &[1, 2, 3])?;
    let d = Distribution::from_logits(&logits, &Options::greedy(), &History::new(64), &[])?;
    assert_eq!(d.rows(), 2);
    assert_eq!(d.vocab(), 3);
    assert_close(
        &d.probs().to_vec::<f32>()?,
        &[0.0, 0.0, 1.0, 1.0, 0.0, 0.0],
        0.0,
        "two greedy rows",
    );
    Ok(())
}

#[test]
fn bad_logit_shapes_are_errors() -> Result<()> {
    let o = Options::default();
    let h = History::new(64);
    for shape in [vec![4], vec![2, 1, 2], vec![1, 1, 1, 4]] {
        let a = Array::from_slice(&[0.0f32; 4], &shape)?;
        let err = Distribution::from_logits(&a, &o, &h, &[]).unwrap_err();
        assert!(
            err.to_string().contains("[rows, vocab]"),
            "{shape:?}: {err}"
        );
    }
    let bad = Options {
        temperature: -1.0,
        ..o
    };
    let a = Array::from_slice(&[0.0f32; 4], &[1, 4])?;
    assert!(Distribution::from_logits(&a, &bad, &h, &[]).is_err());
    Ok(())
}
