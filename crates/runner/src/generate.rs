//! Generation: chunked prefill and the pipelined plain decode loop.
//!
//! The decode loop keeps the device one token ahead: step `i + 1` is built
//! from step `i`'s still-lazy token and scheduled with `async_eval` before
//! the host reads token `i`, so the host's detokenizing and callbacks overlap
//! the next forward, and there is one sync per token.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use mlx_tensor::Array;

use crate::detok::StreamDetokenizer;
use crate::error::{Error, Result};
use crate::model::Model;
use crate::stats::Stats;
use crate::stop::{StopMatcher, StopStep};
use crate::tokenizer::Tokenizer;
use kvcache::Cache;
use sampler::{History, KeyStream, Options, sample_next};

/// Prompt tokens per prefill forward.
pub const PREFILL_CHUNK: usize = 2048;

/// What to generate and when to stop.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Most tokens to generate (capped by the context left after the prompt).
    pub max_tokens: usize,
    /// Sampling.
    pub sampling: Options,
    /// Stop strings: generation ends before the first occurrence.
    pub stop: Vec<String>,
    /// Prompt tokens per prefill forward.
    pub prefill_chunk: usize,
    /// Seed used when `sampling.seed` is `None`.
    pub fallback_seed: u64,
    /// Keep the device one token ahead (turned off anyway when penalties need
    /// each token on the host before the next sample).
    pub pipeline: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: 256,
            sampling: Options::default(),
            stop: Vec::new(),
            prefill_chunk: PREFILL_CHUNK,
            fallback_seed: 0,
            pipeline: true,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// The model produced an end-of-sequence token.
    Eos,
    /// `max_tokens` (or the context) was reached.
    Length,
    /// A stop string was produced.
    Stop,
    /// The cancel flag was set.
    Cancelled,
}

/// The result of one generation.
#[derive(Debug, Clone)]
pub struct Generation {
    /// Generated ids, without a final EOS.
    pub token_ids: Vec<u32>,
    /// Generated text, cut before a stop string.
    pub text: String,
    /// Why it ended.
    pub finish: FinishReason,
    /// Figures.
    pub stats: Stats,
}

/// One sequence's caches and the tokens they hold.
#[derive(Debug)]
pub struct Session<'m> {
    model: &'m dyn Model,
    caches: Vec<Box<dyn Cache>>,
    /// Tokens whose keys and values are in `caches`, in order. Invariant: every
    /// cache's offset equals `committed.len()` between calls.
    committed: Vec<u32>,
}

impl<'m> Session<'m> {
    /// A session with fresh caches.
    pub fn new(model: &'m dyn Model) -> Session<'m> {
        Session {
            model,
            caches: model.new_caches(),
            committed: Vec::new(),
        }
    }

    /// Tokens in the caches.
    pub fn committed(&self) -> &[u32] {
        &self.committed
    }

    /// The caches' common offset.
    ///
    /// # Panics
    /// When the caches disagree with each other or with [`Session::committed`]
    /// (broken bookkeeping, a bug).
    pub fn offset(&self) -> usize {
        for (i, c) in self.caches.iter().enumerate() {
            assert_eq!(
                c.offset(),
                self.committed.len(),
                "cache {i} offset {} != committed tokens {}",
                c.offset(),
                self.committed.len()
            );
        }
        self.committed.len()
    }

    /// The caches.
    pub fn caches(&self) -> &[Box<dyn Cache>] {
        &self.caches
    }

    /// Forwards known tokens in chunks; returns the hidden rows `[n, H]` of the last
    /// chunk (lazy), or `None` for no tokens or on cancellation between chunks.
    pub fn prefill(
        &mut self,
        tokens: &[u32],
        chunk: usize,
        cancel: &AtomicBool,
    ) -> Result<Option<Array>> {
        let mut last = None;
        for part in tokens.chunks(chunk.max(1)) {
            if cancel.load(Ordering::Relaxed) {
                return Ok(None);
            }
            let ids = Array::from_slice(part, &[part.len() as i32])?;
            let hidden = self.model.forward(&ids, &mut self.caches)?;
            let mut state: Vec<Array> = self.caches.iter().flat_map(|c| c.state()).collect();
            state.push(hidden.clone());
            mlx_tensor::eval(&state)?;
            self.committed.extend_from_slice(part);
            last = Some(hidden);
        }
        self.offset();
        Ok(last)
    }

    /// Forwards one (maybe lazy) token and builds the next sample from the last row.
    fn step(
        &mut self,
        token: &Array,
        opts: &Options,
        history: &History,
        keys: &mut KeyStream,
    ) -> Result<Array> {
        let hidden = self.model.forward(token, &mut self.caches)?;
        let logits = self.model.unembed(&hidden)?;
        let y = sample_next(&logits, opts, history, &keys.next_key()?)?;
        y.async_eval()?;
        Ok(y)
    }

    /// Generates a continuation of `prompt`, calling `on_text` with each piece of text.
    ///
    /// On return (also when cancelled) the caches hold exactly
    /// [`Session::committed`]: the prompt and the generated tokens that were forwarded.
    pub fn generate(
        &mut self,
        tok: &Tokenizer,
        prompt: &[u32],
        opts: &GenerateOptions,
        cancel: &AtomicBool,
        mut on_text: impl FnMut(&str),
    ) -> Result<Generation> {
        opts.sampling.validate()?;
        if opts.prefill_chunk == 0 {
            return Err(Error::InvalidOption {
                option: "prefill_chunk",
                message: "must be at least 1 token (the default is 2048)".into(),
            });
        }
        let context = self.model.context_length();
        let start_len = self.committed.len();
        let total = start_len + prompt.len();
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        if total >= context {
            return Err(Error::PromptTooLong {
                prompt: total,
                context,
            });
        }
        let vocab = self.model.vocab_size();
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::VocabMismatch {
                tokenizer: bad as usize + 1,
                model: vocab,
            });
        }
        let max_tokens = opts.max_tokens.min(context - total);
        mlx_tensor::memory::reset_peak();
        let t0 = Instant::now();
        let mut stats = Stats {
            prompt_tokens: prompt.len(),
            ..Stats::default()
        };
        let mut out = Generation {
            token_ids: Vec::new(),
            text: String::new(),
            finish: FinishReason::Length,
            stats: Stats::default(),
        };
        let (body, seed) = prompt.split_at(prompt.len() - 1);
        self.prefill(body, opts.prefill_chunk, cancel)?;
        if cancel.load(Ordering::Relaxed) || max_tokens == 0 {
            out.finish = if max_tokens == 0 {
                FinishReason::Length
            } else {
                FinishReason::Cancelled
            };
            stats.prefill_time = t0.elapsed();
            stats.peak_memory_bytes = mlx_tensor::memory::peak();
            out.stats = stats;
            self.offset();
            return Ok(out);
        }

