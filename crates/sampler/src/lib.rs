//! Token sampling for an MLX runner: options, distributions, speculative acceptance.
//!
//! [`Options`] (validated) describe how logits become a token
//! [`Distribution`]: dense `[R, V]` probability rows on the device, built by
//! penalties (from a per-sequence [`History`]) → logit bias → temperature →
//! top-k → top-p → min-p → normalise. Temperature 0 gives one-hot argmax rows, so greedy
//! decoding and greedy speculation need no separate code path.
//!
//! For speculative decoding, [`accept_chain`] accepts a prefix of a draft
//! chain by rejection sampling against the target rows and draws the next
//! token (residual or bonus) in the same lazy graph: the caller syncs once
//! per round, and the emitted tokens follow the target distribution exactly.
//! Randomness is explicit: every draw takes a key from a seeded [`KeyStream`].
//!
//! This crate knows nothing about caches or models.
//!
//! # Example
//! ```
//! use mlx_tensor::Array;
//! use sampler::{Distribution, History, KeyStream, Options, accept_chain};
//!
//! fn main() -> sampler::Result<()> {
//!     let opts = Options { temperature: 0.0, ..Options::default() };
//!     let history = History::new(opts.repeat_last_n);
//!     let mut keys = KeyStream::new(42);
//!
//!     // The target scored the current token and one draft (two rows).
//!     let logits = Array::from_slice(&[0.0f32, 2.0, 1.0, 3.0, 0.0, 0.0], &[2, 3])?;
//!     let drafted = Array::from_slice(&[1u32], &[1])?;
//!     let target = Distribution::from_logits(&logits, &opts, &history, &[1])?;
//!     // A greedy drafter that proposed token 1 with certainty.
//!     let draft = Distribution::from_probs(&Array::from_slice(&[0.0f32, 1.0, 0.0], &[1, 3])?)?;
//!
//!     let outcome = accept_chain(&target, &draft, &drafted, &keys.next_key()?)?;
//!     // The draft matched the target's argmax (1), then the bonus row's argmax is 0.
//!     assert_eq!(outcome.read()?, (1, 0));
//!     Ok(())
//! }
//! ```
#![warn(missing_docs)]

mod accept;
mod distribution;
mod error;
mod filter;
mod history;
mod keys;
mod options;
mod penalty;
pub mod stats;
mod step;

pub use accept::{Acceptance, BatchAcceptance, BatchOutcome, NO_TOKEN, accept_batch, accept_chain};
pub use distribution::Distribution;
pub use error::{Error, Result};
pub use history::History;
pub use keys::KeyStream;
pub use options::Options;
pub use step::sample_next;
