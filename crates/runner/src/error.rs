//! The crate's error type: every failure names the file, tensor or option at fault.

use std::path::PathBuf;

/// Errors from loading a model folder, tokenizing, rendering chat and generating.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file or folder could not be written (a full disk, a read-only place).
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file or folder being written.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A path the model folder uses is not a regular file (a FIFO, a device,
    /// a socket, a folder or a dangling symlink), refused before it is opened
    /// so that a load never blocks on it.
    #[error("{path} is {kind}, not a regular file: {hint}")]
    NotAFile {
        /// The path.
        path: PathBuf,
        /// What it is ("a FIFO", "a dangling symlink", ...).
        kind: &'static str,
        /// How to fix it.
        hint: String,
    },
    /// A file is a git-lfs pointer, not the content it points to.
    #[error(
        "{path} is a git-lfs pointer ({bytes} bytes), not the file itself: run `git lfs pull` in \
         the model's repository (or download the file directly)"
    )]
    LfsPointer {
        /// The pointer file.
        path: PathBuf,
        /// Its size.
        bytes: u64,
    },
    /// Another run is writing the same output folder.
    #[error(
        "{out} is being written by another run (its staging folder {staging} exists): wait for \
         it to finish, or, if no other run is active (a killed run leaves the folder), delete \
         {staging} and retry"
    )]
    OutputBusy {
        /// The output folder asked for.
        out: PathBuf,
        /// The staging sibling that claims it.
        staging: PathBuf,
    },
    /// The work was interrupted (Ctrl-C, or SIGTERM / SIGHUP in the CLI) before it finished; nothing partial was left.
    #[error("interrupted: {what}")]
    Interrupted {
        /// What was stopped and what was cleaned up.
        what: String,
    },
    /// The logits of a step held NaN or infinite values, so no token can be sampled.
    #[error(
        "the model produced non-finite logits (NaN or infinity) at position {position}: {cause}"
    )]
    NonFiniteLogits {
        /// Position in the sequence of the token that was to be sampled.
        position: usize,
        /// The likely causes and the fix.
        cause: String,
    },
    /// The prompt text is so long that it cannot fit the context, found
    /// before (or while) tokenizing it.
    #[error(
        "prompt too long: {found}, but the model's context is {context} tokens; shorten the \
         prompt"
    )]
    PromptTooLarge {
        /// What was measured ("20971520 bytes, at least 41943 tokens").
        found: String,
        /// Context length in tokens.
        context: usize,
    },
    /// A file the model folder needs is missing.
    #[error("{path} not found: {hint}")]
    MissingFile {
        /// The file that was looked for.
        path: PathBuf,
        /// What the file is for and how to provide it.
        hint: &'static str,
    },
    /// A JSON file did not parse or lacks a required key.
    #[error("{path}: {message}")]
    Json {
        /// The file.
        path: PathBuf,
        /// serde's message, which names the key and line.
        message: String,
    },
    /// A config value is present but unusable.
    #[error("{path}: key `{key}`: {message}")]
    InvalidConfig {
        /// The file.
        path: PathBuf,
        /// The offending key.
        key: &'static str,
        /// Why and how to fix it.
        message: String,
    },
    /// No registered family handles this architecture.
    #[error(
        "unknown architecture `{architecture}` (model_type `{model_type}`) in config.json; supported: {known}"
    )]
    UnknownArchitecture {
        /// `architectures[0]` from config.json.
        architecture: String,
        /// `model_type` from config.json.
        model_type: String,
        /// The registered names, comma separated.
        known: String,
    },
    /// A known architecture whose computation the runner does not implement yet.
    #[error(
        "architecture `{architecture}` (model_type `{model_type}`) is not supported yet: it needs \
         {needs}; supported: {known}"
    )]
    UnsupportedArchitecture {
        /// `architectures[0]` from config.json.
        architecture: String,
        /// `model_type` from config.json.
        model_type: String,
        /// What the runner lacks for it.
        needs: &'static str,
        /// The registered names, comma separated.
        known: String,
    },
    /// The same tensor name is stored in two shard files.
    #[error(
        "tensor `{name}` is stored in both {first} and {second}; a checkpoint holds each tensor \
         once: remove the stale shard or fix model.safetensors.index.json"
    )]
    DuplicateTensor {
        /// The tensor's name.
        name: String,
        /// The first file holding it.
        first: PathBuf,
        /// The second file holding it.
        second: PathBuf,
    },
    /// Tensors the family does not use: the config does not describe the checkpoint.
    #[error(
        "{count} tensor(s) of the checkpoint are not used by family `{family}`: {names}; \
         config.json does not describe these weights (a wrong `architectures`/`model_type`, \
         `num_hidden_layers` or bias flag?): fix config.json, or load with \
         `--allow-unused-tensors` to ignore them"
    )]
    UnusedTensors {
        /// The family that was loading.
        family: &'static str,
        /// How many were left.
        count: usize,
        /// The first few names, comma separated.
        names: String,
    },
    /// A safetensors file has a corrupt or inconsistent header.
    #[error("{path}: corrupt safetensors file: {message}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A tensor the model needs is not in the checkpoint.
    #[error("tensor `{name}` not found in the checkpoint ({count} tensors present)")]
    MissingTensor {
        /// The tensor's name.
        name: String,
        /// How many tensors the checkpoint holds.
        count: usize,
    },
    /// A tensor has the wrong shape for the config.
    #[error("tensor `{name}` has shape {found:?}, config.json implies {expected:?}")]
    TensorShape {
        /// The tensor's name.
        name: String,
        /// The shape the config implies.
        expected: Vec<i32>,
        /// The shape in the file.
        found: Vec<i32>,
    },
    /// A tensor has a dtype the runner cannot compute with.
    #[error("tensor `{name}` has dtype {dtype}; supported: F32, F16, BF16")]
    TensorDtype {
        /// The tensor's name.
        name: String,
        /// Its safetensors dtype name.
        dtype: String,
    },
    /// A weight holds NaN or infinite values (checked once at load).
    #[error("tensor `{name}` holds NaN or infinite values: {cause}")]
    NonFiniteWeights {
        /// The tensor's name.
        name: String,
        /// Where the values came from and the fix.
        cause: String,
    },
    /// tokenizer.json could not be loaded.
    #[error("{path}: cannot load tokenizer: {message}")]
    Tokenizer {
        /// The file.
        path: PathBuf,
        /// The tokenizers crate's message.
        message: String,
    },
    /// The tokenizer produces ids the model has no embedding for.
    #[error(
        "tokenizer mismatch: tokenizer.json has {tokenizer} tokens but config.json vocab_size is {model}; ids at or above {model} cannot be embedded"
    )]
    VocabMismatch {
        /// Tokens in tokenizer.json (including added tokens).
        tokenizer: usize,
        /// The model's vocab_size.
        model: usize,
    },
    /// Encoding or decoding text failed.
    #[error("tokenizer: {0}")]
    Encode(String),
    /// The model ships no chat template but chat was requested.
    #[error("{path}: no `chat_template`; this model cannot format chat; pass raw text instead")]
    NoChatTemplate {
        /// The tokenizer_config.json looked at (it may not exist).
        path: PathBuf,
    },
    /// The chat template failed to compile or render.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// The prompt is empty.
    #[error("the prompt is empty: at least one token is needed")]
    EmptyPrompt,
    /// The prompt does not fit the model's context.
    #[error(
        "prompt too long: the prompt has {prompt} tokens but the model's context is {context} tokens \
         and the reply needs one more: shorten the prompt to fewer than {context} tokens"
    )]
    PromptTooLong {
        /// Prompt tokens.
        prompt: usize,
        /// Context length (max_position_embeddings).
        context: usize,
    },
    /// A generation option is out of range.
    #[error("invalid option `{option}`: {message}")]
    InvalidOption {
        /// The option's name.
        option: &'static str,
        /// Why and the accepted range.
        message: String,
    },
    /// Sampling options were rejected (the message names the option).
    #[error(transparent)]
    Sampler(#[from] sampler::Error),
    /// Speculative decoding with MTP was asked of a model without an MTP head.
    #[error(
        "the model has no multi-token-prediction head (no `mtp.fc`, `model.layers.N.eh_proj` or \
         `model.mtp_layers.0.input_proj` tensors): use `--speculative off` or `auto`"
    )]
    NoMtpHead,
    /// A draft model's tokenizer differs from the target's.
    #[error(
        "draft model {draft} does not share the tokenizer of the target {target}: {detail}; \
         speculative decoding needs both to map text to the same ids (pick a draft model of the \
         same family and tokenizer)"
    )]
    DraftTokenizerMismatch {
        /// The target model folder.
        target: PathBuf,
        /// The draft model folder.
        draft: PathBuf,
        /// The first difference found.
        detail: String,
    },
    /// A cache operation failed.
    #[error(transparent)]
    Cache(#[from] kvcache::Error),
    /// The draft session failed.
    #[error(transparent)]
    Draft(#[from] mtp_draft::Error),
    /// MLX failed.
    #[error(transparent)]
    Mlx(#[from] mlx_tensor::Error),
}

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Reads a file, naming it in the error.
pub(crate) fn read(path: &std::path::Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })
}

/// Parses a JSON file into `T`, naming the file (and serde's key) in the error.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: &std::path::Path) -> Result<T> {
    let bytes = read(path)?;
    serde_json::from_slice(&bytes).map_err(|e| Error::Json {
        path: path.to_owned(),
        message: e.to_string(),
    })
}

impl Error {
    /// True when the input (files, config, options, prompt) is at fault rather than
    /// the runtime: callers map this to a "bad input" exit code.
    pub fn is_bad_input(&self) -> bool {
        // An unreadable input file is bad input (exit 2 in the CLI); a failed
        // write, an interruption and MLX failures are the runtime's.
        !matches!(
            self,
            Error::Write { .. }
                | Error::Interrupted { .. }
                | Error::Encode(_)
                | Error::Cache(_)
                | Error::Draft(_)
                | Error::Mlx(_)
        )
    }
}
