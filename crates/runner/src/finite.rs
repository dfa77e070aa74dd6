//! Non-finite logits: detected in the readback that each step already does,
//! and reported with the likely cause instead of becoming token 0.
//!
//! A NaN or infinite logit makes the softmax NaN, and sampling from NaN
//! returns an arbitrary id (0, often EOS), so without a check a broken step
//! looks like a normal end. Checking costs no extra host sync: a row is broken
//! exactly when its temperature-scaled logsumexp (what the sampler's softmax
//! normalises by) is NaN or infinite, that is when a logit is NaN or `+inf`,
//! or all are `-inf`; the flag is evaluated in the same graph as the sample
//! and read back with it — one `[2]` array (token, flag) for a plain step
//! ([`Checked`]), or the flag row appended to the packed acceptance of a
//! speculative round ([`read_emitted`]).
//!
//! The sampler computes no logsumexp to share (greedy rows take an argmax;
//! sampled rows take a softmax after top-k masking, which could hide a NaN),
//! so the flag is made as cheaply as the same condition allows: a greedy
//! plain step reads one element, the sampled token's own logit (the argmax
//! picks a NaN, else a `+inf`); every other row takes one `max` pass, no exp
//! or log.
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
                "the temperature {:e} divides the logits past f32's range (use 0 for greedy \
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
///
/// The row's maximum decides: MLX's `max` propagates NaN, so it is NaN when
/// a logit is, `+inf` when one is and `-inf` when all are, exactly when the
/// logsumexp is not finite. Dividing by a positive temperature is monotone,
/// so the scaled row overflows exactly when its scaled maximum does.
pub(crate) fn rows_finite(logits: &Array, opts: &Options) -> Result<Array> {
    let v = logits.dim(-1);
    let top = logits
        .reshape(&[-1, v])?
        .max(&[-1], false)?
        .as_type(Dtype::Float32)?;
    let scaled = if opts.is_greedy() {
        top
    } else {
        // The sampler divides by the temperature; so does the check.
        top.divide(&Array::from_f32(opts.temperature)?)?
    };
    finite_flag(&scaled)
}

/// `[n]` u32: 1 where `x` (`[n]` f32) is finite, 0 where it is NaN or ±inf.
fn finite_flag(x: &Array) -> Result<Array> {
    // `x · 0` is 0 for every finite x and NaN for NaN and ±inf.
    let zero = Array::from_f32(0.0)?;
    Ok(x.multiply(&zero)?.equal(&zero)?.as_type(Dtype::Uint32)?)
}

/// The flag of a greedy `token` sampled from the one row of `logits`: its own
/// logit, one element. The greedy token is the argmax of the penalised
/// logits; penalties keep NaN and ±inf as they are, and MLX's argmax picks a
/// NaN first, else a `+inf`, else (all `-inf`) index 0, so the token's logit
/// is finite exactly when the row's maximum is.
fn greedy_token_finite(logits: &Array, token: &Array) -> Result<Array> {
    let v = logits.dim(-1);
    let own = logits.reshape(&[v])?.take(&token.reshape(&[1])?, 0)?;
    finite_flag(&own.as_type(Dtype::Float32)?)
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
    let flag = if opts.is_greedy() {
        greedy_token_finite(logits, token)?
    } else {
        rows_finite(logits, opts)?
    };
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
        assert!(e.contains("temperature 1e-40 divides"), "{e}");
        Ok(())
    }

    /// The flag of `logits` (one row) with the token the sampler draws.
    fn flag(logits: &[f32], opts: &Options) -> Result<u32> {
        let l = Array::from_slice(logits, &[1, logits.len() as i32])?;
        let history = sampler::History::new(8);
        let token = sampler::sample_next(&l, opts, &history, &mlx_tensor::random::key(3)?)?;
        Ok(check(&l, &token, opts, 0, Dtype::Float32)?
            .both
            .to_vec::<u32>()?[1])
    }

    #[test]
    fn the_flag_is_the_logsumexp_condition_on_greedy_and_sampled_rows() -> Result<()> {
        let (nan, inf, ninf) = (f32::NAN, f32::INFINITY, f32::NEG_INFINITY);
        // (row, finite): a NaN or +inf anywhere, or all -inf, breaks the row,
        // wherever it sits relative to the largest finite logit; a single
        // -inf (a masked token) does not.
        let cases: [(&[f32], bool); 8] = [
            (&[3.0, 1.0, ninf], true),
            (&[3.0, nan, 1.0], false),
            (&[nan, 3.0, 1.0], false),
            (&[3.0, 1.0, nan], false),
            (&[3.0, 1.0, inf], false),
            (&[inf, nan, 1.0], false),
            (&[ninf, ninf, ninf], false),
            (&[ninf, 0.0, ninf], true),
        ];
        let sampled = Options {
            temperature: 0.7,
            ..Options::default()
        };
        for opts in [Options::greedy(), sampled] {
            for (row, finite) in cases {
                // The control: the logsumexp itself.
                let lse = Array::from_slice(row, &[1, row.len() as i32])?
                    .logsumexp(&[-1], false)?
                    .to_vec::<f32>()?[0];
                assert_eq!(lse.is_finite(), finite, "control {row:?}");
                let want = u32::from(finite);
                assert_eq!(flag(row, &opts)?, want, "{row:?} at T {}", opts.temperature);
            }
        }
        Ok(())
    }
}
