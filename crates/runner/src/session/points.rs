//! [`RestorePoints`]: snapshots that let a stack with recurrent layers
//! rewind after a forward without replaying tokens.
//!
//! A recurrent layer folds every position into its state, so it rewinds
//! only to a state captured during the forward (see
//! [`kvcache::RecurrentCache`]). Before each forward the session schedules the
//! offsets a rewind may need (the offset before the step, which the MTP
//! boundary re-run and the plain loop's end-of-sequence drop use; every
//! draft position of a verify); after it, the captures are kept here. Besides
//! the last forward's captures two older points are kept while the tokens
//! under them still agree: the newest one below them (so an end-of-sequence
//! drop still leaves the point one token back that an MTP re-run needs) and
//! the anchor, the end of the last prefill (the next chat turn's prompt
//! extends it, so a rewind inside the reply replays from there, not from 0).
//! A stack of KV caches schedules nothing and rewinds by moving offsets.

use kvcache::{Cache, RecurrentCache, Snapshot};

use crate::error::Result;

/// The captures of every cache at one offset.
#[derive(Debug)]
struct Point {
    offset: usize,
    /// One entry per cache: its capture, or `None` for a cache that rewinds
    /// by offset (a `KvCache`) and needs none.
    snaps: Vec<Option<Snapshot>>,
}

/// The restore points of a session, with the tokens they were taken under.
#[derive(Debug, Default)]
pub(crate) struct RestorePoints {
    /// Ascending by offset. A point at offset `o` restores the state of
    /// exactly the first `o` of `tokens`; it is used only while the
    /// session's first `o` tokens agree.
    points: Vec<Point>,
    tokens: Vec<u32>,
    /// The offset of the point kept across later forwards (the end of the
    /// last prefill), while it stays valid.
    anchor: Option<usize>,
}

/// Whether a cache rewinds to any lower offset without a capture.
fn rewinds_live(c: &dyn Cache) -> bool {
    c.rewinds_by_offset()
}

impl RestorePoints {
    /// Schedules `offsets` on every cache when some cache cannot rewind by
    /// its offset; returns whether it did.
    pub(crate) fn schedule(caches: &mut [Box<dyn Cache>], offsets: &[usize]) -> bool {
        // Recurrent layers, and sliding windows once they wrap, need captures.
        if caches.iter().all(|c| rewinds_live(c.as_ref())) {
            return false;
        }
        kvcache::schedule_all(caches, offsets);
        true
    }

    /// Takes the captures of the forward just built; `tokens` are the tokens
    /// the captured offsets index (at least up to the deepest valid one).
    /// Keeps, of the older points still valid under `tokens`, the anchor and
    /// the newest one below the new captures.
    pub(crate) fn take(&mut self, caches: &mut [Box<dyn Cache>], tokens: &[u32]) {
        let n = caches.len();
        let mut fresh: Vec<Point> = Vec::new();
        for (layer, cache) in caches.iter_mut().enumerate() {
            let live = rewinds_live(cache.as_ref());
            for (offset, snap) in cache.take_scheduled() {
                let i = match fresh.binary_search_by_key(&offset, |p| p.offset) {
                    Ok(i) => i,
                    Err(i) => {
                        let snaps = (0..n).map(|_| None).collect();
                        fresh.insert(i, Point { offset, snaps });
                        i
                    }
                };
                if !live {
                    fresh[i].snaps[layer] = Some(snap);
                }
            }
        }
        let below = fresh.first().map_or(usize::MAX, |p| p.offset);
        let agrees = |o: usize| {
            o <= tokens.len() && o <= self.tokens.len() && tokens[..o] == self.tokens[..o]
        };
        let old = std::mem::take(&mut self.points);
        let newest = old
            .iter()
            .map(|p| p.offset)
            .filter(|&o| o < below && agrees(o))
            .max();
        let anchor = self.anchor.filter(|&o| o < below && agrees(o));
        let mut kept: Vec<Point> = old
            .into_iter()
            .filter(|p| Some(p.offset) == newest || Some(p.offset) == anchor)
            .collect();
        kept.extend(fresh);
        self.points = kept;
        self.anchor = anchor;
        self.tokens.clear();
        self.tokens.extend_from_slice(tokens);
    }

    /// Keeps the newest point (the end of the prefill just run) across later
    /// forwards, in place of the previous anchor.
    pub(crate) fn mark_anchor(&mut self) {
        if let Some(p) = self.points.last() {
            self.anchor = Some(p.offset);
        }
    }

