//! Command-line arguments (clap derive).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Examples, exit codes and environment, shown after `--help`.
const AFTER_HELP: &str = "EXAMPLES:
  mtp-runner generate --model models/tiny-mtp --prompt 'Once upon a time' --max-tokens 64
  echo 'Why is the sky blue?' | mtp-runner generate --model DIR --chat --temperature 0.7 --seed 1
  mtp-runner generate --model DIR --prompt 'List:' --stop '\\n\\n' --json
  mtp-runner info --model models/tiny-mtp

EXIT CODES:
  0    success
  1    runtime failure (MLX; writing an output file or stdout fails)
  2    usage error or bad input: input files missing, unreadable (any I/O
       error reading them), corrupt, git-lfs pointers or not regular files
       (FIFO, device, dangling symlink); unknown architecture; invalid
       options; a prompt longer than the context; non-finite logits
  130  interrupted (Ctrl-C, SIGTERM or SIGHUP): while loading, at once;
       while generating, the text generated so far has been printed;
       quantize leaves no --out
  141  stdout closed: its reader went away (`| head`) or it was closed at
       start; generation stops at once

ENVIRONMENT:
  RUST_LOG   log filter (for example `runner=debug`); --verbose sets `info`";

/// Run LLMs on MLX from the command line.
#[derive(Debug, Parser)]
#[command(
    name = "mtp-runner",
    version,
    about = "Generate text with Hugging Face models on MLX",
    after_help = AFTER_HELP
)]
pub(crate) struct Cli {
    /// Log progress and statistics to stderr.
    #[arg(long, short, global = true)]
    pub verbose: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Generate a continuation of a prompt, streaming text to stdout.
    #[command(allow_negative_numbers = true, after_help = AFTER_HELP)]
    Generate(GenerateArgs),
    /// Describe a model folder without loading its weights.
    Info(InfoArgs),
    /// Write an MLX-quantized copy of a model folder (affine 4- or 8-bit, mxfp4, mxfp8 or nvfp4).
    #[command(after_help = crate::quantize::AFTER_HELP)]
    Quantize(crate::quantize::QuantizeArgs),
    /// Chat with a model over several turns (interactive, or --script FILE).
    #[command(allow_negative_numbers = true, after_help = CHAT_AFTER_HELP)]
    Chat(ChatArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    #[command(allow_negative_numbers = true, after_help = SERVE_AFTER_HELP)]
    Serve(ServeArgs),
}

/// Examples shown after `chat --help`.
pub(crate) const CHAT_AFTER_HELP: &str = "EXAMPLES:
  mtp-runner chat --model models/tiny-mtp
  mtp-runner chat --model models/tiny-mtp --script turns.txt -n 32 --temperature 0

In the interactive form type a message and press Enter; `/stats` prints the
figures of the last turn, `/reset` starts a new conversation, `/quit` (or
end of input) leaves. Ctrl-C stops the reply being generated (what it said so
far stays in the conversation) and the chat goes on with the next message.

With --script FILE every non-empty line is one user turn, and one JSON object
per turn is printed: turn, text, token_ids, prompt_tokens, reused_tokens,
reuse_source, generated_tokens, prefill_tps, decode_tps, finish_reason and
the speculation object of `generate --json`.";

/// `chat` options.
#[derive(Debug, Args)]
pub(crate) struct ChatArgs {
    #[command(flatten)]
    pub decode: DecodeArgs,
    /// System message at the start of the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// Run the user turns of FILE (one per line), printing one JSON object per turn.
    #[arg(long, value_name = "FILE")]
    pub script: Option<PathBuf>,
    /// Memory for cached prefixes, in MiB (0: reuse only the live session).
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    pub prefix_cache_mib: usize,
}

// `serve` (src/serve/): its options.
/// Examples shown after `serve --help`.
pub(crate) const SERVE_AFTER_HELP: &str = "EXAMPLES:
  mtp-runner serve --model models/tiny-mtp
  mtp-runner serve --model models/tiny-mtp --port 0 --speculative off
  curl -s localhost:8080/v1/chat/completions -d '{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'

ENDPOINTS:
  POST /v1/chat/completions, POST /v1/completions (stream: true for server-sent events),
  GET /v1/models, GET /health, GET /metrics (Prometheus text)

The decoding flags (--max-tokens, --temperature, --top-p, --stop, --speculative,
--draft-tokens, ...) are the defaults of every request; a request's own fields
override them. Requests run one at a time in arrival order; when --queue-size
are waiting, more get 429. SIGINT or SIGTERM stops accepting, lets the requests
in flight finish (for at most --shutdown-timeout seconds, or until a second
signal, then cancels them) and exits 0. The first line on stderr names the
address (`--port 0` picks a free port).

A client has --read-timeout seconds to send a request's headers (on a
keep-alive connection, counted from the previous response), then as long
again for its body: a late head closes the connection, a late body gets 408.
Generating and sending the response has no time limit. A client that closes its connection cancels
its request, and so does one that only shuts down its sending side (`shutdown(SHUT_WR)`, `nc -N`):
the server sees the same end of input.";

