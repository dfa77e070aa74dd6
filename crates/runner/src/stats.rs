//! Generation statistics: a plain struct the CLI formats.

use std::time::Duration;

/// Figures of one generation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// From the start of prefill until the first generated token was read.
    pub prefill_time: Duration,
    /// Tokens generated (the EOS that ended generation is counted).
    pub generated_tokens: usize,
    /// From the first generated token until the last was read.
    pub decode_time: Duration,
    /// MLX's peak active memory during the generation, in bytes.
    pub peak_memory_bytes: usize,
}

impl Stats {
    /// Prompt tokens per second of prefill (time to first token).
    pub fn prefill_tps(&self) -> f64 {
        rate(self.prompt_tokens, self.prefill_time)
    }

    /// Generated tokens per second after the first (which prefill pays for).
    pub fn decode_tps(&self) -> f64 {
        rate(self.generated_tokens.saturating_sub(1), self.decode_time)
    }
}

fn rate(n: usize, t: Duration) -> f64 {
    let s = t.as_secs_f64();
    if n == 0 || s == 0.0 {
        0.0
    } else {
        n as f64 / s
    }
}
