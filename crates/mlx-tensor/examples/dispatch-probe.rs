//! Host cost of dispatching MLX work from Rust: a chain of `n` elementwise
//! adds on a `[1, 4096]` array, timed as graph build, `async_eval` (MLX
//! encodes and launches the kernels) and the wait, per node. Compared with
//! the same chain built from Python (`examples/dispatch_probe.py`, run with MLX's Python package) it says
//! whether a step's dispatch cost is the graph's or the binding's.
//!
//! `cargo run --release -p mlx-tensor --example dispatch-probe -- [n] [rounds]`
// A measurement tool: its result is one JSON line on stdout.
#![allow(clippy::print_stdout)]
use std::time::Instant;

use mlx_tensor::{Array, Dtype, ops};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(Ok(1600), |s| s.parse())?;
    let rounds: usize = args.next().map_or(Ok(20), |s| s.parse())?;
    let x = ops::zeros(&[1, 4096], Dtype::Bfloat16)?;
    let one = Array::scalar(1.0, Dtype::Bfloat16)?;
    x.eval()?;
    one.eval()?;
    let (mut build, mut dispatch, mut wait) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t0 = Instant::now();
        let mut y = x.clone();
        for _ in 0..n {
            y = y.add(&one)?;
        }
        let t1 = Instant::now();
        y.async_eval()?;
        let t2 = Instant::now();
        y.wait()?;
        let t3 = Instant::now();
        build.push((t1 - t0).as_secs_f64() * 1e6 / n as f64);
        dispatch.push((t2 - t1).as_secs_f64() * 1e6 / n as f64);
        wait.push((t3 - t2).as_secs_f64() * 1e6 / n as f64);
    }
    let med = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "{{\"engine\":\"rust\",\"nodes\":{n},\"build_us_per_node\":{:.3},\"dispatch_us_per_node\":{:.3},\"wait_us_per_node\":{:.3}}}",
        med(build),
        med(dispatch),
        med(wait)
    );
    Ok(())
}
