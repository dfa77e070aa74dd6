//! [`KvCache`]: full attention, preallocated in 256-slot steps, rewound by moving the offset.

use std::sync::atomic::{AtomicU64, Ordering};

use mlx_tensor::Array;

use crate::buffer::{self, check_fits, check_input, grow, round_up};
use crate::schedule::Schedule;
use crate::snapshot::Payload;
use crate::{AttentionMask, Cache, Error, Result, Snapshot};

/// Identifies a cache for its zero-copy snapshots.
static NEXT_ORIGIN: AtomicU64 = AtomicU64::new(1);

/// A full-attention cache: keys and values `[B, H, capacity, D]`, written in
/// place (`buffer::write`: MLX's `slice_update`, on the CPU our
/// `ops::kv_write_cpu`), grown by [`buffer::STEP`] positions at a time.
///
/// A rewind moves the offset; positions past it are dead and overwritten by
/// later writes. So `restore(None, n)` works for every `n ≤ offset` and a
/// speculative rollback costs nothing. Scheduled snapshots are zero-copy
/// marks; [`Cache::snapshot`] returns an owned copy of the live positions
/// (for a prefix cache).
#[derive(Debug)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    /// Positions `0..offset` of the buffers are live.
    offset: usize,
    origin: u64,
    /// Bumped whenever live positions may change (a rewind or a refill), so
    /// older zero-copy marks are refused instead of restoring other data.
    epoch: u64,
    allocations: usize,
    /// Positions [`Cache::reserve`] asked room for: the next growth goes at
    /// least this far.
    reserved: usize,
    schedule: Schedule,
}

impl Default for KvCache {
    fn default() -> Self {
        KvCache::new()
    }
}

impl KvCache {
    /// An empty cache; buffers are allocated on the first write.
    pub fn new() -> KvCache {
        KvCache {
            keys: None,
            values: None,
            offset: 0,
            origin: NEXT_ORIGIN.fetch_add(1, Ordering::Relaxed),
            epoch: 0,
            allocations: 0,
            reserved: 0,
            schedule: Schedule::default(),
        }
    }

    /// Positions the buffers hold (a multiple of 256), 0 before the first write.
    pub fn capacity(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.dim(2) as usize)
    }

    /// Buffer (re)allocations so far: one per 256-position step, not per token.
    pub fn allocations(&self) -> usize {
        self.allocations
    }

    /// Writes `keys`/`values` at position `at`, growing the buffers as needed.
    fn write_at(&mut self, keys: &Array, values: &Array, at: usize) -> Result<()> {
        let len = check_input(keys, values)?;
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            check_fits("keys", k, keys)?;
            check_fits("values", v, values)?;
        }
        let end = at + len;
        if self.capacity() < end.max(self.reserved) {
            let cap = round_up(end.max(self.reserved));
            self.keys = Some(grow(self.keys.as_ref(), keys, at, cap)?);
            self.values = Some(grow(self.values.as_ref(), values, at, cap)?);
            self.allocations += 1;
            tracing::trace!(capacity = cap, "KvCache grew");
        }
        let (k, v) = (self.keys.take(), self.values.take());
        let (k, v) = (k.expect("buffer allocated"), v.expect("buffer allocated"));
        self.keys = Some(buffer::write(&k, keys, 0, at, len)?);
        self.values = Some(buffer::write(&v, values, 0, at, len)?);
        self.offset = end;
        Ok(())
    }

    fn marker(&self) -> Snapshot {
        Snapshot::new(
            self.offset,
            Payload::Marker {
                origin: self.origin,
                epoch: self.epoch,
            },
        )
    }

    fn rewind_to(&mut self, target: usize) {
        assert!(
            target <= self.offset,
            "rewind {target} past {}",
            self.offset
        );
        if target < self.offset {
            self.epoch += 1;
        }
        self.offset = target;
    }
}

impl Cache for KvCache {
    fn kind(&self) -> &'static str {
        "KvCache"
    }

    fn rewinds_by_offset(&self) -> bool {
        true
    }

    fn offset(&self) -> usize {
        self.offset
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let from = self.offset;
        self.write_at(keys, values, from)?;
        for s in self.schedule.due(from, self.offset) {
            let mut snap = self.marker();
            snap.offset = s;
            self.schedule.record(s, snap);
        }
        self.live().map(|mut kv| {
            let v = kv.pop().expect("live values");
            (kv.pop().expect("live keys"), v)
        })
    }

    fn make_mask(&self, n_queries: usize) -> Result<AttentionMask> {
        Ok(if n_queries > 1 {
            AttentionMask::Causal
        } else {
            AttentionMask::None
        })
    }

    fn state(&self) -> Vec<Array> {
        self.keys.iter().chain(&self.values).cloned().collect()
    }

    fn live(&self) -> Result<Vec<Array>> {
        match (&self.keys, &self.values) {
            (Some(k), Some(v)) => Ok(vec![
                buffer::prefix(k, self.offset)?,
                buffer::prefix(v, self.offset)?,
            ]),
            _ => Ok(Vec::new()),
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
            self.rewind_to(target);
            return Ok(());
        };
        if target > snap.offset {
            return Err(Error::SnapshotMismatch {
                target,
                snapshot_offset: snap.offset,
            });
        }
        match &snap.payload {
            Payload::Marker { origin, epoch } => {
                if *origin != self.origin || *epoch != self.epoch {
                    return Err(Error::SnapshotStale {
                        snapshot_offset: snap.offset,
                    });
                }
                // Same cache, no rewind since the mark: positions below it are intact.
                self.rewind_to(target);
                Ok(())
            }
            Payload::Kv { kv } => {
                if let Some((k, v)) = kv.as_ref().filter(|_| target > 0) {
                    let end = target as i32;
                    let (k, v) = (k.slice_axis(2, 0, end)?, v.slice_axis(2, 0, end)?);
                    self.write_at(&k, &v, 0)?;
                }
                self.offset = target;
                self.epoch += 1;
                Ok(())
            }
            other => Err(Error::SnapshotKind {
                expected: self.kind().into(),
                found: other.name(),
            }),
        }
    }

    fn snapshot(&self) -> Result<Snapshot> {
        let kv = match self.live()?.as_slice() {
            [k, v] => Some((k.clone(), v.clone())),
            _ => None,
        };
        Ok(Snapshot::new(self.offset, Payload::Kv { kv }))
    }

    fn schedule_snapshots(&mut self, offsets: &[usize]) {
        if self.schedule.set(offsets, self.offset) {
            let snap = self.marker();
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
        None
    }

    fn kv_buffers(&self) -> Option<(Array, Array)> {
        Some((self.keys.clone()?, self.values.clone()?))
    }

    fn reserve(&mut self, positions: usize) {
        self.reserved = positions;
    }
}
