//! Repetition penalties (repeat, presence, frequency) and the per-token
//! logit bias, applied on the device.
//!
//! Per-token counts are built with one `scatter_add` from host index lists,
//! the bias row with another; the logits never leave the device.

use mlx_tensor::{Array, Dtype, ops};

use crate::{Error, History, Options, Result};

/// How many chain tokens row `row` of `rows` sees: rows are aligned to the end
/// of the chain, so the last row sees all of it and, when
/// `chain_len == rows - 1` (verification), row `r` sees `chain[..r]`.
pub(crate) fn chain_prefix(chain_len: usize, rows: usize, row: usize) -> usize {
    (chain_len + row + 1).saturating_sub(rows)
}

/// Penalised and biased copy of `logits` (`[R, V]` f32), row `r` seeing the
/// history plus its chain prefix. Returns `logits` itself when neither
/// applies.
pub(crate) fn apply(
    logits: &Array,
    opts: &Options,
    history: &History,
    chain: &[u32],
) -> Result<Array> {
    let penalised = penalise(logits, opts, history, chain)?;
    opts.check_bias_ids(logits.dim(1) as usize)?;
    bias(&penalised, &opts.logit_bias)
}

/// `logits` (`[R, V]` f32) plus `bias` (ids checked) on its token columns,
/// every row alike.
fn bias(logits: &Array, bias: &[(u32, f32)]) -> Result<Array> {
    if bias.is_empty() {
        return Ok(logits.clone());
    }
    let vocab = logits.dim(1);
    let n = bias.len() as i32;
    let index: Vec<i32> = bias.iter().map(|b| b.0 as i32).collect();
    let value: Vec<f32> = bias.iter().map(|b| b.1).collect();
    let row = ops::zeros(&[1, vocab], Dtype::Float32)?.scatter_add(
        &Array::from_slice(&index, &[1, n])?,
        &Array::from_slice(&value, &[1, n])?,
        1,
    )?;
    Ok(logits.add(&row)?)
}

/// The repetition penalties of `opts` on `logits` (see [`apply`]).
fn penalise(logits: &Array, opts: &Options, history: &History, chain: &[u32]) -> Result<Array> {
    if !opts.uses_penalties() {
        return Ok(logits.clone());
    }
    let n = opts.repeat_last_n;
    if history.window() < n {
        return Err(Error::HistoryTooShort {
            history: history.window(),
            repeat_last_n: n,
        });
    }
    let rows = logits.dim(0) as usize;
    let vocab = logits.dim(1);
    let windows: Vec<Vec<u32>> = (0..rows)
        .map(|r| history.window_with(&chain[..chain_prefix(chain.len(), rows, r)], n))
        .collect();
    let width = windows.iter().map(Vec::len).max().unwrap_or(0);
    if width == 0 {
        return Ok(logits.clone());
    }
    // Short rows are padded with index `vocab`, an extra column sliced off below.
    let mut index = Vec::with_capacity(rows * width);
    for w in &windows {
        for &t in w {
            if t as i64 >= vocab as i64 {
                return Err(Error::Mismatch {
                    what: "penalty history token id vs vocabulary size",
                    left: t as usize,
                    right: vocab as usize,
                });
            }
            index.push(t as i32);
        }
        index.extend(std::iter::repeat_n(vocab, width - w.len()));
    }
    let shape = [rows as i32, width as i32];
    let index = Array::from_slice(&index, &shape)?;
    let counts = ops::zeros(&[rows as i32, vocab + 1], Dtype::Float32)?
        .scatter_add(&index, &ops::ones(&shape, Dtype::Float32)?, 1)?
        .slice_axis(1, 0, vocab)?;
    let zero = Array::from_f32(0.0)?;
    let seen = counts.greater(&zero)?;

    let mut out = logits.clone();
    if opts.repeat_penalty != 1.0 {
        let rp = Array::from_f32(opts.repeat_penalty)?;
        let penalised = ops::r#where(&out.less(&zero)?, &out.multiply(&rp)?, &out.divide(&rp)?)?;
        out = ops::r#where(&seen, &penalised, &out)?;
    }
    if opts.presence_penalty != 0.0 {
        let seen_f = seen.as_type(Dtype::Float32)?;
        out = out.subtract(&seen_f.multiply(&Array::from_f32(opts.presence_penalty)?)?)?;
    }
    if opts.frequency_penalty != 0.0 {
        out = out.subtract(&counts.multiply(&Array::from_f32(opts.frequency_penalty)?)?)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_prefix_aligns_rows_to_the_end_of_the_chain() {
        let check = |chain_len, rows, expected: &[usize]| {
            let got: Vec<usize> = (0..rows)
                .map(|r| chain_prefix(chain_len, rows, r))
                .collect();
            assert_eq!(got, expected, "chain {chain_len}, rows {rows}");
        };
        check(3, 4, &[0, 1, 2, 3]); // verification: k drafts, k + 1 rows
        check(3, 1, &[3]); // proposal step: one row after the whole chain
        check(0, 3, &[0, 0, 0]); // no chain: every row sees only the history
        check(5, 2, &[4, 5]);
    }
}
