//! The speculative decoder: a depth controller picks `k` per round; a round
//! drafts, verifies in one target forward and accepts; depth 0 hands over
//! to the pipelined plain decoder.
//!
//! A round starts from `current`, the emitted token whose target forward has
//! not run, at slot `pos`. The drafter proposes `d_1..d_k`; the target runs
//! `[current, d_1..d_k]` in one forward ([`Target::begin_verify`]), giving
//! `k + 1` distributions; the sampler's chain rule accepts a prefix
//! `d_1..d_a` and draws the next token from the residual (or the bonus row).
//! Everything from the forward to the acceptance is one lazy graph,
//! evaluated with a single host sync. Then the verify guard commits
//! `[current, d_1..d_a]`, rewinding every target cache to `pos + a + 1`, and
//! the draft run is told which run was committed. An end-of-sequence token
//! among the accepted drafts ends the request there and is not committed.

use std::time::Instant;

use mlx_tensor::{Array, ops};
use sampler::{Distribution, accept_chain};

use super::FinishReason;
use super::output::Flow;
use super::plain::{self, Stretch, Tap};
use super::step::{Decode, step};
use crate::depth::{DepthController, DepthPolicy, Learned};
use crate::drafter::DraftRun;
use crate::error::Result;
use crate::session::Target;
use crate::spec_stats::{Phases, RoundOutcome, SpecStats};

/// Rounds of draft, verify, accept from `seed` (the prompt's last token,
/// not forwarded), until the output is done or the run is cancelled.
pub(super) fn run<F: FnMut(&str)>(
    target: &mut Target<'_>,
    draft: &mut DraftRun<'_, '_>,
    d: &mut Decode<'_, F>,
    seed: u32,
    policy: DepthPolicy,
    memory: &mut Option<Learned>,
) -> Result<SpecStats> {
    // Under reproducible sampling the controller sees modelled costs, and
    // its choices must depend on this request alone: nothing carries over.
    let carry = !crate::seeded::reproducible(d.options);
    let mut depth = DepthController::resume(policy, memory.as_ref().filter(|_| carry));
    let mut stats = SpecStats::new(draft.method());
    let mut current = seed;
    // A depth chosen at the end of a plain stretch, for the round it hands over.
    let mut chosen = None;
    loop {
        if d.cancelled() {
            d.output.result.finish = FinishReason::Cancelled;
            break;
        }
        // A round emits up to depth + 1 tokens; never more than the budget.
        let budget = d.output.left_after_next();
        let k = chosen.take().unwrap_or_else(|| depth.choose(budget));
        if k == 0 && d.pipelined {
            let tap = Tap {
                draft: &mut *draft,
                depth: &mut depth,
                stats: &mut stats,
            };
            match plain::run(target, d, current, Some(tap))? {
                Stretch::Handover { current: c, depth } => {
                    current = c;
                    chosen = Some(depth);
                    continue;
                }
                Stretch::Ended => break,
            }
        }
        let round = round(target, draft, current, k, d)?;
        d.output.first_token();
        // Under a seed, a modelled cost instead of the wall time.
        let cost = crate::seeded::round_cost(round.seconds, round.drafted, d.options);
        depth.record(round.drafted, round.accepted, cost);
        stats.record(&round);
        let mut done = false;
        for &id in &round.emitted {
            if d.emit(id)? == Flow::Done {
                done = true;
                break;
            }
        }
        if done {
            break;
        }
        current = *round
            .emitted
            .last()
            .expect("a round emits at least one token");
    }
    if carry {
        *memory = depth.learned();
    }
    Ok(stats)
}

