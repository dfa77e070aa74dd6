//! Sampling [`Options`] and their validation.

use crate::{Error, Result};

/// How to turn logits into a token distribution.
///
/// The pipeline is penalties → logit bias → temperature → top-k → top-p →
/// min-p → normalise (see [`crate::Distribution::from_logits`]): the logits
/// are penalised, biased per token, divided by the temperature, cut to the `top_k` largest, turned
/// into probabilities, cut to the nucleus of mass `top_p`, cut below `min_p`
/// times the largest probability, and renormalised. Each option's meaning
/// (ranges, "off" values) follows ollama and llama.cpp.
///
/// **Order.** This is the order of ollama's sampler and of Hugging Face
/// transformers' logits processors (the temperature warper runs before the
/// top-k and top-p warpers). It is *not* the order of llama.cpp's default
/// sampler chain (`… top_k; typ_p; top_p; min_p; xtc; temperature`) nor of
/// mlx-lm's `make_sampler` (top-p, min-p and top-k on the unscaled log
/// probabilities, the temperature applied when drawing): those cut top-p and
/// min-p *before* the temperature. The orders agree at temperature 1 and for
/// top-k alone (dividing by a temperature does not reorder tokens); with
/// another temperature and top-p or min-p they keep different sets, so the
/// same options give a different distribution there than here.
///
/// **Top-p fidelity.** The nucleus is decided in f32: the exclusive
/// cumulative sum of the sorted f32 probabilities is compared with `top_p` in
/// f32, so a token whose exclusive mass lies within the sum's rounding error
/// of `top_p` (about 1.5e-5 over a vocabulary of ~150k tokens) may be kept or
/// cut differently from exact arithmetic. Plain and speculative decoding run
/// the same computation, so this is a matter of fidelity to an exact
/// reference, not of losslessness.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Divides the logits; `0` means greedy (one-hot argmax rows).
    pub temperature: f32,
    /// Keeps the `top_k` most likely tokens; `0` (or `>= vocabulary`) is off.
    pub top_k: usize,
    /// Keeps the smallest set of most likely tokens whose probability before
    /// each token is `< top_p`; `1` is off. Allowed range `(0, 1]`.
    pub top_p: f32,
    /// Drops tokens whose probability is below `min_p` times the largest; `0`
    /// is off. Allowed range `[0, 1)`.
    pub min_p: f32,
    /// How many recent tokens the penalties look at; `0` turns all penalties off.
    pub repeat_last_n: usize,
    /// Divides positive logits (multiplies negative ones) of tokens seen in the
    /// window; `1` is off. Must be `> 0`.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every token seen in the window; `0` is off.
    pub presence_penalty: f32,
    /// Subtracted from the logit of a token once per occurrence in the window; `0` is off.
    pub frequency_penalty: f32,
    /// Added to the logits of these token ids after the penalties (OpenAI's
    /// `logit_bias`): `-100` all but bans a token, `100` all but forces it.
    /// Each bias must be finite and each id appear once; empty is off.
    /// Plain and speculative decoding both sample from the biased logits
    /// (the draft too), so speculation stays lossless under a bias.
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed for a reproducible [`crate::KeyStream`]; `None` lets the caller pick one.
    pub seed: Option<u64>,
}

impl Default for Options {
    /// Temperature 1, every filter and penalty off, a 64-token penalty window.
    fn default() -> Self {
        Options {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_last_n: 64,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
        }
    }
}

impl Options {
    /// Greedy decoding: temperature 0, everything else at its default.
    pub fn greedy() -> Self {
        Options {
            temperature: 0.0,
            ..Options::default()
        }
    }

    /// True when rows are one-hot argmax (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// True when some penalty would change the logits.
    pub fn uses_penalties(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }

    /// Checks every option against its allowed range.
    ///
    /// The error names the first offending option, its value and the range.
    pub fn validate(&self) -> Result<()> {
        let checks: [(&'static str, f32, bool, &'static str); 6] = [
            (
                "temperature",
                self.temperature,
                self.temperature.is_finite() && self.temperature >= 0.0,
                "a finite number >= 0 (0 = greedy)",
            ),
            (
                "top_p",
                self.top_p,
                self.top_p > 0.0 && self.top_p <= 1.0,
                "in (0, 1] (1 = off)",
            ),
            (
                "min_p",
                self.min_p,
                self.min_p >= 0.0 && self.min_p < 1.0,
                "in [0, 1) (0 = off)",
            ),
            (
                "repeat_penalty",
                self.repeat_penalty,
                self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0,
                "a finite number > 0 (1 = off)",
            ),
            (
                "presence_penalty",
                self.presence_penalty,
                self.presence_penalty.is_finite(),
                "a finite number (0 = off)",
            ),
            (
                "frequency_penalty",
                self.frequency_penalty,
                self.frequency_penalty.is_finite(),
                "a finite number (0 = off)",
            ),
        ];
        // NaN fails every comparison above, so it is caught by the same checks.
        if let Some((name, value, _, allowed)) = checks.into_iter().find(|&(_, _, ok, _)| !ok) {
            return Err(Error::InvalidOption {
                name,
                value,
                allowed,
            });
        }
        if let Some(&(_, value)) = self.logit_bias.iter().find(|b| !b.1.is_finite()) {
            return Err(Error::InvalidOption {
                name: "logit_bias",
                value,
                allowed: "a finite number per token",
            });
        }
        let mut ids: Vec<u32> = self.logit_bias.iter().map(|b| b.0).collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::DuplicateBias { token: w[0] });
        }
        Ok(())
    }

    /// [`Options::validate`], and every [`Options::logit_bias`] id inside a
    /// vocabulary of `vocab` tokens: what a caller that knows the model
    /// checks before the first forward.
    pub fn validate_for_vocab(&self, vocab: usize) -> Result<()> {
        self.validate()?;
        self.check_bias_ids(vocab)
    }

    /// Every [`Options::logit_bias`] id inside a vocabulary of `vocab` tokens.
    pub(crate) fn check_bias_ids(&self, vocab: usize) -> Result<()> {
        match self.logit_bias.iter().find(|b| b.0 as usize >= vocab) {
            Some(&(token, _)) => Err(Error::BiasOutsideVocabulary { token, vocab }),
            None => Ok(()),
        }
    }
}
