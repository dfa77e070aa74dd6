//! Reusing a live session for the next prompt: rewind every cache, target and
//! draft, to the longest common prefix.
//!
//! Between calls a speculative session's draft caches stand one slot behind
//! the target (the pair at the last committed slot needs the token after it,
//! see [`Session`]). Rewinding the target to `n` therefore rewinds the draft
//! caches to `n - 1`: that drops the pair at slot `n - 1`, whose look-ahead
//! token `n` came from the old sequence (the stale boundary pair), while
//! every pair kept names only tokens below `n`, which the new prompt shares.

use kvcache::{Cache, restore_all};

use crate::drafter::{MtpDrafter, SpecDrafter};
use crate::error::{Error, Result};
use crate::generate::Session;

/// Length of the common prefix of two token sequences.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl Session<'_> {
    /// The MTP drafter, the one drafter whose caches pair with the target's
    /// slots. (A draft model re-syncs its own caches to `committed` when a
    /// request opens, so rewinding and restoring the target is enough for it.)
    fn mtp(&self) -> Option<&MtpDrafter> {
        match &self.drafter {
            Some(SpecDrafter::Mtp(d)) => Some(d),
            _ => None,
        }
    }

    /// The look-ahead of prefix-cache keys for this session: 1 when its
    /// drafter keeps draft caches (draft slot `i` holds token `i + 1`), else 0.
    pub fn lookahead(&self) -> usize {
        self.mtp().map_or(0, |d| d.lookahead())
    }

    /// The MTP head's draft caches (empty for other sessions and for a
    /// cacheless head).
    pub fn draft_caches(&self) -> &[Box<dyn Cache>] {
        self.mtp().map_or(&[], |d| d.head().caches())
    }

    pub(crate) fn draft_caches_mut(&mut self) -> &mut [Box<dyn Cache>] {
        match &mut self.drafter {
            Some(SpecDrafter::Mtp(d)) => d.head_mut().caches_mut(),
            _ => &mut [],
        }
    }

    /// Where the draft caches must stand for `committed` tokens between calls.
    pub(crate) fn draft_level(committed: usize) -> usize {
        committed.saturating_sub(1)
    }

    /// Rewinds the session to its first `n` committed tokens: the target
    /// caches to `n`, the draft caches to `n - 1` (dropping the boundary pair
    /// whose look-ahead token was the old token `n`).
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when `n` is past the committed tokens; a cache
    /// error when a cache cannot rewind without a snapshot (a recurrent
    /// layer). After a cache error the session's caches disagree and it must
    /// be rebuilt (or restored from a prefix cache).
    pub fn rewind_to(&mut self, n: usize) -> Result<()> {
        let have = self.committed.len();
        if n > have {
            return Err(Error::InvalidOption {
                option: "rewind_to",
                message: format!(
                    "cannot rewind to {n} tokens: the session holds {have}; \
                     pass at most {have}"
                ),
            });
        }
        if n == have {
            return Ok(());
        }
        restore_all(&mut self.caches, n, &[])?;
        self.committed.truncate(n);
        let level = Session::draft_level(n);
        for (i, cache) in self.draft_caches_mut().iter_mut().enumerate() {
            let at = cache.offset();
            assert!(
                at >= level,
                "draft cache {i} at {at} is below the level {level} of {have} committed tokens"
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
        self.offset();
        tracing::debug!(from = have, to = n, "session rewound");
        Ok(())
    }

    /// Keeps the longest prefix of `prompt` the session already holds, but
    /// never all of it (at least one prompt token is evaluated again, to
    /// produce the first sample): rewinds to that length and returns it.
    /// Generate from `prompt[n..]` afterwards.
    pub fn reuse_prefix(&mut self, prompt: &[u32]) -> Result<usize> {
        let n = common_prefix(&self.committed, prompt).min(prompt.len().saturating_sub(1));
        self.rewind_to(n)?;
        Ok(n)
    }
}