/// `serve` options.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub decode: DecodeArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// The model id of /v1/models and requests (default: the model folder's name).
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Option<String>,
    /// Requests that may wait while one runs; more get 429.
    #[arg(long, default_value_t = 64)]
    pub queue_size: usize,
    /// Largest request body in bytes; larger gets 413.
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Memory for cached prefixes shared by all requests, in MiB (0: reuse only the live session).
    #[arg(long, default_value_t = 256, value_name = "MIB")]
    pub prefix_cache_mib: usize,
    /// Start every request from empty caches (no prefix reuse across requests).
    #[arg(long)]
    pub no_prefix_reuse: bool,
    /// Seconds that in-flight requests may run after SIGINT/SIGTERM before
    /// they are cancelled (0 to 86400; 0 cancels them at once).
    #[arg(long, default_value_t = 30, value_name = "SECS", value_parser = parse_shutdown_timeout)]
    pub shutdown_timeout: u64,
    /// Seconds a client has to send a request's headers, and then its body
    /// (1 to 3600); slower clients are cut off (a late body gets 408).
    /// Generating and sending the response has no such limit.
    #[arg(long, default_value_t = 30, value_name = "SECS", value_parser = parse_read_timeout)]
    pub read_timeout: u64,
}

/// Longest `--read-timeout`: an hour is already far beyond any real client,
/// and it keeps the deadlines far from `Instant`'s overflow.
const MAX_READ_TIMEOUT: u64 = 3600;

fn parse_read_timeout(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(n) if (1..=MAX_READ_TIMEOUT).contains(&n) => Ok(n),
        _ => Err(format!(
            "expected whole seconds from 1 to {MAX_READ_TIMEOUT} (default 30): the time a client \
             has to send a request's headers, and then its body"
        )),
    }
}

/// Longest `--shutdown-timeout`: a day, far beyond any request's decoding.
const MAX_SHUTDOWN_TIMEOUT: u64 = 86_400;

fn parse_shutdown_timeout(s: &str) -> Result<u64, String> {
    match s.parse::<u64>() {
        Ok(n) if n <= MAX_SHUTDOWN_TIMEOUT => Ok(n),
        _ => Err(format!(
            "expected whole seconds from 0 to {MAX_SHUTDOWN_TIMEOUT} (default 30): how long \
             requests in flight may run after SIGINT/SIGTERM"
        )),
    }
}

/// `generate` options.
#[derive(Debug, Args)]
pub(crate) struct GenerateArgs {
    #[command(flatten)]
    pub decode: DecodeArgs,
    /// Prompt text; read from stdin when absent.
    #[arg(long, short)]
    pub prompt: Option<String>,
    /// Format the prompt with the model's chat template as a user message.
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Print one JSON object with the text, token ids and statistics instead of streaming.
    #[arg(long)]
    pub json: bool,
}

