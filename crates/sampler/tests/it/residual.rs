//! Chain operations on distributions: worked residual examples (hand-computed,
//! tolerance 1e-6), `prob`, `slice_rows`, `concatenate` and their errors.

use crate::support;

use mlx_tensor::Array;
use sampler::{Distribution, Error, Result};
use support::{assert_close, dist, rows_of};

const TOL: f64 = 1e-6;

/// `residual(p, q)` for one row, compared with `expected`.
#[track_caller]
fn check(p: &[f64], q: &[f64], expected: &[f64]) {
    let got = (|| -> Result<Vec<f32>> {
        let r = dist(&[p.to_vec()])?.residual_against(&dist(&[q.to_vec()])?)?;
        Ok(rows_of(&r)?.remove(0))
    })()
    .expect("residual builds");
    assert_close(
        &got,
        expected,
        TOL,
        &format!("residual of p {p:?} against q {q:?}"),
    );
}

#[test]
fn worked_residuals() {
    // max(0, p − q) = (0.3, 0, 0.1, 0) → (0.75, 0, 0.25, 0).
    check(
        &[0.5, 0.3, 0.2, 0.0],
        &[0.2, 0.4, 0.1, 0.3],
        &[0.75, 0.0, 0.25, 0.0],
    );
    // A top-k target (support {1, 2}) against a uniform draft: (0, 0.35, 0.15, 0)
    // → (0, 0.7, 0.3, 0); the draft's mass outside the support plays no part.
    check(&[0.0, 0.6, 0.4, 0.0], &[0.25; 4], &[0.0, 0.7, 0.3, 0.0]);
    // ollama's sample_test case: target {2: 0.5, 5: 0.5}, draft {2: 0.2, 5: 0.32,
    // 0: 0.48} → (0.3, 0.18) / 0.48 = {2: 0.625, 5: 0.375}.
    check(
        &[0.0, 0.0, 0.5, 0.0, 0.0, 0.5],
        &[0.48, 0.0, 0.2, 0.0, 0.0, 0.32],
        &[0.0, 0.0, 0.625, 0.0, 0.0, 0.375],
    );
}

#[test]
fn greedy_residual_is_the_target_argmax() {
    check(&[0.0, 0.0, 1.0], &[1.0, 0.0, 0.0], &[0.0, 0.0, 1.0]);
}

#[test]
fn one_hot_marks_follow_the_rows() -> Result<()> {
    let logits = Array::from_slice(&[0.0f32, 2.0, 1.0, 3.0, 0.0, 0.0], &[2, 3])?;
    let h = sampler::History::new(64);
    let greedy = Distribution::from_logits(&logits, &sampler::Options::greedy(), &h, &[])?;
    let soft = Distribution::from_logits(&logits, &sampler::Options::default(), &h, &[])?;
    assert!(greedy.is_one_hot() && !soft.is_one_hot());
    assert!(greedy.slice_rows(1, 2)?.is_one_hot());
    assert!(!Distribution::concatenate(&[greedy.clone(), soft.clone()])?.is_one_hot());
    // A one-hot row samples its argmax under any key; its residual is itself.
    let key = mlx_tensor::random::key(3)?;
    assert_eq!(greedy.sample(&key)?.to_vec::<u32>()?, vec![1, 0]);
    let r = greedy.residual_against(&soft)?;
    assert!(r.is_one_hot());
    assert_close(
        &r.probs().to_vec::<f32>()?,
        &[0.0, 1.0, 0.0, 1.0, 0.0, 0.0],
        0.0,
        "residual",
    );
    Ok(())
}

#[test]
fn equal_rows_fall_back_to_the_target() {
    check(&[0.2, 0.3, 0.5], &[0.2, 0.3, 0.5], &[0.2, 0.3, 0.5]);
    check(&[0.0, 1.0, 0.0], &[0.0, 1.0, 0.0], &[0.0, 1.0, 0.0]);
}

