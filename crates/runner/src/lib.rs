//! Model loading and generation for mtp-runner.
//!
//! `runner` turns a Hugging Face model folder into something that generates:
//! [`load()`] reads `config.json`, the (sharded) safetensors, `tokenizer.json`,
//! `tokenizer_config.json` and `generation_config.json`, picks a family from the
//! registry ([`model::FAMILIES`]) and builds a [`Model`]; [`Session::generate`]
//! runs chunked prefill and a pipelined decode loop, streaming text that never
//! splits a UTF-8 character and stopping on EOS, a token budget, stop strings
//! or a cancel flag. Every bad input is an [`Error`] naming the file, tensor or
//! option at fault.
//!
//! # Example
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
#![warn(missing_docs)]

pub mod chat;
pub mod config;
pub mod conversation;
pub mod depth;
pub mod detok;
pub mod drafter;
mod error;
pub mod files;
pub mod finite;
pub mod generate;
pub mod load;
pub mod model;
pub mod models;
pub mod mtp;
pub mod out_dir;
pub mod prefix;
pub mod quant;
pub mod reuse;
pub mod seeded;
pub mod spec_stats;
pub mod speculate;
pub mod stats;
pub mod stop;
#[cfg(feature = "testing")]
pub mod testing;
pub mod tokenizer;
pub mod weights;

pub use config::{GenerationConfig, ModelConfig};
pub use error::{Error, Result};
pub use generate::{FinishReason, GenerateOptions, Generation, Session};
pub use kvcache::{Cache, KvCache};
pub use load::{LoadOptions, LoadedModel, ModelInfo, inspect, load};
pub use model::Model;
/// The sampler crate, re-exported for callers that build options.
pub use sampler;
pub use sampler::Options as SamplingOptions;
pub use stats::Stats;
pub use tokenizer::Tokenizer;
