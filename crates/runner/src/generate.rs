//! Generation: chunked prefill, the pipelined plain decode loop, and the
//! speculative loop.
//!
//! The plain loop keeps the device one token ahead: step `i + 1` is built
//! from step `i`'s still-lazy token and scheduled with `async_eval` before
//! the host reads token `i`, so the host's detokenizing and callbacks overlap
//! the next forward, and there is one sync per token.
//!
//! A session made with [`Session::with_mtp`], [`Session::with_draft_model`]
//! or [`Session::with_ngram`] decodes in speculative rounds instead (see
//! [`crate::speculate`] and [`crate::drafter`]): one host sync per round, and
//! the same tokens as the plain loop under greedy decoding.

mod points;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use mlx_tensor::Array;

use crate::depth::{DepthController, DepthPolicy};
use crate::detok::StreamDetokenizer;
use crate::drafter::{DraftRun, ModelDrafter, NgramDrafter, NgramOptions, SpecDrafter};
use crate::error::{Error, Result};
use crate::finite::Checked; // robust2
use crate::model::Model;
use crate::spec_stats::SpecStats;
use crate::speculate::RoundOutcome;
use crate::stats::Stats;
use crate::stop::{StopMatcher, StopStep};
use crate::tokenizer::Tokenizer;
use kvcache::Cache;
use mtp_draft::Drafter;
pub(crate) use points::RestorePoints;
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

pub use crate::drafter::MtpDrafter;

/// One sequence's caches and the tokens they hold.
pub struct Session<'m> {
    pub(crate) model: &'m dyn Model,
    pub(crate) caches: Vec<Box<dyn Cache>>,
    /// Tokens whose keys and values are in `caches`, in order. Invariant: every
    /// cache's offset equals `committed.len()` between calls.
    pub(crate) committed: Vec<u32>,
    /// The drafter of a speculative session. Between calls an MTP drafter's
    /// draft caches hold the pairs of every committed slot but the last
    /// (whose pair needs the token after it); a draft model holds a prefix of
    /// `committed` (re-synced when a request opens).
    pub(crate) drafter: Option<SpecDrafter<'m>>,
    /// Snapshots of the last forward for caches that cannot rewind by
    /// offset (recurrent layers); empty for a stack of KV caches.
    pub(crate) points: RestorePoints,
}

impl std::fmt::Debug for Session<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("model", &self.model)
            .field("caches", &self.caches)
            .field("committed", &self.committed.len())
            .field("drafter", &self.drafter.as_ref().map(SpecDrafter::method))
            .finish()
    }
}

