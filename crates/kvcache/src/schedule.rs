//! Scheduled snapshot offsets, shared by every cache kind.

use mlx_tensor::Array;
use smallvec::SmallVec;

use crate::Snapshot;

/// Offsets at which the next writes capture a snapshot, and the captures.
///
/// Invariant: `pending` is strictly ascending and every entry is above the
/// owning cache's offset; `captured` is in ascending offset order.
#[derive(Debug, Default)]
pub(crate) struct Schedule {
    pending: SmallVec<[usize; 8]>,
    captured: Vec<(usize, Snapshot)>,
}

impl Schedule {
    /// Stores `offsets`; returns true when `current` is among them (the
    /// caller captures it at once and records it).
    ///
    /// # Panics
    /// When the previous schedule was not drained, or the offsets are not
    /// strictly ascending and at least `current`: both are caller bugs.
    pub(crate) fn set(&mut self, offsets: &[usize], current: usize) -> bool {
        assert!(
            self.pending.is_empty() && self.captured.is_empty(),
            "previous snapshot schedule not drained: {} pending, {} captured (call take_scheduled)",
            self.pending.len(),
            self.captured.len()
        );
        assert!(
            offsets.windows(2).all(|w| w[0] < w[1]),
            "scheduled snapshot offsets must be strictly ascending, got {offsets:?}"
        );
        if let Some(&first) = offsets.first() {
            assert!(
                first >= current,
                "cannot schedule a snapshot at offset {first}: the cache is already at {current}"
            );
        }
        let now = offsets.first() == Some(&current);
        self.pending
            .extend(offsets.iter().copied().filter(|&o| o > current));
        now
    }

    /// Pending offsets in `(from, to]`, ascending.
    pub(crate) fn due(&self, from: usize, to: usize) -> SmallVec<[usize; 8]> {
        self.pending
            .iter()
            .copied()
            .filter(|&o| o > from && o <= to)
            .collect()
    }

    /// True when `offset` is scheduled and not yet captured.
    pub(crate) fn is_pending(&self, offset: usize) -> bool {
        self.pending.contains(&offset)
    }

    /// Records the capture at `offset` and removes it from the pending list.
    pub(crate) fn record(&mut self, offset: usize, snapshot: Snapshot) {
        assert_eq!(
            snapshot.offset(),
            offset,
            "snapshot recorded under offset {offset} restores offset {}",
            snapshot.offset()
        );
        self.pending.retain(|&mut o| o != offset);
        let at = self.captured.partition_point(|(o, _)| *o < offset);
        self.captured.insert(at, (offset, snapshot));
    }

    /// Drains the captures; offsets never reached are dropped.
    pub(crate) fn take(&mut self) -> Vec<(usize, Snapshot)> {
        if !self.pending.is_empty() {
            tracing::debug!(
                uncaptured = ?self.pending,
                "snapshot schedule drained before these offsets were reached"
            );
            self.pending.clear();
        }
        std::mem::take(&mut self.captured)
    }

    /// The captures not yet taken.
    /// Bytes of a cache whose live state is `state` plus the snapshots this
    /// schedule holds: what `Cache::nbytes` reports for KV and rotating caches.
    pub(crate) fn bytes_with(&self, state: &[Array]) -> usize {
        state.iter().map(Array::nbytes).sum::<usize>()
            + self.captured().map(Snapshot::nbytes).sum::<usize>()
    }

    pub(crate) fn captured(&self) -> impl Iterator<Item = &Snapshot> {
        self.captured.iter().map(|(_, s)| s)
    }
}
