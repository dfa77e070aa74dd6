//! [`Session::generate`]: checks a request, prefills the prompt, and runs one
//! decode loop over the session's decoder.
//!
//! A plain session decodes with the pipelined plain decoder
//! (`generate/plain.rs`): one sync per token, the device one token ahead. A
//! speculative session decodes in rounds (`generate/speculative.rs`): a
//! depth controller picks the draft depth, a round drafts, verifies in one
//! target forward and accepts with one host sync, and depth 0 hands over to
//! the plain decoder. Both emit through one [`Output`] (EOS, budget, stop
//! strings, the text callback); "forward one token and sample" is
//! `generate/step.rs`. Under greedy decoding both give the same tokens.

mod output;
mod plain;
mod speculative;
mod step;
mod warm;

use std::sync::atomic::AtomicBool;
use std::time::Instant;

use sampler::{History, KeyStream, Options};

use crate::depth::DepthPolicy;
use crate::drafter::DraftRun;
use crate::error::{Error, Result};
use crate::session::PREFILL_CHUNK;
use crate::session::{Session, Target, prefill_chunks};
use crate::spec_stats::SpecStats;
use crate::stats::Stats;
use crate::tokenizer::Tokenizer;
use output::Output;
use step::Decode;

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
    /// Draft depth of a speculative session (ignored by a plain one).
    pub depth: DepthPolicy,
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
            depth: DepthPolicy::default(),
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
    /// Speculation figures, for a speculative session.
    pub speculation: Option<SpecStats>,
}

/// Most generated positions a request reserves cache room for up front
/// (beyond them the caches grow in 256-position steps as they fill): a
/// request asking for a huge budget does not hold that memory from its start.
const RESERVE_AHEAD: usize = 4096;

thread_local! {
    static RESERVE: crate::switch::Flag = const { std::cell::Cell::new(None) };
}

/// Room for the whole request in the attention caches from the prefill on
/// (`prompt` tokens still to forward, then the seed, `max_tokens`, and the
/// drafts a round runs past what it commits, at most `depth`'s deepest):
/// growing them step by step mid-decode stalls a round each time (fresh
/// buffers, copies, new shapes).
fn reserve(
    target: &mut Target<'_>,
    drafter: Option<&mut crate::drafter::Drafter<'_>>,
    prompt: usize,
    max_tokens: usize,
    depth: DepthPolicy,
) {
    if !reserve_caches() {
        return;
    }
    let deepest = match depth {
        DepthPolicy::Fixed(n) | DepthPolicy::Auto { max: n } => n,
    };
    let end = target.committed().len() + prompt + 1 + max_tokens.min(RESERVE_AHEAD) + deepest;
    let end = end.min(target.model().context_length());
    target.reserve(end);
    if let Some(d) = drafter {
        d.reserve(end);
    }
}

/// Whether requests reserve their caches' room up front (on by default;
/// `MTP_KV_RESERVE=0` grows them step by step as they fill).
fn reserve_caches() -> bool {
    crate::switch::get(&RESERVE, "MTP_KV_RESERVE", true)
}

