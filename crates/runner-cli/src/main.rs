//! The `mtp-runner` binary: argument parsing, progress and output around `runner`.
//!
//! All MLX work happens on the main thread. Ctrl-C ends a load at once and,
//! during generation, sets a flag that the loop checks every token (see
//! `signal.rs`).

mod args;
#[cfg(test)]
mod args_props;
mod chat;
mod output;
mod quantize;
mod report;
mod signal;
// `serve` (HTTP server): everything lives under serve/.
mod serve;
mod validate;

use std::io::{IsTerminal, Read, Write};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Parser;
use mlx_tensor::{Device, Dtype};
use runner::Message;
use runner::{DepthPolicy, DraftQuant};
use runner::{FinishReason, GenerateOptions, LoadOptions, SamplingOptions, Session, Speculation};

use args::{
    Cli, Command, DecodeArgs, DeviceArg, DraftQuantArg, DraftTokens, DtypeArg, GenerateArgs,
    InfoArgs, SpeculativeArg,
};

/// Exit code for a usage error or bad input.
const EXIT_BAD_INPUT: u8 = 2;
/// Exit code for a runtime failure.
const EXIT_RUNTIME: u8 = 1;
/// Exit code after Ctrl-C (128 + SIGINT).
const EXIT_INTERRUPTED: u8 = 130;
/// Exit code when stdout is closed or its reader went away (128 + SIGPIPE,
/// what a shell reports for a tool that a broken pipe ends).
const EXIT_OUTPUT_CLOSED: u8 = 141;

/// Counts heap bytes, so a chat template's rendering runs in a bounded arena
/// (`runner::apply_chat_template` stops a rendering past its memory limit).
#[global_allocator]
static ALLOC: mlx_tensor::budget::Counting = mlx_tensor::budget::Counting;

/// A usage problem found by the CLI itself (exit code 2).
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

fn main() -> ExitCode {
    let code = run_cli();
    // Rust's stdout is line-buffered behind a lock: flush it, then leave
    // without static destructors (OpenBLAS's can hang; see `exit_now`).
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    mlx_tensor::exit_now(i32::from(code))
}

fn run_cli() -> u8 {
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    let result = match cli.command {
        Command::Generate(a) => generate(a, cli.verbose),
        Command::Info(a) => info(a),
        Command::Quantize(a) => quantize::run(a),
        Command::Chat(a) => chat::run(a, cli.verbose),
        Command::Serve(a) => serve::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let code = exit_code(&e);
            // A reader that went away wants no message (like any filter in a pipe).
            if code != EXIT_OUTPUT_CLOSED || !e.to_string().contains("broken pipe") {
                #[allow(clippy::print_stderr)]
                {
                    eprintln!("error: {}", error_text(&e));
                }
            }
            code
        }
    }
}

/// The error and its causes joined by `: `, leaving out a cause whose text
/// the previous one already ends with (`cannot read F: E` is not followed by `E`).
fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut last = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !last.is_empty() && last.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
        last = text;
    }
    out
}

/// The exit code of an error: see `EXIT CODES` in `--help`.
fn exit_code(e: &anyhow::Error) -> u8 {
    for cause in e.chain() {
        if cause.is::<Usage>() {
            return EXIT_BAD_INPUT;
        }
        if cause.is::<output::OutputClosed>() {
            return EXIT_OUTPUT_CLOSED;
        }
        if let Some(r) = cause.downcast_ref::<runner::Error>() {
            return match r {
                runner::Error::Interrupted { .. } => EXIT_INTERRUPTED,
                r if r.is_bad_input() => EXIT_BAD_INPUT,
                _ => EXIT_RUNTIME,
            };
        }
    }
    EXIT_RUNTIME
}

