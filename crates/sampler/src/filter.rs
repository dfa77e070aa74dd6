//! From (penalised) logits to probabilities: temperature, top-k, top-p, min-p,
//! normalisation, all as one lazy graph over `[R, V]` f32 rows.

use mlx_tensor::{Array, Dtype, ops};

use crate::{Options, Result};

/// Row-wise one-hot of the argmax of `logits` (`[R, V]`); ties go to the
/// lowest index, as MLX's argmax does.
pub(crate) fn one_hot_argmax(logits: &Array) -> Result<Array> {
    let vocab = logits.dim(-1);
    let ids = ops::arange(0.0, vocab as f64, 1.0, Dtype::Uint32)?;
    let best = logits.argmax(-1, true)?;
    Ok(ids.equal(&best)?.as_type(Dtype::Float32)?)
}

/// Probabilities `[R, V]` from logits `[R, V]` (f32) under `opts`.
pub(crate) fn probabilities(logits: &Array, opts: &Options) -> Result<Array> {
    if opts.is_greedy() {
        return one_hot_argmax(logits);
    }
    let vocab = logits.dim(-1);
    let mut scores = logits.divide(&Array::from_f32(opts.temperature)?)?;
    let k = opts.top_k.min(i32::MAX as usize) as i32;
    if k > 0 && k < vocab {
        scores = keep_top_k(&scores, k)?;
    }
    let mut probs = scores.softmax(&[-1], true)?;
    if opts.top_p < 1.0 {
        probs = top_p(&probs, opts.top_p)?;
    }
    if opts.min_p > 0.0 {
        probs = min_p(&probs, opts.min_p)?;
    }
    normalise(&probs)
}

/// Sets every score outside the `k` largest of its row to -inf. Exactly `k`
/// survive even with ties (which of the tied ones is up to the partition).
fn keep_top_k(scores: &Array, k: i32) -> Result<Array> {
    let shape = scores.shape();
    let top = scores
        .negative()?
        .argpartition(k - 1, -1)?
        .slice_axis(-1, 0, k)?;
    let rows = shape[0];
    let mask = ops::zeros(&shape, Dtype::Float32)?.put_along_axis(
        &top,
        &ops::ones(&[rows, k], Dtype::Float32)?,
        -1,
    )?;
    let ninf = Array::from_f32(f32::NEG_INFINITY)?;
    Ok(ops::r#where(
        &mask.greater(&Array::from_f32(0.0)?)?,
        scores,
        &ninf,
    )?)
}

/// Keeps, in descending order, each token whose exclusive cumulative
/// probability is `< p`; the most likely token always survives.
fn top_p(probs: &Array, p: f32) -> Result<Array> {
    let order = probs.negative()?.argsort(-1)?;
    let sorted = probs.take_along_axis(&order, -1)?;
    let before = sorted.cumsum(-1, false, false)?;
    let keep_sorted = before.less(&Array::from_f32(p)?)?.as_type(Dtype::Float32)?;
    let keep =
        ops::zeros(&probs.shape(), Dtype::Float32)?.put_along_axis(&order, &keep_sorted, -1)?;
    Ok(probs.multiply(&keep)?)
}

/// Zeroes tokens whose probability is below `m` times the row's largest.
fn min_p(probs: &Array, m: f32) -> Result<Array> {
    let floor = probs.max(&[-1], true)?.multiply(&Array::from_f32(m)?)?;
    let keep = probs.greater_equal(&floor)?;
    Ok(ops::r#where(&keep, probs, &Array::from_f32(0.0)?)?)
}

/// Divides each row (last axis) by its sum.
pub(crate) fn normalise(probs: &Array) -> Result<Array> {
    Ok(probs.divide(&probs.sum(&[-1], true)?)?)
}
