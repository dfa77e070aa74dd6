//! Multi-token-prediction draft sessions: pairing target hiddens with tokens.
//!
//! A model with an MTP head predicts the token after next from the target's
//! hidden at a slot fused with the token that followed it. This crate holds
//! the bookkeeping around such a head, not its math: a [`Drafter`] owns the
//! head for the lifetime of a loaded model and opens a [`DraftSession`] per
//! request. The runner reports every run it commits to the target caches
//! ([`DraftSession::committed`]), asks for a draft chain before each
//! verification ([`DraftSession::propose`]), and settles the session with the
//! token it emits last ([`DraftSession::settle`], [`DraftSession::close`]).
//!
//! For a head with draft caches the session keeps the pairing invariant:
//! draft slot `S` holds token `S + 1` fused with the target hidden at `S`.
//! Completed pairs are buffered (pinned) and written in one head forward at
//! a flush, at most [`PENDING_FLUSH_PAIRS`] at a time; speculative entries of
//! a proposal are dropped before each flush. A cacheless head drafts every
//! step from the last committed slot instead.
//!
//! # Example
//! A cacheless head whose "model" always predicts the token after its input:
//! ```
//! use kvcache::Cache;
//! use mlx_tensor::{Array, Dtype, ops};
//! use mtp_draft::{DraftHead, DraftSampling, Drafter, HeadOutput, Result};
//! use sampler::{History, KeyStream, Options};
//!
//! const VOCAB: i32 = 8;
//!
//! #[derive(Debug)]
//! struct NextToken;
//!
//! impl DraftHead for NextToken {
//!     fn forward(&mut self, tokens: &Array, hiddens: &Array, _position: usize) -> Result<HeadOutput> {
//!         // One-hot of (token + 1) mod VOCAB, as the pre-unembed rows.
//!         let next = tokens.add(&Array::from_int(1, Dtype::Uint32)?)?
//!             .remainder(&Array::from_int(VOCAB.into(), Dtype::Uint32)?)?;
//!         let ids = ops::arange(0.0, VOCAB.into(), 1.0, Dtype::Uint32)?;
//!         let out = next.reshape(&[-1, 1])?.equal(&ids)?.as_type(Dtype::Float32)?;
//!         Ok(HeadOutput { out, hidden: hiddens.clone() })
//!     }
//!     fn unembed(&mut self, out: &Array) -> Result<Array> {
//!         Ok(out.clone())
//!     }
//!     fn caches(&self) -> &[Box<dyn Cache>] {
//!         &[]
//!     }
//!     fn caches_mut(&mut self) -> &mut [Box<dyn Cache>] {
//!         &mut []
//!     }
//! }
//!
//! fn main() -> Result<()> {
//!     let mut drafter = Drafter::new(NextToken);
//!     let mut session = drafter.open();
//!     // Prefill reported tokens 0..3 with their target hiddens; 3 is current.
//!     let prompt = Array::from_slice(&[0u32, 1, 2], &[3])?;
//!     session.committed(&prompt, &ops::zeros(&[3, 4], Dtype::Float32)?, 0)?;
//!     let (options, history) = (Options::greedy(), History::new(0));
//!     let mut keys = KeyStream::new(0);
//!     let sampling = DraftSampling { options: &options, history: &history, keys: &mut keys };
//!     let current = Array::from_slice(&[3u32], &[1])?;
//!     let proposal = session.propose(&current, 3, sampling)?.expect("primed");
//!     assert_eq!(proposal.tokens.to_vec::<u32>()?, vec![4, 5, 6]);
//!     session.close()
//! }
//! ```
#![warn(missing_docs)]

mod drafter;
mod error;
mod head;
mod pending;
mod propose;
mod session;

pub use drafter::Drafter;
pub use error::{Error, Result};
pub use head::{DraftHead, HeadOutput};
pub use pending::PENDING_FLUSH_PAIRS;
pub use propose::{DraftChain, DraftSampling, Proposal};
pub use session::DraftSession;
