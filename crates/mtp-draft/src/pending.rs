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

    /// Joins the buffered runs into one and starts that join on the device
    /// without waiting; a no-op for one run or none.
    ///
    /// Why: a flush joins its span's runs, one copy node per run and array,
    /// so on CUDA a flush after a plain stretch of `m` one-token runs is a
    /// graph MLX has not seen for each new `m`, built anew (`cudaGraphInstantiate`,
    /// 0.7–2.8 ms a catch-up on an H100: docs/gpu.md, session 38). Joined
    /// after every run, each join is the same two-input graph, and the
    /// flush slices one run whatever the stretch's length.
    pub(crate) fn compact(&mut self) -> Result<()> {
        if self.lens.len() < 2 {
            return Ok(());
        }
        let tokens = join(self.tokens.arrays().cloned().collect())?;
        let hiddens = join(self.hiddens.arrays().cloned().collect())?;
        mlx_tensor::async_eval(&[tokens.clone(), hiddens.clone()])?;
        let count = self.count;
        self.clear();
        self.push(&tokens, &hiddens, count);
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    fn run(first: u32, n: usize) -> (Array, Array) {
        let ids: Vec<u32> = (first..first + n as u32).collect();
        let hid: Vec<f32> = ids.iter().flat_map(|&i| [i as f32, -(i as f32)]).collect();
        (
            Array::from_slice(&ids, &[n as i32]).unwrap(),
            Array::from_slice(&hid, &[n as i32, 2]).unwrap(),
        )
    }

    /// A kept run of 3 pairs, then one-token runs as a plain stretch pushes them.
    fn stretch(plain: usize) -> Pending {
        let mut p = Pending::default();
        let (t, h) = run(0, 3);
        p.push(&t, &h, 3);
        for i in 0..plain {
            let (t, h) = run(3 + i as u32, 1);
            p.push(&t, &h, 1);
        }
        p
    }

    #[test]
    fn compacted_runs_give_the_same_spans_from_one_run() {
        for plain in [0, 1, 6] {
            let before = stretch(plain);
            let mut after = stretch(plain);
            after.compact().unwrap();
            assert_eq!(after.count(), before.count());
            assert_eq!(after.lens.len(), 1, "{plain}: one run after compacting");
            for (start, n) in [(0, 3 + plain), (1, 2 + plain), (2, 1)] {
                let (t0, h0) = before.span(start, n).unwrap();
                let (t1, h1) = after.span(start, n).unwrap();
                // One run is sliced, never joined again at the flush: the
                // flush's operations do not depend on the stretch's length.
                let census = h1.pending_census();
                assert!(!census.contains("Concatenate"), "{plain}: {census}");
                if plain > 0 && start == 0 {
                    let census = h0.pending_census();
                    assert!(census.contains("Concatenate"), "{plain}: {census}");
                }
                assert_eq!(t0.to_vec::<u32>().unwrap(), t1.to_vec::<u32>().unwrap());
                assert_eq!(h0.to_vec::<f32>().unwrap(), h1.to_vec::<f32>().unwrap());
            }
        }
    }
}
