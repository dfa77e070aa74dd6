//! The pipelined plain decoder: the device stays one token ahead.
//!
//! Step `i + 1` is built from step `i`'s still-lazy token and dispatched
//! before the host reads token `i`, so the host's detokenizing and callbacks
//! overlap the next forward, and there is one sync per token. In a
//! speculative session it runs the depth-0 rounds ([`Tap`]): while the depth
//! controller keeps choosing 0, every committed token is reported to the
//! draft run with its hidden, so drafting can resume at any round.

use std::time::Instant;

use mlx_tensor::Array;

use super::FinishReason;
use super::output::Flow;
use super::step::{Decode, step};
use crate::depth::DepthController;
use crate::drafter::DraftRun;
use crate::error::Result;
use crate::session::Target;
use crate::spec_stats::{RoundOutcome, SpecStats};

/// The speculative decoder's bookkeeping that a plain stretch keeps up.
pub(super) struct Tap<'a, 'r, 'm> {
    pub(super) draft: &'a mut DraftRun<'r, 'm>,
    pub(super) depth: &'a mut DepthController,
    pub(super) stats: &'a mut SpecStats,
}

/// How a plain stretch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Stretch {
    /// Generation ended (the output's finish says why).
    Ended,
    /// The depth controller chose `depth` > 0 (or the run was cancelled)
    /// for the round of `current`, emitted but not forwarded.
    Handover { current: u32, depth: usize },
}

/// Decodes plainly from `current` (emitted, not forwarded). Without a tap
/// it runs to the end, stepping after each read when not pipelined; with one
/// (always pipelined) it hands over when the controller picks a depth.
// Long: the pipelined loop's one body: depth choice, dispatch ahead, read, tap, emit, hand-over.
pub(super) fn run<F: FnMut(&str)>(
    target: &mut Target<'_>,
    d: &mut Decode<'_, F>,
    current: u32,
    mut tap: Option<Tap<'_, '_, '_>>,
) -> Result<Stretch> {
    let pos = target.offset();
    let cur = Array::from_slice(&[current], &[1])?;
    let first = step(target, &cur, d)?;
    if let Some(t) = tap.as_mut() {
        t.draft.committed(&[current], &cur, &first.hidden, pos)?;
    }
    target.push(current);
    let mut y = first.next;
    let mut t0 = Instant::now();
    loop {
        // The round of `y` (emitted next) at depth 0 is its forward,
        // dispatched now; any other depth hands `y` over as `current`.
        let more = d.more_after_next();
        let after = d.output.left_after_next().saturating_sub(1);
        let k = match tap.as_mut() {
            Some(t) if more => t.depth.choose(after),
            _ => 0,
        };
        let ahead = if d.pipelined && more && k == 0 {
            Some(step(target, &y.token, d)?)
        } else {
            None
        };
        let t_read = Instant::now();
        let id: u32 = y.read()?; // fails on non-finite logits
        let t_emit = Instant::now();
        d.output.first_token();
        if let Some(t) = tap.as_mut() {
            let now = Instant::now();
            let seconds = (now - t0).as_secs_f64();
            t0 = now;
            // Under a seed, a modelled cost instead of the wall time. The
            // stretch's last round (no step built ahead of its read) is no
            // sample of a pipelined token's cost.
            if ahead.is_some() || crate::seeded::reproducible(d.options) {
                t.depth
                    .record(0, 0, crate::seeded::round_cost(seconds, 0, d.options));
            } else {
                t.depth.record_untimed_plain();
            }
            t.stats.record(&RoundOutcome {
                drafted: 0,
                accepted: 0,
                emitted: vec![id],
                seconds,
                phases: Default::default(),
                syncs: 1,
            });
        }
        if let Some(a) = &ahead {
            // An end-of-sequence token forwarded ahead is dropped below.
            if let Some(t) = tap.as_mut().filter(|_| !d.output.is_eos(id)) {
                t.draft
                    .committed(&[id], &y.token, &a.hidden, target.committed().len())?;
                if keep_up() {
                    t.draft.keep_up()?;
                }
            }
            target.push(id);
        }
        let flow = d.emit(id)?;
        let phases = &mut d.output.result.stats.plain;
        phases.tokens += 1;
        phases.wait += t_emit - t_read;
        phases.emit += t_emit.elapsed();
        if let Some(a) = &ahead {
            phases.build += a.build;
            phases.dispatch += a.dispatch;
        }
        if flow == Flow::Done {
            if ahead.is_some() && d.output.result.finish == FinishReason::Eos {
                target.drop_last()?;
            }
            return Ok(Stretch::Ended);
        }
        y = match ahead {
            Some(a) => a.next,
            None if tap.is_some() => {
                return Ok(Stretch::Handover {
                    current: id,
                    depth: k,
                });
            }
            None if !more => {
                d.output.result.finish = FinishReason::Cancelled;
                return Ok(Stretch::Ended);
            }
            None => {
                // Not pipelined: the next forward waits for this read.
                let arr = Array::from_slice(&[id], &[1])?;
                let s = step(target, &arr, d)?;
                let phases = &mut d.output.result.stats.plain;
                phases.build += s.build;
                phases.dispatch += s.dispatch;
                target.push(id);
                s.next
            }
        };
    }
}

/// Whether a plain stretch of a speculative session writes the MTP head's
/// buffered pairs as each flush span fills ([`DraftRun::keep_up`]; default
/// on; `MTP_PLAIN_KEEP_UP=0` leaves them for the catch-up when drafting
/// resumes, as before): a long stretch's catch-up then runs as one forward
/// rather than as spans that each but the last wait for the device. On an
/// H100 (tiny-mtp, f32) the first drafted round after 63 plain tokens took
/// 9.6–12.1 ms with it and 17.4 without, against 2.3 ms for a round: most
/// of what is left is not the flush but the round's new sequence of ops
/// for MLX's CUDA graphs (docs/gpu.md, session 37).
fn keep_up() -> bool {
    thread_local! {
        static ON: crate::switch::Flag = const { std::cell::Cell::new(None) };
    }
    crate::switch::get(&ON, "MTP_PLAIN_KEEP_UP", true)
}
