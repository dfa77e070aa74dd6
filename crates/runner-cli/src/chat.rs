//! `mtp-runner chat`: a multi-turn conversation, interactive or scripted,
//! each turn reusing the cached prefix of the history.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use serde::Serialize;

use runner::ReuseSource;
use runner::{Conversation, Turn};
use runner::{FinishReason, GenerateOptions};

use crate::args::ChatArgs;
use crate::report::{SpeculationReport, finish_name, stats_line};

/// One turn of `--script` output.
#[derive(Debug, Serialize)]
struct TurnReport<'a> {
    turn: usize,
    text: &'a str,
    token_ids: &'a [u32],
    /// Tokens of the whole templated prompt (history included).
    prompt_tokens: usize,
    /// Of those, tokens reused from the caches.
    reused_tokens: usize,
    /// `none`, `live` or `stored`.
    reuse_source: &'static str,
    generated_tokens: usize,
    prefill_tps: f64,
    decode_tps: f64,
    finish_reason: &'static str,
    speculation: SpeculationReport,
}

impl<'a> TurnReport<'a> {
    fn new(t: &'a Turn) -> Self {
        let g = &t.generation;
        TurnReport {
            turn: t.index,
            text: &g.text,
            token_ids: &g.token_ids,
            prompt_tokens: t.prompt.len(),
            reused_tokens: t.reused_tokens,
            reuse_source: source_name(t.source),
            generated_tokens: g.stats.generated_tokens,
            prefill_tps: g.stats.prefill_tps(),
            decode_tps: g.stats.decode_tps(),
            finish_reason: finish_name(g.finish),
            speculation: SpeculationReport::new(g),
        }
    }
}

fn source_name(s: ReuseSource) -> &'static str {
    match s {
        ReuseSource::None => "none",
        ReuseSource::Live => "live",
        ReuseSource::Stored => "stored",
    }
}

/// One line of per-turn figures.
fn turn_line(t: &Turn) -> String {
    format!(
        "turn {}: prompt {} tokens ({} reused, {}) | {}",
        t.index,
        t.prompt.len(),
        t.reused_tokens,
        source_name(t.source),
        stats_line(&t.generation)
    )
}

/// Runs `chat`.
#[allow(clippy::print_stderr)]
pub(crate) fn run(a: ChatArgs, verbose: bool) -> Result<u8> {
    // Until the first turn Ctrl-C ends the process at once (loading only reads).
    let interrupt = crate::signal::Interrupt::install()?;
    let cancel = interrupt.flag().clone();
    crate::validate::decode_args(&a.decode)?;
    let budget = crate::validate::prefix_cache_bytes(a.prefix_cache_mib)?;
    crate::output::check_stdout_open()?;
    crate::set_device(a.decode.device)?;
    let script = match &a.script {
        Some(p) => {
            let bytes = std::fs::read(p)
                .map_err(|source| runner::Error::Io {
                    path: p.clone(),
                    source,
                })
                .context("reading the --script file")?;
            Some(crate::validate::utf8(
                bytes,
                &format!("the script {}", p.display()),
            )?)
        }
        None => None,
    };
    let m = crate::load_with_progress(&a.decode)?;
    let opts = crate::generate_options(&a.decode, &m.generation_config);
    let draft = crate::load_draft_model(&a.decode, &m)?;
    let session = crate::open_session(&a.decode, &m, draft.as_ref())?;
    let context = m.model.context_length();
    let mut chat = Conversation::new(session, &m.tokenizer, a.system.as_deref(), budget)
        .context("starting the chat (the model needs a chat template in tokenizer_config.json)")?;
    interrupt.cooperative();
    match script {
        Some(text) => run_script(&mut chat, &text, &opts, &cancel, verbose, context),
        None => run_interactive(&mut chat, &opts, &cancel, verbose, context),
    }
}

/// A note when a reply stopped because the conversation filled the model's
/// context (not at `--max-tokens` or the end of the reply).
fn context_note(t: &Turn, opts: &GenerateOptions, context: usize) -> Option<String> {
    let g = &t.generation;
    let full = t.prompt.len() + g.stats.generated_tokens + 1 >= context;
    (g.finish == FinishReason::Length && g.stats.generated_tokens < opts.max_tokens && full).then(
        || {
            format!(
                "(reply cut: the conversation reached the model's context of {context} tokens; \
                 `/reset` starts a new conversation)"
            )
        },
    )
}