impl<'m> Session<'m> {
    /// A session with fresh caches that decodes plainly.
    pub fn new(model: &'m dyn Model) -> Session<'m> {
        Session {
            model,
            caches: model.new_caches(),
            committed: Vec::new(),
            drafter: None,
            points: RestorePoints::default(),
        }
    }

    /// A session that decodes speculatively with the model's MTP head.
    pub fn with_mtp(model: &'m dyn Model) -> Result<Session<'m>> {
        let head = model.mtp_head().ok_or(Error::NoMtpHead)?;
        Ok(Session::with_drafter(
            model,
            SpecDrafter::Mtp(Drafter::new(head)),
        ))
    }

    /// A session that decodes speculatively with a separate draft model
    /// (load it with [`crate::drafter::load_draft`], which checks that the
    /// tokenizers agree).
    pub fn with_draft_model(model: &'m dyn Model, draft: &'m dyn Model) -> Session<'m> {
        let drafter = ModelDrafter::new(draft, model.vocab_size());
        Session::with_drafter(model, SpecDrafter::Model(drafter))
    }

    /// A session that decodes speculatively with n-gram prompt lookup.
    pub fn with_ngram(model: &'m dyn Model, options: NgramOptions) -> Session<'m> {
        let drafter = NgramDrafter::new(model.vocab_size(), options);
        Session::with_drafter(model, SpecDrafter::Ngram(drafter))
    }

    /// A session that decodes speculatively with `drafter`.
    pub fn with_drafter(model: &'m dyn Model, drafter: SpecDrafter<'m>) -> Session<'m> {
        let mut s = Session::new(model);
        s.drafter = Some(drafter);
        s
    }

    /// True when the session drafts (with any drafter).
    pub fn is_speculative(&self) -> bool {
        self.drafter.is_some()
    }

    /// The drafter's method name (`mtp`, `draft-model`, `ngram`), or `None` for a plain session.
    pub fn drafter_method(&self) -> Option<&'static str> {
        self.drafter.as_ref().map(SpecDrafter::method)
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
    /// A speculative session reports the chunks to its drafter.
    pub fn prefill(
        &mut self,
        tokens: &[u32],
        chunk: usize,
        cancel: &AtomicBool,
    ) -> Result<Option<Array>> {
        let mut drafter = self.drafter.take();
        let result = (|| {
            let mut draft = match drafter.as_mut() {
                Some(d) => Some(d.open(&self.committed)?),
                None => None,
            };
            let last = self.prefill_chunks(tokens, chunk, cancel, draft.as_mut())?;
            if let Some(d) = draft {
                d.close()?;
            }
            Ok(last)
        })();
        self.drafter = drafter;
        result
    }

    fn prefill_chunks(
        &mut self,
        tokens: &[u32],
        chunk: usize,
        cancel: &AtomicBool,
        mut draft: Option<&mut DraftRun<'_, 'm>>,
    ) -> Result<Option<Array>> {
        let mut last = None;
        for part in tokens.chunks(chunk.max(1)) {
            if cancel.load(Ordering::Relaxed) {
                return Ok(None);
            }
            let pos = self.committed.len();
            let ids = Array::from_slice(part, &[part.len() as i32])?;
            let points = RestorePoints::schedule(&mut self.caches, &[pos + part.len() - 1]);
            let hidden = self.model.forward(&ids, &mut self.caches)?;
            let mut state: Vec<Array> = self.caches.iter().flat_map(|c| c.state()).collect();
            state.push(hidden.clone());
            mlx_tensor::eval(&state)?;
            self.committed.extend_from_slice(part);
            if points {
                self.points.take(&mut self.caches, &self.committed);
            }
            if let Some(d) = draft.as_deref_mut() {
                d.committed(part, &ids, &hidden, pos)?;
            }
            last = Some(hidden);
        }
        if !tokens.is_empty() {
            // The end of a prompt: the next chat turn's prompt extends it.
            self.points.mark_anchor();
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
    ) -> Result<Checked> {
        Ok(self.step_with_hidden(token, opts, history, keys)?.0)
    }

    /// [`Session::step`], also returning the forward's hidden row `[1, H]` (lazy).
    fn step_with_hidden(
        &mut self,
        token: &Array,
        opts: &Options,
        history: &History,
        keys: &mut KeyStream,
    ) -> Result<(Checked, Array)> {
        let at = self.caches.first().map_or(0, |c| c.offset());
        let points = RestorePoints::schedule(&mut self.caches, &[at]);
        let hidden = self.model.forward(token, &mut self.caches)?;
        if points {
            self.points.take(&mut self.caches, &self.committed);
        }
        let logits = self.model.unembed(&hidden)?;
        let y = sample_next(&logits, opts, history, &keys.next_key()?)?;
        // robust2: the finiteness flag rides on the sample's readback (no extra sync).
        let y = crate::finite::check(&logits, &y, opts, at + 1, hidden.dtype())?;
        y.async_eval()?;
        Ok((y, hidden))
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
        on_text: impl FnMut(&str),
    ) -> Result<Generation> {
        opts.sampling.validate()?;
        if opts.prefill_chunk == 0 {
            return Err(Error::InvalidOption {
                option: "prefill_chunk",
                message: "must be at least 1 token (the default is 2048)".into(),
            });
        }
        let context = self.model.context_length();
        let total = self.committed.len() + prompt.len();
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
        let mut drafter = self.drafter.take();
        let result = self.run(
            drafter.as_mut(),
            tok,
            prompt,
            max_tokens,
            opts,
            cancel,
            on_text,
        );
        self.drafter = drafter;
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        mut drafter: Option<&mut SpecDrafter<'m>>,
        tok: &Tokenizer,
        prompt: &[u32],
        max_tokens: usize,
        opts: &GenerateOptions,
        cancel: &AtomicBool,
        on_text: impl FnMut(&str),
    ) -> Result<Generation> {
        mlx_tensor::memory::reset_peak();
        let t0 = Instant::now();
        let (body, seed) = prompt.split_at(prompt.len() - 1);
        // An MTP session re-runs its last committed token: the hidden there
        // completes the draft caches' open boundary pair with the first new
        // token (at least one token is always re-evaluated). Recurrent layers
        // without a point there replay from the nearest one below.
        let mut body = body.to_vec();
        if let (Some(SpecDrafter::Mtp(d)), false) =
            (drafter.as_deref_mut(), self.committed.is_empty())
        {
            let keep = self.committed.len() - 1;
            let draft_offset = d.head().cache_offset().unwrap_or(keep);
            assert!(
                draft_offset <= keep,
                "draft caches at {draft_offset} past the boundary slot {keep}"
            );
            let replay = self.rewind_target(keep)?;
            crate::reuse::rewind_draft(d.head_mut().caches_mut(), self.committed.len())?;
            body.splice(0..0, replay);
        }
        let mut draft = match drafter {
            Some(d) => Some(d.open(&self.committed)?),
            None => None,
        };
        self.prefill_chunks(&body, opts.prefill_chunk, cancel, draft.as_mut())?;

        let sampling = &opts.sampling;
        let mut history = History::new(sampling.repeat_last_n);
        history.commit(&self.committed);
        history.commit(seed);
        let mut keys = KeyStream::new(sampling.seed.unwrap_or(opts.fallback_seed));
        let mut output = Output::new(tok, self.model, opts, max_tokens, on_text);
        output.stats.prompt_tokens = prompt.len();
        if cancel.load(Ordering::Relaxed) || max_tokens == 0 {
            output.result.finish = if max_tokens == 0 {
                FinishReason::Length
            } else {
                FinishReason::Cancelled
            };
        } else if let Some(d) = draft.as_mut() {
            let spec = self.decode_speculative(
                d,
                seed[0],
                opts,
                &mut history,
                &mut keys,
                &mut output,
                cancel,
            )?;
            output.result.speculation = Some(spec);
        } else {
            self.decode_plain(seed, opts, &mut history, &mut keys, &mut output, cancel)?;
        }
        if let Some(d) = draft {
            d.close()?;
        }
        output.finish()?;
        // The last dispatched forward (and a draft flush's async evaluation) may
        // still be running: finish everything on the stream so the caches are
        // settled and no work is in flight when the caller drops arrays or exits.
        let state: Vec<Array> = self.caches.iter().flat_map(|c| c.state()).collect();
        mlx_tensor::eval(&state)?;
        mlx_tensor::synchronize()?;
        let t_end = Instant::now();
        let t_first = output.t_first.unwrap_or(t_end);
        let mut result = output.result;
        result.stats = output.stats;
        result.stats.prefill_time = t_first - t0;
        result.stats.decode_time = t_end - t_first;
        result.stats.generated_tokens = output.generated;
        result.stats.peak_memory_bytes = mlx_tensor::memory::peak();
        self.offset();
        tracing::debug!(
            prompt = prompt.len(),
            generated = output.generated,
            decode_tps = result.stats.decode_tps(),
            "generation done"
        );
        Ok(result)
    }

    /// The pipelined plain loop, from the prompt's last token.
    fn decode_plain<F: FnMut(&str)>(
        &mut self,
        seed: &[u32],
        opts: &GenerateOptions,
        history: &mut History,
        keys: &mut KeyStream,
        output: &mut Output<'_, F>,
        cancel: &AtomicBool,
    ) -> Result<()> {
        let sampling = &opts.sampling;
        let pipelined = opts.pipeline && !sampling.uses_penalties();
        // `pending` is the lazy sample of the last forwarded token; its own forward is
        // dispatched (when pipelined) before it is read.
        let seed_arr = Array::from_slice(seed, &[1])?;
        let mut pending = Some(self.step(&seed_arr, sampling, history, keys)?);
        self.committed.push(seed[0]);
        while let Some(y) = pending.take() {
            let more = output.generated + 1 < output.max_tokens && !cancel.load(Ordering::Relaxed);
            let ahead = if pipelined && more {
                Some(self.step(&y.token, sampling, history, keys)?)
            } else {
                None
            };
            let id: u32 = y.read()?; // robust2: fails on non-finite logits
            output.first_token();
            if ahead.is_some() {
                self.committed.push(id);
            }
            history.commit(&[id]);
            if output.push(id)? == Flow::Done {
                if ahead.is_some() && output.result.finish == FinishReason::Eos {
                    self.drop_forwarded_eos()?;
                }
                break;
            }
            if !more {
                output.result.finish = FinishReason::Cancelled;
                break;
            }
            pending = match ahead {
                Some(a) => Some(a),
                None => {
                    let arr = Array::from_slice(&[id], &[1])?;
                    let a = self.step(&arr, sampling, history, keys)?;
                    self.committed.push(id);
                    Some(a)
                }
            };
        }
        Ok(())
    }

    /// The speculative loop: rounds of draft, verify, accept.
    #[allow(clippy::too_many_arguments)]
    fn decode_speculative<F: FnMut(&str)>(
        &mut self,
        draft: &mut DraftRun<'_, 'm>,
        seed: u32,
        opts: &GenerateOptions,
        history: &mut History,
        keys: &mut KeyStream,
        output: &mut Output<'_, F>,
        cancel: &AtomicBool,
    ) -> Result<SpecStats> {
        let mut depth = DepthController::new(opts.depth);
        let mut stats = SpecStats::new(draft.method());
        let eos = output.eos.clone();
        let pipelined = opts.pipeline && !opts.sampling.uses_penalties();
        let mut current = seed;
        // A depth chosen at the end of a plain stretch, for the round it hands over.
        let mut chosen = None;
        loop {
            if cancel.load(Ordering::Relaxed) {
                output.result.finish = FinishReason::Cancelled;
                break;
            }
            // A round emits up to depth + 1 tokens; never more than the budget.
            let budget = output.max_tokens - output.generated - 1;
            let k = chosen.take().unwrap_or_else(|| depth.choose(budget));
            if k == 0 && pipelined {
                let stretch = PlainStretch {
                    depth: &mut depth,
                    stats: &mut stats,
                    eos: &eos,
                    cancel,
                };
                match self.plain_stretch(draft, current, stretch, opts, history, keys, output)? {
                    Some((next, k)) => {
                        current = next;
                        chosen = Some(k);
                        continue;
                    }
                    None => break,
                }
            }
            let round = self.spec_round(draft, current, k, &opts.sampling, history, keys, &eos)?;
            output.first_token();
            // robust2: under a seed, a modelled cost instead of the wall time.
            let cost = crate::seeded::round_cost(round.seconds, round.drafted, &opts.sampling);
            depth.record(round.drafted, round.accepted, cost);
            stats.record(&round);
            let mut done = false;
            for &id in &round.emitted {
                history.commit(&[id]);
                if output.push(id)? == Flow::Done {
                    done = true;
                    break;
                }
            }
            if done {
                break;
            }
            current = *round
                .emitted
                .last()
                .expect("a round emits at least one token");
        }
        Ok(stats)
    }

    /// A step ahead already forwarded the end-of-sequence token (the last
    /// committed one): drop it, so no loop ever leaves an EOS in the caches.
    fn drop_forwarded_eos(&mut self) -> Result<()> {
        let keep = self.committed.len() - 1;
        self.points
            .restore(&mut self.caches, keep, &self.committed)?;
        self.committed.truncate(keep);
        Ok(())
    }

    /// Depth-0 rounds of the speculative loop, run as the pipelined plain
    /// loop: while the controller keeps choosing depth 0, the forward of each
    /// token is dispatched before the host reads it (one sync per token, the
    /// host's work overlapping the device's), and every committed token is
    /// reported to the draft run with its hidden, so drafting can resume at
    /// any round. A depth-0 round in [`Session::spec_round`] would instead
    /// wait for each forward before building the next one.
    ///
    /// Returns the next round's `current` (emitted, not forwarded) and the
    /// depth chosen for it, or `None` when generation ended.
    #[allow(clippy::too_many_arguments)]
    fn plain_stretch<F: FnMut(&str)>(
        &mut self,
        draft: &mut DraftRun<'_, 'm>,
        current: u32,
        stretch: PlainStretch<'_>,
        opts: &GenerateOptions,
        history: &mut History,
        keys: &mut KeyStream,
        output: &mut Output<'_, F>,
    ) -> Result<Option<(u32, usize)>> {
        let PlainStretch {
            depth,
            stats,
            eos,
            cancel,
        } = stretch;
        let sampling = &opts.sampling;
        let pos = self.offset();
        let cur = Array::from_slice(&[current], &[1])?;
        let (mut y, hidden) = self.step_with_hidden(&cur, sampling, history, keys)?;
        draft.committed(&[current], &cur, &hidden, pos)?;
        self.committed.push(current);
        let mut t = Instant::now();
        loop {
            // The round of `y` (emitted next) at depth 0 is its forward,
            // dispatched now; any other depth hands `y` over as `current`.
            let after = output.max_tokens.saturating_sub(output.generated + 2);
            let more = output.generated + 1 < output.max_tokens && !cancel.load(Ordering::Relaxed);
            let k = if more { depth.choose(after) } else { 0 };
            let ahead = if more && k == 0 {
                Some(self.step_with_hidden(&y.token, sampling, history, keys)?)
            } else {
                None
            };
            let id: u32 = y.read()?; // robust2: fails on non-finite logits
            output.first_token();
            let now = Instant::now();
            let seconds = (now - t).as_secs_f64();
            t = now;
            depth.record(0, 0, crate::seeded::round_cost(seconds, 0, sampling)); // robust2
            stats.record(&RoundOutcome {
                drafted: 0,
                accepted: 0,
                emitted: vec![id],
                seconds,
            });
            if let Some((_, h)) = &ahead {
                // An end-of-sequence token forwarded ahead is dropped below.
                if !eos.contains(&id) {
                    let at = self.committed.len();
                    draft.committed(&[id], &y.token, h, at)?;
                }
                self.committed.push(id);
            }
            history.commit(&[id]);
            if output.push(id)? == Flow::Done {
                if ahead.is_some() && output.result.finish == FinishReason::Eos {
                    self.drop_forwarded_eos()?;
                }
                return Ok(None);
            }
            match ahead {
                Some((next, _)) => y = next,
                None => return Ok(Some((id, k))),
            }
        }
    }
}

/// The speculative loop's bookkeeping that a plain stretch updates.
struct PlainStretch<'a> {
    depth: &'a mut DepthController,
    stats: &'a mut SpecStats,
    eos: &'a [u32],
    cancel: &'a AtomicBool,
}

/// Whether generation goes on after a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flow {
    Go,
    Done,
}

