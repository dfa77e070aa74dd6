//! Sampling [`Options`] and their validation.

use crate::{Error, Result};

/// How to turn logits into a token distribution.
///
/// Semantics follow ollama / llama.cpp. The pipeline is penalties →
/// temperature → top-k → top-p → min-p → normalise (see
/// [`crate::Distribution::from_logits`]).
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
        match checks.into_iter().find(|&(_, _, ok, _)| !ok) {
            Some((name, value, _, allowed)) => Err(Error::InvalidOption {
                name,
                value,
                allowed,
            }),
            None => Ok(()),
        }
    }
}
