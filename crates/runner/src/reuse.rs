//! Reusing a live session for the next prompt: rewind every cache, target and
//! draft, to the longest common prefix.
//!
//! Between calls a speculative session's draft caches stand one slot behind
//! the target (the pair at the last committed slot needs the token after it,
//! see [`Session`]). Rewinding the target to `n` therefore rewinds the draft
//! caches to `n - 1`: that drops the pair at slot `n - 1`, whose look-ahead
//! token `n` came from the old sequence (the stale boundary pair), while
//! every pair kept names only tokens below `n`, which the new prompt shares.

use std::sync::atomic::AtomicBool;

use kvcache::{Cache, Snapshot};

use crate::drafter::{MtpDrafter, SpecDrafter};
use crate::error::{Error, Result};
use crate::generate::{PREFILL_CHUNK, Session};

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
    /// Caches that rewind by offset (full attention) just move back. A
    /// recurrent layer goes back only to a state captured earlier (see
    /// [`crate::generate`]'s restore points); when there is none at `n`, the
    /// session restarts from the nearest point below (a capture, else fresh
    /// caches) and forwards the tokens in between again, so the result is
    /// the same state, only slower. An MTP session also needs the point at
    /// `n - 1` (its next request re-runs token `n - 1`), or it replays from
    /// below that.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when `n` is past the committed tokens; MLX
    /// errors of the replay.
    pub fn rewind_to(&mut self, n: usize) -> Result<()> {
        self.rewind_replaying(n).map(|_| ())
    }

    /// The offset [`Session::rewind_to`] would replay from to reach `n`
    /// (`n` itself when it forwards nothing).
    pub(crate) fn replay_from(&self, n: usize) -> usize {
        let n = n.min(self.committed.len());
        let pts = &self.points;
        let back_ok =
            self.lookahead() == 0 || n == 0 || pts.reaches(&self.caches, n - 1, &self.committed);
        if back_ok && pts.reaches(&self.caches, n, &self.committed) {
            return n;
        }
        let below = if self.lookahead() == 0 {
            n
        } else {
            n.saturating_sub(1)
        };
        pts.deepest(&self.caches, below, &self.committed)
            .unwrap_or(0)
    }

    /// Copies of the target's restore point at `offset` (for a prefix-cache
    /// entry), or `None` when there is none valid.
    pub(crate) fn back_point(&self, offset: usize) -> Result<Option<Vec<Option<Snapshot>>>> {
        self.points.copy_at(&self.caches, offset, &self.committed)
    }

    /// [`Session::rewind_to`], returning how many tokens it forwarded again.
    pub(crate) fn rewind_replaying(&mut self, n: usize) -> Result<usize> {
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
            return Ok(0);
        }
        let from = self.replay_from(n);
        let mut replay = self.rewind_target(from)?;
        replay.truncate(n - from);
        let level = if replay.is_empty() {
            Session::draft_level(n)
        } else {
            // The replay reports its run from `from` to the drafter, which
            // pairs it from the draft caches' offset: they stand level.
            from
        };
        rewind_draft(self.draft_caches_mut(), level)?;
        if !replay.is_empty() {
            let never = AtomicBool::new(false);
            self.prefill(&replay, PREFILL_CHUNK, &never)?;
        }
        self.offset();
        tracing::debug!(
            from = have,
            to = n,
            replayed = replay.len(),
            "session rewound"
        );
        Ok(replay.len())
    }

    /// Puts the target caches at the deepest offset at or below `n` that
    /// they reach without a forward (a live rewind or a restore point valid
    /// under the committed tokens, else fresh caches at 0), truncates the
    /// committed tokens there and returns the ones dropped. The draft caches
    /// are the caller's.
    pub(crate) fn rewind_target(&mut self, n: usize) -> Result<Vec<u32>> {
        let to = match self.points.deepest(&self.caches, n, &self.committed) {
            Some(o) => {
                self.points.restore(&mut self.caches, o, &self.committed)?;
                o
            }
            None => {
                tracing::debug!(n, "no restore point: fresh caches");
                self.caches = self.model.new_caches();
                self.points.clear();
                0
            }
        };
        Ok(self.committed.split_off(to))
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

/// Rewinds draft caches (full attention, which rewind by offset) to `level`.
///
/// # Panics
/// When a cache stands below `level` (broken pairing bookkeeping).
pub(crate) fn rewind_draft(caches: &mut [Box<dyn Cache>], level: usize) -> Result<()> {
    for (i, cache) in caches.iter_mut().enumerate() {
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
