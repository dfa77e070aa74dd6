//! The engine: one thread that owns the model, its session and the prefix
//! cache, fed in order from a bounded queue. This is the only file of `serve`
//! that uses the `runner` crate: the HTTP side sees [`Engine`], [`Prompt`],
//! [`Params`], [`Event`] and [`Outcome`], so re-pointing `serve` at another
//! session API changes this file alone.
//!
//! MLX arrays are `!Send`, so everything MLX touches (the model, the session
//! with its draft caches, the prefix cache) is created and dropped on the
//! engine thread. What crosses threads is plain data: token ids, options,
//! text pieces, figures.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tokio::sync::mpsc::UnboundedSender;

use runner::Message;
use runner::PrefixCache;
use runner::{
    Conversation, FinishReason, GenerateOptions, Generation, Model, Session, Speculation, Tokenizer,
};

use super::error::ApiError;
use super::metrics::Metrics;
use crate::args::DecodeArgs;
use crate::report::SpeculationReport;

/// How the engine runs, from `serve`'s flags.
#[derive(Debug)]
pub(super) struct EngineConfig {
    /// The model and the decoding defaults (`generate`'s flags).
    pub decode: DecodeArgs,
    /// The id `/v1/models` lists and requests may name.
    pub model_id: String,
    /// Requests that may wait while one runs.
    pub queue: usize,
    /// Bytes of the shared prefix cache (0: only the live session is reused).
    pub prefix_cache_bytes: usize,
    /// Reuse cached prefixes across requests; off, every request starts
    /// from empty caches (a cold run).
    pub prefix_reuse: bool,
}

/// What the HTTP side knows about the served model.
#[derive(Debug, Clone)]
pub(super) struct ModelCard {
    /// The id requests name.
    pub id: String,
    /// Context length in tokens.
    pub context_length: usize,
    /// The drafter (`mtp`, `draft-model`, `ngram`) or `off`.
    pub speculation: &'static str,
    /// Whether the model has a chat template (`/v1/chat/completions`).
    pub chat: bool,
}

/// A prompt in engine terms.
#[derive(Debug, Clone)]
pub(super) enum Prompt {
    /// Chat messages, rendered with the model's template.
    Chat(Vec<ChatMessage>),
    /// Raw text, tokenized with the tokenizer's special tokens.
    Text(String),
    /// Token ids as given.
    Tokens(Vec<u32>),
}

/// One chat message.
#[derive(Debug, Clone)]
pub(super) struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// Per-request overrides of the server's decoding defaults; `None` keeps the default.
#[derive(Debug, Clone, Default)]
pub(super) struct Params {
    /// Most tokens to generate.
    pub max_tokens: Option<usize>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// Top-k (0 = off).
    pub top_k: Option<usize>,
    /// Min-p.
    pub min_p: Option<f32>,
    /// Seed.
    pub seed: Option<u64>,
    /// Stop strings (replace the server's `--stop`).
    pub stop: Option<Vec<String>>,
    /// Presence penalty.
    pub presence_penalty: Option<f32>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f32>,
    /// Repetition penalty (1 = off).
    pub repetition_penalty: Option<f32>,
    /// Per-token logit biases (replace the server's `--logit-bias`).
    pub logit_bias: Option<Vec<(u32, f32)>>,
}

/// Why a generation ended, in OpenAI's terms (`stop` covers EOS and stop strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Finish {
    /// End of sequence or a stop string.
    Stop,
    /// The token budget or the context.
    Length,
    /// The client went away or the server shut down.
    Cancelled,
}

impl Finish {
    /// The `finish_reason` string.
    pub(super) fn name(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Cancelled => "cancelled",
        }
    }
}

/// Speculation counters of one generation, for `/metrics`.
#[derive(Debug, Clone)]
pub(super) struct SpecCounts {
    /// The drafter.
    pub method: String,
    /// Rounds that drafted at least one token.
    pub drafts: u64,
    /// Draft tokens proposed.
    pub draft_tokens: u64,
    /// Draft tokens accepted.
    pub accepted_tokens: u64,
    /// `accepted_per_pos[i]`: rounds that accepted draft position `i + 1`.
    pub accepted_per_pos: Vec<u64>,
}

