//! Soak: chat turns with MTP speculation in one process until a token count
//! is reached, sampling MLX active memory and process RSS after every turn;
//! prints one JSON summary.
//!
//! `cargo run --release -p runner --example soak -- [--model DIR] [--tokens N]
//! [--turn-tokens N] [--cycle-tokens N] [--prefix-cache-mib N] [--temperature T]
//! [--warmup-cycles N] [--draft-tokens N]` (with `SOAK_SAMPLES=1`, one JSON
//! line per turn first)
//! (or `cargo xtask soak`). The conversation starts over (`reset`) once its
//! prompt passes `--cycle-tokens`, so it never reaches the context; the
//! first `--warmup-cycles` cycles, and at least the turns until the prefix
//! cache first evicts an entry, are the warm-up (caches and the prefix cache
//! grow to their working size), and growth is measured against their
//! maximum.
//!
//! `tests/soak.rs` runs [`soak`] on a short budget and asserts the figures.
// An example: its output is its interface.
#![allow(clippy::print_stdout)]

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use runner::Conversation;
use runner::DepthPolicy;
use runner::{GenerateOptions, LoadOptions, SamplingOptions, Session};
use serde::Serialize;

/// User messages, cycled.
const MESSAGES: &[&str] = &[
    "Write a Python function that reverses a list.",
    "Now make it work for strings too.",
    "Add type hints and a docstring.",
    "Write a test for it.",
    "How would you do the same in Rust?",
];

/// What to run.
#[derive(Debug, Clone)]
pub(crate) struct SoakOptions {
    /// Model folder (needs an MTP head and a chat template).
    pub model: PathBuf,
    /// Stop once this many tokens are generated.
    pub tokens: usize,
    /// Most tokens per turn.
    pub turn_tokens: usize,
    /// Start the conversation over once its prompt is longer than this.
    pub cycle_tokens: usize,
    /// Prefix-cache budget in MiB.
    pub prefix_cache_mib: usize,
    /// Sampling temperature (0: greedy, so every cycle repeats the first).
    pub temperature: f32,
    /// Conversation cycles counted as warm-up (the prefix cache fills over
    /// more than one).
    pub warmup_cycles: usize,
    /// A fixed draft depth, or `None` for the automatic depth (which may
    /// stop drafting when drafts do not pay).
    pub depth: Option<usize>,
}

impl Default for SoakOptions {
    fn default() -> Self {
        SoakOptions {
            model: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-mtp"),
            tokens: 20_000,
            turn_tokens: 200,
            cycle_tokens: 1_200,
            prefix_cache_mib: 32,
            temperature: 0.8,
            warmup_cycles: 2,
            depth: None,
        }
    }
}

/// Memory after one turn.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Sample {
    /// Tokens generated so far.
    pub tokens: usize,
    /// MLX active memory, bytes.
    pub active: usize,
    /// Process resident set, bytes.
    pub rss: usize,
    /// Pinned arrays alive between turns (the prefix cache's entries own some).
    pub pins: usize,
    /// Bytes held by the prefix cache's entries.
    pub prefix_cache: usize,
    /// Tokens in the live session's caches.
    pub session_tokens: usize,
}

/// The JSON summary.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Summary {
    /// Tokens generated.
    pub tokens: usize,
    /// Turns run.
    pub turns: usize,
    /// Conversations started over.
    pub resets: usize,
    /// Turns in the warm-up (the first `warmup_cycles` cycles, and at least
    /// until the prefix cache first evicts an entry).
    pub warmup_turns: usize,
    /// Largest MLX active memory during the warm-up, bytes.
    pub active_warm_bytes: usize,
    /// MLX active memory after the last turn.
    pub active_end_bytes: usize,
    /// Largest active memory after the warm-up minus `active_warm_bytes` (may be negative).
    pub active_max_growth_bytes: i64,
    /// Largest RSS during the warm-up, bytes.
    pub rss_warm_bytes: usize,
    /// RSS after the last turn.
    pub rss_end_bytes: usize,
    /// Largest RSS after the warm-up minus `rss_warm_bytes`.
    pub rss_max_growth_bytes: i64,
    /// Most pinned arrays alive between turns (held by prefix-cache entries).
    pub max_pins_between_turns: usize,
    /// Most pins between turns after the warm-up minus the most during it.
    pub pins_max_growth: i64,
    /// Pinned arrays alive after the conversation is dropped (0: none leaked).
    pub live_pins: usize,
    /// Draft tokens proposed over all turns.
    pub drafted: usize,
    /// Draft tokens accepted / proposed over all turns.
    pub acceptance_rate: f64,
    /// Wall seconds.
    pub seconds: f64,
    /// Generated tokens per second, prefill included.
    pub tokens_per_second: f64,
    /// Every turn's sample.
    #[serde(skip)]
    pub samples: Vec<Sample>,
}

/// Resident set of this process: `/proc/self/statm`'s resident pages times
/// the kernel page size; 0 where there is no procfs.
pub(crate) fn rss_bytes() -> usize {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<usize>().ok())
        .map_or(0, |pages| pages * page_size())
}

/// The page size as the kernel reports it for this process (`KernelPageSize`
/// in `/proc/self/smaps`), 4 KiB when it cannot be read.
fn page_size() -> usize {
    std::fs::read_to_string("/proc/self/smaps")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("KernelPageSize:"))?
                .split_whitespace()
                .nth(1)?
                .parse::<usize>()
                .ok()
        })
        .map_or(4096, |kb| kb * 1024)
}

