//! The drafters of speculative decoding behind one seam: the model's own
//! MTP head, a separate draft model, and n-gram prompt lookup.
//!
//! A [`SpecDrafter`] lives with a [`crate::Session`]; each request opens a
//! [`DraftRun`] from it, which the one speculative loop
//! ([`crate::speculate`]) talks to: it reports every run of committed tokens
//! (with the target hiddens, which only the MTP head uses) and asks for a
//! [`Proposal`] of up to `k` tokens after the current one. Every proposal
//! carries the distributions its tokens were drawn from (one-hot rows for
//! prompt lookup), so the same acceptance rule keeps the output lossless.

pub mod draft_model;
pub mod ngram;

use mlx_tensor::Array;
use mtp_draft::{DraftHead, DraftSampling, DraftSession, Drafter, Proposal};

use crate::error::Result;

pub use draft_model::{ModelDrafter, check_same_tokenizer, load_draft};
pub use ngram::{NgramDrafter, NgramOptions};

/// A drafter over whichever MTP head the model has.
pub type MtpDrafter = Drafter<Box<dyn DraftHead>>;

/// The drafter of a speculative session.
pub enum SpecDrafter<'m> {
    /// The target's multi-token-prediction head.
    Mtp(MtpDrafter),
    /// A separate draft model sharing the target's tokenizer.
    Model(ModelDrafter<'m>),
    /// Prompt lookup.
    Ngram(NgramDrafter),
}

impl std::fmt::Debug for SpecDrafter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // The head is a trait object without `Debug`.
            SpecDrafter::Mtp(d) => f
                .debug_struct("Mtp")
                .field("lookahead", &d.lookahead())
                .finish(),
            SpecDrafter::Model(d) => f.debug_tuple("Model").field(d).finish(),
            SpecDrafter::Ngram(d) => f.debug_tuple("Ngram").field(d).finish(),
        }
    }
}

impl<'m> SpecDrafter<'m> {
    /// The name reported as [`crate::spec_stats::SpecStats::method`]:
    /// `mtp`, `draft-model` or `ngram`.
    pub fn method(&self) -> &'static str {
        match self {
            SpecDrafter::Mtp(_) => "mtp",
            SpecDrafter::Model(_) => "draft-model",
            SpecDrafter::Ngram(_) => "ngram",
        }
    }

    /// Opens one request's run; `committed` is what the target's caches hold.
    pub(crate) fn open(&mut self, committed: &[u32]) -> Result<DraftRun<'_, 'm>> {
        Ok(match self {
            SpecDrafter::Mtp(d) => DraftRun::Mtp(d.open()),
            SpecDrafter::Model(d) => {
                d.sync(committed)?;
                DraftRun::Model(d)
            }
            SpecDrafter::Ngram(d) => DraftRun::Ngram(d),
        })
    }
}

/// One request's drafting state.
pub(crate) enum DraftRun<'a, 'm> {
    Mtp(DraftSession<'a, Box<dyn DraftHead>>),
    Model(&'a mut ModelDrafter<'m>),
    Ngram(&'a NgramDrafter),
}

impl DraftRun<'_, '_> {
    /// See [`SpecDrafter::method`].
    pub(crate) fn method(&self) -> &'static str {
        match self {
            DraftRun::Mtp(_) => "mtp",
            DraftRun::Model(_) => "draft-model",
            DraftRun::Ngram(_) => "ngram",
        }
    }

    /// The target committed `ids` (also as the array `tokens`, with target
    /// hiddens `hidden` `[n, H]`) at slots `pos..pos + n`.
    pub(crate) fn committed(
        &mut self,
        ids: &[u32],
        tokens: &Array,
        hidden: &Array,
        pos: usize,
    ) -> Result<()> {
        match self {
            DraftRun::Mtp(d) => d.committed(tokens, hidden, pos)?,
            DraftRun::Model(d) => d.committed(ids, pos)?,
            DraftRun::Ngram(_) => {}
        }
        Ok(())
    }

    /// Up to `max_tokens` drafts after `current` (emitted, not yet forwarded
    /// by the target; `current_arr` is the same token as a `[1]` array),
    /// where `context` is the target's committed tokens. `None`: decode this
    /// round plainly.
    pub(crate) fn propose(
        &mut self,
        current: u32,
        current_arr: &Array,
        context: &[u32],
        max_tokens: usize,
        sampling: DraftSampling<'_>,
    ) -> Result<Option<Proposal>> {
        if max_tokens == 0 {
            return Ok(None);
        }
        match self {
            DraftRun::Mtp(d) => Ok(d.propose(current_arr, max_tokens, sampling)?),
            DraftRun::Model(d) => d.propose(current, max_tokens, sampling),
            DraftRun::Ngram(d) => d.propose(context, current, max_tokens),
        }
    }

    /// Ends the request (the MTP session flushes its buffered pairs).
    pub(crate) fn close(self) -> Result<()> {
        if let DraftRun::Mtp(d) = self {
            d.close()?;
        }
        Ok(())
    }
}