/// The result of one request.
#[derive(Debug)]
pub(super) struct Outcome {
    /// Why it ended.
    pub finish: Finish,
    /// Tokens of the whole prompt.
    pub prompt_tokens: usize,
    /// Of those, tokens reused from the caches.
    pub cached_tokens: usize,
    /// Tokens generated (an EOS that ended generation counts).
    pub completion_tokens: usize,
    /// The `speculation` object of `generate --json`.
    pub speculation: SpeculationReport,
    /// Counters for `/metrics` (`None` for plain decoding).
    pub spec_counts: Option<SpecCounts>,
    /// From the request entering the queue to its first token.
    pub time_to_first_token: Duration,
    /// From the request entering the queue to its end.
    pub latency: Duration,
    /// Generated tokens per second after the first.
    pub decode_tps: f64,
}

/// What the engine tells a request's handler, in order: `Started`, any
/// `Text`, then `Done`; or `Failed` at any point.
#[derive(Debug)]
pub(super) enum Event {
    /// The request left the queue and its prefix is in place.
    Started,
    /// A piece of generated text.
    Text(String),
    /// Generation ended.
    Done(Box<Outcome>),
    /// The request failed.
    Failed(ApiError),
}

/// Which tokenizer a request decodes with.
#[derive(Debug, Clone, Copy)]
enum TokKind {
    /// The model's end-of-sequence ids.
    Plain,
    /// Also the chat template's end-of-turn token.
    Chat,
}

/// A request ready to queue: its tokens and options.
#[derive(Debug)]
pub(super) struct Prepared {
    prompt: Vec<u32>,
    options: GenerateOptions,
    tok: TokKind,
}

struct Job {
    prepared: Prepared,
    events: UnboundedSender<Event>,
    cancel: Arc<AtomicBool>,
    enqueued: Instant,
}

/// Cancels its request when dropped: a handler holds it while the client
/// waits, so a client that goes away (the handler or stream is dropped)
/// stops its decoding before the next round, or before it starts.
#[derive(Debug)]
pub(super) struct Ticket {
    cancel: Arc<AtomicBool>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
    }
}

/// State the engine thread and the handles share.
#[derive(Debug, Default)]
struct Shared {
    /// The cancel flag of the request running now.
    current: Mutex<Option<Arc<AtomicBool>>>,
    /// Set on shutdown after the grace period: cancel what runs and what waits.
    abort_all: AtomicBool,
    /// Set on shutdown: refuse new requests.
    draining: AtomicBool,
    /// Set when the engine thread has ended (also by a panic).
    stopped: AtomicBool,
}

/// Marks the engine stopped when the engine thread ends, however it ends.
struct StoppedOnDrop<'a>(&'a AtomicBool);

impl Drop for StoppedOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The tokenizers of the two [`TokKind`]s.
#[derive(Debug, Clone)]
struct Tokenizers {
    plain: Tokenizer,
    chat: Option<Tokenizer>,
}

impl Tokenizers {
    fn new(model: &dyn Model, tok: &Tokenizer) -> Tokenizers {
        // The chat template's end-of-turn token ends a reply, as in `chat`:
        // a conversation knows which one (a plain session costs no weights).
        let chat = Session::open(model, Speculation::Off, None)
            .and_then(|s| Conversation::new(s, tok, None, 0))
            .ok()
            .map(|c| c.tokenizer().clone());
        Tokenizers {
            plain: tok.clone(),
            chat,
        }
    }

    fn get(&self, k: TokKind) -> &Tokenizer {
        match k {
            TokKind::Plain => &self.plain,
            TokKind::Chat => self.chat.as_ref().unwrap_or(&self.plain),
        }
    }
}

/// The handle the HTTP side holds (cheap to clone).
#[derive(Debug, Clone)]
pub(super) struct Engine {
    card: ModelCard,
    tokenizers: Arc<Tokenizers>,
    defaults: Arc<GenerateOptions>,
    jobs: SyncSender<Job>,
    queue: usize,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
}

