//! [`RecurrentCache`]: conv and recurrent state of a linear-attention or SSM layer.

use mlx_tensor::{Array, Dtype, ops};
use smallvec::SmallVec;

use crate::schedule::Schedule;
use crate::snapshot::Payload;
use crate::{AttentionMask, Cache, Error, Result, Snapshot};

/// The state of a GatedDeltaNet / Mamba-style layer: a conv tail (for
/// example `[B, conv_kernel - 1, conv_dim]`) and a recurrent state (for
/// example `[B, H_v, D_v, D_k]`, float32). The cache does not interpret the
/// shapes; it keeps them fixed once set.
///
/// Every position is folded into the state, so it cannot rewind by offset.
/// Rollback points come from the forward itself: when offsets are scheduled,
/// the layer asks [`RecurrentCache::splits`] which interior states to emit,
/// hands each to [`RecurrentCache::capture`], then calls
/// [`RecurrentCache::update`] with the final state. A state at an offset
/// equal to the cache's offset is captured at scheduling time.
#[derive(Debug, Default)]
pub struct RecurrentCache {
    conv: Option<Array>,
    recurrent: Option<Array>,
    offset: usize,
    schedule: Schedule,
}

fn check_same(name: &'static str, old: Option<&Array>, new: &Array) -> Result<()> {
    let Some(old) = old else { return Ok(()) };
    if old.shape() != new.shape() {
        return Err(Error::ShapeMismatch {
            name,
            expected: format!("{:?} as held so far", old.shape().as_slice()),
            found: new.shape().to_vec(),
        });
    }
    if old.dtype() != new.dtype() {
        return Err(Error::DtypeMismatch {
            name,
            expected: old.dtype(),
            found: new.dtype(),
        });
    }
    Ok(())
}

impl RecurrentCache {
    /// An empty cache at offset 0 with no state yet.
    pub fn new() -> RecurrentCache {
        RecurrentCache::default()
    }

    /// The conv state, `None` before the first update.
    pub fn conv(&self) -> Option<&Array> {
        self.conv.as_ref()
    }

    /// The recurrent state, `None` before the first update.
    pub fn recurrent(&self) -> Option<&Array> {
        self.recurrent.as_ref()
    }

    /// The conv state, or zeros of `shape` before the first update.
    pub fn conv_or_zeros(&self, shape: &[i32], dtype: Dtype) -> Result<Array> {
        match &self.conv {
            Some(c) => Ok(c.clone()),
            None => Ok(ops::zeros(shape, dtype)?),
        }
    }

    /// The recurrent state, or zeros of `shape` before the first update.
    pub fn recurrent_or_zeros(&self, shape: &[i32], dtype: Dtype) -> Result<Array> {
        match &self.recurrent {
            Some(r) => Ok(r.clone()),
            None => Ok(ops::zeros(shape, dtype)?),
        }
    }

    /// Scheduled offsets strictly inside the next forward of `positions`
    /// positions, relative to the current offset (`1..positions`): the
    /// interior states the layer should emit and [`capture`](Self::capture).
    pub fn splits(&self, positions: usize) -> SmallVec<[usize; 8]> {
        let o = self.offset;
        self.schedule
            .due(o, o + positions)
            .into_iter()
            .filter(|&s| s < o + positions)
            .map(|s| s - o)
            .collect()
    }

    /// Offers the state after position `offset - 1` of the running forward;
    /// kept (and true returned) when `offset` is scheduled. Safe to call for
    /// every position.
    ///
    /// # Panics
    /// When `offset` is not past the cache's offset: states of the running
    /// forward are always ahead of it.
    pub fn capture(&mut self, offset: usize, conv: &Array, recurrent: &Array) -> bool {
        assert!(
            offset > self.offset,
            "capture at offset {offset} is not inside a forward from offset {}",
            self.offset
        );
        if !self.schedule.is_pending(offset) {
            return false;
        }
        let snap = Snapshot::new(
            offset,
            Payload::Recurrent {
                conv: Some(conv.clone()),
                recurrent: Some(recurrent.clone()),
            },
        );
        self.schedule.record(offset, snap);
        true
    }