/// Model, sampling and decoding options shared by `generate` and `chat`.
#[derive(Debug, Args)]
pub(crate) struct DecodeArgs {
    /// Model folder (config.json, *.safetensors, tokenizer.json).
    #[arg(long, short)]
    pub model: PathBuf,
    /// Most tokens to generate.
    #[arg(long, short = 'n', default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy. Default: generation_config.json, else 0.
    #[arg(long, short)]
    pub temperature: Option<f32>,
    /// Keep the K most likely tokens (0 = off).
    #[arg(long)]
    pub top_k: Option<usize>,
    /// Nucleus sampling mass in (0, 1].
    #[arg(long)]
    pub top_p: Option<f32>,
    /// Drop tokens below M × the top probability, in [0, 1).
    #[arg(long)]
    pub min_p: Option<f32>,
    /// Repetition penalty (1 = off).
    #[arg(long)]
    pub repeat_penalty: Option<f32>,
    /// Tokens the penalties look back over.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Presence penalty (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Frequency penalty (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Add BIAS to token ID's logit, as `ID=BIAS` (repeatable; -100 all but
    /// bans the token, 100 all but forces it).
    #[arg(long = "logit-bias", value_name = "ID=BIAS", value_parser = parse_logit_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Random seed (default: from the clock). With a seed, sampled output is the
    /// same run after run under every --speculative and --draft-tokens setting
    /// (auto depth then follows acceptance and a fixed cost model, not timings).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop before this string (repeatable; `\n` and `\t` are newline and tab).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceArg::Auto)]
    pub device: DeviceArg,
    /// Compute dtype (f32 is fastest on the CPU).
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    pub dtype: DtypeArg,
    /// Load a checkpoint even when it holds tensors the model does not use
    /// (by default an error: the config would not describe the weights).
    #[arg(long)]
    pub allow_unused_tensors: bool,
    /// Speculative decoding: `mtp` drafts with the model's MTP head (an error
    /// without one), `draft-model` with `--draft-model`, `ngram` by prompt
    /// lookup; `auto` picks MTP when the model has a head, else the draft
    /// model when one is given, else n-gram lookup (whose auto depth falls
    /// back to plain steps when drafts do not pay); `off` decodes plainly.
    #[arg(long, value_enum, default_value_t = SpeculativeArg::Auto)]
    pub speculative: SpeculativeArg,
    /// A smaller model with the same tokenizer to draft with (`--speculative
    /// draft-model`, or `auto` for a model without an MTP head).
    #[arg(long, value_name = "DIR")]
    pub draft_model: Option<PathBuf>,
    /// Draft tokens per round: a number, or `auto` (per round, the depth with
    /// the best expected tokens per second; it may fall back to 0).
    #[arg(long, default_value = "auto", value_parser = parse_draft_tokens)]
    pub draft_tokens: DraftTokens,
    /// Precision of the MTP head's drafting weights (its unembedding,
    /// projection and block; the model itself keeps `--dtype`): `q8` or `q4`
    /// read fewer bytes per drafted token, `off` drafts with the loaded
    /// weights, `auto` picks what pays on this backend. The output is the
    /// same either way; only acceptance can change.
    #[arg(long, value_enum, default_value_t = DraftQuantArg::Auto)]
    pub draft_quant: DraftQuantArg,
    /// The vocabulary the MTP head drafts over: a count N drafts over the N
    /// lowest token ids and the special tokens (a smaller unembedding per
    /// drafted token; byte-level BPE ids run from frequent to rare), `off`
    /// over all of them, `auto` as `MTP_DRAFT_VOCAB` says (default off). The
    /// output is the same either way; only acceptance can change.
    #[arg(long, default_value = "auto", value_parser = parse_draft_vocab)]
    pub draft_vocab: runner::DraftVocab,
}

fn parse_draft_vocab(s: &str) -> std::result::Result<runner::DraftVocab, String> {
    runner::DraftVocab::parse(s).map_err(|e| e.to_string())
}

/// `--draft-quant`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum DraftQuantArg {
    /// What pays on this backend (or `MTP_DRAFT_QUANT`).
    Auto,
    /// The weights as loaded.
    Off,
    /// 8-bit affine, groups of 64.
    Q8,
    /// 4-bit affine, groups of 64.
    Q4,
}