/// Runs one round at depth `depth` (0, or a drafter with nothing to
/// propose: a plain step that still reports its run to the draft run).
// Long: one round's phases in order (draft, verify, accept, commit), each timed where it ends.
fn round<F: FnMut(&str)>(
    target: &mut Target<'_>,
    draft: &mut DraftRun<'_, '_>,
    current: u32,
    depth: usize,
    d: &mut Decode<'_, F>,
) -> Result<RoundOutcome> {
    let t0 = Instant::now();
    let syncs0 = mlx_tensor::host_syncs();
    let profile = crate::spec_stats::profiling_rounds();
    let pos = target.offset();
    let cur = Array::from_slice(&[current], &[1])?;
    let proposal = draft.propose(current, &cur, target.committed(), depth, d.draft_sampling())?;
    if let Some(p) = &proposal {
        if profile {
            mlx_tensor::eval([&p.tokens])?;
        } else if early_dispatch() {
            // The device runs the draft chain while the host builds the verify.
            mlx_tensor::async_eval([&p.tokens])?;
        }
    }
    let t_draft = Instant::now();
    let Some(proposal) = proposal else {
        let s = step(target, &cur, d)?;
        // The step's one sync: the sample's graph holds the forward, and so
        // every cache write and the hidden reported below.
        let next: u32 = s.next.read()?;
        draft.committed(&[current], &cur, &s.hidden, pos)?;
        target.push(current);
        return Ok(RoundOutcome {
            drafted: 0,
            accepted: 0,
            emitted: vec![next],
            seconds: t0.elapsed().as_secs_f64(),
            phases: Phases::default(),
            syncs: mlx_tensor::host_syncs() - syncs0,
        });
    };

    let k = proposal.len;
    let model = target.model();
    let input = ops::concatenate(&[cur, proposal.tokens.clone()], 0)?;
    let verify = target.begin_verify(&input, k)?;
    let hidden = verify.hidden().clone();
    if profile {
        hidden.eval()?;
    }
    let t_verify = Instant::now();
    let logits = model.unembed(&hidden)?;
    // Penalties see the draft chain up to each row; without penalties the
    // chain is irrelevant and reading it would cost a sync.
    let chain = if d.options.uses_penalties() {
        proposal.tokens.to_vec::<u32>()?
    } else {
        Vec::new()
    };
    let dist = Distribution::from_logits(&logits, d.options, &d.history, &chain)?;
    let acceptance = accept_chain(&dist, &proposal.dist, &proposal.tokens, &d.keys.next_key()?)?;
    // The round's one sync: the acceptance's graph holds the target forward
    // (every cache write, the hiddens reported below) and the draft chain.
    // The target rows' finiteness is read in the same sync.
    let t_built = Instant::now();
    let mut emitted =
        crate::finite::read_emitted(&acceptance, &logits, d.options, pos + 1, hidden.dtype())?;
    let t_read = Instant::now();
    let accepted = emitted.len() - 1;
    // Keep `current` and the accepted drafts before any end-of-sequence token.
    let keep_drafts = match emitted.iter().position(|&t| d.output.is_eos(t)) {
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
    verify.commit(&kept)?;
    draft.committed(
        &kept,
        &input.slice_axis(0, 0, keep as i32)?,
        &hidden.slice_axis(0, 0, keep as i32)?,
        pos,
    )?;
    let t_end = Instant::now();
    let secs = |a: Instant, b: Instant| (b - a).as_secs_f64();
    // Unprofiled, building the verify graph counts as verify and the one
    // sync as the wait; profiled, the verify forward ran in its own sync.
    let (verify_end, wait_start) = if profile {
        (t_verify, t_verify)
    } else {
        (t_built, t_built)
    };
    Ok(RoundOutcome {
        drafted: k,
        accepted,
        emitted,
        seconds: secs(t0, t_end),
        phases: Phases {
            draft: secs(t0, t_draft),
            verify: secs(t_draft, verify_end),
            wait: secs(wait_start, t_read),
            commit: secs(t_read, t_end),
        },
        syncs: mlx_tensor::host_syncs() - syncs0,
    })
}

/// Whether a round hands its draft chain to MLX as soon as it is built, so
/// the device runs it while the host builds the verify (default on;
/// `MTP_EARLY_DRAFT_DISPATCH=0` dispatches it with the verify instead). The
/// round still has one sync: an `async_eval` does not wait.
fn early_dispatch() -> bool {
    thread_local! {
        static ON: crate::switch::Flag = const { std::cell::Cell::new(None) };
    }
    crate::switch::get(&ON, "MTP_EARLY_DRAFT_DISPATCH", true)
}
