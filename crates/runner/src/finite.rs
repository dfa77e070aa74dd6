//! Non-finite logits: detected in the readback that each step already does,
//! and reported with the likely cause instead of becoming token 0.
//!
//! A NaN or infinite logit makes the softmax NaN, and sampling from NaN
//! returns an arbitrary id (0, often EOS), so without a check a broken step
//! looks like a normal end. Checking costs no extra host sync: the check is
//! one reduction per row (`logsumexp` of the temperature-scaled logits, NaN or
//! infinite exactly when a logit is NaN or `+inf`, or all are `-inf`),
//! evaluated in the same graph as the sample and read back with it — one
//! `[2]` array (token, flag) for a plain step ([`Checked`]), or the flag row
//! appended to the packed acceptance of a speculative round
//! ([`read_emitted`]).
//!
//! robust2 owns this file. Call sites (in `generate.rs` and `speculate.rs`)
//! are marked `robust2:`.

use mlx_tensor::{Array, Dtype, ops};
use sampler::{Acceptance, Options};

use crate::error::{Error, Result};

/// Why a model's logits may be non-finite, given how it is run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Causes {
    /// The compute dtype.
    pub dtype: Dtype,
    /// The sampling temperature (0 = greedy).
    pub temperature: f32,
}

impl Causes {
    /// The likely causes, most likely first, each with its fix.
    pub(crate) fn explain(&self) -> String {
        let mut out = Vec::new();
        if self.temperature > 0.0 && self.temperature < 1e-3 {
            out.push(format!(
                "--temperature {:e} divides the logits past f32's range (use 0 for greedy \
                 decoding, or a temperature of at least 0.01)",
                self.temperature
            ));
        }
        match self.dtype {
            Dtype::Float16 => out.push(
                "activations overflowed float16's range (±65504) with --dtype f16: use --dtype \
                 bf16 or f32"
                    .into(),
            ),
            Dtype::Bfloat16 => {
                out.push("precision was lost in bfloat16 (--dtype bf16): try --dtype f32".into())
            }
            _ => {}
        }
        out.push(
            "a config.json value (rms_norm_eps, rope_theta, rope_scaling) or the weights are \
             broken: compare them with the model's original files"
                .into(),
        );
        out.join("; or ")
    }
}

/// A sample and its finiteness flag, both lazy; [`Checked::read`] reads them
/// with one sync. The token array stays a valid id for the next forward.
#[derive(Debug, Clone)]
pub(crate) struct Checked {
    /// The sampled token `[1]` u32 (for the next forward's input).
    pub token: Array,
    /// `[token, flag]` u32, flag 1 when the row was finite.
    both: Array,
    /// Where the sampled token goes in the sequence.
    position: usize,
    causes: Causes,
}

/// Whether each row of `logits` (`[R, V]` or `[V]`) is finite after the
/// temperature scaling the sampler applies: `[R]` u32, 1 for finite.
pub(crate) fn rows_finite(logits: &Array, opts: &Options) -> Result<Array> {
    let v = logits.dim(-1);
    let rows = logits.reshape(&[-1, v])?.as_type(Dtype::Float32)?;
    let scaled = if opts.is_greedy() {
        rows
    } else {
        // The sampler divides by the temperature; so does the check.
        rows.divide(&Array::from_f32(opts.temperature)?)?
    };
    let lse = scaled.logsumexp(&[-1], false)?;
    // `x · 0` is 0 for every finite x and NaN for NaN and ±inf.
    let zero = Array::from_f32(0.0)?;
    Ok(lse.multiply(&zero)?.equal(&zero)?.as_type(Dtype::Uint32)?)
}

/// `token` (the `[1]` sample of the one row of `logits`, for sequence
/// position `position`) with its flag; `dtype` is the compute dtype.
pub(crate) fn check(
    logits: &Array,
    token: &Array,
    opts: &Options,
    position: usize,
    dtype: Dtype,
) -> Result<Checked> {
    let flag = rows_finite(logits, opts)?;
    let both = ops::concatenate(&[token.reshape(&[1])?.as_type(Dtype::Uint32)?, flag], 0)?;
    Ok(Checked {
        token: token.clone(),
        both,
        position,
        causes: Causes {
            dtype,
            temperature: opts.temperature,
        },
    })
}

impl Checked {
    /// Schedules the token and the flag together.
    pub(crate) fn async_eval(&self) -> Result<()> {
        mlx_tensor::async_eval(&[self.token.clone(), self.both.clone()])?;
        Ok(())
    }

    /// The token id (one sync), or [`Error::NonFiniteLogits`].
    pub(crate) fn read(&self) -> Result<u32> {
        let v = self.both.to_vec::<u32>()?;
        if v[1] == 0 {
            return Err(Error::NonFiniteLogits {
                position: self.position,
                cause: self.causes.explain(),
            });
        }
        Ok(v[0])
    }
}

/// [`Acceptance::read_emitted`] with the finiteness of the target rows read
/// in the same sync: an error when a row the outcome depends on (rows
/// `0..=accepted`) was not finite. `pos` is the position of row 0.
pub(crate) fn read_emitted(
    acceptance: &Acceptance,
    logits: &Array,
    opts: &Options,
    pos: usize,
    dtype: Dtype,
) -> Result<Vec<u32>> {
    let causes = Causes {
        dtype,
        temperature: opts.temperature,
    };
    let packed = acceptance.packed();
    let width = packed.dim(1) as usize;
    let flags = rows_finite(logits, opts)?.reshape(&[1, -1])?;
    let all = ops::concatenate(&[packed.clone(), flags], 1)?.to_vec::<u32>()?;
    let (row, flags) = all.split_at(width);
    let emitted = acceptance.emitted_from(row);
    let accepted = emitted.len() - 1;
    if let Some(bad) = flags[..=accepted.min(flags.len() - 1)]
        .iter()
        .position(|&f| f == 0)
    {
        return Err(Error::NonFiniteLogits {
            position: pos + bad,
            cause: causes.explain(),
        });
    }
    Ok(emitted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(logits: &[f32], opts: &Options) -> Result<u32> {
        let l = Array::from_slice(logits, &[1, logits.len() as i32])?;
        let token = Array::from_slice(&[1u32], &[1])?;
        check(&l, &token, opts, 7, Dtype::Float16)?.read()
    }

    #[test]
    fn a_finite_row_reads_its_token_and_a_broken_one_names_the_causes() -> Result<()> {
        let greedy = Options::greedy();
        assert_eq!(read(&[0.5, 2.0, f32::NEG_INFINITY], &greedy)?, 1);
        for bad in [[0.5, f32::NAN, 1.0], [0.5, f32::INFINITY, 1.0]] {
            let e = read(&bad, &greedy).unwrap_err().to_string();
            assert!(
                e.contains("position 7") && e.contains("--dtype f16") && e.contains("bf16 or f32"),
                "{e}"
            );
        }
        // Finite logits that a tiny temperature scales past f32's range.
        let tiny = Options {
            temperature: 1e-40,
            ..Options::default()
        };
        let e = read(&[0.5, 2.0, 1.0], &tiny).unwrap_err().to_string();
        assert!(e.contains("--temperature 1e-40"), "{e}");
        Ok(())
    }
}