impl Session<'_> {
    /// Builds ahead of the first request what MLX's CUDA backend builds on
    /// first use of a shape: the speculative rounds' kernels (which the first
    /// speculative request builds otherwise) and, under shape buckets, every
    /// prefill bucket's (which each bucket's first prompt pays otherwise). A
    /// server calls it at start-up; elsewhere it does nothing. Returns the
    /// prefill buckets run.
    ///
    /// # Errors
    /// MLX errors of the scratch forwards.
    pub fn warm_up(&self) -> Result<usize> {
        if let Some(d) = &self.drafter {
            warm::warm_for(self.model(), d);
        }
        warm::prefill_shapes(self.model())
    }

    /// Generates a continuation of `prompt`, calling `on_text` with each piece of text.
    ///
    /// On return (also when cancelled) the caches hold exactly
    /// [`Session::committed`]: the prompt and the generated tokens that were forwarded.
    ///
    /// # Errors
    /// Bad options ([`Error::InvalidOption`], sampling errors), an empty
    /// prompt, a prompt that does not fit the context, ids outside the
    /// vocabulary: checked before anything runs, the session is left as it
    /// was. Errors while running (MLX errors, non-finite logits) empty the
    /// session first (`Session::empty_after`): its caches may be
    /// part-written.
    pub fn generate(
        &mut self,
        tok: &Tokenizer,
        prompt: &[u32],
        opts: &GenerateOptions,
        cancel: &AtomicBool,
        on_text: impl FnMut(&str),
    ) -> Result<Generation> {
        let max_tokens = self.check(prompt, opts)?;
        let r = self.run(tok, prompt, opts, max_tokens, cancel, on_text);
        self.empty_after(r)
    }

    /// [`Session::generate`] after its checks, with the budget they left.
    fn run(
        &mut self,
        tok: &Tokenizer,
        prompt: &[u32],
        opts: &GenerateOptions,
        max_tokens: usize,
        cancel: &AtomicBool,
        on_text: impl FnMut(&str),
    ) -> Result<Generation> {
        if let Some(d) = &self.drafter {
            warm::warm_for(self.model(), d);
        }
        mlx_tensor::memory::reset_peak();
        let t0 = Instant::now();
        let (body, seed) = self.rerun_boundary(prompt)?;
        let model = self.model();
        let Session {
            target,
            drafter,
            depth_memory,
        } = &mut *self;
        reserve(target, drafter.as_mut(), body.len(), max_tokens, opts.depth);
        // One draft run for the prefill and the decode: an MTP run carries
        // the last hidden from one to the other.
        let mut draft = match drafter.as_mut() {
            Some(d) => Some(d.open(target.committed())?),
            None => None,
        };
        prefill_chunks(target, &body, opts.prefill_chunk, cancel, draft.as_mut())?;
        let mut history = History::new(opts.sampling.repeat_last_n);
        history.commit(target.committed());
        history.commit(&[seed]);
        let mut output = Output::new(tok, model, &opts.stop, max_tokens, on_text);
        output.result.stats.prompt_tokens = prompt.len();
        let mut d = Decode {
            options: &opts.sampling,
            history,
            keys: KeyStream::new(opts.sampling.seed.unwrap_or(opts.fallback_seed)),
            output,
            cancel,
            pipelined: opts.pipeline && !opts.sampling.uses_penalties(),
        };
        decode(
            target,
            draft.as_mut(),
            &mut d,
            seed,
            opts.depth,
            depth_memory,
        )?;
        if let Some(r) = draft {
            r.close()?;
        }
        d.output.finish()?;
        // The last dispatched forward (and a draft flush's async evaluation) may
        // still be running: finish everything on the stream so the caches are
        // settled and no work is in flight when the caller drops arrays or exits.
        self.target.settle()?;
        let t_end = Instant::now();
        let t_first = d.output.t_first.unwrap_or(t_end);
        let generated = d.output.generated;
        let mut result = d.output.result;
        result.stats.prefill_time = t_first - t0;
        result.stats.decode_time = t_end - t_first;
        result.stats.generated_tokens = generated;
        result.stats.peak_memory_bytes = mlx_tensor::memory::peak();
        self.offset();
        tracing::debug!(
            prompt = prompt.len(),
            generated,
            decode_tps = result.stats.decode_tps(),
            "generation done"
        );
        Ok(result)
    }

    /// Checks a request; returns the token budget the context leaves.
    fn check(&self, prompt: &[u32], opts: &GenerateOptions) -> Result<usize> {
        let vocab = self.model().vocab_size();
        // Bias ids too: checked here, before any forward, not at the first sampling.
        opts.sampling.validate_for_vocab(vocab)?;
        if opts.prefill_chunk == 0 {
            return Err(Error::InvalidOption {
                option: "prefill_chunk",
                message: "must be at least 1 token (the default is 2048)".into(),
            });
        }
        let context = self.model().context_length();
        let total = self.committed().len() + prompt.len();
        if prompt.is_empty() {
            return Err(Error::EmptyPrompt);
        }
        if total >= context {
            return Err(Error::PromptTooLong {
                prompt: total,
                context,
            });
        }
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::VocabMismatch {
                tokenizer: bad as usize + 1,
                model: vocab,
            });
        }
        Ok(opts.max_tokens.min(context - total))
    }

    /// Splits `prompt` into the tokens to prefill and its last token, which
    /// the decoders forward. An MTP session first re-runs its last committed
    /// token: the hidden there completes the draft caches' open boundary pair
    /// with the first new token (so the body starts with it). Recurrent
    /// layers without a point there replay from the nearest one below.
    fn rerun_boundary(&mut self, prompt: &[u32]) -> Result<(Vec<u32>, u32)> {
        let (body, seed) = prompt.split_at(prompt.len() - 1);
        let mut body = body.to_vec();
        let committed = self.target.committed().len();
        if let Some(d) = self
            .drafter
            .as_mut()
            .filter(|d| d.reruns_boundary(committed))
        {
            let replay = self.target.rewind_reachable(committed - 1)?;
            d.rewind(self.target.committed().len())?;
            body.splice(0..0, replay);
        }
        Ok((body, seed[0]))
    }
}

/// The decode loop from `seed`: the speculative decoder when there is a
/// draft run, else the plain one.
fn decode<F: FnMut(&str)>(
    target: &mut Target<'_>,
    draft: Option<&mut DraftRun<'_, '_>>,
    d: &mut Decode<'_, F>,
    seed: u32,
    depth: DepthPolicy,
    memory: &mut Option<crate::depth::Learned>,
) -> Result<()> {
    if d.output.max_tokens == 0 {
        d.output.result.finish = FinishReason::Length;
        return Ok(());
    }
    if d.cancelled() {
        d.output.result.finish = FinishReason::Cancelled;
        return Ok(());
    }
    match draft {
        Some(draft) => {
            let spec = speculative::run(target, draft, d, seed, depth, memory)?;
            d.output.result.speculation = Some(spec);
        }
        None => {
            plain::run(target, d, seed, None)?;
        }
    }
    Ok(())
}