/// Shuts the engine down from the signal handler without holding the queue open.
#[derive(Debug, Clone)]
pub(super) struct Stopper {
    shared: Arc<Shared>,
}

impl Stopper {
    /// Refuse new requests (those queued still run).
    pub(super) fn drain(&self) {
        self.shared.draining.store(true, Ordering::Relaxed);
    }

    /// Cancel the running request and every queued one.
    pub(super) fn abort_all(&self) {
        self.drain();
        self.shared.abort_all.store(true, Ordering::Relaxed);
        if let Some(c) = self.shared.current.lock().expect("engine lock").as_ref() {
            c.store(true, Ordering::Relaxed);
        }
    }
}

/// Loads the model on a new engine thread and returns its handle once it is ready.
pub(super) fn start(
    config: EngineConfig,
    metrics: Arc<Metrics>,
) -> Result<(Engine, JoinHandle<()>)> {
    crate::validate::decode_args(&config.decode)?;
    if config.queue == 0 {
        return Err(crate::Usage(
            "--queue-size 0 would refuse every request: pass 1 or more (default 64)".into(),
        )
        .into());
    }
    let (jobs, queue_rx) = std::sync::mpsc::sync_channel::<Job>(config.queue);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let shared = Arc::new(Shared::default());
    let queue = config.queue;
    let thread = {
        let shared = Arc::clone(&shared);
        let metrics = Arc::clone(&metrics);
        std::thread::Builder::new()
            .name("mtp-engine".into())
            .spawn(move || engine_main(config, ready_tx, queue_rx, shared, metrics))
            .context("starting the engine thread")?
    };
    let ready: Result<Ready> = ready_rx
        .recv()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("the engine thread ended while loading")));
    let ready = match ready {
        Ok(r) => r,
        Err(e) => {
            let _ = thread.join();
            return Err(e);
        }
    };
    let engine = Engine {
        card: ready.card,
        tokenizers: Arc::new(ready.tokenizers),
        defaults: Arc::new(ready.defaults),
        jobs,
        queue,
        shared,
        metrics,
    };
    Ok((engine, thread))
}

/// What the engine thread hands back once the model is loaded.
struct Ready {
    card: ModelCard,
    tokenizers: Tokenizers,
    defaults: GenerateOptions,
}

impl Engine {
    /// The served model.
    pub(super) fn card(&self) -> &ModelCard {
        &self.card
    }

    /// A handle that can stop the engine.
    pub(super) fn stopper(&self) -> Stopper {
        Stopper {
            shared: Arc::clone(&self.shared),
        }
    }

    /// True until shutdown begins or the engine thread ends.
    pub(super) fn accepting(&self) -> bool {
        !self.shared.draining.load(Ordering::Relaxed)
            && !self.shared.stopped.load(Ordering::Relaxed)
    }

    /// Tokenizes `prompt` and builds the options of `params` over the
    /// server's defaults, on the caller's thread: bad input is answered
    /// before the request waits in the queue. `field` names the prompt's
    /// request field in errors.
    pub(super) fn prepare(
        &self,
        prompt: &Prompt,
        params: &Params,
        field: &str,
    ) -> Result<Prepared, ApiError> {
        let (tokens, kind) = self.tokenize(prompt, field)?;
        if tokens.is_empty() {
            return Err(ApiError::invalid(
                field,
                format!("`{field}` is empty: at least one prompt token is needed"),
            ));
        }
        let context = self.card.context_length;
        if tokens.len() >= context {
            return Err(ApiError::invalid(
                field,
                format!(
                    "the prompt has {} tokens but the model's context is {context} tokens: \
                     shorten `{field}` to fewer than {context} tokens",
                    tokens.len()
                ),
            ));
        }
        let options = self.options(params)?;
        Ok(Prepared {
            prompt: tokens,
            options,
            tok: kind,
        })
    }

