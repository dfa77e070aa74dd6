//! One speculative round: draft, verify in one target forward, accept, rewind.
//!
//! A round starts from `current`, the emitted token whose target forward has
//! not run, at slot `pos`. The drafter proposes `d_1..d_k`; the target runs
//! `[current, d_1..d_k]` in one forward, giving `k + 1` distributions; the
//! sampler's chain rule accepts a prefix `d_1..d_a` and draws the next token
//! from the residual (or the bonus row). Everything from the forward to the
//! acceptance is one lazy graph, evaluated with a single host sync. Then every
//! target cache is rewound to `pos + a + 1` and the draft session is told which
//! run was committed. An end-of-sequence token among the accepted drafts ends
//! the request there and is not committed.

use std::time::Instant;

use mlx_tensor::{Array, ops};
use mtp_draft::DraftSampling;
use sampler::{Distribution, History, KeyStream, Options, accept_chain, sample_next};

use crate::drafter::DraftRun;
use crate::error::Result;
use crate::generate::{RestorePoints, Session};

/// What one round did.
#[derive(Debug, Clone, PartialEq)]
pub struct RoundOutcome {
    /// Draft tokens proposed (0 for a plain step).
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// Tokens to emit, in order: the accepted drafts, then the next token;
    /// cut after an end-of-sequence token.
    pub emitted: Vec<u32>,
    /// Wall time of the round in seconds.
    pub seconds: f64,
}

impl<'m> Session<'m> {
    /// Runs one round at depth `depth` (0, or an unprimed drafter: a plain step
    /// that still reports its run to the draft session).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn spec_round(
        &mut self,
        draft: &mut DraftRun<'_, 'm>,
        current: u32,
        depth: usize,
        opts: &Options,
        history: &History,
        keys: &mut KeyStream,
        eos: &[u32],
    ) -> Result<RoundOutcome> {
        let t0 = Instant::now();
        let pos = self.offset();
        let cur = Array::from_slice(&[current], &[1])?;
        let proposal = draft.propose(
            current,
            &cur,
            &self.committed,
            depth,
            DraftSampling {
                options: opts,
                history,
                keys,
            },
        )?;
        let Some(proposal) = proposal else {
            let points = RestorePoints::schedule(&mut self.caches, &[pos]);
            let hidden = self.model.forward(&cur, &mut self.caches)?;
            if points {
                self.points.take(&mut self.caches, &self.committed);
            }
            let logits = self.model.unembed(&hidden)?;
            let y = sample_next(&logits, opts, history, &keys.next_key()?)?;
            // robust2: the finiteness flag rides on the sample's readback.
            let y = crate::finite::check(&logits, &y, opts, pos + 1, hidden.dtype())?;
            // The step's one sync: the sample's graph holds the forward, and so
            // every cache write and the hidden reported below.
            let next: u32 = y.read()?;
            draft.committed(&[current], &cur, &hidden, pos)?;
            self.committed.push(current);
            return Ok(RoundOutcome {
                drafted: 0,
                accepted: 0,
                emitted: vec![next],
                seconds: t0.elapsed().as_secs_f64(),
            });
        };

        let k = proposal.len;
        let input = ops::concatenate(&[cur, proposal.tokens.clone()], 0)?;
        // Recurrent layers capture their state after `current` and after each
        // draft in this same forward; the rewind below restores one of them.
        let offsets: Vec<usize> = (pos..=pos + k).collect();
        let points = RestorePoints::schedule(&mut self.caches, &offsets);
        let hidden = self.model.forward(&input, &mut self.caches)?;
        let logits = self.model.unembed(&hidden)?;
        // Penalties see the draft chain up to each row; without penalties the
        // chain is irrelevant and reading it would cost a sync.
        let chain = if opts.uses_penalties() {
            proposal.tokens.to_vec::<u32>()?
        } else {
            Vec::new()
        };
        let target = Distribution::from_logits(&logits, opts, history, &chain)?;
        let acceptance =
            accept_chain(&target, &proposal.dist, &proposal.tokens, &keys.next_key()?)?;
        // The round's one sync: the acceptance's graph holds the target forward
        // (every cache write, the hiddens reported below) and the draft chain.
        // robust2: the target rows' finiteness is read in the same sync.
        let mut emitted =
            crate::finite::read_emitted(&acceptance, &logits, opts, pos + 1, hidden.dtype())?;
        let accepted = emitted.len() - 1;
        // Keep `current` and the accepted drafts before any end-of-sequence token.
        let keep_drafts = match emitted.iter().position(|t| eos.contains(t)) {
            Some(i) => {
                emitted.truncate(i + 1);
                i.min(accepted)
            }
            None => accepted,
        };
        let keep = keep_drafts + 1;
        let kept: Vec<u32> = std::iter::once(current)
            .chain(emitted[..keep_drafts].iter().copied())
            .collect();
        let before = self.committed.len();
        self.committed.extend_from_slice(&kept);
        if points {
            self.points.take(&mut self.caches, &self.committed);
        }
        let restored = self
            .points
            .restore(&mut self.caches, pos + keep, &self.committed);
        self.committed.truncate(before);
        restored?;
        draft.committed(
            &kept,
            &input.slice_axis(0, 0, keep as i32)?,
            &hidden.slice_axis(0, 0, keep as i32)?,
            pos,
        )?;
        self.committed.extend_from_slice(&kept);
        Ok(RoundOutcome {
            drafted: k,
            accepted,
            emitted,
            seconds: t0.elapsed().as_secs_f64(),
        })
    }
}
