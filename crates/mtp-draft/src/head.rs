//! The seam to the model: [`DraftHead`], one forward of a multi-token-prediction head.

use kvcache::Cache;
use mlx_tensor::Array;

use crate::Result;

/// What one head forward returns, row for row with its input.
#[derive(Debug, Clone)]
pub struct HeadOutput {
    /// `[L, D]`: the rows before the unembedding (after the head's final
    /// norm, if it has one). Only the row being sampled is ever unembedded,
    /// through [`DraftHead::unembed`], so a 256-row flush costs no
    /// vocabulary-sized matmul.
    pub out: Array,
    /// `[L, H]`: the hidden that conditions the next draft step, chained in
    /// place of a target hidden when the head drafts from its own output.
    pub hidden: Array,
}

/// A multi-token-prediction head: the model side of a draft session.
///
/// `runner` implements it for the MTP layers of Qwen3.5, DeepSeek-V3 and
/// MiMo; tests implement it with fakes. The session decides what to feed and
/// where; the head only computes and writes its caches.
///
/// Row `i` of a forward fuses `tokens[i]` (the look-ahead token) with
/// `hiddens[i]` and sits at RoPE position and draft-cache slot
/// `position + i`. A head with draft caches appends the `L` rows to every
/// cache at `position`, which the session guarantees equals the caches'
/// offset. A cacheless ("single-position") head attends the target caches
/// read-only and writes nothing.
pub trait DraftHead {
    /// One forward over `L ≥ 1` rows: `tokens` is `[L]` `u32` (it may still be
    /// a lazy device array) and `hiddens` is `[L, H]`.
    fn forward(&mut self, tokens: &Array, hiddens: &Array, position: usize) -> Result<HeadOutput>;

    /// Logits `[R, V]` for rows `[R, D]` of [`HeadOutput::out`].
    fn unembed(&mut self, out: &Array) -> Result<Array>;

    /// The head's draft caches; empty for a cacheless head.
    fn caches(&self) -> &[Box<dyn Cache>];

    /// The head's draft caches, to rewind them.
    fn caches_mut(&mut self) -> &mut [Box<dyn Cache>];

    /// The draft caches' offset (they move together), or `None` for a
    /// cacheless head.
    fn cache_offset(&self) -> Option<usize> {
        self.caches().first().map(|c| c.offset())
    }

    /// The row count a flush of `rows` buffered pairs runs its forward over.
    /// A head whose caches all rewind by offset may ask for more (a bucketed
    /// shape its backend has already built): the session pads the pairs with
    /// copies of the last one and rewinds the caches past the padding, which
    /// causal attention keeps out of the real rows. Values below `rows` are
    /// taken as `rows`. The default keeps `rows`.
    fn flush_rows(&self, rows: usize) -> usize {
        rows
    }

    /// The most buffered pairs one flush forward may take when the draft
    /// caches sit at `at`. A flush of more pairs runs as several forwards,
    /// each starting where the last one ended, so that a head can bound a
    /// flush's scratch memory (its attention grows with rows × keys, and a
    /// session that stays at depth 0 flushes [`crate::PENDING_FLUSH_PAIRS`]
    /// pairs at a time). Values below 1 are taken as 1. The default takes
    /// every buffered pair in one forward.
    fn flush_span(&self, at: usize) -> usize {
        let _ = at;
        usize::MAX
    }
}

/// A boxed head is a head, so a runner can hold `Drafter<Box<dyn DraftHead>>`
/// over whichever family it loaded.
impl<H: DraftHead + ?Sized> DraftHead for Box<H> {
    fn forward(&mut self, tokens: &Array, hiddens: &Array, position: usize) -> Result<HeadOutput> {
        (**self).forward(tokens, hiddens, position)
    }

    fn unembed(&mut self, out: &Array) -> Result<Array> {
        (**self).unembed(out)
    }

    fn caches(&self) -> &[Box<dyn Cache>] {
        (**self).caches()
    }

    fn caches_mut(&mut self) -> &mut [Box<dyn Cache>] {
        (**self).caches_mut()
    }

    fn cache_offset(&self) -> Option<usize> {
        (**self).cache_offset()
    }

    fn flush_rows(&self, rows: usize) -> usize {
        (**self).flush_rows(rows)
    }

    fn flush_span(&self, at: usize) -> usize {
        (**self).flush_span(at)
    }
}
