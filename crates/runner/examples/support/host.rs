//! Host cost of a one-token step, shared by the `scale-bench` and
//! `verify-probe` examples: building its graph (forward, unembedding,
//! argmax; no evaluation), the op count of that graph, the synced step, and
//! a pipelined loop (the next step built from the lazy token and dispatched
//! before the current one is read). A step whose build time nears the
//! pipelined time per token is bound by the host. Then synced forwards of 1,
//! 2 and 5 rows (a verify's shape), phase by phase.

use std::time::Instant;

use mlx_tensor::Array;
use runner::Model;
use serde_json::{Value, json};

/// The median of `v` (the upper middle for an even count).
pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One step's lazy token `[1]` after `t`.
fn step(m: &dyn Model, caches: &mut [Box<dyn kvcache::Cache>], t: &Array) -> Array {
    let h = m.forward(t, caches).expect("forward");
    m.unembed(&h)
        .expect("unembed")
        .argmax(-1, false)
        .expect("argmax")
        .reshape(&[1])
        .expect("reshape")
}

/// Measures `rounds` steps at key length ~1,000 (`ids(n, salt)`: `n` token ids).
pub(crate) fn probe(m: &dyn Model, ids: &dyn Fn(usize, u32) -> Vec<u32>, rounds: usize) -> Value {
    let mut caches = m.new_caches();
    let prompt = Array::from_slice(&ids(1000, 5), &[1000]).expect("tokens");
    m.forward(&prompt, &mut caches)
        .expect("prefill")
        .eval()
        .expect("eval");
    let (mut build, mut synced, mut nodes) = (Vec::new(), Vec::new(), 0);
    let mut census = String::new();
    for r in 0..rounds + 2 {
        let t = Array::from_slice(&ids(1, r as u32), &[1]).expect("tokens");
        let start = Instant::now();
        let y = step(m, &mut caches, &t);
        let built = start.elapsed().as_secs_f64() * 1e3;
        nodes = y.pending_nodes();
        if r == 2 {
            census = y.pending_census();
        }
        y.eval().expect("eval");
        if r >= 2 {
            build.push(built);
            synced.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    let t = Array::from_slice(&ids(1, 1), &[1]).expect("tokens");
    let mut y = step(m, &mut caches, &t);
    y.async_eval().expect("async_eval");
    let start = Instant::now();
    // Per token of the pipelined loop: building the next step's graph and
    // dispatching it (MLX encodes and launches its kernels) while this one
    // runs, then waiting for this one. Build or dispatch near a step's time
    // means the host, not the device, sets the pace.
    let (mut ahead, mut dispatch, mut wait) = (Vec::new(), Vec::new(), Vec::new());
    let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
    for _ in 0..rounds {
        let t0 = Instant::now();
        let next = step(m, &mut caches, &y);
        let t1 = Instant::now();
        next.async_eval().expect("async_eval");
        let t2 = Instant::now();
        let _: u32 = y.item().expect("item");
        ahead.push(ms(t0, t1));
        dispatch.push(ms(t1, t2));
        wait.push(ms(t2, Instant::now()));
        y = next;
    }
    let _: u32 = y.item().expect("item");
    let pipelined = start.elapsed().as_secs_f64() * 1e3 / rounds as f64;
    let census: serde_json::Map<String, Value> = census
        .lines()
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(k, n)| (k.to_owned(), json!(n.parse::<u64>().unwrap_or(0))))
        .collect();
    let verify: serde_json::Map<String, Value> = [1usize, 2, 5]
        .iter()
        .map(|&r| (r.to_string(), forward_rows(m, &mut caches, ids, r, rounds)))
        .collect();
    json!({"graph_nodes": nodes, "census": census, "build_ms": median(build), "synced_step_ms": median(synced),
           "pipelined_ms_per_token": pipelined, "pipelined_build_ms": median(ahead),
           "pipelined_dispatch_ms": median(dispatch), "pipelined_wait_ms": median(wait), "rounds": rounds,
           "verify": verify})
}

/// A verify's host cost at `rows` rows, synced each time as a round is:
/// building the forward, unembedding and argmax of `rows` rows (with any
/// layer-group dispatches made on the way), dispatching the rest
/// (`async_eval`), then waiting for the device. Each forward commits one
/// row (the caches are rewound to one past their offset), so the key length
/// grows as in decoding.
fn forward_rows(
    m: &dyn Model,
    caches: &mut [Box<dyn kvcache::Cache>],
    ids: &dyn Fn(usize, u32) -> Vec<u32>,
    rows: usize,
    rounds: usize,
) -> Value {
    let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
    let (mut build, mut dispatch, mut wait, mut total) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut nodes = 0;
    for r in 0..rounds + 2 {
        let offset = caches[0].offset();
        let t = Array::from_slice(&ids(rows, 7 + r as u32), &[rows as i32]).expect("tokens");
        let t0 = Instant::now();
        let h = m.forward(&t, caches).expect("forward");
        let y = m
            .unembed(&h)
            .expect("unembed")
            .argmax(-1, false)
            .expect("argmax");
        let t1 = Instant::now();
        nodes = y.pending_nodes();
        let t1b = Instant::now();
        y.async_eval().expect("async_eval");
        let t2 = Instant::now();
        y.eval().expect("eval");
        let t3 = Instant::now();
        // A recurrent cache cannot rewind without a snapshot: no verify figures then.
        for c in caches.iter_mut() {
            if !matches!(c.restore(None, offset + 1), Ok(true)) {
                return json!({"skipped": format!("a {} cache does not rewind by offset", c.kind())});
            }
        }
        if r >= 2 {
            build.push(ms(t0, t1));
            dispatch.push(ms(t1b, t2));
            wait.push(ms(t2, t3));
            total.push(ms(t0, t3) - ms(t1, t1b));
        }
    }
    json!({"graph_nodes": nodes, "build_ms": median(build), "dispatch_ms": median(dispatch),
           "wait_ms": median(wait), "synced_ms": median(total),
           "layer_dispatch_forced": runner::layer_dispatch()})
}
