//! [`RotatingKvCache`]: a sliding window of keys and values with a kept prefix.

use mlx_tensor::{Array, ops};
use smallvec::{SmallVec, smallvec};

use crate::buffer::{self, check_fits, check_input, grow, round_up};
use crate::schedule::Schedule;
use crate::snapshot::Payload;
use crate::{AttentionMask, Cache, Error, Result, Snapshot};

/// A sliding-window cache of `max_size` slots whose first `keep` positions
/// (attention sinks) are never evicted.
///
/// # Layout
/// Position `p` always lives in slot `p` if `p < keep`, else in slot
/// `keep + (p - keep) % (max_size - keep)`. The ring therefore depends only on
/// which positions are live, never on how they were written, which is what
/// makes rewinds and snapshots exact.
///
/// # Visibility
/// The query at position `q` sees key `k` when `k ≤ q` and either `k < keep`
/// or `q - k < max_size - keep`. With `keep = 0` that is mlx-lm's sliding
/// window: each query sees itself and the `max_size - 1` positions before it.
///
/// # What `update_and_fetch` returns, and the mask
/// For an update of `L` positions at offset `o` (`e = o + L`), see
/// [`RotatingKvCache::fetch_positions`] for the exact key positions:
/// - `e ≤ max_size` (not wrapped): keys of positions `0..e` in order, mask
///   [`AttentionMask::Causal`] (none for `L = 1`).
/// - `L = 1` after the wrap: the whole ring in slot order (attention does not
///   care about key order); every slot is visible, so no mask.
/// - `L > 1` after the wrap (prefill, verify): the sinks, the old positions
///   that the first query still sees, then the `L` new ones, in time order;
///   the mask is a boolean array built by [`Cache::make_mask`].
///
/// Call `make_mask(L)` *before* `update_and_fetch` (as mlx-lm does).
///
/// # Rewinds
/// Until the offset passes `max_size` no position has been evicted and
/// `restore(None, n)` works for every `n ≤ offset`. After the wrap a rewind
/// needs a snapshot captured at the target offset ([`Cache::schedule_snapshots`]
/// before the forward); without one `restore` answers `Ok(false)` and
/// `try_restore` [`Error::WrappedWithoutSnapshot`].
#[derive(Debug)]
pub struct RotatingKvCache {
    max_size: usize,
    keep: usize,
    /// The ring `[B, H, capacity, D]`; `capacity ≥ min(offset, max_size)` and
    /// `capacity ≤ max_size`.
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
    allocations: usize,
    schedule: Schedule,
}

/// Which of the three return layouts an update of `L` positions uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    Linear,
    Ring,
    Gathered,
}

/// `(slot, position, len)`: a run of consecutive positions in consecutive slots.
type Run = (usize, usize, usize);

impl RotatingKvCache {
    /// A window of `max_size` positions whose first `keep` are never evicted.
    pub fn new(max_size: usize, keep: usize) -> Result<RotatingKvCache> {
        if keep >= max_size {
            return Err(Error::BadWindow { max_size, keep });
        }
        Ok(RotatingKvCache {
            max_size,
            keep,
            keys: None,
            values: None,
            offset: 0,
            allocations: 0,
            schedule: Schedule::default(),
        })
    }

    /// The kept prefix.
    pub fn keep(&self) -> usize {
        self.keep
    }

