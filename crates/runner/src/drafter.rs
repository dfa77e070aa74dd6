//! The drafters of speculative decoding behind one seam: the model's own
//! MTP head, a separate draft model, and n-gram prompt lookup.
//!
//! A [`Drafter`] lives with a [`crate::Session`] and owns every special case
//! of its kind: the look-ahead of prefix keys, the draft caches and their
//! rewind, and whether the next request re-runs the boundary token. Each
//! request opens a [`DraftRun`] from it, which the decode loop talks to: it
//! reports every run of committed tokens (with the target hiddens, which only
//! the MTP head uses) and asks for a [`Proposal`] of up to `k` tokens after
//! the current one. Every proposal carries the distributions its tokens were
//! drawn from (one-hot rows for prompt lookup), so the same acceptance rule
//! keeps the output lossless. Draft steps are sampled by
//! [`mtp_draft::DraftChain`], shared by the MTP head and the draft model.
//!
//! Adding a drafter: a file under `drafter/` with its state, a variant of
//! [`Drafter`], [`DraftRun`] and [`DraftMethod`], and its arm in each method
//! below.

pub(crate) mod draft_model;
pub(crate) mod ngram;

use kvcache::Cache;
use mlx_tensor::Array;
use mtp_draft::{DraftHead, DraftSampling, DraftSession, Proposal};

use crate::error::Result;
use crate::models::Model;

pub(crate) use draft_model::ModelDrafter;
pub use draft_model::load_draft;
pub(crate) use ngram::NgramDrafter;
pub use ngram::NgramOptions;

/// A drafter over whichever MTP head the model has.
pub(crate) type MtpDrafter = mtp_draft::Drafter<Box<dyn DraftHead>>;

/// Which drafter a speculative session uses (reported as
/// [`crate::SpecStats::method`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DraftMethod {
    /// The target's multi-token-prediction head.
    Mtp,
    /// A separate draft model sharing the target's tokenizer.
    DraftModel,
    /// N-gram prompt lookup.
    Ngram,
}

impl DraftMethod {
    /// The name used on the command line and in `--json`: `mtp`,
    /// `draft-model` or `ngram`.
    pub fn as_str(self) -> &'static str {
        match self {
            DraftMethod::Mtp => "mtp",
            DraftMethod::DraftModel => "draft-model",
            DraftMethod::Ngram => "ngram",
        }
    }
}

impl std::fmt::Display for DraftMethod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The drafter of a speculative session.
pub(crate) enum Drafter<'m> {
    /// The target's multi-token-prediction head.
    Mtp(MtpDrafter),
    /// A separate draft model sharing the target's tokenizer.
    Model(ModelDrafter<'m>),
    /// Prompt lookup.
    Ngram(NgramDrafter),
}

impl std::fmt::Debug for Drafter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // The head is a trait object without `Debug`.
            Drafter::Mtp(d) => f
                .debug_struct("Mtp")
                .field("lookahead", &d.lookahead())
                .finish(),
            Drafter::Model(d) => f.debug_tuple("Model").field(d).finish(),
            Drafter::Ngram(d) => f.debug_tuple("Ngram").field(d).finish(),
        }
    }
}

impl<'m> Drafter<'m> {
    /// Which drafter this is.
    pub(crate) fn method(&self) -> DraftMethod {
        match self {
            Drafter::Mtp(_) => DraftMethod::Mtp,
            Drafter::Model(_) => DraftMethod::DraftModel,
            Drafter::Ngram(_) => DraftMethod::Ngram,
        }
    }

    /// The look-ahead of prefix-cache keys: 1 when the drafter keeps draft
    /// caches that pair with the target's slots (draft slot `i` holds token
    /// `i + 1`), else 0. (A draft model re-syncs its own caches to the
    /// committed tokens when a request opens, so it needs none.)
    pub(crate) fn lookahead(&self) -> usize {
        match self {
            Drafter::Mtp(d) => d.lookahead(),
            Drafter::Model(_) | Drafter::Ngram(_) => 0,
        }
    }

    /// The draft caches that stand one slot behind the target between calls
    /// (an MTP head's; empty otherwise).
    pub(crate) fn paired_caches(&self) -> &[Box<dyn Cache>] {
        match self {
            Drafter::Mtp(d) => d.head().caches(),
            Drafter::Model(_) | Drafter::Ngram(_) => &[],
        }
    }