#[test]
fn residual_works_row_by_row() -> Result<()> {
    let p = dist(&[vec![0.5, 0.5, 0.0], vec![0.1, 0.1, 0.8]])?;
    let q = dist(&[vec![0.5, 0.5, 0.0], vec![0.6, 0.2, 0.2]])?;
    let r = p.residual_against(&q)?;
    assert_close(
        &r.probs().to_vec::<f32>()?,
        &[0.5, 0.5, 0.0, 0.0, 0.0, 1.0],
        TOL,
        "two rows: a degenerate one and a one-token residual",
    );
    Ok(())
}

#[test]
fn residual_shape_mismatches_are_errors() -> Result<()> {
    let p = dist(&[vec![0.5, 0.5]])?;
    let wide = dist(&[vec![0.2, 0.3, 0.5]])?;
    let tall = dist(&[vec![0.5, 0.5], vec![0.5, 0.5]])?;
    let err = p.residual_against(&wide).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Mismatch {
                left: 2,
                right: 3,
                ..
            }
        ),
        "{err:?}"
    );
    let err = p.residual_against(&tall).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Mismatch {
                left: 1,
                right: 2,
                ..
            }
        ),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn prob_reads_one_token_per_row() -> Result<()> {
    let d = dist(&[vec![0.1, 0.9, 0.0], vec![0.3, 0.3, 0.4]])?;
    let p = d.prob(&Array::from_slice(&[1u32, 2], &[2])?)?;
    assert_close(&p.to_vec::<f32>()?, &[0.9, 0.4], TOL, "prob");
    let p = d.prob(&Array::from_slice(&[2i32, 0], &[2])?)?;
    assert_close(&p.to_vec::<f32>()?, &[0.0, 0.3], TOL, "prob with i32 ids");
    let err = d.prob(&Array::from_slice(&[1u32], &[1])?).unwrap_err();
    assert!(err.to_string().contains("one token per row"), "{err}");
    Ok(())
}

#[test]
fn slice_and_concatenate_rows() -> Result<()> {
    let a = dist(&[vec![1.0, 0.0], vec![0.0, 1.0]])?;
    let b = dist(&[vec![0.5, 0.5]])?;
    let c = Distribution::concatenate(&[a.clone(), b])?;
    assert_eq!((c.rows(), c.vocab()), (3, 2));
    assert_close(
        &c.probs().to_vec::<f32>()?,
        &[1.0, 0.0, 0.0, 1.0, 0.5, 0.5],
        0.0,
        "concatenate",
    );
    let s = c.slice_rows(1, 3)?;
    assert_close(
        &s.probs().to_vec::<f32>()?,
        &[0.0, 1.0, 0.5, 0.5],
        0.0,
        "slice_rows",
    );
    assert_eq!(c.slice_rows(2, 2)?.rows(), 0);

    let err = c.slice_rows(2, 4).unwrap_err();
    assert!(
        matches!(
            err,
            Error::RowRange {
                start: 2,
                end: 4,
                rows: 3
            }
        ),
        "{err:?}"
    );
    assert!(matches!(c.slice_rows(2, 1), Err(Error::RowRange { .. })));
    assert!(matches!(
        Distribution::concatenate(&[]),
        Err(Error::EmptyConcatenate)
    ));
    let wide = dist(&[vec![0.2, 0.3, 0.5]])?;
    let err = Distribution::concatenate(&[a, wide]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Mismatch {
                left: 2,
                right: 3,
                ..
            }
        ),
        "{err:?}"
    );
    Ok(())
}

#[test]
fn sampling_never_draws_a_zero_probability_token() -> Result<()> {
    // 2000 rows of the same two-token support, one draw each.
    let row = vec![0.0, 0.25, 0.0, 0.75, 0.0];
    let d = dist(&vec![row; 2000])?;
    let ids = d.sample(&mlx_tensor::random::key(5)?)?.to_vec::<u32>()?;
    assert_eq!(ids.len(), 2000);
    assert!(
        ids.iter().all(|&t| t == 1 || t == 3),
        "drew outside the support"
    );
    // Loose sanity on the split: 1500 ± 5σ (σ ≈ 19.4).
    let threes = ids.iter().filter(|&&t| t == 3).count() as f64;
    assert!(
        (threes - 1500.0).abs() < 97.0,
        "token 3 drawn {threes} times of 2000"
    );
    Ok(())
}