    /// Stores the state after a forward of `positions` positions and moves
    /// the offset by that much; a snapshot scheduled at the new offset is
    /// captured.
    pub fn update(&mut self, conv: Array, recurrent: Array, positions: usize) -> Result<()> {
        check_same("conv state", self.conv.as_ref(), &conv)?;
        check_same("recurrent state", self.recurrent.as_ref(), &recurrent)?;
        self.offset += positions;
        if positions > 0 {
            // A no-op when the forward already captured its last state.
            self.capture_end(&conv, &recurrent);
        }
        self.conv = Some(conv);
        self.recurrent = Some(recurrent);
        Ok(())
    }

    fn capture_end(&mut self, conv: &Array, recurrent: &Array) {
        if self.schedule.is_pending(self.offset) {
            let snap = Snapshot::new(
                self.offset,
                Payload::Recurrent {
                    conv: Some(conv.clone()),
                    recurrent: Some(recurrent.clone()),
                },
            );
            self.schedule.record(self.offset, snap);
        }
    }

    fn current(&self) -> Snapshot {
        Snapshot::new(
            self.offset,
            Payload::Recurrent {
                conv: self.conv.clone(),
                recurrent: self.recurrent.clone(),
            },
        )
    }
}

impl Cache for RecurrentCache {
    fn kind(&self) -> &'static str {
        "RecurrentCache"
    }

    fn offset(&self) -> usize {
        self.offset
    }

    fn update_and_fetch(&mut self, _keys: &Array, _values: &Array) -> Result<(Array, Array)> {
        Err(Error::NotApplicable {
            cache: "RecurrentCache",
            op: "update_and_fetch",
            hint: "use as_recurrent_mut() and update(conv, recurrent, positions)",
        })
    }

    fn make_mask(&self, _n_queries: usize) -> Result<AttentionMask> {
        Err(Error::NotApplicable {
            cache: "RecurrentCache",
            op: "make_mask",
            hint: "a recurrent layer attends to no keys",
        })
    }

    /// The states plus captured snapshots not yet taken, so that one eval of
    /// a prefill step materialises them too.
    fn state(&self) -> Vec<Array> {
        let mut all: Vec<Array> = self.conv.iter().chain(&self.recurrent).cloned().collect();
        for s in self.schedule.captured() {
            all.extend(s.arrays());
        }
        all
    }

    fn live(&self) -> Result<Vec<Array>> {
        Ok(self.conv.iter().chain(&self.recurrent).cloned().collect())
    }

    fn try_restore(&mut self, snapshot: Option<&Snapshot>, target: usize) -> Result<()> {
        let Some(snap) = snapshot else {
            return match target.cmp(&self.offset) {
                std::cmp::Ordering::Equal => Ok(()),
                std::cmp::Ordering::Less => Err(Error::CannotRewind {
                    target,
                    offset: self.offset,
                }),
                std::cmp::Ordering::Greater => Err(Error::RestoreBeyondOffset {
                    target,
                    offset: self.offset,
                }),
            };
        };
        let Payload::Recurrent { conv, recurrent } = &snap.payload else {
            return Err(Error::SnapshotKind {
                expected: self.kind().into(),
                found: snap.payload.name(),
            });
        };
        if target != snap.offset {
            return Err(Error::SnapshotMismatch {
                target,
                snapshot_offset: snap.offset,
            });
        }
        self.conv = conv.clone();
        self.recurrent = recurrent.clone();
        self.offset = target;
        Ok(())
    }

    fn snapshot(&self) -> Result<Snapshot> {
        Ok(self.current())
    }

    fn schedule_snapshots(&mut self, offsets: &[usize]) {
        if self.schedule.set(offsets, self.offset) {
            let snap = self.current();
            self.schedule.record(self.offset, snap);
        }
    }

    fn take_scheduled(&mut self) -> Vec<(usize, Snapshot)> {
        self.schedule.take()
    }

    fn nbytes(&self) -> usize {
        self.state().iter().map(Array::nbytes).sum()
    }

    fn max_size(&self) -> Option<usize> {
        None
    }

    fn as_recurrent(&self) -> Option<&RecurrentCache> {
        Some(self)
    }

    fn as_recurrent_mut(&mut self) -> Option<&mut RecurrentCache> {
        Some(self)
    }
}