    fn tokenize(&self, prompt: &Prompt, field: &str) -> Result<(Vec<u32>, TokKind), ApiError> {
        let bad = |e: runner::Error| ApiError::invalid(field, format!("`{field}`: {e}"));
        match prompt {
            Prompt::Chat(msgs) => {
                let Some(tok) = &self.tokenizers.chat else {
                    return Err(ApiError::invalid(
                        field,
                        format!(
                            "model `{}` has no chat template (tokenizer_config.json): send raw \
                             text to /v1/completions instead",
                            self.card.id
                        ),
                    ));
                };
                let msgs: Vec<Message> = msgs
                    .iter()
                    .map(|m| Message::new(&m.role, &m.content))
                    .collect();
                let text = runner::apply_chat_template(tok, &msgs).map_err(bad)?;
                Ok((tok.encode(&text, false).map_err(bad)?, TokKind::Chat))
            }
            Prompt::Text(text) => Ok((
                self.tokenizers.plain.encode(text, true).map_err(bad)?,
                TokKind::Plain,
            )),
            Prompt::Tokens(ids) => {
                let vocab = self.tokenizers.plain.vocab_size();
                if let Some((i, &t)) = ids.iter().enumerate().find(|(_, t)| **t as usize >= vocab) {
                    return Err(ApiError::invalid(
                        field,
                        format!(
                            "`{field}[{i}]` is token {t}, outside the vocabulary of {vocab} tokens"
                        ),
                    ));
                }
                Ok((ids.clone(), TokKind::Plain))
            }
        }
    }

    fn options(&self, p: &Params) -> Result<GenerateOptions, ApiError> {
        let mut o = (*self.defaults).clone();
        if let Some(n) = p.max_tokens {
            o.max_tokens = n;
        }
        let s = &mut o.sampling;
        s.temperature = p.temperature.unwrap_or(s.temperature);
        s.top_p = p.top_p.unwrap_or(s.top_p);
        s.top_k = p.top_k.unwrap_or(s.top_k);
        s.min_p = p.min_p.unwrap_or(s.min_p);
        s.presence_penalty = p.presence_penalty.unwrap_or(s.presence_penalty);
        s.frequency_penalty = p.frequency_penalty.unwrap_or(s.frequency_penalty);
        s.repeat_penalty = p.repetition_penalty.unwrap_or(s.repeat_penalty);
        if let Some(bias) = &p.logit_bias {
            s.logit_bias = bias.clone();
        }
        if p.seed.is_some() {
            s.seed = p.seed;
        }
        if let Some(stop) = &p.stop {
            o.stop = stop.clone();
        }
        o.fallback_seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        // Bias ids against the tokenizer's vocabulary, as prompt ids are.
        if let Err(e) = o
            .sampling
            .validate_for_vocab(self.tokenizers.plain.vocab_size())
        {
            let param = match &e {
                runner::sampler::Error::InvalidOption { name, .. } => match *name {
                    "repeat_penalty" => "repetition_penalty",
                    n => n,
                },
                runner::sampler::Error::DuplicateBias { .. }
                | runner::sampler::Error::BiasOutsideVocabulary { .. } => "logit_bias",
                _ => "",
            };
            return Err(ApiError::invalid(param, format!("{e}")));
        }
        Ok(o)
    }

    /// Queues `prepared`; its events arrive on `events`. Returns the ticket
    /// that cancels it when dropped, or 429 when the queue is full and 503
    /// when the server is shutting down.
    pub(super) fn submit(
        &self,
        prepared: Prepared,
        events: UnboundedSender<Event>,
    ) -> Result<Ticket, ApiError> {
        if !self.accepting() {
            return Err(ApiError::unavailable(
                "the server is shutting down (or its engine stopped)",
            ));
        }
        let cancel = Arc::new(AtomicBool::new(false));
        let job = Job {
            prepared,
            events,
            cancel: Arc::clone(&cancel),
            enqueued: Instant::now(),
        };
        // Counted before the send, so the engine's decrement never goes first.
        self.metrics.waiting.fetch_add(1, Ordering::Relaxed);
        match self.jobs.try_send(job) {
            Ok(()) => Ok(Ticket { cancel }),
            Err(e) => {
                self.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
                Err(match e {
                    TrySendError::Full(_) => ApiError::queue_full(self.queue),
                    TrySendError::Disconnected(_) => {
                        ApiError::unavailable("the engine has stopped; restart the server")
                    }
                })
            }
        }
    }
}

