//! Dispatch points inside a forward: where a multi-row forward hands the
//! layers built so far to MLX (an `async_eval`, not a sync), so the device
//! runs them while the host builds the rest.
//!
//! Why: on an H200 a speculative round is bound by the host building and
//! encoding MLX's graph as much as by the device (docs/gpu.md, session 15: a
//! kernel trace of a depth-4 round at the 8B shape showed the device idle
//! for 2.7 ms while the host built the verify, which was only dispatched
//! whole once built). A verify's graph is built layer by layer, and nothing
//! after layer `i` changes what layers `0..=i` compute, so dispatching every
//! few layers lets the device start on the first layers while the host
//! builds the next ones. Values are unchanged: an `async_eval` evaluates the
//! same graph, and the round's one host sync stays the read at its end.
//!
//! Off by default, kept for measurement (`MTP_LAYER_DISPATCH=1` turns it
//! on): it did not pay. On an H200 (c432a36, bf16, alternating processes,
//! docs/gpu.md session 16) a depth-4 round cost the same with it as
//! without (8b 12.98 against 13.21 ms, 1.7b 10.08 against 10.14; groups of
//! two 12.63 and 11.88): the time only moved from the round's final wait
//! into the build, because MLX encodes a dispatched group on the calling
//! thread, so the host's building and encoding stay one serial path, and
//! that path, not an idle device, bounds the round. On a CPU the device is
//! the host's own cores (tiny-mtp f32 depth 4: 34.8 ms a round both ways).
//! `MTP_LAYER_DISPATCH_EVERY=N` sets the group size (default
//! [`DEFAULT_LAYER_DISPATCH_EVERY`]).

use std::cell::Cell;

use mlx_tensor::Array;

use crate::error::Result;

/// Layers per dispatched group unless `MTP_LAYER_DISPATCH_EVERY` says
/// otherwise: about 100 of MLX's graph nodes at ~25 nodes a layer, the size
/// of one of MLX's CUDA command batches.
pub const DEFAULT_LAYER_DISPATCH_EVERY: usize = 4;

thread_local! {
    static ON: crate::switch::Flag = const { Cell::new(None) };
    static EVERY: Cell<Option<usize>> = const { Cell::new(None) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

/// Dispatches made on this thread so far (layer groups and draft steps):
/// what a test reads to see that the switch took effect.
pub fn layer_dispatches() -> u64 {
    COUNT.with(Cell::get)
}

fn dispatched() {
    COUNT.with(|c| c.set(c.get() + 1));
}

/// Turns layer-group dispatch on or off for this thread's later forwards,
/// over `MTP_LAYER_DISPATCH`.
pub fn set_layer_dispatch(on: bool) {
    crate::switch::set(&ON, on);
}

/// Sets this thread's group size (layers per dispatch, at least 1), over
/// `MTP_LAYER_DISPATCH_EVERY`.
pub fn set_layer_dispatch_every(layers: usize) {
    EVERY.with(|c| c.set(Some(layers.max(1))));
}

/// Whether this thread dispatches multi-row forwards in layer groups.
pub fn layer_dispatch() -> bool {
    crate::switch::get(&ON, "MTP_LAYER_DISPATCH", false)
}

/// Layers per group: `MTP_LAYER_DISPATCH_EVERY` when it is a positive
/// integer (anything else keeps the default, with a warning).
fn every() -> usize {
    crate::switch::get_parsed(
        &EVERY,
        "MTP_LAYER_DISPATCH_EVERY",
        parse_every,
        DEFAULT_LAYER_DISPATCH_EVERY,
        "a positive integer",
    )
}

/// The group size from its variable: unset gives the default, a positive
/// integer itself, anything else `None`.
fn parse_every(raw: Option<&str>) -> Option<usize> {
    match raw {
        None => Some(DEFAULT_LAYER_DISPATCH_EVERY),
        Some(s) => s.trim().parse().ok().filter(|&n| n > 0),
    }
}

/// Whether a forward that has just built layer `done` (1-based) of
/// `layers` dispatches what it has: a multi-row input, a full group, and
/// not the last layer (the caller's own evaluation takes the rest).
fn due(rows: usize, done: usize, layers: usize, every: usize) -> bool {
    rows >= 2 && done < layers && done.is_multiple_of(every)
}

/// Called by a trunk's layer loop after layer `done` (1-based) of `layers`
/// with the residual stream `x` `[1, L, H]`: dispatches the layers so far
/// when layer-group dispatch is on and a group is full.
pub(crate) fn after_layer(x: &Array, done: usize, layers: usize) -> Result<()> {
    if layer_dispatch() && due(x.dim(1) as usize, done, layers, every()) {
        x.async_eval()?;
        dispatched();
    }
    Ok(())
}

/// Called by the MTP head after building one draft step's layer: dispatches
/// it, so the device runs step `i` while the host builds its unembedding
/// and step `i + 1`. Only for single rows (a draft step); a flush of
/// several rows is dispatched whole by the draft session.
pub(crate) fn after_draft_step(out: &Array, hidden: &Array) -> Result<()> {
    if layer_dispatch() && out.dim(0) == 1 {
        mlx_tensor::async_eval([out, hidden])?;
        dispatched();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_fall_inside_multi_row_forwards_only() {
        // 36 layers in groups of 4: after layers 4, 8, ..., 32, never after 36.
        let at: Vec<usize> = (1..=36).filter(|&d| due(5, d, 36, 4)).collect();
        assert_eq!(at, vec![4, 8, 12, 16, 20, 24, 28, 32]);
        assert!((1..=36).all(|d| !due(1, d, 36, 4)), "one row never");
        assert!(!due(5, 6, 6, 1), "the last layer is the caller's");
    }

    #[test]
    fn the_group_size_is_a_positive_integer_or_the_default() {
        assert_eq!(parse_every(None), Some(DEFAULT_LAYER_DISPATCH_EVERY));
        assert_eq!(parse_every(Some("6")), Some(6));
        assert_eq!(parse_every(Some(" 2 ")), Some(2));
        assert_eq!(parse_every(Some("0")), None);
        assert_eq!(parse_every(Some("four")), None);
    }
}
