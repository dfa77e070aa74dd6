//! [`Distribution`]: dense rows of token probabilities on the device, and the
//! chain operations speculative decoding needs.

use mlx_tensor::{Array, Dtype, ops, random};

use crate::{Error, History, Options, Result, filter, penalty};

/// Rows of probabilities, `[R, V]` f32 on the device (lazy until read).
///
/// Every row sums to 1 (up to f32 rounding) and has no negative entry; a
/// token's probability is 0 exactly when a filter removed it.
#[derive(Debug, Clone)]
pub struct Distribution {
    /// `[R, V]` f32.
    probs: Array,
    /// Every row is one-hot (built at temperature 0). Lets sampling take the
    /// argmax instead of a V-wide random draw; the result is the same.
    one_hot: bool,
}

impl Distribution {
    /// Distributions of the next token after each row of `logits`.
    ///
    /// `logits` is `[R, V]` (or `[1, R, V]`), any float dtype. Row `r` is
    /// penalised as if the chain tokens before it had been appended to
    /// `history` (which is not changed): rows are aligned to the end of
    /// `chain`, so with `chain.len() == R - 1` (verifying `R - 1` drafts) row
    /// `r` sees `chain[..r]`, with `R == 1` the row sees the whole chain (a
    /// proposal step), and with an empty chain every row sees the history.
    ///
    /// Pipeline: penalties → temperature → top-k → top-p → min-p → normalise.
    /// Temperature 0 gives one-hot argmax rows.
    pub fn from_logits(
        logits: &Array,
        opts: &Options,
        history: &History,
        chain: &[u32],
    ) -> Result<Distribution> {
        opts.validate()?;
        let logits = rows_of(logits, "logits")?.as_type(Dtype::Float32)?;
        let scores = penalty::apply(&logits, opts, history, chain)?;
        Ok(Distribution {
            probs: filter::probabilities(&scores, opts)?,
            one_hot: opts.is_greedy(),
        })
    }

    /// Wraps probabilities the caller made (`[R, V]`, any float dtype, each
    /// row non-negative and summing to 1: not checked, that would need a sync).
    pub fn from_probs(probs: &Array) -> Result<Distribution> {
        let probs = rows_of(probs, "probs")?.as_type(Dtype::Float32)?;
        Ok(Distribution {
            probs,
            one_hot: false,
        })
    }

    /// Joins distributions row-wise (for example one per drafting step).
    pub fn concatenate(parts: &[Distribution]) -> Result<Distribution> {
        let first = parts.first().ok_or(Error::EmptyConcatenate)?;
        for p in parts {
            if p.vocab() != first.vocab() {
                return Err(Error::Mismatch {
                    what: "vocabulary sizes of concatenated distributions",
                    left: first.vocab(),
                    right: p.vocab(),
                });
            }
        }
        let arrays: Vec<Array> = parts.iter().map(|p| p.probs.clone()).collect();
        Ok(Distribution {
            probs: ops::concatenate(&arrays, 0)?,
            one_hot: parts.iter().all(|p| p.one_hot),
        })
    }

    /// Rows `start..end`.
    pub fn slice_rows(&self, start: usize, end: usize) -> Result<Distribution> {
        let rows = self.rows();
        if start > end || end > rows {
            return Err(Error::RowRange { start, end, rows });
        }
        Ok(Distribution {
            probs: self.probs.slice_axis(0, start as i32, end as i32)?,
            one_hot: self.one_hot,
        })
    }

    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.probs.dim(0) as usize
    }

    /// Vocabulary size.
    pub fn vocab(&self) -> usize {
        self.probs.dim(1) as usize
    }

    /// The `[R, V]` f32 probabilities.
    pub fn probs(&self) -> &Array {
        &self.probs
    }

    /// Probability of `tokens[r]` under row `r`: `[R]` from `[R]` integer ids
    /// (each below the vocabulary size; not checked, that would need a sync).
    pub fn prob(&self, tokens: &Array) -> Result<Array> {
        let rows = self.rows() as i32;
        if tokens.shape().as_slice() != [rows] {
            return Err(Error::Shape {
                what: "tokens for Distribution::prob",
                shape: tokens.shape().to_vec(),
                expected: format!("[{rows}] (one token per row)"),
            });
        }
        let idx = tokens.as_type(Dtype::Uint32)?.reshape(&[rows, 1])?;
        Ok(self.probs.take_along_axis(&idx, 1)?.reshape(&[rows])?)
    }

    /// `normalise(max(0, p − q))` row by row, where `self` is the target `p`
    /// and `draft` is `q`. Its support lies within the target's. Where `p`
    /// and `q` agree everywhere the difference is all zero; that row falls
    /// back to `p`, which is what a rejection there would have to sample
    /// (a rejection is then impossible anyway).
    pub fn residual_against(&self, draft: &Distribution) -> Result<Distribution> {
        check_same_shape(self, draft)?;
        if self.one_hot {
            // max(0, p − q) of a one-hot p is zero or a multiple of p.
            return Ok(self.clone());
        }
        Ok(Distribution {
            probs: residual(&self.probs, &draft.probs)?,
            one_hot: false,
        })
    }

    /// True when every row is one-hot (built at temperature 0).
    pub fn is_one_hot(&self) -> bool {
        self.one_hot
    }

    /// One token per row, drawn with `key`: `[R]` u32, lazy.
    pub fn sample(&self, key: &Array) -> Result<Array> {
        if self.one_hot {
            return Ok(self.probs.argmax(-1, false)?);
        }
        sample_rows(&self.probs, key)
    }
}

/// `normalise(max(0, p − q))` along the last axis, falling back to `p` where
/// the difference sums to 0.
pub(crate) fn residual(p: &Array, q: &Array) -> Result<Array> {
    let zero = Array::from_f32(0.0)?;
    let diff = p.subtract(q)?.maximum(&zero)?;
    let total = diff.sum(&[-1], true)?;
    // The guard keeps 0/0 out of the untaken branch of the `where`.
    let safe = total.maximum(&Array::from_f32(f32::MIN_POSITIVE)?)?;
    Ok(ops::r#where(
        &total.greater(&zero)?,
        &diff.divide(&safe)?,
        p,
    )?)
}

/// A categorical draw along the last axis of probabilities (zeros are never drawn).
pub(crate) fn sample_rows(probs: &Array, key: &Array) -> Result<Array> {
    Ok(random::categorical(&probs.log()?, -1, key)?)
}

fn check_same_shape(target: &Distribution, draft: &Distribution) -> Result<()> {
    if target.vocab() != draft.vocab() {
        return Err(Error::Mismatch {
            what: "residual_against: target vs draft vocabulary",
            left: target.vocab(),
            right: draft.vocab(),
        });
    }
    if target.rows() != draft.rows() {
        return Err(Error::Mismatch {
            what: "residual_against: target vs draft rows",
            left: target.rows(),
            right: draft.rows(),
        });
    }
    Ok(())
}

/// `x` as `[R, V]`: accepts `[R, V]` or `[1, R, V]`.
fn rows_of(x: &Array, what: &'static str) -> Result<Array> {
    let shape = x.shape();
    match shape.as_slice() {
        [r, v] if *r > 0 && *v > 0 => Ok(x.clone()),
        [1, r, v] if *r > 0 && *v > 0 => Ok(x.reshape(&[*r, *v])?),
        _ => Err(Error::Shape {
            what,
            shape: shape.to_vec(),
            expected: "[rows, vocab] or [1, rows, vocab] with rows, vocab > 0".into(),
        }),
    }
}
