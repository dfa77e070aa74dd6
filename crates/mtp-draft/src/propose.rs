//! [`DraftSession::propose`]: drafting a chain of tokens after the current one.

use mlx_tensor::{Array, ops};
use sampler::{Distribution, History, KeyStream, Options};

use crate::Result;
use crate::head::{DraftHead, HeadOutput};
use crate::session::{DraftSession, check_output, one_token};

/// What a proposal samples with: the request's options and penalty history,
/// and the key stream its draws come from.
#[derive(Debug)]
pub struct DraftSampling<'a> {
    /// The request's sampling options (the same ones validation uses).
    pub options: &'a Options,
    /// The committed penalty history; the proposal never mutates it.
    pub history: &'a History,
    /// One key per draft step is taken from it.
    pub keys: &'a mut KeyStream,
}

/// A drafted chain after the current token.
#[derive(Debug)]
pub struct Proposal {
    /// `[k]` `u32` draft tokens; still lazy unless penalties forced a read.
    pub tokens: Array,
    /// `k`, known on the host without a sync.
    pub len: usize,
    /// The `k` draft distributions, row `i` the one `tokens[i]` was drawn
    /// from, for the acceptance test.
    pub dist: Distribution,
}

impl<H: DraftHead> DraftSession<'_, H> {
    /// Drafts up to `max_tokens` tokens after `current` (the emitted token
    /// whose target forward has not run yet, at slot `frontier`).
    ///
    /// Returns `None` when `max_tokens` is 0 or the session is unprimed (no
    /// target hidden reported yet): decode plainly and report the runs.
    ///
    /// A head with draft caches first settles the frontier pair with
    /// `current`, so the flush's last row is the first draft step and needs no
    /// head call; each later step writes the next draft slot speculatively
    /// (dropped at the next flush). A cacheless head anchors every step at
    /// `frontier - 1`. Earlier drafts are penalty history for later rows, as
    /// in validation.
    ///
    /// No step reads the device unless the options use penalties: the
    /// sampler takes the chain as host tokens, so then each draft is read
    /// back (one sync per step).
    pub fn propose(
        &mut self,
        current: &Array,
        max_tokens: usize,
        sampling: DraftSampling<'_>,
    ) -> Result<Option<Proposal>> {
        let carried = self.frontier_hidden.as_ref().map(|h| h.array().clone());
        let (Some(mut hidden), true) = (carried, max_tokens > 0) else {
            return Ok(None);
        };
        let current = one_token(current)?;
        if self.cached {
            // Also drops speculative entries of an earlier, unverified proposal.
            self.settle(&current)?;
            // A restored prefix with nothing new to pair leaves no held row.
            if self.held.is_none() {
                return Ok(None);
            }
        }
        let anchor = self.frontier - 1;
        let mut chain = DraftChain::new(sampling, max_tokens);
        let mut token = current;
        for i in 0..max_tokens {
            let step = match (&self.held, i) {
                (Some(held), 0) if self.cached => HeadOutput {
                    out: held.out.array().clone(),
                    hidden: held.hidden.array().clone(),
                },
                _ => {
                    let position = if self.cached { anchor + i } else { anchor };
                    if self.cached {
                        self.assert_caches_at(position, "before a draft step");
                    }
                    let out = self.head.forward(&token, &hidden, position)?;
                    check_output(&out, 1)?;
                    out
                }
            };
            let logits = self.head.unembed(&step.out)?;
            token = chain.step(&logits)?;
            hidden = step.hidden;
        }
        chain.finish().map(Some)
    }
}

/// The one draft-step sampler: every drafter that samples its own rows (the
/// MTP head, a draft model) builds its chain with it, so draft tokens are
/// drawn exactly as validation expects.
///
/// Each step turns a row of logits into a draft distribution (the request's
/// options, with the earlier drafts as penalty history) and draws the next
/// token: the argmax for greedy options (a one-hot row needs no key), else a
/// sample from the next key. Nothing is read from the device unless the
/// options use penalties, which need each draft on the host.
#[derive(Debug)]
pub struct DraftChain<'a> {
    sampling: DraftSampling<'a>,
    tokens: Vec<Array>,
    dists: Vec<Distribution>,
    /// The drafts so far on the host (only when penalties need them).
    chain: Vec<u32>,
}

impl<'a> DraftChain<'a> {
    /// An empty chain of at most `max_tokens` steps.
    pub fn new(sampling: DraftSampling<'a>, max_tokens: usize) -> DraftChain<'a> {
        DraftChain {
            sampling,
            tokens: Vec::with_capacity(max_tokens),
            dists: Vec::with_capacity(max_tokens),
            chain: Vec::new(),
        }
    }

    /// Samples the next draft from `logits` `[1, V]` and returns it as a
    /// `[1]` `u32` array (lazy unless penalties forced a read).
    pub fn step(&mut self, logits: &Array) -> Result<Array> {
        let opts = self.sampling.options;
        let dist = Distribution::from_logits(logits, opts, self.sampling.history, &self.chain)?;
        // Greedy rows are one-hot: their argmax is the draw, with no key.
        let next = if opts.is_greedy() {
            dist.probs().argmax(-1, false)?
        } else {
            dist.sample(&self.sampling.keys.next_key()?)?
        };
        if opts.uses_penalties() {
            self.chain.push(next.item::<u32>()?);
        }
        self.tokens.push(next.clone());
        self.dists.push(dist);
        Ok(next)
    }

    /// The proposal of the steps taken.
    ///
    /// # Panics
    /// When no step was taken (a proposal has at least one draft).
    pub fn finish(self) -> Result<Proposal> {
        assert!(!self.tokens.is_empty(), "a draft chain of no steps");
        Ok(Proposal {
            len: self.tokens.len(),
            tokens: ops::concatenate(&self.tokens, 0)?,
            dist: Distribution::concatenate(&self.dists)?,
        })
    }
}
