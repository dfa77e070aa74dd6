//! Host cost of a one-token step, shared by the `scale-bench` and
//! `verify-probe` examples: building its graph (forward, unembedding,
//! argmax; no evaluation), the op count of that graph, the synced step, and
//! a pipelined loop (the next step built from the lazy token and dispatched
//! before the current one is read). A step whose build time nears the
//! pipelined time per token is bound by the host.

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
    for r in 0..rounds + 2 {
        let t = Array::from_slice(&ids(1, r as u32), &[1]).expect("tokens");
        let start = Instant::now();
        let y = step(m, &mut caches, &t);
        let built = start.elapsed().as_secs_f64() * 1e3;
        nodes = y.pending_nodes();
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
    for _ in 0..rounds {
        let next = step(m, &mut caches, &y);
        next.async_eval().expect("async_eval");
        let _: u32 = y.item().expect("item");
        y = next;
    }
    let _: u32 = y.item().expect("item");
    let pipelined = start.elapsed().as_secs_f64() * 1e3 / rounds as f64;
    json!({"graph_nodes": nodes, "build_ms": median(build), "synced_step_ms": median(synced),
           "pipelined_ms_per_token": pipelined, "rounds": rounds})
}
