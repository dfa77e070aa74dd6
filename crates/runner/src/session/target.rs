//! [`Target`]: the target model's caches, the tokens they hold and the
//! restore points, behind the only code that moves or restores them.
//!
//! Every write to the target caches goes through one of three doors: a
//! prefill chunk (forwarded and committed at once), a plain step
//! ([`Target::forward_one`], committed by [`Target::push`] once its token is
//! known), and a verify ([`Target::begin_verify`], whose [`Verify`] guard
//! keeps the accepted run on [`Verify::commit`] and rewinds everything it
//! wrote when dropped). Every rewind goes through [`Target::rewind_reachable`]
//! or the guard, which pick a live rewind or a restore point valid under the
//! committed tokens.

use kvcache::{Cache, Snapshot};
use mlx_tensor::Array;

use super::points::RestorePoints;
use crate::error::Result;
use crate::models::{Model, sdpa};

/// One sequence's target caches and the tokens they hold.
pub(crate) struct Target<'m> {
    model: &'m dyn Model,
    caches: Vec<Box<dyn Cache>>,
    /// Tokens whose keys and values are in `caches`, in order. Invariant: every
    /// cache's offset equals `committed.len()` between calls (a plain step
    /// forwarded ahead is one past it until [`Target::push`]).
    committed: Vec<u32>,
    /// Snapshots of the last forward for caches that cannot rewind by
    /// offset (recurrent layers); empty for a stack of KV caches.
    points: RestorePoints,
}

impl std::fmt::Debug for Target<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("model", &self.model)
            .field("caches", &self.caches)
            .field("committed", &self.committed.len())
            .finish()
    }
}

impl<'m> Target<'m> {
    /// Fresh caches of `model`, holding nothing.
    pub(crate) fn new(model: &'m dyn Model) -> Target<'m> {
        Target {
            model,
            caches: model.new_caches(),
            committed: Vec::new(),
            points: RestorePoints::default(),
        }
    }

    /// The target model.
    pub(crate) fn model(&self) -> &'m dyn Model {
        self.model
    }

    /// Tokens in the caches.
    pub(crate) fn committed(&self) -> &[u32] {
        &self.committed
    }

    /// The caches.
    pub(crate) fn caches(&self) -> &[Box<dyn Cache>] {
        &self.caches
    }

    /// Asks every cache for room for `positions` positions (see [`Cache::reserve`]).
    pub(crate) fn reserve(&mut self, positions: usize) {
        for c in &mut self.caches {
            c.reserve(positions);
        }
    }

    /// The caches' common offset.
    ///
    /// # Panics
    /// When the caches disagree with each other or with the committed tokens
    /// (broken bookkeeping, a bug).
    pub(crate) fn offset(&self) -> usize {
        for (i, c) in self.caches.iter().enumerate() {
            assert_eq!(
                c.offset(),
                self.committed.len(),
                "cache {i} offset {} != committed tokens {}",
                c.offset(),
                self.committed.len()
            );
        }
        self.committed.len()
    }

    /// Forwards and commits one prefill chunk (at most `cap` tokens, the
    /// chunk size), evaluated; returns the chunk as an array and its hidden
    /// rows `[n, H]`. Under shape buckets over caches that rewind by offset
    /// (`sdpa::pads_over`) the forward runs over `sdpa::row_bucket` rows, the
    /// chunk followed by copies of its last token, and the caches are rewound
    /// past the padding: causal attention keeps the padding out of the
    /// chunk's rows, so they are what an unpadded forward gives.
    pub(crate) fn prefill_chunk(&mut self, part: &[u32], cap: usize) -> Result<(Array, Array)> {
        let pos = self.committed.len();
        let n = part.len();
        let ids = Array::from_slice(part, &[n as i32])?;
        let rows = if sdpa::pads_over(&self.caches) {
            let room = self.model.context_length().saturating_sub(pos);
            sdpa::row_bucket(n, cap).min(room).max(n)
        } else {
            n
        };
        // The offset one token back: the MTP boundary re-run and the plain
        // loop's end-of-sequence drop rewind there.
        let points = RestorePoints::schedule(&mut self.caches, &[pos + n - 1]);
        let hidden = if rows > n {
            let mut padded = part.to_vec();
            padded.resize(rows, part[n - 1]);
            let input = Array::from_slice(&padded, &[rows as i32])?;
            let hidden = self.model.forward(&input, &mut self.caches)?;
            for c in &mut self.caches {
                c.try_restore(None, pos + n)?;
            }
            hidden.slice_axis(0, 0, n as i32)?
        } else {
            self.model.forward(&ids, &mut self.caches)?
        };
        let mut state: Vec<Array> = self.caches.iter().flat_map(|c| c.state()).collect();
        state.push(hidden.clone());
        mlx_tensor::eval(&state)?;
        self.committed.extend_from_slice(part);
        if points {
            self.points.take(&mut self.caches, &self.committed);
        }
        Ok((ids, hidden))
    }