fn init_tracing(verbose: bool) {
    use tracing_subscriber::EnvFilter;
    let default = if verbose { "info" } else { "warn" };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

fn info(a: InfoArgs) -> Result<u8> {
    signal::Interrupt::install()?;
    output::check_stdout_open()?;
    let i = runner::inspect(&a.model)
        .with_context(|| format!("reading model folder {}", a.model.display()))?;
    let mut out = std::io::stdout().lock();
    let text = if a.json {
        serde_json::to_string_pretty(&report::InfoReport::new(&i))?
    } else {
        report::info_text(&i)
    };
    writeln!(out, "{text}")
        .and_then(|()| out.flush())
        .map_err(output::write_error)?;
    Ok(0)
}

fn set_device(d: DeviceArg) -> Result<()> {
    let gpu = match d {
        DeviceArg::Cpu => false,
        DeviceArg::Gpu if !mlx_tensor::gpu_available() => {
            return Err(Usage(
                "--device gpu: this MLX build has no GPU backend; use --device cpu".into(),
            )
            .into());
        }
        DeviceArg::Gpu => true,
        DeviceArg::Auto => mlx_tensor::gpu_available(),
    };
    mlx_tensor::set_default_device(if gpu { Device::Gpu } else { Device::Cpu })
        .context("selecting the MLX device")?;
    tracing::info!(device = %mlx_tensor::device_name().unwrap_or_default(), "device");
    Ok(())
}

/// The prompt: `--prompt`, or stdin read up to `limit` bytes (a longer one
/// fails as too long without being read further).
fn read_prompt(a: &GenerateArgs, limit: usize, context: usize) -> Result<String> {
    if let Some(p) = &a.prompt {
        return Ok(p.clone());
    }
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        return Err(Usage("no prompt: pass --prompt TEXT or pipe text on stdin".into()).into());
    }
    let mut bytes = Vec::new();
    stdin
        .lock()
        .take(limit as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| runner::Error::Io {
            path: "<stdin>".into(),
            source,
        })
        .context("reading the prompt from stdin")?;
    if bytes.len() > limit {
        return Err(runner::Error::PromptTooLarge {
            found: format!("stdin holds more than {limit} bytes (the most that context can hold)"),
            context,
        }
        .into());
    }
    validate::utf8(bytes, "the prompt on stdin")
}

fn sampling(a: &DecodeArgs, g: &runner::GenerationConfig) -> SamplingOptions {
    let greedy_default = g.do_sample == Some(false) || g.temperature.is_none();
    SamplingOptions {
        temperature: a.temperature.unwrap_or(if greedy_default {
            0.0
        } else {
            g.temperature.unwrap_or(0.0)
        }),
        top_k: a.top_k.or(g.top_k.map(|k| k.max(0) as usize)).unwrap_or(0),
        top_p: a.top_p.or(g.top_p).unwrap_or(1.0),
        min_p: a.min_p.or(g.min_p).unwrap_or(0.0),
        repeat_last_n: a.repeat_last_n,
        repeat_penalty: a.repeat_penalty.or(g.repetition_penalty).unwrap_or(1.0),
        presence_penalty: a.presence_penalty,
        frequency_penalty: a.frequency_penalty,
        logit_bias: a.logit_bias.clone(),
        seed: a.seed,
    }
}

/// The load options `--dtype` asks for.
fn load_options(a: &DecodeArgs) -> LoadOptions {
    let dtype = match a.dtype {
        DtypeArg::F32 => Dtype::Float32,
        DtypeArg::Bf16 => Dtype::Bfloat16,
        DtypeArg::F16 => Dtype::Float16,
    };
    LoadOptions {
        dtype,
        allow_unused_tensors: a.allow_unused_tensors,
        draft_quant: match a.draft_quant {
            DraftQuantArg::Auto => DraftQuant::Auto,
            DraftQuantArg::Off => DraftQuant::Off,
            DraftQuantArg::Q8 => DraftQuant::Bits(8),
            DraftQuantArg::Q4 => DraftQuant::Bits(4),
        },
        draft_vocab: a.draft_vocab,
        ..LoadOptions::default()
    }
}

fn load_with_progress(a: &DecodeArgs) -> Result<runner::LoadedModel> {
    let opts = load_options(a);
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template("loading {bar:30} {pos}/{len} files")
                .expect("static template"),
        );
        b
    });
    let m = runner::load(&a.model, opts, |done, total| {
        if let Some(b) = &bar {
            b.set_length(total as u64);
            b.set_position(done as u64);
        }
    })
    .with_context(|| format!("loading model from {}", a.model.display()))?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(m)
}

/// Turns `\n`, `\t` and `\\` typed on a command line into the characters.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// The generation options that `--max-tokens`, the sampling flags, `--stop`
/// and `--draft-tokens` ask for.
fn generate_options(a: &DecodeArgs, g: &runner::GenerationConfig) -> GenerateOptions {
    GenerateOptions {
        max_tokens: a.max_tokens,
        sampling: sampling(a, g),
        stop: a.stop.iter().map(|s| unescape(s)).collect(),
        fallback_seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
        depth: match a.draft_tokens {
            DraftTokens::Fixed(n) => DepthPolicy::Fixed(n),
            DraftTokens::Auto => DepthPolicy::default(),
        },
        ..GenerateOptions::default()
    }
}

