//! [`sample_next`]: the plain decode loop's one-token sampler.

use mlx_tensor::{Array, Dtype};

use crate::{Distribution, Error, History, Options, Result, penalty};

/// The next token after `logits` (`[1, V]`, or `[1, 1, V]`): `[1]` u32, lazy,
/// so the decode loop can queue the next forward before reading it.
///
/// Same distribution as `Distribution::from_logits(..).sample(key)`; greedy
/// skips the random draw and takes the argmax of the penalised logits.
pub fn sample_next(
    logits: &Array,
    opts: &Options,
    history: &History,
    key: &Array,
) -> Result<Array> {
    let v = if logits.ndim() == 0 {
        0
    } else {
        logits.dim(-1)
    };
    if v == 0 || logits.size() != v as usize {
        return Err(Error::Shape {
            what: "logits for sample_next",
            shape: logits.shape().to_vec(),
            expected: "[1, vocab] (one row)".into(),
        });
    }
    if !opts.is_greedy() {
        return Distribution::from_logits(&logits.reshape(&[1, v])?, opts, history, &[])?
            .sample(key);
    }
    opts.validate()?;
    let logits = logits.reshape(&[1, v])?.as_type(Dtype::Float32)?;
    let scores = penalty::apply(&logits, opts, history, &[])?;
    Ok(scores.argmax(-1, false)?)
}