/// Turns generated ids into the result: end-of-sequence and budget checks,
/// streaming detokenization, stop strings, the text callback.
struct Output<'t, F: FnMut(&str)> {
    tok: &'t Tokenizer,
    eos: Vec<u32>,
    detok: StreamDetokenizer,
    stop: StopMatcher,
    on_text: F,
    result: Generation,
    stats: Stats,
    generated: usize,
    max_tokens: usize,
    t_first: Option<Instant>,
}

impl<'t, F: FnMut(&str)> Output<'t, F> {
    fn new(
        tok: &'t Tokenizer,
        model: &dyn Model,
        opts: &GenerateOptions,
        max_tokens: usize,
        on_text: F,
    ) -> Self {
        let mut eos = tok.eos_ids().to_vec();
        eos.extend(
            model
                .eos_ids()
                .iter()
                .filter(|x| !tok.eos_ids().contains(x)),
        );
        Output {
            tok,
            eos,
            detok: StreamDetokenizer::new(),
            stop: StopMatcher::new(&opts.stop),
            on_text,
            result: Generation {
                token_ids: Vec::new(),
                text: String::new(),
                finish: FinishReason::Length,
                stats: Stats::default(),
                speculation: None,
            },
            stats: Stats::default(),
            generated: 0,
            max_tokens,
            t_first: None,
        }
    }

