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
//! On by default on CUDA for models whose decoder layers are big
//! ([`MIN_LAYER_MIB`] MiB or more of weights a layer, from the config:
//! the 8B shape's 368 MiB, not 1.7B's 96), off elsewhere;
//! `MTP_LAYER_DISPATCH=1` / `0` (or [`set_layer_dispatch`]) forces it on or
//! off for every model. History: on an H200 at c432a36 (docs/gpu.md,
//! session 16) it did not pay: a depth-4 round cost the same with it as
//! without (8b 12.98 against 13.21 ms, 1.7b 10.08 against 10.14), because
//! the time only moved from the round's final wait into the build: MLX
//! encodes a dispatched group on the calling thread, and with cuBLASLt's
//! host cost per product (the verify's big products went to it then) that
//! serial host path bounded the round. Since every product of a layer goes
//! to the few-rows kernel (`models/skinny.rs`, session 23) the host encodes
//! a big layer faster than the device runs it, so the device idles only
//! while the host builds the first group: on an H100 at 8b, alternating
//! processes, depth-4 rounds 10.89 and 11.14 ms with it against 11.53 and
//! 14.43 without, a synced 5-row forward 9.22 against 10.41–11.47 ms; at
//! 1.7b (one pair) 8.65 against 7.12 ms, hence the size rule. On a CPU the
//! device is the host's own cores (tiny-mtp f32 depth 4: 34.8 ms a round
//! both ways). `MTP_LAYER_DISPATCH_EVERY=N` sets the group size (default
//! [`DEFAULT_LAYER_DISPATCH_EVERY`]).

use std::cell::Cell;

use mlx_tensor::{Array, Dtype};

use crate::config::ModelConfig;
use crate::error::Result;

/// The smallest decoder layer, in MiB of weights, that layer-group dispatch
/// is on for by default (on CUDA; see the module's doc).
pub const MIN_LAYER_MIB: u64 = 192;

/// Layers per dispatched group unless `MTP_LAYER_DISPATCH_EVERY` says
/// otherwise: about 100 of MLX's graph nodes at ~25 nodes a layer, the size
/// of one of MLX's CUDA command batches.
pub const DEFAULT_LAYER_DISPATCH_EVERY: usize = 4;

thread_local! {
    /// `Some(None)`: not forced (each model's size decides).
    static ON: Cell<Option<Option<bool>>> = const { Cell::new(None) };
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

/// Forces layer-group dispatch on or off for this thread's later forwards
/// of every model, over `MTP_LAYER_DISPATCH` and the size rule.
pub fn set_layer_dispatch(on: bool) {
    ON.with(|c| c.set(Some(Some(on))));
}

/// Sets this thread's group size (layers per dispatch, at least 1), over
/// `MTP_LAYER_DISPATCH_EVERY`.
pub fn set_layer_dispatch_every(layers: usize) {
    EVERY.with(|c| c.set(Some(layers.max(1))));
}

/// Whether layer-group dispatch is forced on this thread
/// ([`set_layer_dispatch`], else `MTP_LAYER_DISPATCH`: `1` on, `0` off);
/// `None` when each model's size decides.
pub fn layer_dispatch() -> Option<bool> {
    crate::switch::get_parsed(
        &ON,
        "MTP_LAYER_DISPATCH",
        |raw| match raw {
            None => Some(None),
            Some("1") => Some(Some(true)),
            Some("0") => Some(Some(false)),
            Some(_) => None,
        },
        None,
        "0 or 1",
    )
}

/// The weight bytes one decoder layer of `c` reads for a token in
/// `dtype`, from the config: q/k/v, o and the three MLP products (an
/// estimate: a mixture of experts counts `intermediate_size` once, a
/// quantized checkpoint its unpacked size).
pub(crate) fn layer_bytes(c: &ModelConfig, dtype: Dtype) -> u64 {
    let (h, d) = (c.hidden_size as u64, c.head_dim as u64);
    let (hq, hkv) = (c.num_attention_heads as u64, c.num_key_value_heads as u64);
    let attention = h * (hq + 2 * hkv) * d + hq * d * h;
    let mlp = 3 * h * c.intermediate_size as u64;
    (attention + mlp) * dtype.size() as u64
}

/// Whether forwards over layers of `layer_bytes` dispatch in layer groups
/// on this thread: as forced, else on CUDA from [`MIN_LAYER_MIB`] up.
fn dispatch_for(layer_bytes: u64) -> bool {
    layer_dispatch()
        .unwrap_or_else(|| layer_bytes >= MIN_LAYER_MIB << 20 && crate::models::sdpa::on_cuda())
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
/// of the model configured by `c`, with the residual stream `x`
/// `[1, L, H]`: dispatches the layers so far when layer-group dispatch is
/// on for this model and a group is full.
pub(crate) fn after_layer(x: &Array, done: usize, layers: usize, c: &ModelConfig) -> Result<()> {
    if due(x.dim(1) as usize, done, layers, every()) && dispatch_for(layer_bytes(c, x.dtype())) {
        x.async_eval()?;
        dispatched();
    }
    Ok(())
}

/// Called by the MTP head after building one draft step's layer: dispatches
/// it, so the device runs step `i` while the host builds its unembedding
/// and step `i + 1`. Only for single rows (a draft step); a flush of
/// several rows is dispatched whole by the draft session. `layer_bytes`:
/// the head's block, as [`layer_bytes`] gives it.
pub(crate) fn after_draft_step(out: &Array, hidden: &Array, layer_bytes: u64) -> Result<()> {
    if out.dim(0) == 1 && dispatch_for(layer_bytes) {
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

    /// The size rule's estimate at the benchmark shapes: 8b's layers are
    /// over the line in bf16, 1.7b's are not, and nothing is on a CPU.
    #[test]
    fn only_big_layers_on_cuda_dispatch_by_default() {
        let cfg = |h: usize, i: usize, hq: usize, hkv: usize| {
            let json = format!(
                r#"{{"model_type": "qwen3", "hidden_size": {h}, "intermediate_size": {i},
                    "num_hidden_layers": 2, "num_attention_heads": {hq},
                    "num_key_value_heads": {hkv}, "head_dim": {}, "vocab_size": 64}}"#,
                h / hq
            );
            ModelConfig::from_json(&json, "config.json".as_ref()).unwrap()
        };
        let b8 = layer_bytes(&cfg(4096, 12288, 32, 8), Dtype::Bfloat16);
        let b17 = layer_bytes(&cfg(2048, 6144, 16, 8), Dtype::Bfloat16);
        assert_eq!(b8, (4096 * 6144 + 4096 * 4096 + 3 * 4096 * 12288) * 2);
        assert!(b8 >= MIN_LAYER_MIB << 20 && b17 < MIN_LAYER_MIB << 20);
        assert_eq!(
            layer_bytes(&cfg(2048, 6144, 16, 8), Dtype::Float32),
            2 * b17
        );
        assert!(!crate::models::sdpa::on_cuda());
        assert!(!dispatch_for(b8), "a CPU never by default");
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