    /// Forgets every point (the caches were replaced).
    pub(crate) fn clear(&mut self) {
        *self = RestorePoints::default();
    }

    /// The point at `offset`, when it was taken under `committed`'s tokens.
    fn point(&self, offset: usize, committed: &[u32]) -> Option<&Point> {
        let valid = self.tokens.len() >= offset
            && committed.len() >= offset
            && self.tokens[..offset] == committed[..offset];
        if !valid {
            return None;
        }
        self.points.iter().find(|p| p.offset == offset)
    }

    /// Whether [`RestorePoints::restore`] can take every cache to `offset`.
    pub(crate) fn reaches(
        &self,
        caches: &[Box<dyn Cache>],
        offset: usize,
        committed: &[u32],
    ) -> bool {
        let point = self.point(offset, committed);
        caches.iter().enumerate().all(|(layer, c)| {
            c.offset() == offset
                || (offset < c.offset() && rewinds_live(c.as_ref()))
                || point.is_some_and(|p| p.snaps[layer].is_some())
        })
    }

    /// The deepest offset at or below `n` that [`RestorePoints::restore`]
    /// reaches, or `None` (only fresh caches stand lower).
    pub(crate) fn deepest(
        &self,
        caches: &[Box<dyn Cache>],
        n: usize,
        committed: &[u32],
    ) -> Option<usize> {
        std::iter::once(n)
            .chain(self.points.iter().rev().map(|p| p.offset))
            .filter(|&o| o <= n)
            .find(|&o| self.reaches(caches, o, committed))
    }

    /// Rewinds every cache to `offset` (`committed` holds at least the first
    /// `offset` tokens the caches will hold): live where a cache can, else
    /// from a point taken under the same tokens. Check with
    /// [`RestorePoints::reaches`] first: on an error the caches before the
    /// failing one are already rewound.
    pub(crate) fn restore(
        &self,
        caches: &mut [Box<dyn Cache>],
        offset: usize,
        committed: &[u32],
    ) -> Result<()> {
        let point = self.point(offset, committed);
        for (layer, cache) in caches.iter_mut().enumerate() {
            if cache.restore(None, offset)? {
                continue;
            }
            let Some(snap) = point.and_then(|p| p.snaps[layer].as_ref()) else {
                return Err(kvcache::Error::SnapshotMissing {
                    offset,
                    layer,
                    cache_offset: cache.offset(),
                }
                .into());
            };
            cache.try_restore(Some(snap), offset)?;
        }
        Ok(())
    }

    /// Copies of the captures at `offset` taken under `committed`'s tokens
    /// (for a prefix-cache entry), or `None` when some cache that needs one
    /// has none.
    pub(crate) fn copy_at(
        &self,
        caches: &[Box<dyn Cache>],
        offset: usize,
        committed: &[u32],
    ) -> Result<Option<Vec<Option<Snapshot>>>> {
        if !self.reaches(caches, offset, committed) {
            return Ok(None);
        }
        let Some(point) = self.point(offset, committed) else {
            // Every cache rewinds live: nothing to keep.
            return Ok(Some(caches.iter().map(|_| None).collect()));
        };
        Ok(Some(copy_all(&point.snaps)?))
    }

    /// Replaces every point with `snaps` at `offset`, taken under `tokens`
    /// (a restored prefix-cache entry's capture one token back); it becomes
    /// the anchor.
    pub(crate) fn install(
        &mut self,
        offset: usize,
        snaps: &[Option<Snapshot>],
        tokens: &[u32],
    ) -> Result<()> {
        self.points = vec![Point {
            offset,
            snaps: copy_all(snaps)?,
        }];
        self.tokens = tokens.to_vec();
        self.anchor = Some(offset);
        Ok(())
    }
}

/// Copies snapshots of recurrent caches (a snapshot owns its pins and is not
/// `Clone`: restoring it into a scratch cache and snapshotting that shares
/// the same arrays).
fn copy_all(snaps: &[Option<Snapshot>]) -> Result<Vec<Option<Snapshot>>> {
    snaps
        .iter()
        .map(|s| {
            s.as_ref()
                .map(|s| {
                    let mut scratch = RecurrentCache::new();
                    scratch.try_restore(Some(s), s.offset())?;
                    Ok(scratch.snapshot()?)
                })
                .transpose()
        })
        .collect()
}
