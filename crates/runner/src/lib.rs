//! Model loading and generation for mtp-runner.
//!
//! `runner` turns a Hugging Face model folder into something that generates.
//! This file is the library's surface; everything else is `pub(crate)`.
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
//! Stop strings and config errors, without a model:
//! ```
//! use runner::stop::{StopMatcher, StopStep};
//!
//! // Text that could begin a stop string is held back until it is decided.
//! let mut stop = StopMatcher::new(&["</s>".to_owned()]);
//! assert_eq!(stop.push("Hello <"), StopStep::Continue("Hello ".into()));
//! assert_eq!(stop.push("/s> more"), StopStep::Stop("".into()));
//!
//! // Config errors name the file and the key.
//! let err = runner::ModelConfig::from_json("{}", "m/config.json".as_ref()).unwrap_err();
//! assert!(err.to_string().contains("m/config.json"));
//! assert!(err.to_string().contains("hidden_size"));
//! ```
#![warn(missing_docs, unreachable_pub)]

// Model loading (owned by the loading work; public until its prefixed
// weight views land, then `pub(crate)` like the rest).
pub mod chat;
pub mod config;
// Bad-input guards: files in model folders, non-finite values, output folders.
pub mod files;
pub mod finite;
pub mod load;
pub mod models;
pub mod out_dir;
pub mod quant;
pub mod quantize;
pub mod tokenizer;
pub mod weights;
// Reproducible sampling under a seed (the auto depth's fixed cost model).
pub mod seeded;
// Text utilities with no model state.
pub mod detok;
pub mod stop;
#[cfg(feature = "testing")]
pub mod testing;

// The generation core: reached through the re-exports below.
mod conversation;
mod depth;
mod drafter;
mod error;
mod generate;
mod prefix;
mod session;
mod spec_stats;
mod stats;

pub use chat::{Message, apply_chat_template};
pub use config::{GenerationConfig, ModelConfig};
pub use conversation::{Conversation, END_OF_TURN, Turn};
pub use depth::DepthPolicy;
pub use drafter::{DraftMethod, NgramOptions, load_draft};
pub use error::{Error, Result};
pub use generate::{FinishReason, GenerateOptions, Generation};
pub use load::{LoadOptions, LoadedModel, ModelInfo, inspect, load};
pub use models::Model;
pub use models::sdpa::{AttentionPath, attention_path, set_attention_path};
pub use models::skinny::set_rows_kernel;
pub use prefix::{PrefixCache, Reuse, ReuseSource};
/// The sampler crate, re-exported for callers that build options.
pub use sampler;
pub use sampler::Options as SamplingOptions;
pub use session::{Session, Speculation};
pub use spec_stats::SpecStats;
pub use stats::Stats;
pub use tokenizer::Tokenizer;
