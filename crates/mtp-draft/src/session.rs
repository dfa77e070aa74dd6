//! [`DraftSession`]: one request's pairing of committed tokens with target hiddens.
//!
//! A head with draft caches keeps the pairing invariant: draft slot `S` holds
//! the look-ahead token at `S + 1` fused with the target hidden at `S`. A
//! slot's pair therefore completes only when the token after it is known, so
//! the session carries the hidden of the last reported slot (the frontier
//! hidden) until the next token arrives, buffers completed pairs, and writes
//! them in one head forward at a flush.

use mlx_tensor::{Array, Pinned, ops};

use crate::head::{DraftHead, HeadOutput};
use crate::pending::{PENDING_FLUSH_PAIRS, Pending};
use crate::{Error, Result};

/// One request's drafting state, opened by [`crate::Drafter::open`].
///
/// Call [`DraftSession::close`] at the end of the request: it flushes the
/// buffered pairs so the draft caches end level with the target. Dropping a
/// session without closing releases its pins but abandons those pairs.
#[derive(Debug)]
pub struct DraftSession<'d, H: DraftHead> {
    pub(crate) head: &'d mut H,
    /// Whether the head has draft caches (the paired mode) or is cacheless.
    pub(crate) cached: bool,
    /// The slot after the last reported token.
    pub(crate) frontier: usize,
    /// `[1, H]`: the target hidden at `frontier - 1`, fused into the next
    /// pair; `None` until the first committed run (the drafter is unprimed).
    pub(crate) frontier_hidden: Option<Pinned>,
    /// The slot after the last pair written to the draft caches; the caches
    /// may run past it only with speculative entries of a proposal.
    pub(crate) committed_offset: usize,
    /// Completed pairs for slots `committed_offset..committed_offset + count`.
    pub(crate) pending: Pending,
    /// The last flushed row's head output, reused as the first draft step.
    pub(crate) held: Option<Held>,
}

/// The frontier row of the last flush: `out` `[1, D]` predicts the token
/// after the look-ahead token of slot `frontier - 1`; `hidden` `[1, H]`
/// conditions the next step.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) out: Pinned,
    pub(crate) hidden: Pinned,
}

impl<'d, H: DraftHead> DraftSession<'d, H> {
    pub(crate) fn new(head: &'d mut H) -> Self {
        let offset = head.cache_offset();
        // A restored prefix arrives with the draft caches already written;
        // pairing resumes from their offset.
        let start = offset.unwrap_or(0);
        DraftSession {
            head,
            cached: offset.is_some(),
            frontier: start,
            frontier_hidden: None,
            committed_offset: start,
            pending: Pending::default(),
            held: None,
        }
    }

    /// The slot after the last reported token.
    pub fn frontier(&self) -> usize {
        self.frontier
    }

    /// The slot after the last pair written to the draft caches.
    pub fn committed_offset(&self) -> usize {
        self.committed_offset
    }

    /// The draft caches' offset (past the committed offset while a
    /// proposal's speculative entries are in them); `None` when cacheless.
    pub fn cache_offset(&self) -> Option<usize> {
        self.head.cache_offset()
    }

    /// Completed pairs waiting for a flush.
    pub fn pending(&self) -> usize {
        self.pending.count()
    }

    /// Whether a target hidden has been reported, so drafting can start.
    pub fn is_primed(&self) -> bool {
        self.frontier_hidden.is_some()
    }

    /// Reports a run committed to the target caches: `tokens` `[n]` sit at
    /// slots `position..position + n` and `hiddens` `[n, H]` are the target's
    /// draft-conditioning hiddens there. Runs arrive in slot order (prefill
    /// chunks, plain decode steps, each round's validated run); a run may
    /// start below the frontier when its first tokens are already paired (a
    /// proposal settled them, or a restored prefix covers them).
    ///
    /// # Panics
    /// When the run starts past the frontier: the slots between would never
    /// get their pair, which is a bug in the caller's bookkeeping.
    pub fn committed(&mut self, tokens: &Array, hiddens: &Array, position: usize) -> Result<()> {
        let n = run_len(tokens, hiddens, position)?;
        let primed = self.frontier_hidden.is_some();
        if self.cached || primed {
            assert!(
                position <= self.frontier,
                "mtp-draft: committed run at {position} leaves a gap after the frontier {}",
                self.frontier
            );
        }
        if self.cached {
            let written = self.committed_offset + self.pending.count();
            assert!(
                position <= written + 1,
                "mtp-draft: committed run at {position} leaves a pair gap at slot {written}"
            );
            // Token i of the run completes slot position - 1 + i; the slots
            // below `written` already hold their pair.
            let start = written + 1 - position;
            if start < n {
                let ids = tokens.slice_axis(0, start as i32, n as i32)?;
                let paired = if start == 0 {
                    let carried = self.frontier_hidden.as_ref().unwrap_or_else(|| {
                        panic!(
                            "mtp-draft: slot {written} needs the target hidden at {written} \
                             but none was reported (frontier {})",
                            self.frontier
                        )
                    });
                    if n == 1 {
                        carried.array().clone()
                    } else {
                        let shifted = hiddens.slice_axis(0, 0, n as i32 - 1)?;
                        ops::concatenate(&[carried.array().clone(), shifted], 0)?
                    }
                } else {
                    hiddens.slice_axis(0, start as i32 - 1, n as i32 - 1)?
                };
                self.queue(&ids, &paired, n - start)?;
            }
        }
        self.frontier = position + n;
        self.frontier_hidden = Some(hiddens.slice_axis(0, n as i32 - 1, n as i32)?.pin());
        Ok(())
    }