/// The library's speculation mode for `--speculative`.
fn speculation(a: &DecodeArgs) -> Speculation {
    match a.speculative {
        SpeculativeArg::Off => Speculation::Off,
        SpeculativeArg::Mtp => Speculation::Mtp,
        SpeculativeArg::DraftModel => Speculation::DraftModel,
        SpeculativeArg::Ngram => Speculation::Ngram,
        SpeculativeArg::Auto => Speculation::Auto,
    }
}

/// The `--draft-model` when the `--speculative` choice will use it, loaded
/// after checking that its tokenizer is the target's.
fn load_draft_model(
    a: &DecodeArgs,
    m: &runner::LoadedModel,
) -> Result<Option<runner::LoadedModel>> {
    let Some(dir) = a.draft_model.as_deref() else {
        return Ok(None);
    };
    if !speculation(a).uses_draft_model(m.model.as_ref()) {
        // Only `auto` gets here (the other modes refuse the flag up front):
        // the model's own MTP head drafts. A path that is no folder is still
        // a mistake worth stopping for; a folder is said to go unused.
        if !dir.is_dir() {
            return Err(Usage(format!(
                "--draft-model {} is not a folder (and --speculative auto would not use it: \
                 {} has an MTP head); drop --draft-model, or fix the path and pass \
                 --speculative draft-model to draft with it",
                dir.display(),
                a.model.display()
            ))
            .into());
        }
        tracing::warn!(
            "--draft-model {} is not used: --speculative auto drafts with the MTP head of {}; \
             pass --speculative draft-model to draft with it instead",
            dir.display(),
            a.model.display()
        );
        return Ok(None);
    }
    let draft = runner::load_draft(dir, &a.model, &m.tokenizer, load_options(a))
        .with_context(|| format!("loading the draft model from {}", dir.display()))?;
    Ok(Some(draft))
}

/// A session decoding as `--speculative` asks, drafting with `draft` when
/// it uses a draft model: the one way `generate` and `chat` open sessions.
fn open_session<'m>(
    a: &DecodeArgs,
    m: &'m runner::LoadedModel,
    draft: Option<&'m runner::LoadedModel>,
) -> Result<Session<'m>> {
    let draft = draft.map(|d| d.model.as_ref());
    Session::open(m.model.as_ref(), speculation(a), draft)
        .with_context(|| format!("--speculative {}", a.speculative.name()))
}

#[allow(clippy::print_stderr)]
fn generate(a: GenerateArgs, verbose: bool) -> Result<u8> {
    // Until generation starts Ctrl-C ends the process at once (loading only reads).
    let interrupt = signal::Interrupt::install()?;
    let cancel = interrupt.flag().clone();
    validate::decode_args(&a.decode)?;
    output::check_stdout_open()?;
    set_device(a.decode.device)?;
    let m = load_with_progress(&a.decode)?;
    let context = m.model.context_length();
    let prompt_text = read_prompt(&a, m.tokenizer.max_text_bytes(context), context)?;
    let prompt = if a.chat {
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(Message::new("system", s));
        }
        msgs.push(Message::new("user", &prompt_text));
        let text = runner::apply_chat_template(&m.tokenizer, &msgs)
            .context("formatting the prompt with the chat template (--chat)")?;
        m.tokenizer.encode_within(&text, false, context)
    } else {
        m.tokenizer.encode_within(&prompt_text, true, context)
    }
    .context("tokenizing the prompt")?;
    let opts = generate_options(&a.decode, &m.generation_config);
    let draft = load_draft_model(&a.decode, &m)?;
    let mut session = open_session(&a.decode, &m, draft.as_ref())?;
    // From here Ctrl-C stops generation and the text so far is printed.
    interrupt.cooperative();
    tracing::info!(prompt_tokens = prompt.len(), ?opts.sampling, "generating");
    let mut stream = output::Stream::new(&cancel);
    let g = session
        .generate(&m.tokenizer, &prompt, &opts, &cancel, |text| {
            if !a.json {
                stream.text(text);
            }
        })
        .context("generating")?;
    if let Some(e) = stream.failed() {
        return Err(e);
    }
    let out = stream.out();
    let end = if a.json {
        serde_json::to_string(&report::GenerateReport::new(&g))? + "\n"
    } else {
        "\n".to_owned()
    };
    out.write_all(end.as_bytes())
        .and_then(|()| out.flush())
        .map_err(output::write_error)?;
    let cancelled = g.finish == FinishReason::Cancelled;
    if verbose || cancelled {
        // Interrupted: what was generated is on stdout; say how far it got.
        let tag = if cancelled { "interrupted: " } else { "" };
        eprintln!("{tag}{}", report::stats_line(&g));
    }
    Ok(if cancelled { EXIT_INTERRUPTED } else { 0 })
}
