//! [`RestorePoints`]: snapshots that let a stack with recurrent layers
//! rewind after a forward without replaying tokens.
//!
//! A recurrent layer folds every position into its state, so it rewinds
//! only to a state captured during the forward (see
//! [`kvcache::RecurrentCache`]). Before each forward the session schedules the
//! offsets a rewind may need (the offset before the step, which the MTP
//! boundary re-run and the plain loop's end-of-sequence drop use; every
//! draft position of a verify); after it, the captures are kept here until
//! the next forward. A stack of KV caches schedules nothing and rewinds by
//! moving offsets, as before.

use kvcache::{Cache, Snapshot, restore_all, schedule_all};

use crate::error::Result;

/// The captures of the last forward, with the tokens they were taken under.
#[derive(Debug, Default)]
pub(crate) struct RestorePoints {
    /// One list per cache (as [`Cache::take_scheduled`] returns them), or
    /// empty when nothing was scheduled.
    lists: Vec<Vec<(usize, Snapshot)>>,
    /// A capture at offset `o` restores the state of exactly these first `o`
    /// tokens; it is used only while the session's first `o` tokens agree.
    tokens: Vec<u32>,
}

impl RestorePoints {
    /// Schedules `offsets` on every cache when some cache cannot rewind by
    /// its offset; returns whether it did.
    pub(crate) fn schedule(caches: &mut [Box<dyn Cache>], offsets: &[usize]) -> bool {
        if !caches.iter().any(|c| c.as_recurrent().is_some()) {
            return false;
        }
        schedule_all(caches, offsets);
        true
    }

    /// Takes the captures of the forward just built; `tokens` are the tokens
    /// the captured offsets index (at least up to the deepest valid one).
    pub(crate) fn take(&mut self, caches: &mut [Box<dyn Cache>], tokens: &[u32]) {
        self.lists = caches.iter_mut().map(|c| c.take_scheduled()).collect();
        self.tokens.clear();
        self.tokens.extend_from_slice(tokens);
    }

    /// Rewinds every cache to `offset` (`committed` holds at least the first
    /// `offset` tokens the caches will hold): live where a cache can, else
    /// from a capture taken under the same tokens.
    pub(crate) fn restore(
        &self,
        caches: &mut [Box<dyn Cache>],
        offset: usize,
        committed: &[u32],
    ) -> Result<()> {
        let valid = !self.lists.is_empty()
            && self.tokens.len() >= offset
            && committed.len() >= offset
            && self.tokens[..offset] == committed[..offset];
        let lists: &[Vec<(usize, Snapshot)>] = if valid { &self.lists } else { &[] };
        Ok(restore_all(caches, offset, lists)?)
    }
}