    /// Completes the open frontier pair with `next` (the token after the last
    /// committed slot, a scalar or `[1]`) and flushes, leaving the draft
    /// caches level with the target. A no-op for a cacheless head.
    pub fn settle(&mut self, next: &Array) -> Result<()> {
        let next = one_token(next)?;
        if !self.cached {
            return Ok(());
        }
        let written = self.committed_offset + self.pending.count();
        if let Some(carried) = &self.frontier_hidden
            && self.frontier - 1 == written
        {
            let carried = carried.array().clone();
            self.queue(&next, &carried, 1)?;
        }
        self.flush()
    }

    /// Writes the buffered pairs now if they fill one flush span at the
    /// committed offset ([`DraftHead::flush_span`], at most
    /// [`PENDING_FLUSH_PAIRS`]): a single head forward, handed to MLX
    /// without waiting. A decode loop that commits one token at a time (a
    /// plain stretch of a speculative session) calls it after each token, so
    /// the stretch's pairs reach the draft caches in forwards that queue
    /// between the target's steps, and drafting resumes after at most one
    /// span's catch-up instead of a flush of the whole stretch, whose spans
    /// each wait for the device (see [`DraftSession::flush`]). A no-op for a
    /// cacheless head.
    ///
    /// Short of a span, the buffered runs are joined into one
    /// (`Pending::compact`, also without waiting), so the flush that ends
    /// the stretch is the same sequence of device operations whatever the
    /// stretch's length.
    pub fn flush_ready(&mut self) -> Result<()> {
        if !self.cached {
            return Ok(());
        }
        let span = self
            .head
            .flush_span(self.committed_offset)
            .clamp(1, PENDING_FLUSH_PAIRS);
        if self.pending.count() >= span {
            self.flush()?;
        } else {
            self.pending.compact()?;
        }
        Ok(())
    }

    /// Drops the speculative entries past the committed offset, then writes
    /// the buffered pairs to the draft caches in head forwards of at most
    /// [`DraftHead::flush_span`] pairs each. Afterwards the caches sit
    /// exactly at [`DraftSession::committed_offset`].
    pub fn flush(&mut self) -> Result<()> {
        self.drop_speculative()?;
        let m = self.pending.count();
        if m == 0 {
            return Ok(());
        }
        let mut done = 0;
        while done < m {
            let at = self.committed_offset;
            let span = self.head.flush_span(at).clamp(1, m - done);
            let (ids, hiddens) = self.pending.span(done, span)?;
            let out = self.forward_span(&ids, &hiddens, span)?;
            done += span;
            let row = |a: &Array| a.slice_axis(0, span as i32 - 1, span as i32);
            let held = [row(&out.out)?, row(&out.hidden)?];
            self.held = Some(Held {
                out: held[0].pin(),
                hidden: held[1].pin(),
            });
            self.committed_offset += span;
            self.assert_caches_at(self.committed_offset, "after a flush");
            // Start the writes now: a session that never drafts would otherwise
            // keep the whole flush graph, and every hidden it reads, until
            // close; and a span's scratch is freed before the next one runs.
            // The last span runs asynchronously on the held row alone, which
            // every cache write of the span feeds: an asynchronous eval holds
            // its outputs' data until its work has run, and a cache buffer
            // held so would make the first draft step's write copy it.
            if done < m {
                let mut state: Vec<Array> =
                    self.head.caches().iter().flat_map(|c| c.state()).collect();
                state.extend(held);
                mlx_tensor::eval(&state)?;
            } else {
                mlx_tensor::async_eval(&held)?;
            }
            tracing::trace!(at, pairs = span, "mtp-draft flush");
        }
        self.pending.clear();
        Ok(())
    }

