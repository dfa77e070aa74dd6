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
    /// Each buffered run's length, in order.
    lens: Vec<usize>,
    /// Pairs across all buffered runs (the sum of their lengths).
    count: usize,
}

impl Pending {
    /// Buffers one run of `n` pairs.
    pub(crate) fn push(&mut self, tokens: &Array, hiddens: &Array, n: usize) {
        self.tokens.push(tokens);
        self.hiddens.push(hiddens);
        self.lens.push(n);
        self.count += n;
    }

    /// Pairs buffered.
    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Pairs `start..start + n` of the buffered runs as one `[n]` token run
    /// and `[n, H]` hiddens (copies of only those pairs, or the run itself
    /// when it is exactly one run); the pins stay until [`Pending::clear`].
    pub(crate) fn span(&self, start: usize, n: usize) -> Result<(Array, Array)> {
        assert!(
            n > 0 && start + n <= self.count,
            "mtp-draft: pairs {start}..{} of {} buffered",
            start + n,
            self.count
        );
        let (mut toks, mut hids) = (Vec::new(), Vec::new());
        let mut first = 0;
        for ((t, h), &len) in self
            .tokens
            .arrays()
            .zip(self.hiddens.arrays())
            .zip(&self.lens)
        {
            let (lo, hi) = (start.max(first), (start + n).min(first + len));
            if lo < hi {
                if hi - lo == len {
                    toks.push(t.clone());
                    hids.push(h.clone());
                } else {
                    let (a, b) = ((lo - first) as i32, (hi - first) as i32);
                    toks.push(t.slice_axis(0, a, b)?);
                    hids.push(h.slice_axis(0, a, b)?);
                }
            }
            first += len;
            if first >= start + n {
                break;
            }
        }
        Ok((join(toks)?, join(hids)?))
    }

    /// Releases the buffered pairs.
    pub(crate) fn clear(&mut self) {
        self.tokens.clear();
        self.hiddens.clear();
        self.lens.clear();
        self.count = 0;
    }
}

fn join(parts: Vec<Array>) -> Result<Array> {
    Ok(match parts.as_slice() {
        [one] => one.clone(),
        _ => ops::concatenate(&parts, 0)?,
    })
}