/// Runs the soak (see the module docs).
pub(crate) fn soak(o: &SoakOptions) -> Result<Summary, Box<dyn std::error::Error>> {
    let m = runner::load(&o.model, LoadOptions::default(), |_, _| {})?;
    run(&m, o)
}

/// Runs the soak on a loaded model.
pub(crate) fn run(
    m: &runner::LoadedModel,
    o: &SoakOptions,
) -> Result<Summary, Box<dyn std::error::Error>> {
    let start = Instant::now();
    let session = Session::with_mtp(m.model.as_ref())?;
    let mut chat = Conversation::new(session, &m.tokenizer, None, o.prefix_cache_mib << 20)?;
    let never = AtomicBool::new(false);
    let (mut tokens, mut turns, mut resets) = (0usize, 0usize, 0usize);
    let (mut drafted, mut accepted) = (0usize, 0usize);
    let mut warmup_turns = None;
    // The prefix cache is at its working size once it has evicted an entry.
    let mut evicted = o.prefix_cache_mib == 0;
    let mut cache_bytes = 0;
    let mut samples = Vec::new();
    while tokens < o.tokens {
        let message = MESSAGES[turns % MESSAGES.len()];
        if chat.prompt_for(message)?.len() > o.cycle_tokens {
            chat.reset();
            resets += 1;
            if resets >= o.warmup_cycles && evicted && warmup_turns.is_none() {
                warmup_turns = Some(turns);
            }
        }
        let opts = GenerateOptions {
            max_tokens: o.turn_tokens.min(o.tokens - tokens),
            sampling: SamplingOptions {
                temperature: o.temperature,
                seed: Some(turns as u64),
                ..SamplingOptions::default()
            },
            depth: o
                .depth
                .map_or_else(DepthPolicy::default, DepthPolicy::Fixed),
            ..GenerateOptions::default()
        };
        let t = chat.say(message, &opts, &never, |_| {})?;
        tokens += t.generation.stats.generated_tokens;
        turns += 1;
        if let Some(s) = &t.generation.speculation {
            drafted += s.drafted;
            accepted += s.accepted;
        }
        evicted |= chat.prefix_cache().bytes() < cache_bytes;
        cache_bytes = chat.prefix_cache().bytes();
        samples.push(Sample {
            tokens,
            active: mlx_tensor::memory::active(),
            rss: rss_bytes(),
            pins: mlx_tensor::live_pins(),
            prefix_cache: chat.prefix_cache().bytes(),
            session_tokens: chat.session().committed().len(),
        });
    }
    drop(chat);
    let live_pins = mlx_tensor::live_pins();
    // With no reset at all the whole run is the warm-up.
    let warm = warmup_turns.unwrap_or(samples.len()).max(1);
    let (warm_s, rest) = samples.split_at(warm.min(samples.len()));
    let max = |s: &[Sample], f: fn(&Sample) -> usize| s.iter().map(f).max().unwrap_or(0);
    let growth = |f: fn(&Sample) -> usize| match rest {
        [] => 0,
        r => max(r, f) as i64 - max(warm_s, f) as i64,
    };
    let last = samples.last().copied().unwrap_or(Sample {
        tokens: 0,
        active: 0,
        rss: 0,
        pins: 0,
        prefix_cache: 0,
        session_tokens: 0,
    });
    let seconds = start.elapsed().as_secs_f64();
    Ok(Summary {
        tokens,
        turns,
        resets,
        warmup_turns: warm_s.len(),
        active_warm_bytes: max(warm_s, |s| s.active),
        active_end_bytes: last.active,
        active_max_growth_bytes: growth(|s| s.active),
        rss_warm_bytes: max(warm_s, |s| s.rss),
        rss_end_bytes: last.rss,
        rss_max_growth_bytes: growth(|s| s.rss),
        max_pins_between_turns: max(&samples, |s| s.pins),
        pins_max_growth: growth(|s| s.pins),
        live_pins,
        drafted,
        acceptance_rate: if drafted > 0 {
            accepted as f64 / drafted as f64
        } else {
            0.0
        },
        seconds,
        tokens_per_second: tokens as f64 / seconds,
        samples,
    })
}

fn parse(args: impl Iterator<Item = String>) -> Result<SoakOptions, Box<dyn std::error::Error>> {
    let mut o = SoakOptions::default();
    let mut args = args;
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--model" => o.model = Path::new(&val()?).to_path_buf(),
            "--tokens" => o.tokens = val()?.parse()?,
            "--turn-tokens" => o.turn_tokens = val()?.parse()?,
            "--cycle-tokens" => o.cycle_tokens = val()?.parse()?,
            "--prefix-cache-mib" => o.prefix_cache_mib = val()?.parse()?,
            "--temperature" => o.temperature = val()?.parse()?,
            "--warmup-cycles" => o.warmup_cycles = val()?.parse()?,
            "--draft-tokens" => o.depth = Some(val()?.parse()?),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    Ok(o)
}

#[allow(dead_code)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let o = parse(std::env::args().skip(1))?;
    let s = soak(&o)?;
    if std::env::var_os("SOAK_SAMPLES").is_some() {
        for x in &s.samples {
            println!("{}", serde_json::to_string(x)?);
        }
    }
    println!("{}", serde_json::to_string(&s)?);
    mlx_tensor::exit_now(0)
}
