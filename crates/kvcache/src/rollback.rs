//! Rewinding a whole stack of caches after a speculative verify.

use crate::{Cache, Error, Result, Snapshot};

/// Schedules the same snapshot offsets on every cache of a stack.
pub fn schedule_all(caches: &mut [Box<dyn Cache>], offsets: &[usize]) {
    for c in caches {
        c.schedule_snapshots(offsets);
    }
}

/// Rewinds every cache to `offset`: by moving the offset where the cache can
/// (full attention, an unwrapped window), else from the snapshot captured at
/// `offset` in that layer's list. `snapshots` is empty (no snapshots) or has
/// one list per cache, as [`Cache::take_scheduled`] returns them.
///
/// After a verify of `current + k` drafts from offset `o` that accepted
/// `accepted` drafts, the target is `o + 1 + accepted`.
///
/// # Errors
/// [`Error::SnapshotMissing`] when a layer needs a snapshot that is not
/// there, [`Error::LayerCount`] for a list of the wrong length, and any
/// non-refusal error of [`Cache::try_restore`]. Layers before the failing one
/// are already rewound: the stack is then inconsistent and the request should
/// be abandoned.
pub fn restore_all(
    caches: &mut [Box<dyn Cache>],
    offset: usize,
    snapshots: &[Vec<(usize, Snapshot)>],
) -> Result<()> {
    if !snapshots.is_empty() && snapshots.len() != caches.len() {
        return Err(Error::LayerCount {
            caches: caches.len(),
            snapshots: snapshots.len(),
        });
    }
    for (layer, cache) in caches.iter_mut().enumerate() {
        match cache.try_restore(None, offset) {
            Ok(()) => continue,
            Err(e) if e.is_refusal() => {
                let snap = snapshots
                    .get(layer)
                    .and_then(|list| list.iter().find(|(o, _)| *o == offset))
                    .map(|(_, s)| s);
                let Some(snap) = snap else {
                    tracing::debug!(layer, error = %e, "live rewind refused and no snapshot");
                    return Err(Error::SnapshotMissing {
                        offset,
                        layer,
                        cache_offset: cache.offset(),
                    });
                };
                cache.try_restore(Some(snap), offset)?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Takes every cache's scheduled snapshots, rewinds the stack to `offset`
/// with [`restore_all`] and drops the snapshots (on every path), which is the
/// whole rollback after a verify.
pub fn rollback(caches: &mut [Box<dyn Cache>], offset: usize) -> Result<()> {
    let snapshots: Vec<Vec<(usize, Snapshot)>> =
        caches.iter_mut().map(|c| c.take_scheduled()).collect();
    restore_all(caches, offset, &snapshots)
}