    /// [`Drafter::paired_caches`], to restore them.
    pub(crate) fn paired_caches_mut(&mut self) -> &mut [Box<dyn Cache>] {
        match self {
            Drafter::Mtp(d) => d.head_mut().caches_mut(),
            Drafter::Model(_) | Drafter::Ngram(_) => &mut [],
        }
    }

    /// Asks the drafter's caches (the MTP head's, or the draft model's) for
    /// room for `positions` positions (see [`Cache::reserve`]).
    pub(crate) fn reserve(&mut self, positions: usize) {
        let caches = match self {
            Drafter::Mtp(d) => d.head_mut().caches_mut(),
            Drafter::Model(d) => d.caches_mut(),
            Drafter::Ngram(_) => &mut [],
        };
        for c in caches {
            c.reserve(positions);
        }
    }

    /// Whether a request re-runs the last committed token: the MTP head's
    /// open boundary pair needs the target hidden there with the first new
    /// token. Checks that the draft caches stand at or below that slot.
    pub(crate) fn reruns_boundary(&self, committed: usize) -> bool {
        let Drafter::Mtp(d) = self else {
            return false;
        };
        if committed == 0 {
            return false;
        }
        let keep = committed - 1;
        let draft_offset = d.head().cache_offset().unwrap_or(keep);
        assert!(
            draft_offset <= keep,
            "draft caches at {draft_offset} past the boundary slot {keep}"
        );
        true
    }

    /// Rewinds the paired draft caches (full attention, which rewind by
    /// offset) to `level`.
    ///
    /// # Panics
    /// When a cache stands below `level` (broken pairing bookkeeping).
    pub(crate) fn rewind(&mut self, level: usize) -> Result<()> {
        for (i, cache) in self.paired_caches_mut().iter_mut().enumerate() {
            let at = cache.offset();
            assert!(
                at >= level,
                "draft cache {i} at {at} is below the level {level}"
            );
            if at > level && !cache.restore(None, level)? {
                return Err(kvcache::Error::SnapshotMissing {
                    offset: level,
                    layer: i,
                    cache_offset: at,
                }
                .into());
            }
        }
        Ok(())
    }

    /// Drops every draft state, as a drafter made fresh for `target` has
    /// none: a new copy of the MTP head (empty draft caches), a draft model's
    /// empty caches; an n-gram drafter keeps nothing.
    pub(crate) fn empty(&mut self, target: &'m dyn Model) {
        match self {
            Drafter::Mtp(d) => {
                if let Some(head) = target.mtp_head() {
                    *d = MtpDrafter::new(head);
                }
            }
            Drafter::Model(d) => *d = ModelDrafter::new(d.model(), target.vocab_size()),
            Drafter::Ngram(_) => {}
        }
    }

    /// Opens one request's run; `committed` is what the target's caches hold.
    pub(crate) fn open(&mut self, committed: &[u32]) -> Result<DraftRun<'_, 'm>> {
        Ok(match self {
            Drafter::Mtp(d) => DraftRun::Mtp(d.open()),
            Drafter::Model(d) => {
                d.sync(committed)?;
                DraftRun::Model(d)
            }
            Drafter::Ngram(d) => DraftRun::Ngram(d),
        })
    }
}

/// One request's drafting state, opened by [`Drafter::open`].
pub(crate) enum DraftRun<'a, 'm> {
    Mtp(DraftSession<'a, Box<dyn DraftHead>>),
    Model(&'a mut ModelDrafter<'m>),
    Ngram(&'a NgramDrafter),
}

impl DraftRun<'_, '_> {
    /// Which drafter this run belongs to.
    pub(crate) fn method(&self) -> DraftMethod {
        match self {
            DraftRun::Mtp(_) => DraftMethod::Mtp,
            DraftRun::Model(_) => DraftMethod::DraftModel,
            DraftRun::Ngram(_) => DraftMethod::Ngram,
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

    /// Between the single tokens of a plain stretch: writes what the MTP
    /// head has buffered once it fills a flush span (see
    /// [`DraftSession::flush_ready`](mtp_draft::DraftSession::flush_ready)),
    /// so drafting resumes without a long catch-up. Other drafters keep
    /// their pending tokens until they propose.
    pub(crate) fn keep_up(&mut self) -> Result<()> {
        if let DraftRun::Mtp(d) = self {
            d.flush_ready()?;
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
