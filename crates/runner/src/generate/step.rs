//! [`Decode`]: one request's decoding state, and [`step`], "forward one
//! token and sample", written once for every decoder.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mlx_tensor::Array;
use mtp_draft::DraftSampling;
use sampler::{History, KeyStream, Options, sample_next};

use super::output::{Flow, Output};
use crate::error::Result;
use crate::finite::Checked;
use crate::session::Target;

/// What every decoder of one request shares: the sampling state, the output
/// and the cancel flag.
pub(super) struct Decode<'r, F: FnMut(&str)> {
    pub(super) options: &'r Options,
    /// The committed penalty history (the prompt, then each emitted token).
    pub(super) history: History,
    /// Every random draw of the request, in order.
    pub(super) keys: KeyStream,
    pub(super) output: Output<'r, F>,
    pub(super) cancel: &'r AtomicBool,
    /// Keep the device one token ahead (off when penalties need each token
    /// on the host before the next sample).
    pub(super) pipelined: bool,
}

impl<F: FnMut(&str)> Decode<'_, F> {
    /// Whether the cancel flag is set.
    pub(super) fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    /// Whether a token may follow the next one (budget and cancel flag).
    pub(super) fn more_after_next(&self) -> bool {
        self.output.generated + 1 < self.output.max_tokens && !self.cancelled()
    }

    /// Emits one generated token: penalty history, then the output.
    pub(super) fn emit(&mut self, id: u32) -> Result<Flow> {
        self.history.commit(&[id]);
        self.output.push(id)
    }

    /// The sampling a draft proposal uses.
    pub(super) fn draft_sampling(&mut self) -> DraftSampling<'_> {
        DraftSampling {
            options: self.options,
            history: &self.history,
            keys: &mut self.keys,
        }
    }
}

/// A forwarded token's outputs.
pub(super) struct Step {
    /// The next token, sampled from the last row (lazy, dispatched), with the
    /// row's finiteness flag read in the same sync (robust2).
    pub(super) next: Checked,
    /// The forward's hidden row `[1, H]` (lazy).
    pub(super) hidden: Array,
    /// Host time building the step's graph, and handing it to MLX.
    pub(super) build: Duration,
    pub(super) dispatch: Duration,
}

/// Forwards one (maybe lazy) token after `target`'s committed ones (not
/// committed yet: see [`Target::forward_one`]) and dispatches the sample of
/// the next token.
pub(super) fn step<F: FnMut(&str)>(
    target: &mut Target<'_>,
    token: &Array,
    d: &mut Decode<'_, F>,
) -> Result<Step> {
    let t0 = Instant::now();
    let at = target.offset();
    let hidden = target.forward_one(token)?;
    let logits = target.model().unembed(&hidden)?;
    let next = sample_next(&logits, d.options, &d.history, &d.keys.next_key()?)?;
    let next = crate::finite::check(&logits, &next, d.options, at + 1, hidden.dtype())?;
    let built = Instant::now();
    next.async_eval()?;
    Ok(Step {
        next,
        hidden,
        build: built - t0,
        dispatch: built.elapsed(),
    })
}