    /// Slots the ring holds now (grows in 256-slot steps up to `max_size`).
    pub fn capacity(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.dim(2) as usize)
    }

    /// Ring (re)allocations so far.
    pub fn allocations(&self) -> usize {
        self.allocations
    }

    /// True once positions have been evicted (a live rewind is impossible).
    pub fn wrapped(&self) -> bool {
        self.offset > self.max_size
    }

    fn window(&self) -> usize {
        self.max_size - self.keep
    }

    fn slot(&self, p: usize) -> usize {
        if p < self.keep {
            p
        } else {
            self.keep + (p - self.keep) % self.window()
        }
    }

    /// First live non-sink position at offset `o`.
    fn live_from(&self, o: usize) -> usize {
        o.saturating_sub(self.window()).max(self.keep)
    }

    /// Runs covering positions `a..b`, whose non-sink part must fit the window.
    fn runs(&self, a: usize, b: usize) -> SmallVec<[Run; 3]> {
        let mut out: SmallVec<[Run; 3]> = smallvec![];
        let mut p = a;
        if p < self.keep && p < b {
            let end = b.min(self.keep);
            out.push((p, p, end - p));
            p = end;
        }
        assert!(
            b.saturating_sub(p) <= self.window(),
            "positions {p}..{b} exceed the window of {}",
            self.window()
        );
        while p < b {
            let s = self.slot(p);
            let len = (b - p).min(self.max_size - s);
            out.push((s, p, len));
            p += len;
        }
        out
    }

    fn layout(&self, n: usize) -> Layout {
        if self.offset + n <= self.max_size {
            Layout::Linear
        } else if n == 1 {
            Layout::Ring
        } else {
            Layout::Gathered
        }
    }

    /// Old positions the first of `n` new queries still sees (Gathered layout).
    fn old_positions(&self) -> (usize, usize, usize) {
        let o = self.offset;
        let sinks = o.min(self.keep);
        let from = (o + 1).saturating_sub(self.window()).max(self.keep);
        (sinks, from.min(o), o)
    }

    /// Absolute positions of the keys that `update_and_fetch` of `n_queries`
    /// positions will return, in the order it returns them.
    pub fn fetch_positions(&self, n_queries: usize) -> Vec<usize> {
        let e = self.offset + n_queries;
        match self.layout(n_queries) {
            Layout::Linear => (0..e).collect(),
            Layout::Ring => {
                let last = e - 1;
                let w = self.window();
                (0..self.max_size)
                    .map(|s| {
                        if s < self.keep {
                            s
                        } else {
                            last - (self.slot(last) + w - s) % w
                        }
                    })
                    .collect()
            }
            Layout::Gathered => {
                let (sinks, from, to) = self.old_positions();
                (0..sinks).chain(from..to).chain(self.offset..e).collect()
            }
        }
    }

    /// Writes the positions of `at..at+L` that are live at `at+L` into the
    /// ring and moves the offset there.
    fn write(&mut self, keys: &Array, values: &Array, at: usize) -> Result<()> {
        let len = check_input(keys, values)?;
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            check_fits("keys", k, keys)?;
            check_fits("values", v, values)?;
        }
        let e = at + len;
        let need = e.min(self.max_size);
        let cap = self.capacity();
        if cap < need {
            // Below max_size the ring never wrapped: slots 0..at hold positions 0..at.
            let new_cap = round_up(need).min(self.max_size);
            let kept = at.min(cap);
            self.keys = Some(grow(self.keys.as_ref(), keys, kept, new_cap)?);
            self.values = Some(grow(self.values.as_ref(), values, kept, new_cap)?);
            self.allocations += 1;
            tracing::trace!(capacity = new_cap, "RotatingKvCache grew");
        }
        let mut runs = self.runs(at, e.min(self.keep).max(at));
        runs.extend(self.runs(self.live_from(e).max(at), e));
        let (mut k, mut v) = (
            self.keys.take().expect("ring allocated"),
            self.values.take().expect("ring allocated"),
        );
        for (slot, p, n) in runs {
            k = buffer::write(&k, keys, p - at, slot, n)?;
            v = buffer::write(&v, values, p - at, slot, n)?;
        }
        self.keys = Some(k);
        self.values = Some(v);
        self.offset = e;
        Ok(())
    }

    /// Sinks, the old positions the new queries see, then the new keys.
    fn gather(&self, ring: &Array, new: &Array) -> Result<Array> {
        let (sinks, from, to) = self.old_positions();
        let mut parts = Vec::new();
        for (slot, _, n) in self.runs(0, sinks).into_iter().chain(self.runs(from, to)) {
            parts.push(ring.slice_axis(2, slot as i32, (slot + n) as i32)?);
        }
        parts.push(new.clone());
        Ok(ops::concatenate(&parts, 2)?)
    }

    fn window_snapshot(
        &self,
        offset: usize,
        base: Option<(Array, Array)>,
        base_offset: usize,
        tail: Option<(Array, Array)>,
    ) -> Snapshot {
        Snapshot::new(
            offset,
            Payload::Window {
                max_size: self.max_size,
                keep: self.keep,
                base,
                base_offset,
                tail,
            },
        )
    }

    fn ring(&self) -> Option<(Array, Array)> {
        self.keys.clone().zip(self.values.clone())
    }
}