    /// Keeps the newest restore point (the end of the prefill just run)
    /// across later forwards: the next chat turn's prompt extends it.
    pub(crate) fn mark_anchor(&mut self) {
        self.points.mark_anchor();
    }

    /// Forwards one (maybe lazy) token after the committed ones and returns
    /// its hidden row `[1, H]` (lazy). The token is not committed: call
    /// [`Target::push`] with its id once it is known (the pipelined loop
    /// dispatches the forward before reading the token).
    pub(crate) fn forward_one(&mut self, token: &Array) -> Result<Array> {
        let at = self.caches.first().map_or(0, |c| c.offset());
        let points = RestorePoints::schedule(&mut self.caches, &[at]);
        let hidden = self.model.forward(token, &mut self.caches)?;
        if points {
            self.points.take(&mut self.caches, &self.committed);
        }
        Ok(hidden)
    }

    /// Commits the token of the last [`Target::forward_one`].
    pub(crate) fn push(&mut self, id: u32) {
        self.committed.push(id);
    }

    /// Drops the last committed token (an end-of-sequence token a plain step
    /// forwarded ahead), so no loop leaves one in the caches.
    pub(crate) fn drop_last(&mut self) -> Result<()> {
        let keep = self.committed.len() - 1;
        self.points
            .restore(&mut self.caches, keep, &self.committed)?;
        self.committed.truncate(keep);
        Ok(())
    }

    /// Forwards `input` (`[current, d_1..d_k]`, `drafts` = k) after the
    /// committed tokens in one go, capturing the states a rewind to any of
    /// its `k + 1` prefixes needs; the guard decides what stays.
    pub(crate) fn begin_verify(&mut self, input: &Array, drafts: usize) -> Result<Verify<'_, 'm>> {
        let pos = self.offset();
        // Recurrent layers capture their state after `current` and after each
        // draft in this same forward; the commit restores one of them.
        let offsets: Vec<usize> = (pos..=pos + drafts).collect();
        let scheduled = RestorePoints::schedule(&mut self.caches, &offsets);
        let hidden = match self.model.forward(input, &mut self.caches) {
            Ok(h) => h,
            Err(e) => {
                // Nothing was committed: drain what was scheduled and go back.
                let _ = Verify {
                    target: self,
                    pos,
                    scheduled,
                    hidden: None,
                };
                return Err(e);
            }
        };
        Ok(Verify {
            target: self,
            pos,
            scheduled,
            hidden: Some(hidden),
        })
    }