        let sampling = &opts.sampling;
        let mut history = History::new(sampling.repeat_last_n);
        history.commit(&self.committed);
        history.commit(seed);
        let mut keys = KeyStream::new(sampling.seed.unwrap_or(opts.fallback_seed));
        let pipelined = opts.pipeline && !sampling.uses_penalties();
        let eos: Vec<u32> = {
            let mut e = tok.eos_ids().to_vec();
            e.extend(
                self.model
                    .eos_ids()
                    .iter()
                    .filter(|x| !tok.eos_ids().contains(x)),
            );
            e
        };
        let mut detok = StreamDetokenizer::new();
        let mut stop = StopMatcher::new(&opts.stop);
        let mut emit = |text: &str, out: &mut Generation| {
            if !text.is_empty() {
                out.text.push_str(text);
                on_text(text);
            }
        };

        // `pending` is the lazy sample of the last forwarded token; its own forward is
        // dispatched (when pipelined) before it is read.
        let seed_arr = Array::from_slice(seed, &[1])?;
        let mut pending = Some(self.step(&seed_arr, sampling, &history, &mut keys)?);
        self.committed.push(seed[0]);
        let mut t_first = None;
        let mut generated = 0usize;
        while let Some(y) = pending.take() {
            let more = generated + 1 < max_tokens && !cancel.load(Ordering::Relaxed);
            let ahead = if pipelined && more {
                Some(self.step(&y, sampling, &history, &mut keys)?)
            } else {
                None
            };
            let id: u32 = y.item()?;
            generated += 1;
            if t_first.is_none() {
                t_first = Some(Instant::now());
            }
            if ahead.is_some() {
                self.committed.push(id);
            }
            history.commit(&[id]);
            if eos.contains(&id) {
                out.finish = FinishReason::Eos;
                break;
            }
            out.token_ids.push(id);
            let piece = detok.push(tok, id)?;
            match stop.push(&piece) {
                StopStep::Continue(t) => emit(&t, &mut out),
                StopStep::Stop(t) => {
                    emit(&t, &mut out);
                    out.finish = FinishReason::Stop;
                    break;
                }
            }
            if !more {
                out.finish = if generated >= max_tokens {
                    FinishReason::Length
                } else {
                    FinishReason::Cancelled
                };
                break;
            }
            pending = match ahead {
                Some(a) => Some(a),
                None => {
                    let arr = Array::from_slice(&[id], &[1])?;
                    let a = self.step(&arr, sampling, &history, &mut keys)?;
                    self.committed.push(id);
                    Some(a)
                }
            };
        }
        if out.finish != FinishReason::Stop {
            let rest = detok.flush(tok)?;
            let mut tail = match stop.push(&rest) {
                StopStep::Continue(t) => t,
                StopStep::Stop(t) => {
                    out.finish = FinishReason::Stop;
                    t
                }
            };
            if out.finish != FinishReason::Stop {
                tail.push_str(&stop.flush());
            }
            emit(&tail, &mut out);
        }
        // The last dispatched forward may still be running; finish it so the caches are settled.
        let state: Vec<Array> = self.caches.iter().flat_map(|c| c.state()).collect();
        mlx_tensor::eval(&state)?;
        let t_end = Instant::now();
        let t_first = t_first.unwrap_or(t_end);
        stats.prefill_time = t_first - t0;
        stats.decode_time = t_end - t_first;
        stats.generated_tokens = generated;
        stats.peak_memory_bytes = mlx_tensor::memory::peak();
        out.stats = stats;
        self.offset();
        tracing::debug!(
            prompt = prompt.len(),
            generated,
            decode_tps = out.stats.decode_tps(),
            "generation done"
        );
        Ok(out)
    }
}