impl Cache for RotatingKvCache {
    fn kind(&self) -> &'static str {
        "RotatingKvCache"
    }

    fn offset(&self) -> usize {
        self.offset
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let n = check_input(keys, values)?;
        let (o, e) = (self.offset, self.offset + n);
        let layout = self.layout(n);
        let due = self.schedule.due(o, e);
        let before = if due.is_empty() { None } else { self.ring() };
        let gathered = match (layout, &self.keys, &self.values) {
            (Layout::Gathered, Some(k), Some(v)) => {
                check_fits("keys", k, keys)?;
                check_fits("values", v, values)?;
                Some((self.gather(k, keys)?, self.gather(v, values)?))
            }
            // Nothing written yet: the new positions are all there is to see.
            (Layout::Gathered, _, _) => Some((keys.clone(), values.clone())),
            _ => None,
        };
        self.write(keys, values, o)?;
        for s in due {
            let tail = (
                keys.slice_axis(2, 0, (s - o) as i32)?,
                values.slice_axis(2, 0, (s - o) as i32)?,
            );
            let snap = self.window_snapshot(s, before.clone(), o, Some(tail));
            self.schedule.record(s, snap);
        }
        if let Some(kv) = gathered {
            return Ok(kv);
        }
        let (k, v) = self.ring().expect("ring written");
        Ok((
            buffer::prefix(&k, e.min(self.max_size))?,
            buffer::prefix(&v, e.min(self.max_size))?,
        ))
    }

    fn make_mask(&self, n_queries: usize) -> Result<AttentionMask> {
        Ok(match self.layout(n_queries) {
            Layout::Linear if n_queries > 1 => AttentionMask::Causal,
            Layout::Linear | Layout::Ring => AttentionMask::None,
            Layout::Gathered => {
                let keys = self.fetch_positions(n_queries);
                let mut mask = Vec::with_capacity(n_queries * keys.len());
                for q in self.offset..self.offset + n_queries {
                    mask.extend(
                        keys.iter()
                            .map(|&k| k <= q && (k < self.keep || q - k < self.window())),
                    );
                }
                AttentionMask::Array(Array::from_slice(
                    &mask,
                    &[n_queries as i32, keys.len() as i32],
                )?)
            }
        })
    }

    fn state(&self) -> Vec<Array> {
        self.keys.iter().chain(&self.values).cloned().collect()
    }

    fn live(&self) -> Result<Vec<Array>> {
        let n = self.offset.min(self.max_size);
        match self.ring() {
            Some((k, v)) => Ok(vec![buffer::prefix(&k, n)?, buffer::prefix(&v, n)?]),
            None => Ok(Vec::new()),
        }
    }

    fn try_restore(&mut self, snapshot: Option<&Snapshot>, target: usize) -> Result<()> {
        let Some(snap) = snapshot else {
            if target > self.offset {
                return Err(Error::RestoreBeyondOffset {
                    target,
                    offset: self.offset,
                });
            }
            if target < self.offset && self.wrapped() {
                return Err(Error::WrappedWithoutSnapshot {
                    target,
                    offset: self.offset,
                    max_size: self.max_size,
                });
            }
            self.offset = target;
            return Ok(());
        };
        let Payload::Window {
            max_size,
            keep,
            base,
            base_offset,
            tail,
        } = &snap.payload
        else {
            return Err(Error::SnapshotKind {
                expected: format!(
                    "RotatingKvCache(max_size {}, keep {})",
                    self.max_size, self.keep
                ),
                found: snap.payload.name(),
            });
        };
        if (*max_size, *keep) != (self.max_size, self.keep) {
            return Err(Error::SnapshotKind {
                expected: format!(
                    "RotatingKvCache(max_size {}, keep {})",
                    self.max_size, self.keep
                ),
                found: snap.payload.name(),
            });
        }
        // A snapshot past the wrap holds exactly one window: only its own offset.
        if target > snap.offset || (target < snap.offset && snap.offset > self.max_size) {
            return Err(Error::SnapshotMismatch {
                target,
                snapshot_offset: snap.offset,
            });
        }
        // Rebuild on the side so that a failure leaves this cache unchanged.
        let mut rebuilt = RotatingKvCache::new(self.max_size, self.keep)?;
        rebuilt.keys = base.as_ref().map(|(k, _)| k.clone());
        rebuilt.values = base.as_ref().map(|(_, v)| v.clone());
        rebuilt.offset = *base_offset;
        if let Some((k, v)) = tail {
            rebuilt.write(k, v, *base_offset)?;
        }
        assert_eq!(
            rebuilt.offset, snap.offset,
            "window snapshot rebuilt to {} instead of {}",
            rebuilt.offset, snap.offset
        );
        self.keys = rebuilt.keys;
        self.values = rebuilt.values;
        self.allocations += rebuilt.allocations;
        self.offset = target;
        Ok(())
    }

    fn snapshot(&self) -> Result<Snapshot> {
        Ok(self.window_snapshot(self.offset, self.ring(), self.offset, None))
    }

    fn schedule_snapshots(&mut self, offsets: &[usize]) {
        if self.schedule.set(offsets, self.offset) {
            let snap = self.window_snapshot(self.offset, self.ring(), self.offset, None);
            self.schedule.record(self.offset, snap);
        }
    }

    fn take_scheduled(&mut self) -> Vec<(usize, Snapshot)> {
        self.schedule.take()
    }

    fn nbytes(&self) -> usize {
        self.schedule.bytes_with(&self.state())
    }

    fn max_size(&self) -> Option<usize> {
        Some(self.max_size)
    }
}
