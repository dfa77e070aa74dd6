//! Completed draft-cache pairs waiting, pinned, for one batched head forward.

use mlx_tensor::{Array, PinSet, ops};

use crate::Result;

/// The flush cap: completed pairs buffered before a flush is forced, so the
/// pinned target hiddens stay bounded however long a committed run is.
pub const PENDING_FLUSH_PAIRS: usize = 256;

/// Runs of look-ahead tokens `[n]` with their target hiddens `[n, H]`, in
/// slot order and contiguous: the pair after the last buffered one is the
/// next slot to write.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    tokens: PinSet,
    hiddens: PinSet,
    /// Pairs across all buffered runs (the sum of their lengths).
    count: usize,
}

impl Pending {
    /// Buffers one run of `n` pairs.
    pub(crate) fn push(&mut self, tokens: &Array, hiddens: &Array, n: usize) {
        self.tokens.push(tokens);
        self.hiddens.push(hiddens);
        self.count += n;
    }

    /// Pairs buffered.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// The buffered runs joined into one `[m]` token run and `[m, H]` hiddens;
    /// the pins stay until [`Pending::clear`].
    pub(crate) fn joined(&self) -> Result<(Array, Array)> {
        Ok((join(&self.tokens)?, join(&self.hiddens)?))
    }

    /// Releases the buffered pairs.
    pub(crate) fn clear(&mut self) {
        self.tokens.clear();
        self.hiddens.clear();
        self.count = 0;
    }
}

fn join(set: &PinSet) -> Result<Array> {
    let parts: Vec<Array> = set.arrays().cloned().collect();
    Ok(match parts.as_slice() {
        [one] => one.clone(),
        _ => ops::concatenate(&parts, 0)?,
    })
}