/// `--speculative`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SpeculativeArg {
    /// Plain decoding.
    Off,
    /// Multi-token prediction with the model's own head.
    Mtp,
    /// A separate draft model (`--draft-model DIR`).
    DraftModel,
    /// N-gram prompt lookup (no model).
    Ngram,
    /// MTP when the model has a head, else the draft model when given, else n-gram.
    Auto,
}

impl SpeculativeArg {
    /// The flag's value as typed.
    pub(crate) fn name(self) -> &'static str {
        match self {
            SpeculativeArg::Off => "off",
            SpeculativeArg::Mtp => "mtp",
            SpeculativeArg::DraftModel => "draft-model",
            SpeculativeArg::Ngram => "ngram",
            SpeculativeArg::Auto => "auto",
        }
    }
}

/// `--draft-tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DraftTokens {
    /// A fixed depth.
    Fixed(usize),
    /// Chosen per round.
    Auto,
}

/// Deepest draft `--draft-tokens` accepts.
pub(crate) const MAX_DRAFT_TOKENS: usize = 16;

fn parse_draft_tokens(s: &str) -> Result<DraftTokens, String> {
    if s == "auto" {
        return Ok(DraftTokens::Auto);
    }
    match s.parse::<usize>() {
        Ok(n) if n <= MAX_DRAFT_TOKENS => Ok(DraftTokens::Fixed(n)),
        _ => Err(format!(
            "expected `auto` or a number of draft tokens from 0 to {MAX_DRAFT_TOKENS}"
        )),
    }
}

/// `info` options.
#[derive(Debug, Args)]
pub(crate) struct InfoArgs {
    /// Model folder.
    #[arg(long, short)]
    pub model: PathBuf,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `--device`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum DeviceArg {
    /// The CPU backend.
    Cpu,
    /// The GPU (CUDA or Metal build of MLX).
    Gpu,
    /// The GPU when the MLX build has one, else the CPU.
    Auto,
}

/// `--dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum DtypeArg {
    /// 32-bit float.
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
}

/// `--logit-bias ID=BIAS`: a token id and a bias from -100 to 100 (the
/// range the HTTP API's `logit_bias` takes, as OpenAI's does).
fn parse_logit_bias(s: &str) -> Result<(u32, f32), String> {
    let (id, bias) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not ID=BIAS (for example 198=-100)"))?;
    let id = id
        .trim()
        .parse::<u32>()
        .map_err(|_| format!("`{id}` is not a token id (a whole number from 0)"))?;
    let bias = bias
        .trim()
        .parse::<f32>()
        .ok()
        .filter(|b| (-100.0..=100.0).contains(b))
        .ok_or_else(|| format!("`{bias}` is not a bias from -100 to 100"))?;
    Ok((id, bias))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logit_biases_take_the_api_range() {
        assert_eq!(parse_logit_bias("198=-100"), Ok((198, -100.0)));
        assert_eq!(parse_logit_bias(" 5 = 100 "), Ok((5, 100.0)));
        for bad in ["5=101", "5=-100.5", "5=1e30", "5=inf", "5=NaN"] {
            let e = parse_logit_bias(bad).unwrap_err();
            assert!(e.contains("from -100 to 100"), "{bad}: {e}");
        }
        assert!(parse_logit_bias("5").unwrap_err().contains("ID=BIAS"));
        assert!(parse_logit_bias("-1=2").unwrap_err().contains("token id"));
    }

    #[test]
    fn timeouts_out_of_range_are_refused_with_the_range() {
        assert_eq!(parse_shutdown_timeout("0"), Ok(0));
        assert_eq!(parse_shutdown_timeout("86400"), Ok(86_400));
        for bad in ["86401", "-1", "1e9", "18446744073709551616", ""] {
            let e = parse_shutdown_timeout(bad).unwrap_err();
            assert!(e.contains("from 0 to 86400"), "{bad}: {e}");
        }
        assert_eq!(parse_read_timeout("1"), Ok(1));
        for bad in ["0", "3601"] {
            let e = parse_read_timeout(bad).unwrap_err();
            assert!(e.contains("from 1 to 3600"), "{bad}: {e}");
        }
    }
}