    /// One flush forward over `m` pairs at the committed offset, padded to
    /// [`DraftHead::flush_rows`] rows when the head asks for more.
    fn forward_span(&mut self, ids: &Array, hiddens: &Array, m: usize) -> Result<HeadOutput> {
        let at = self.committed_offset;
        let rows = self.head.flush_rows(m).max(m);
        if rows > m {
            // Padding: copies of the last pair, rewound after the forward,
            // as one broadcast block, so the padded input is the same two
            // joined parts whatever `m` (a part per copy made each `m` a
            // new sequence of device operations).
            let repeat = |a: &Array| -> Result<Array> {
                let last = a.slice_axis(0, m as i32 - 1, m as i32)?;
                let mut shape = a.shape().to_vec();
                shape[0] = (rows - m) as i32;
                let pad = last.broadcast_to(&shape)?;
                Ok(ops::concatenate(&[a.clone(), pad], 0)?)
            };
            let out = self.head.forward(&repeat(ids)?, &repeat(hiddens)?, at)?;
            check_output(&out, rows)?;
            for (i, cache) in self.head.caches_mut().iter_mut().enumerate() {
                let rewound = cache.restore(None, at + m)?;
                assert!(
                    rewound,
                    "mtp-draft: draft cache {i} asked for padded flushes but cannot rewind"
                );
            }
            Ok(out)
        } else {
            let out = self.head.forward(ids, hiddens, at)?;
            check_output(&out, m)?;
            Ok(out)
        }
    }

    /// Flushes what is buffered and leaves the draft caches at the committed
    /// offset, dropping speculative entries of an unverified proposal.
    pub fn close(mut self) -> Result<()> {
        self.flush()
    }

    fn queue(&mut self, tokens: &Array, hiddens: &Array, n: usize) -> Result<()> {
        self.pending.push(tokens, hiddens, n);
        if self.pending.count() >= PENDING_FLUSH_PAIRS {
            self.flush()?;
        }
        Ok(())
    }

    /// Rewinds the draft caches to the committed offset: entries past it were
    /// written by proposal steps conditioned on the head's own hidden.
    pub(crate) fn drop_speculative(&mut self) -> Result<()> {
        let to = self.committed_offset;
        for (i, cache) in self.head.caches_mut().iter_mut().enumerate() {
            let at = cache.offset();
            assert!(
                at >= to,
                "mtp-draft: draft cache {i} sits at {at}, below the committed offset {to}"
            );
            if at > to {
                let rewound = cache.restore(None, to)?;
                assert!(
                    rewound,
                    "mtp-draft: draft cache {i} could not rewind from {at} to {to}"
                );
            }
        }
        Ok(())
    }

    pub(crate) fn assert_caches_at(&self, want: usize, when: &str) {
        for (i, cache) in self.head.caches().iter().enumerate() {
            let at = cache.offset();
            assert!(
                at == want,
                "mtp-draft: draft cache {i} at {at} {when}, expected {want}"
            );
        }
    }
}

/// Checks a committed run's shapes and returns its length.
fn run_len(tokens: &Array, hiddens: &Array, position: usize) -> Result<usize> {
    let (ts, hs) = (tokens.shape(), hiddens.shape());
    if ts.len() != 1 || ts[0] == 0 {
        return Err(Error::BadShape {
            what: "committed tokens",
            shape: ts.to_vec(),
            expected: "[n] with n >= 1",
        });
    }
    if hs.len() != 2 {
        return Err(Error::BadShape {
            what: "committed hiddens",
            shape: hs.to_vec(),
            expected: "[n, H]",
        });
    }
    if ts[0] != hs[0] {
        return Err(Error::RunMismatch {
            position,
            tokens: ts[0] as usize,
            hiddens: hs[0] as usize,
        });
    }
    Ok(ts[0] as usize)
}

/// A token given as a scalar or `[1]`, as a `[1]` run.
pub(crate) fn one_token(token: &Array) -> Result<Array> {
    let shape = token.shape();
    if token.size() != 1 || shape.len() > 1 {
        return Err(Error::BadShape {
            what: "token",
            shape: shape.to_vec(),
            expected: "a scalar or [1]",
        });
    }
    Ok(token.reshape(&[1])?)
}

pub(crate) fn check_output(out: &HeadOutput, rows: usize) -> Result<()> {
    for (what, a) in [("out", &out.out), ("hidden", &out.hidden)] {
        let shape = a.shape();
        if shape.len() != 2 || shape[0] as usize != rows {
            return Err(Error::HeadOutput {
                what,
                shape: shape.to_vec(),
                rows,
                expected: "[rows, width]",
            });
        }
    }
    Ok(())
}