    fn first_token(&mut self) {
        if self.t_first.is_none() {
            self.t_first = Some(Instant::now());
        }
    }

    fn emit(&mut self, text: &str) {
        if !text.is_empty() {
            self.result.text.push_str(text);
            (self.on_text)(text);
        }
    }

    /// Takes one generated id.
    fn push(&mut self, id: u32) -> Result<Flow> {
        self.generated += 1;
        if self.eos.contains(&id) {
            self.result.finish = FinishReason::Eos;
            return Ok(Flow::Done);
        }
        self.result.token_ids.push(id);
        let piece = self.detok.push(self.tok, id)?;
        match self.stop.push(&piece) {
            StopStep::Continue(t) => self.emit(&t),
            StopStep::Stop(t) => {
                self.emit(&t);
                self.result.finish = FinishReason::Stop;
                return Ok(Flow::Done);
            }
        }
        if self.generated >= self.max_tokens {
            self.result.finish = FinishReason::Length;
            return Ok(Flow::Done);
        }
        Ok(Flow::Go)
    }

    /// Flushes held-back text at the end.
    fn finish(&mut self) -> Result<()> {
        if self.result.finish == FinishReason::Stop {
            return Ok(());
        }
        let rest = self.detok.flush(self.tok)?;
        let mut tail = match self.stop.push(&rest) {
            StopStep::Continue(t) => t,
            StopStep::Stop(t) => {
                self.result.finish = FinishReason::Stop;
                t
            }
        };
        if self.result.finish != FinishReason::Stop {
            tail.push_str(&self.stop.flush());
        }
        self.emit(&tail);
        Ok(())
    }
}
