//! The [`Cache`] trait that every per-layer cache implements, and [`AttentionMask`].

use std::fmt;

use mlx_tensor::{Array, fast};

use crate::{RecurrentCache, Result, Snapshot};

/// One layer's cache. The runner holds a stack of them as
/// `Vec<Box<dyn Cache>>` (the trait is object safe).
///
/// Attention caches take keys and values laid out `[B, H_kv, L, D]` and
/// append them at [`Cache::offset`]. Recurrent caches hold conv and recurrent
/// state instead; the attention methods return [`crate::Error::NotApplicable`]
/// for them.
///
/// # Rollback
/// After `try_restore(snapshot, n)` succeeds, [`Cache::live`] equals that of a
/// cache built fresh from the first `n` positions, bit for bit.
/// A speculative verify schedules its rollback points before the forward
/// ([`Cache::schedule_snapshots`]), takes the captures after it
/// ([`Cache::take_scheduled`]) and rewinds the stack with
/// [`crate::restore_all`] (or [`crate::rollback`], which does both).
pub trait Cache: fmt::Debug {
    /// The kind of cache, for messages (`"KvCache"`, ...).
    fn kind(&self) -> &'static str;

    /// Whether [`Cache::restore`] reaches every lower offset without a
    /// snapshot (a plain KV cache: rewinding moves its offset). Sliding
    /// windows and recurrent state need a capture taken at the offset.
    fn rewinds_by_offset(&self) -> bool {
        false
    }

    /// Positions written so far (monotonic except through restores).
    fn offset(&self) -> usize;

    /// Appends `L` positions at the offset and returns the keys and values the
    /// new queries attend to, with the mask from [`Cache::make_mask`].
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)>;

    /// The mask for the *next* `update_and_fetch` of `n_queries` positions:
    /// call it before the update (as mlx-lm's `make_mask`), one per forward
    /// per kind of cache, and pass [`AttentionMask::as_fast`] to attention.
    fn make_mask(&self, n_queries: usize) -> Result<AttentionMask>;

    /// The arrays that hold the cache, to evaluate together with a step.
    fn state(&self) -> Vec<Array>;

    /// The logical contents (keys and values of the live positions, or the
    /// recurrent states), empty before the first write. Two caches with equal
    /// `live()` and offset behave the same for every later update.
    fn live(&self) -> Result<Vec<Array>>;

    /// Rewinds (or, with a snapshot, restores) to `offset`. On error the cache
    /// is unchanged; [`crate::Error::is_refusal`] errors may succeed with a
    /// snapshot captured at `offset`.
    fn try_restore(&mut self, snapshot: Option<&Snapshot>, offset: usize) -> Result<()>;

    /// [`Cache::try_restore`] with refusals as `Ok(false)`: true when the
    /// cache now stands at `offset`, false when it needs a (fitting) snapshot
    /// and is unchanged. Bad input (a target past the offset without a
    /// snapshot, a snapshot from another kind of cache) stays an `Err`.
    fn restore(&mut self, snapshot: Option<&Snapshot>, offset: usize) -> Result<bool> {
        match self.try_restore(snapshot, offset) {
            Ok(()) => Ok(true),
            Err(e) if e.is_refusal() => {
                tracing::debug!(kind = self.kind(), offset, error = %e, "restore refused");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Captures the state now.
    fn snapshot(&self) -> Result<Snapshot>;

    /// Makes the next updates capture a snapshot as they reach each of these
    /// absolute offsets (strictly ascending, at least the current offset; one
    /// equal to the offset is captured at once).
    ///
    /// # Panics
    /// When the offsets are out of order or already passed, or the previous
    /// schedule was not drained with [`Cache::take_scheduled`].
    fn schedule_snapshots(&mut self, offsets: &[usize]);

    /// Drains the schedule: the snapshots captured, ascending by offset.
    /// Offsets never reached are forgotten.
    fn take_scheduled(&mut self) -> Vec<(usize, Snapshot)>;

    /// Bytes held: buffers at their capacity, plus captures not yet taken.
    fn nbytes(&self) -> usize;

    /// The window size of a sliding-window cache.
    fn max_size(&self) -> Option<usize>;

    /// The whole key and value buffers `[B, H, capacity, D]` whose first
    /// [`Cache::offset`] positions are the live keys and values, for kernels
    /// that read them in place (a cache that keeps them otherwise, or keeps
    /// none, says `None`).
    fn kv_buffers(&self) -> Option<(Array, Array)> {
        None
    }

    /// Asks for room for `positions` positions in all, so that the writes up
    /// to there allocate once (at the next write) instead of growing step by
    /// step. A hint: caches without growing buffers ignore it, and a smaller
    /// value than the buffers hold never shrinks them.
    fn reserve(&mut self, positions: usize) {
        let _ = positions;
    }

    /// This cache as a [`RecurrentCache`], for the layers that own one.
    fn as_recurrent(&self) -> Option<&RecurrentCache> {
        None
    }

    /// This cache as a mutable [`RecurrentCache`].
    fn as_recurrent_mut(&mut self) -> Option<&mut RecurrentCache> {
        None
    }
}

/// The attention mask that goes with the keys an update returns.
#[derive(Debug, Clone)]
pub enum AttentionMask {
    /// Every query sees every returned key.
    None,
    /// Causal, aligned at the end (query `i` of `L` sees keys `0..=S-L+i`).
    Causal,
    /// Boolean `[L, S]`, true where the query sees the key.
    Array(Array),
}

impl AttentionMask {
    /// The form [`fast::scaled_dot_product_attention`] takes.
    pub fn as_fast(&self) -> fast::Mask<'_> {
        match self {
            AttentionMask::None => fast::Mask::None,
            AttentionMask::Causal => fast::Mask::Causal,
            AttentionMask::Array(a) => fast::Mask::Array(a),
        }
    }
}
