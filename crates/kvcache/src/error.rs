//! The crate's error type: impossible restores, mismatched inputs and MLX failures.

use mlx_tensor::Dtype;

/// Errors from cache updates and restores.
///
/// Some variants are *refusals*: the cache is unchanged and the same rewind
/// may succeed with a snapshot ([`Error::is_refusal`]). [`crate::Cache::restore`]
/// reports those as `Ok(false)`; every other variant is bad input or an MLX
/// failure and stays an `Err`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A rewind to an offset the cache has not reached, without a snapshot
    /// that holds it.
    #[error("cannot restore to offset {target}: the cache holds only {offset} positions")]
    RestoreBeyondOffset {
        /// The offset asked for.
        target: usize,
        /// The cache's offset.
        offset: usize,
    },
    /// A sliding-window cache that has wrapped lost the positions a live
    /// rewind would need; restore from a snapshot scheduled at `target`.
    #[error(
        "rotating cache (max_size {max_size}) wrapped at offset {offset}: rewinding to {target} \
         needs a snapshot captured at {target} (schedule_snapshots before the forward)"
    )]
    WrappedWithoutSnapshot {
        /// The offset asked for.
        target: usize,
        /// The cache's offset.
        offset: usize,
        /// The window size.
        max_size: usize,
    },
    /// A recurrent cache folds every position into its state and cannot
    /// rewind by moving its offset.
    #[error(
        "recurrent cache at offset {offset} cannot rewind to {target} without a snapshot \
         captured at {target}"
    )]
    CannotRewind {
        /// The offset asked for.
        target: usize,
        /// The cache's offset.
        offset: usize,
    },
    /// No snapshot at `offset` was given for a layer that needs one.
    #[error(
        "layer {layer} (offset {cache_offset}) needs a snapshot at offset {offset} and none was \
         captured there"
    )]
    SnapshotMissing {
        /// The offset the rewind needed.
        offset: usize,
        /// Index of the cache in the stack.
        layer: usize,
        /// That cache's offset.
        cache_offset: usize,
    },
    /// The snapshot does not hold the state at `target`.
    #[error("a snapshot taken at offset {snapshot_offset} cannot restore offset {target}")]
    SnapshotMismatch {
        /// The offset asked for.
        target: usize,
        /// The offset the snapshot captured.
        snapshot_offset: usize,
    },
    /// A zero-copy snapshot whose cache has been rewound or replaced since it
    /// was taken; its positions may have been overwritten.
    #[error(
        "the snapshot at offset {snapshot_offset} refers to cache contents that a later rewind \
         invalidated"
    )]
    SnapshotStale {
        /// The offset the snapshot captured.
        snapshot_offset: usize,
    },
    /// A snapshot made by another kind of cache (or another window size).
    #[error("a {found} snapshot cannot restore a {expected}")]
    SnapshotKind {
        /// The cache being restored.
        expected: String,
        /// What the snapshot came from.
        found: String,
    },
    /// An operation that this kind of cache does not have.
    #[error("{cache} has no {op}: {hint}")]
    NotApplicable {
        /// The cache kind.
        cache: &'static str,
        /// The operation called.
        op: &'static str,
        /// What to call instead.
        hint: &'static str,
    },
    /// Keys, values or states whose shape does not fit the cache.
    #[error("{name} has shape {found:?}, expected {expected}")]
    ShapeMismatch {
        /// Which input.
        name: &'static str,
        /// What the cache needs, in words (for example `[1, 2, L, 64]`).
        expected: String,
        /// The shape given.
        found: Vec<i32>,
    },
    /// Keys or values of another dtype than the cache holds.
    #[error("{name} has dtype {found:?}, the cache holds {expected:?}")]
    DtypeMismatch {
        /// Which input.
        name: &'static str,
        /// The cache's dtype.
        expected: Dtype,
        /// The dtype given.
        found: Dtype,
    },
    /// A rotating cache whose kept prefix leaves no room for the window.
    #[error("rotating cache needs keep < max_size, got keep {keep} and max_size {max_size}")]
    BadWindow {
        /// The window size.
        max_size: usize,
        /// The kept prefix.
        keep: usize,
    },
    /// A stack rewind given a snapshot list per layer whose length is wrong.
    #[error("restore_all got snapshots for {snapshots} layers and {caches} caches")]
    LayerCount {
        /// Caches in the stack.
        caches: usize,
        /// Snapshot lists given.
        snapshots: usize,
    },
    /// An MLX call failed.
    #[error(transparent)]
    Mlx(#[from] mlx_tensor::Error),
}

impl Error {
    /// True when the cache refused a rewind and is unchanged: the same rewind
    /// may succeed with a snapshot captured at the target offset.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Error::WrappedWithoutSnapshot { .. }
                | Error::CannotRewind { .. }
                | Error::SnapshotMismatch { .. }
                | Error::SnapshotStale { .. }
        )
    }
}

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
