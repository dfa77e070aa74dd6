//! Token sampling. TEMPORARY stand-in with the `sampler` crate's surface
//! (`Options`, `History`, `KeyStream`, `sample_next`), replaced when it lands.

use mlx_tensor::{Array, Dtype, random};

use crate::error::{Error, Result};

/// Sampling options.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// Temperature; 0 is greedy.
    pub temperature: f32,
    /// Top-k; 0 is off.
    pub top_k: usize,
    /// Top-p; 1 is off.
    pub top_p: f32,
    /// Min-p; 0 is off.
    pub min_p: f32,
    /// Penalty window.
    pub repeat_last_n: usize,
    /// Repetition penalty; 1 is off.
    pub repeat_penalty: f32,
    /// Presence penalty.
    pub presence_penalty: f32,
    /// Frequency penalty.
    pub frequency_penalty: f32,
    /// Seed.
    pub seed: Option<u64>,
}

impl Default for Options {
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
    /// Greedy.
    pub fn greedy() -> Self {
        Options {
            temperature: 0.0,
            ..Options::default()
        }
    }
    /// True when penalties change logits.
    pub fn uses_penalties(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }
    /// Range checks.
    pub fn validate(&self) -> Result<()> {
        let bad = |option, message: String| Err(Error::InvalidOption { option, message });
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad("temperature", format!("{} must be >= 0", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", format!("{} must be in (0, 1]", self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p < 1.0) {
            return bad("min_p", format!("{} must be in [0, 1)", self.min_p));
        }
        if !(self.repeat_penalty > 0.0) {
            return bad(
                "repeat_penalty",
                format!("{} must be > 0", self.repeat_penalty),
            );
        }
        Ok(())
    }
}

/// Tokens seen, for penalties.
#[derive(Debug, Clone, Default)]
pub struct History {
    tokens: Vec<u32>,
}

impl History {
    /// A history with a window.
    pub fn new(_window: usize) -> Self {
        History::default()
    }
    /// Records tokens.
    pub fn commit(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
    }
}

/// Seeded keys.
#[derive(Debug)]
pub struct KeyStream {
    key: Array,
}

impl KeyStream {
    /// From a seed.
    pub fn new(seed: u64) -> Self {
        KeyStream {
            key: random::key(seed).expect("random key"),
        }
    }
    /// The next key.
    pub fn next_key(&mut self) -> Result<Array> {
        let (a, b) = random::split2(&self.key)?;
        self.key = a;
        Ok(b)
    }
}

/// Samples `[1]` u32 from logits `[1, V]`.
pub fn sample_next(logits: &Array, opts: &Options, _h: &History, key: &Array) -> Result<Array> {
    if opts.temperature == 0.0 {
        return Ok(logits.argmax(-1, false)?.as_type(Dtype::Uint32)?);
    }
    let t = Array::from_f32(1.0 / opts.temperature)?;
    Ok(random::categorical(&logits.multiply(&t)?, -1, key)?.as_type(Dtype::Uint32)?)
}
