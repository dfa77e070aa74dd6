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
    /// Where the plain decoder's time went, summed over its tokens (zero
    /// when every token came from speculative rounds).
    pub plain: PlainPhases,
}

/// Host time of the plain decoder's tokens, by phase, summed: what a plain
/// token costs beyond the device's step shows here (on CUDA a step is bound
/// by the host building and dispatching its graph).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PlainPhases {
    /// Tokens these sums cover (every token the plain decoder read).
    pub tokens: usize,
    /// Building the next step's graph (forward, unembedding, sample, checks).
    pub build: Duration,
    /// Handing it to MLX (`async_eval`: encoding and launching its kernels).
    pub dispatch: Duration,
    /// Waiting for the token being read (its step's device time not hidden
    /// behind the host work above).
    pub wait: Duration,
    /// Emitting it: penalty history, detokenizing, stop strings, the callback.
    pub emit: Duration,
}

impl PlainPhases {
    /// Each phase's mean per token in milliseconds: build, dispatch, wait, emit.
    pub fn per_token_ms(&self) -> [f64; 4] {
        let n = self.tokens.max(1) as f64;
        [self.build, self.dispatch, self.wait, self.emit].map(|d| d.as_secs_f64() * 1e3 / n)
    }
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