    /// Puts the caches at the deepest offset at or below `n` that they reach
    /// without a forward (a live rewind or a restore point valid under the
    /// committed tokens, else fresh caches at 0), truncates the committed
    /// tokens there and returns the ones dropped (the caller replays what it
    /// needs of them).
    pub(crate) fn rewind_reachable(&mut self, n: usize) -> Result<Vec<u32>> {
        let to = match self.deepest(n) {
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

    /// Fresh caches holding nothing.
    pub(crate) fn reset(&mut self) {
        self.caches = self.model.new_caches();
        self.committed.clear();
        self.points.clear();
    }

    /// Whether the caches reach `offset` without a forward.
    pub(crate) fn reaches(&self, offset: usize) -> bool {
        self.points.reaches(&self.caches, offset, &self.committed)
    }

    /// The deepest offset at or below `n` the caches reach without a
    /// forward, or `None` (only fresh caches stand lower).
    pub(crate) fn deepest(&self, n: usize) -> Option<usize> {
        self.points.deepest(&self.caches, n, &self.committed)
    }

    /// Copies of the restore point at `offset` (for a prefix-cache entry),
    /// or `None` when there is none valid.
    pub(crate) fn back_point(&self, offset: usize) -> Result<Option<Vec<Option<Snapshot>>>> {
        self.points.copy_at(&self.caches, offset, &self.committed)
    }

    /// A snapshot of every cache as it stands.
    pub(crate) fn snapshots(&self) -> Result<Vec<Snapshot>> {
        Ok(self
            .caches
            .iter()
            .map(|c| c.snapshot())
            .collect::<Result<_, _>>()?)
    }

    /// Restores every cache from `snaps` to hold `tokens`; `back` (the
    /// captures one token back, for a recurrent stack) becomes the only
    /// restore point.
    pub(crate) fn restore_from(
        &mut self,
        snaps: &[Snapshot],
        tokens: &[u32],
        back: Option<&[Option<Snapshot>]>,
    ) -> Result<()> {
        let n = tokens.len();
        if let Err(e) = put(&mut self.caches, snaps, n) {
            // Some caches may have moved: start over rather than disagree.
            self.reset();
            return Err(e);
        }
        self.committed = tokens.to_vec();
        match back {
            // A recurrent entry restores at its own end only: n is its length.
            Some(back) if n > 0 => self.points.install(n - 1, back, tokens)?,
            _ => self.points.clear(),
        }
        self.offset();
        Ok(())
    }

    /// Waits for every write in flight to the caches (the last dispatched
    /// forward), so nothing runs when the caller drops arrays or exits.
    pub(crate) fn settle(&self) -> Result<()> {
        let state: Vec<Array> = self.caches.iter().flat_map(|c| c.state()).collect();
        mlx_tensor::eval(&state)?;
        mlx_tensor::synchronize()?;
        Ok(())
    }
}

/// A verify forward in flight: [`Verify::commit`] keeps the accepted run;
/// dropping the guard instead rewinds every cache to where it began, so an
/// error between the forward and the acceptance leaves the caches holding
/// exactly the committed tokens.
#[must_use = "dropping a Verify rewinds the verify forward"]
pub(crate) struct Verify<'t, 'm> {
    target: &'t mut Target<'m>,
    /// The committed length before the forward.
    pos: usize,
    /// Whether restore points were scheduled (a recurrent stack).
    scheduled: bool,
    /// The forward's hidden rows `[k + 1, H]`; `None` when it failed.
    hidden: Option<Array>,
}

impl Verify<'_, '_> {
    /// The forward's hidden rows `[k + 1, H]` (lazy).
    pub(crate) fn hidden(&self) -> &Array {
        self.hidden
            .as_ref()
            .expect("a verify guard holds its forward")
    }

    /// Keeps `kept` (`current` and the accepted drafts, a prefix of the
    /// verified input) and rewinds every cache to the end of it.
    pub(crate) fn commit(mut self, kept: &[u32]) -> Result<()> {
        let t = &mut *self.target;
        let before = t.committed.len();
        t.committed.extend_from_slice(kept);
        if std::mem::take(&mut self.scheduled) {
            t.points.take(&mut t.caches, &t.committed);
        }
        let restored = t
            .points
            .restore(&mut t.caches, self.pos + kept.len(), &t.committed);
        if restored.is_err() {
            // Dropping `self` below rewinds to `pos`.
            t.committed.truncate(before);
            return restored;
        }
        // Committed: nothing for the drop to undo.
        self.pos = t.committed.len();
        Ok(())
    }
}

impl Drop for Verify<'_, '_> {
    fn drop(&mut self) {
        let t = &mut *self.target;
        if self.scheduled {
            t.points.take(&mut t.caches, &t.committed);
        }
        let at_rest = t.caches.iter().all(|c| c.offset() == self.pos);
        if at_rest {
            return;
        }
        if let Err(e) = t.points.restore(&mut t.caches, self.pos, &t.committed) {
            // Never leave caches that disagree with the committed tokens.
            tracing::warn!(error = %e, "verify rewind failed: fresh caches");
            t.reset();
        }
    }
}

/// Restores each cache from its snapshot to `offset`.
fn put(caches: &mut [Box<dyn Cache>], snaps: &[Snapshot], offset: usize) -> Result<()> {
    assert_eq!(
        caches.len(),
        snaps.len(),
        "{} caches but {} snapshots",
        caches.len(),
        snaps.len()
    );
    for (layer, (c, s)) in caches.iter_mut().zip(snaps).enumerate() {
        if !c.restore(Some(s), offset)? {
            return Err(kvcache::Error::SnapshotMissing {
                offset,
                layer,
                cache_offset: c.offset(),
            }
            .into());
        }
    }
    Ok(())
}
