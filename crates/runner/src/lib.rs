//! Model loading and generation for mtp-runner.
//!
//! `runner` turns a Hugging Face model folder into something that generates.
//! This file is the library's surface; every module is private (tests reach
//! a few internals through a hidden `testing` door).
//!
//! - **Load and inspect**: [`load()`] reads `config.json`, the (sharded)
//!   safetensors, `tokenizer.json`, `tokenizer_config.json` and
//!   `generation_config.json`, picks a family and builds a [`Model`] in a
//!   [`LoadedModel`]; [`inspect()`] describes a folder without its weights;
//!   [`load_draft()`] loads a draft model after checking its tokenizer.
//! - **Open a session**: [`Session::open`] with a [`Speculation`] mode (off,
//!   MTP, draft model, n-gram, auto), the one way the CLI's `generate` and
//!   `chat` and library users choose how to decode.
//! - **Generate**: [`Session::generate`] with [`GenerateOptions`] (budget,
//!   [`SamplingOptions`], stop strings, [`DepthPolicy`]), a cancel flag
//!   (checked between prefill chunks and before every step or round) and a
//!   text callback (UTF-8 never split); it returns a [`Generation`] with
//!   [`Stats`] and, when speculative, [`SpecStats`]. On return the session's
//!   caches hold exactly [`Session::committed`], so the next call continues
//!   from there ([`Session::reuse_prefix`], [`Session::rewind_to`]).
//! - **Conversations and reuse**: [`Conversation`] runs chat turns over one
//!   session with the model's chat template; a [`PrefixCache`] keeps prompt
//!   prefixes across sessions and requests ([`PrefixCache::prepare`] /
//!   [`PrefixCache::store`]).
//! - **Errors**: every bad input is an [`Error`] naming the file, tensor or
//!   option at fault ([`Error::is_bad_input`]).
//!
//! One session is one sequence and runs on the thread that made it (MLX
//! arrays are not `Send`); a server runs its sessions on one MLX thread.
//!
//! # Example
//! ```no_run
//! use std::sync::atomic::AtomicBool;
//!
//! use runner::{GenerateOptions, LoadOptions, SamplingOptions, Session, Speculation};
//!
//! fn main() -> runner::Result<()> {
//!     let m = runner::load("models/tiny-mtp".as_ref(), LoadOptions::default(), |_, _| {})?;
//!     let mut session = Session::open(m.model.as_ref(), Speculation::Auto, None)?;
//!     let prompt = m.tokenizer.encode("def fibonacci(n):", true)?;
//!     let opts = GenerateOptions {
//!         max_tokens: 32,
//!         sampling: SamplingOptions::greedy(),
//!         ..GenerateOptions::default()
//!     };
//!     let cancel = AtomicBool::new(false);
//!     let g = session.generate(&m.tokenizer, &prompt, &opts, &cancel, |text| print!("{text}"))?;
//!     println!("\n{:?}, {} tokens", g.finish, g.token_ids.len());
//!     Ok(())
//! }
//! ```
//!
//! Config errors, without a model:
//! ```
//! // Config errors name the file and the key.
//! let err = runner::ModelConfig::from_json("{}", "m/config.json".as_ref()).unwrap_err();
//! assert!(err.to_string().contains("m/config.json"));
//! assert!(err.to_string().contains("hidden_size"));
//! assert!(err.is_bad_input());
//! ```
#![warn(missing_docs)]

// Model loading: config, weights, families, tokenizer and chat template.
mod chat;
mod config;
mod load;
mod models;
mod quant;
mod quantize;
mod tokenizer;
mod weights;
// Bad-input guards: files in model folders, non-finite values, output folders.
mod files;
mod finite;
mod fp8;
mod out_dir;
// Reproducible sampling under a seed (the auto depth's fixed cost model).
mod seeded;
// Per-thread measurement switches (kernels, round profiling) read from the environment.
mod switch;
// Evaluation order of lazy graphs built in blocks.
mod schedule;
// Text utilities with no model state.
mod detok;
mod stop;
// The generation core.
mod conversation;
mod depth;
mod draft_head;
mod drafter;
mod error;
mod generate;
mod prefix;
mod session;
mod spec_stats;
mod stats;

// Internals that the integration tests, examples and benches reach; not API.
#[doc(hidden)]
pub mod testing;

pub use chat::{Message, apply_chat_template};
pub use config::{GenerationConfig, HybridConfig, LayerKind, ModelConfig, RopeScaling, TokenIds};
pub use conversation::{Conversation, END_OF_TURN, Turn};
pub use depth::DepthPolicy;
pub use draft_head::{DraftHeadSetup, DraftQuant, DraftVocab};
pub use drafter::{DraftMethod, NgramOptions, load_draft};
pub use error::{Error, Result};
pub use files::check_model_folder;
pub use generate::{FinishReason, GenerateOptions, Generation};
pub use load::{LoadOptions, LoadedModel, ModelInfo, inspect, load};
pub use models::Model;
pub use models::cpu_fused::{set_cpu_fused, set_cpu_fused_heads};
pub use models::delta_kernel::set_delta_kernel;
pub use models::dispatch::{
    DEFAULT_LAYER_DISPATCH_EVERY, MIN_LAYER_MIB as LAYER_DISPATCH_MIN_MIB, layer_dispatch,
    layer_dispatches, set_layer_dispatch, set_layer_dispatch_every,
};
pub use models::heads_kernel::set_fused_heads;
pub use models::kernel_check::{KernelCheck, kernel_checks};
pub use models::layers::LinearLayout;
pub use models::sdpa::{
    AttentionPath, attention_path, set_attention_path, set_shape_buckets, shape_buckets,
};
pub use models::skinny::{
    DEFAULT_MAX_MIB as DEFAULT_ROWS_KERNEL_MAX_MIB, set_rows_kernel, set_rows_kernel_max_mib,
    set_rows_kernel_one_row,
};
pub use prefix::{PrefixCache, Reuse, ReuseSource};
pub use quant::{QuantParams, set_cpu_quant_rows};
pub use quantize::{QuantizeOptions, QuantizeReport, quantize_folder, quantize_folder_cancellable};
/// The sampler crate, re-exported for callers that build options.
pub use sampler;
pub use sampler::Options as SamplingOptions;
pub use session::{Session, Speculation};
pub use spec_stats::{Phases, RoundMeans, RoundTimes, SpecStats, set_profile_rounds};
pub use stats::{PlainPhases, Stats};
pub use tokenizer::Tokenizer;