#[allow(clippy::print_stderr)]
fn run_script(
    chat: &mut Conversation<'_>,
    script: &str,
    opts: &GenerateOptions,
    cancel: &AtomicBool,
    verbose: bool,
    context: usize,
) -> Result<u8> {
    let mut stdout = std::io::stdout().lock();
    for (i, line) in script.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let t = chat
            .say(line, opts, cancel, |_| {})
            .with_context(|| format!("script turn {}", i + 1))?;
        let line = serde_json::to_string(&TurnReport::new(&t))? + "\n";
        stdout
            .write_all(line.as_bytes())
            .and_then(|()| stdout.flush())
            .map_err(crate::output::write_error)?;
        if let Some(note) = context_note(&t, opts, context) {
            eprintln!("turn {}: {note}", t.index);
        }
        if verbose {
            eprintln!("{}", turn_line(&t));
        }
        if t.generation.finish == FinishReason::Cancelled {
            return Ok(crate::EXIT_INTERRUPTED);
        }
    }
    Ok(0)
}

// Long: one read loop over the slash commands and the turn's outcomes.
#[allow(clippy::print_stderr)]
fn run_interactive(
    chat: &mut Conversation<'_>,
    opts: &GenerateOptions,
    cancel: &AtomicBool,
    verbose: bool,
    context: usize,
) -> Result<u8> {
    let stdin = std::io::stdin();
    let tty = stdin.is_terminal();
    let mut last: Option<Turn> = None;
    let mut input = stdin.lock();
    loop {
        if tty {
            eprint!("> ");
        }
        let mut bytes = Vec::new();
        if input
            .read_until(b'\n', &mut bytes)
            .map_err(|source| runner::Error::Io {
                path: "<stdin>".into(),
                source,
            })
            .context("reading a message from stdin")?
            == 0
        {
            break;
        }
        let line = match crate::validate::utf8(bytes, "the message") {
            Ok(l) => l,
            Err(e) => {
                // One bad line is not the end of the conversation.
                eprintln!("error: {e:#}; message skipped");
                continue;
            }
        };
        match line.trim() {
            "" => continue,
            "/quit" | "/exit" => break,
            "/reset" => {
                chat.reset();
                last = None;
                eprintln!("(new conversation)");
                continue;
            }
            "/stats" => {
                match &last {
                    Some(t) => eprintln!(
                        "{} | prefix cache: {:.1} of {:.1} MiB",
                        turn_line(t),
                        chat.prefix_cache().bytes() as f64 / (1 << 20) as f64,
                        chat.prefix_cache().budget() as f64 / (1 << 20) as f64
                    ),
                    None => eprintln!("(no turn yet)"),
                }
                continue;
            }
            _ => {}
        }
        let line = line.trim_end_matches(['\n', '\r']);
        // A Ctrl-C at the prompt is spent; only one during this turn cancels it.
        cancel.store(false, Ordering::Relaxed);
        tracing::info!("generating a reply");
        let mut stream = crate::output::Stream::new(cancel);
        let said = chat.say(line, opts, cancel, |text| stream.text(text));
        let t = match said {
            Ok(t) => t,
            // Bad input (a history past the context, say) leaves the conversation
            // as it was: report it and read the next message.
            Err(e) if e.is_bad_input() => {
                eprintln!("error: {e}; `/reset` starts a new conversation");
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if let Some(e) = stream.failed() {
            return Err(e);
        }
        let out = stream.out();
        out.write_all(b"\n")
            .and_then(|()| out.flush())
            .map_err(crate::output::write_error)?;
        drop(stream);
        if let Some(note) = context_note(&t, opts, context) {
            eprintln!("{note}");
        }
        if t.generation.finish == FinishReason::Cancelled {
            // The reply so far stays in the history; the next message continues.
            eprintln!("interrupted: {}", turn_line(&t));
        } else if verbose {
            eprintln!("{}", turn_line(&t));
        }
        last = Some(t);
    }
    Ok(0)
}