/// `--logit-bias` ids against the vocabulary: refused at start-up (a usage
/// error), not blamed on each request's `logit_bias`.
fn check_bias(defaults: &GenerateOptions, tokenizers: &Tokenizers) -> Result<()> {
    defaults
        .sampling
        .validate_for_vocab(tokenizers.plain.vocab_size())
        .map_err(|e| crate::Usage(format!("--logit-bias: {e}")).into())
}

fn engine_main(
    config: EngineConfig,
    ready: std::sync::mpsc::Sender<Result<Ready>>,
    jobs: Receiver<Job>,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
) {
    let _stopped = StoppedOnDrop(&shared.stopped);
    let a = &config.decode;
    // MLX's default device and streams are per thread: choose them here.
    let loaded = (|| {
        crate::set_device(a.device)?;
        let m = crate::load_with_progress(a)?;
        let draft = crate::load_draft_model(a, &m)?;
        Ok((m, draft))
    })();
    let (m, draft) = match loaded {
        Ok(x) => x,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let session = match crate::open_session(a, &m, draft.as_ref()) {
        Ok(s) => s,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let t0 = std::time::Instant::now();
    match session.warm_up() {
        Ok(0) => {}
        Ok(buckets) => tracing::info!(
            buckets,
            ms = t0.elapsed().as_secs_f64() * 1e3,
            "prefill shapes warmed"
        ),
        Err(e) => tracing::warn!(error = %e, "warming the prefill shapes failed"),
    }
    let tokenizers = Tokenizers::new(m.model.as_ref(), &m.tokenizer);
    let card = ModelCard {
        id: config.model_id.clone(),
        context_length: m.model.context_length(),
        speculation: session.drafter_method().map_or("off", |d| d.as_str()),
        chat: tokenizers.chat.is_some(),
    };
    let defaults = crate::generate_options(a, &m.generation_config);
    if let Err(e) = check_bias(&defaults, &tokenizers) {
        let _ = ready.send(Err(e));
        return;
    }
    tracing::info!(model = %card.id, speculation = card.speculation, "engine ready");
    let mut worker = Worker {
        config: &config,
        model: &m,
        draft: draft.as_ref(),
        session,
        cache: PrefixCache::new(config.prefix_cache_bytes),
        tokenizers: tokenizers.clone(),
        shared: &shared,
        metrics: &metrics,
    };
    if ready
        .send(Ok(Ready {
            card,
            tokenizers,
            defaults,
        }))
        .is_err()
    {
        return;
    }
    // Ends when every handle (the queue's senders) is dropped.
    while let Ok(job) = jobs.recv() {
        worker.metrics.waiting.fetch_sub(1, Ordering::Relaxed);
        worker.run(job);
    }
    tracing::info!("engine stopped");
}

/// The engine thread's state.
struct Worker<'m> {
    config: &'m EngineConfig,
    model: &'m runner::LoadedModel,
    draft: Option<&'m runner::LoadedModel>,
    session: Session<'m>,
    cache: PrefixCache,
    tokenizers: Tokenizers,
    shared: &'m Shared,
    metrics: &'m Metrics,
}

impl<'m> Worker<'m> {
    fn run(&mut self, job: Job) {
        if job.cancel.load(Ordering::Relaxed) || self.shared.abort_all.load(Ordering::Relaxed) {
            // The client left while it waited, or the server is stopping.
            self.metrics.record_cancelled_in_queue();
            let _ = job.events.send(Event::Failed(ApiError::unavailable(
                "the request was cancelled",
            )));
            return;
        }
        *self.shared.current.lock().expect("engine lock") = Some(Arc::clone(&job.cancel));
        if self.shared.abort_all.load(Ordering::Relaxed) {
            job.cancel.store(true, Ordering::Relaxed);
        }
        self.metrics.running.fetch_add(1, Ordering::Relaxed);
        let result = self.generate(&job);
        self.metrics.running.fetch_sub(1, Ordering::Relaxed);
        *self.shared.current.lock().expect("engine lock") = None;
        let event = match result {
            Ok(o) => {
                self.metrics.record_outcome(&o);
                Event::Done(Box::new(o))
            }
            Err(e) => {
                let api = to_api_error(&e);
                if api.is_server_error() {
                    // A session whose request failed midway has emptied its
                    // caches (`Session::empty_after`); empty them here too
                    // for a failure outside the session, keeping what the
                    // auto depth controller learned, and free the prefix
                    // cache (the failure may have been memory). A fresh
                    // session only if even that fails.
                    tracing::error!("request failed: {e:#}");
                    self.cache.clear();
                    if self.session.rewind_to(0).is_err()
                        && let Ok(s) =
                            crate::open_session(&self.config.decode, self.model, self.draft)
                    {
                        self.session = s;
                    }
                }
                self.metrics.record_failed();
                Event::Failed(api)
            }
        };
        let _ = job.events.send(event);
    }

    fn generate(&mut self, job: &Job) -> Result<Outcome> {
        let p = &job.prepared;
        let started = Instant::now();
        let cached = if self.config.prefix_reuse {
            self.cache.prepare(&mut self.session, &p.prompt)?.tokens
        } else {
            // Empty caches, as a fresh session has, but the same session: what
            // the auto depth controller learned (this machine's round costs)
            // carries over, so each request does not seed its depth again.
            self.session.rewind_to(0).context("emptying the session")?;
            0
        };
        let events = &job.events;
        let cancel = &*job.cancel;
        let _ = events.send(Event::Started);
        let tok = self.tokenizers.get(p.tok);
        let g = self
            .session
            .generate(tok, &p.prompt[cached..], &p.options, cancel, |text| {
                // A receiver that is gone is a client that is gone.
                if events.send(Event::Text(text.to_owned())).is_err() {
                    cancel.store(true, Ordering::Relaxed);
                }
            })
            .context("generating")?;
        if self.config.prefix_reuse && self.cache.budget() > 0 {
            self.cache
                .store(&self.session)
                .context("storing the prefix")?;
        }
        Ok(outcome(&g, p.prompt.len(), cached, job.enqueued, started))
    }
}

fn outcome(
    g: &Generation,
    prompt_tokens: usize,
    cached_tokens: usize,
    enqueued: Instant,
    started: Instant,
) -> Outcome {
    let finish = match g.finish {
        FinishReason::Eos | FinishReason::Stop => Finish::Stop,
        FinishReason::Length => Finish::Length,
        FinishReason::Cancelled => Finish::Cancelled,
    };
    let spec_counts = g.speculation.as_ref().map(|s| SpecCounts {
        method: s.method.as_str().to_owned(),
        drafts: s.depth_over_time.iter().filter(|&&d| d > 0).count() as u64,
        draft_tokens: s.drafted as u64,
        accepted_tokens: s.accepted as u64,
        accepted_per_pos: s.accepted_at.iter().map(|&n| n as u64).collect(),
    });
    Outcome {
        finish,
        prompt_tokens,
        cached_tokens,
        completion_tokens: g.stats.generated_tokens,
        speculation: SpeculationReport::new(g),
        spec_counts,
        time_to_first_token: (started - enqueued) + g.stats.prefill_time,
        latency: enqueued.elapsed(),
        decode_tps: g.stats.decode_tps(),
    }
}

/// Bad input from the library is the client's (400); the rest is ours (500).
fn to_api_error(e: &anyhow::Error) -> ApiError {
    for cause in e.chain() {
        if let Some(r) = cause.downcast_ref::<runner::Error>() {
            if r.is_bad_input() {
                return ApiError::invalid("", format!("{r}"));
            }
            break;
        }
    }
    ApiError::internal(format!("{e:#}"))
}
