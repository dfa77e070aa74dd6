//! The decode step against its physical floor: device memory bandwidth, launch overhead, and (with `--model`) the ratio.
//!
//! `cargo run --release -p runner --example bandwidth -- [--info] [--kernel-check]
//! [--device cpu|gpu|auto] [--mib N] [--reps R] [--model DIR] [--tokens N] [--runs R]`
//!
//! One JSON line per measurement, each with `"bench":"floor"` and a `"kind"`:
//! * `device`: `gpu_available`, the device in use and its name, the MLX version.
//!   `--info` prints only this line (what `xtask gpu-check` reads).
//! * `kernel-check` (`--kernel-check`, which prints only these after the
//!   device line; CUDA only): each of our CUDA kernels against the ops it
//!   replaces (`runner::kernel_checks`): `kernel`, `dtype`, `rel_err`,
//!   `tolerance`, `passed`. `xtask gpu-check` enforces them.
//! * `bandwidth`: `op` = `copy` (`y = x * 1`, reads and writes N bytes), `sum`
//!   (reads N bytes), `gemv` (`[1,4096] @ [4096,N/4096]`, reads N bytes: a
//!   decode step's pattern) or, on a CPU, `rows` (the same product through our
//!   rows kernel, the path a CPU decode step takes), `bytes`, `gb_per_s` (best
//!   of `--reps`).
//! * `overhead`: `round_trip_us` (one tiny op, eval, back on the host) and
//!   `per_op_us` (each extra op in a chain of 100 tiny dependent ops, one eval).
//! * `decode` (with `--model`): `weight_bytes` (MLX active memory the loaded
//!   weights hold; the MTP head's and the embedding's share count too, so this
//!   over-states what a plain step reads), `ops_per_step` (graph nodes of one
//!   lazily built plain step: forward, unembed, argmax), `step_ms` (median plain
//!   greedy decode step), `floor_ms` = weight_bytes ÷ the best read bandwidth
//!   (sum, gemv or rows) +
//!   ops_per_step × per_op_us, and `ratio` = step_ms ÷ floor_ms.
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use mlx_tensor::{Array, Device, Dtype};
use runner::{GenerateOptions, LoadOptions, SamplingOptions, Session};
use serde_json::{Value, json};

/// The median of `samples` (seconds), which must be non-empty.
fn median(mut samples: Vec<f64>) -> f64 {
    assert!(!samples.is_empty(), "median of no samples");
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Seconds one `build()` + eval takes, the best of `reps` after one warm-up:
/// a floor wants the fastest the device did, and on a shared machine the
/// median carries other processes' load.
fn time_eval(
    reps: usize,
    mut build: impl FnMut() -> mlx_tensor::Result<Array>,
) -> mlx_tensor::Result<f64> {
    build()?.eval()?;
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = Instant::now();
        build()?.eval()?;
        t.push(start.elapsed().as_secs_f64());
    }
    Ok(t.into_iter().fold(f64::INFINITY, f64::min))
}

fn emit(line: &Value) -> std::io::Result<()> {
    std::io::Write::write_all(&mut std::io::stdout(), format!("{line}\n").as_bytes())
}

/// Copy, sum and GEMV bandwidth over an f32 array of `mib` MiB; returns the best read GB/s.
fn bandwidth(mib: usize, reps: usize) -> Result<f64, Box<dyn std::error::Error>> {
    let n = mib * (1 << 20) / 4;
    let x = mlx_tensor::ops::arange(0.0, n as f64, 1.0, Dtype::Float32)?;
    x.eval()?;
    let one = Array::scalar(1.0, Dtype::Float32)?;
    let bytes = x.nbytes() as f64;
    let copy = time_eval(reps, || x.multiply(&one))?;
    emit(
        &json!({"bench": "floor", "kind": "bandwidth", "op": "copy", "bytes": bytes,
        "gb_per_s": 2.0 * bytes / copy / 1e9, "reps": reps}),
    )?;
    let sum = time_eval(reps, || x.sum(&[0], false))?;
    emit(
        &json!({"bench": "floor", "kind": "bandwidth", "op": "sum", "bytes": bytes,
        "gb_per_s": bytes / sum / 1e9, "reps": reps}),
    )?;
    // The decode step's own access pattern: one row times a weight matrix (BLAS on
    // the CPU, cuBLAS on CUDA), which MLX's CPU reduction does not match.
    const K: i32 = 4096;
    let w = x.reshape(&[K, (n / K as usize) as i32])?;
    let v = mlx_tensor::ops::ones(&[1, K], Dtype::Float32)?;
    v.eval()?;
    let gemv = time_eval(reps, || v.matmul(&w))?;
    emit(
        &json!({"bench": "floor", "kind": "bandwidth", "op": "gemv", "bytes": bytes,
        "gb_per_s": bytes / gemv / 1e9, "reps": reps}),
    )?;
    // On a CPU a dense decode step's products go through our own rows kernel
    // (all cores, each weight row streamed once), which reads faster than
    // MLX's one-thread reduction or BLAS's GEMV: without it a step could beat
    // its "floor".
    let mut best = sum.min(gemv);
    if mlx_tensor::default_device() == Device::Cpu {
        let wt = x.reshape(&[(n / K as usize) as i32, K])?;
        let rows = time_eval(reps, || mlx_tensor::ops::rows_matmul_t(&v, &wt))?;
        emit(
            &json!({"bench": "floor", "kind": "bandwidth", "op": "rows", "bytes": bytes,
            "gb_per_s": bytes / rows / 1e9, "reps": reps}),
        )?;
        best = best.min(rows);
    }
    // The floor takes the best read rate measured.
    Ok(bytes / best / 1e9)
}

/// Round trip of one tiny op and the cost of each op in a chain; returns µs per op.
fn overhead(reps: usize) -> Result<f64, Box<dyn std::error::Error>> {
    const CHAIN: usize = 100;
    let a = Array::from_slice(&[1.0f32], &[1])?;
    let rt = time_eval(reps.max(50), || a.add(&a))?;
    let chain = time_eval(reps.max(10), || {
        let mut y = a.add(&a)?;
        for _ in 1..CHAIN {
            y = y.add(&a)?;
        }
        Ok(y)
    })?;
    let per_op = ((chain - rt) / (CHAIN - 1) as f64).max(0.0) * 1e6;
    emit(
        &json!({"bench": "floor", "kind": "overhead", "round_trip_us": rt * 1e6,
        "per_op_us": per_op, "chain": CHAIN}),
    )?;
    Ok(per_op)
}

/// Plain decode step time on `dir` against weight_bytes ÷ `gbs` + ops × `per_op_us`.
fn decode_floor(
    dir: &Path,
    tokens: usize,
    runs: usize,
    gbs: f64,
    per_op_us: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    let before = mlx_tensor::memory::active();
    let m = runner::load(dir, LoadOptions::default(), |_, _| {})?;
    let weight_bytes = mlx_tensor::memory::active().saturating_sub(before);
    let ids = m.tokenizer.encode("Once upon a time", true)?;
    // One plain step built lazily after a prefill: its node count is what one eval dispatches.
    let model = m.model.as_ref();
    let mut caches = model.new_caches();
    let prompt = Array::from_slice(&ids, &[ids.len() as i32])?;
    let h = model.forward(&prompt, &mut caches)?;
    let last = h.slice_axis(0, ids.len() as i32 - 1, ids.len() as i32)?;
    let tok = model
        .unembed(&last)?
        .argmax(-1, false)?
        .as_type(Dtype::Uint32)?;
    tok.eval()?;
    let next = model
        .unembed(&model.forward(&tok, &mut caches)?)?
        .argmax(-1, false)?;
    let ops_per_step = next.pending_nodes();
    drop((next, caches));
    let opts = GenerateOptions {
        max_tokens: tokens,
        sampling: SamplingOptions::greedy(),
        ..GenerateOptions::default()
    };
    let never = AtomicBool::new(false);
    let mut steps = Vec::with_capacity(runs);
    for run in 0..=runs {
        let g = Session::new(model).generate(&m.tokenizer, &ids, &opts, &never, |_| {})?;
        if run > 0 {
            steps.push(1e3 / g.stats.decode_tps());
        }
    }
    let step_ms = median(steps);
    let bytes_ms = weight_bytes as f64 / (gbs * 1e9) * 1e3;
    let ops_ms = ops_per_step as f64 * per_op_us / 1e3;
    let floor_ms = bytes_ms + ops_ms;
    emit(
        &json!({"bench": "floor", "kind": "decode", "model": dir.display().to_string(),
        "weight_bytes": weight_bytes, "ops_per_step": ops_per_step, "step_ms": step_ms,
        "bandwidth_gb_per_s": gbs, "per_op_us": per_op_us, "bytes_ms": bytes_ms, "ops_ms": ops_ms,
        "floor_ms": floor_ms, "ratio": step_ms / floor_ms, "tokens": tokens, "runs": runs}),
    )?;
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut info_only, mut kernel_check) = (false, false);
    let (mut device, mut mib, mut reps) = ("auto".to_owned(), None, 10usize);
    let (mut model, mut tokens, mut runs) = (None, 128usize, 3usize);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--info" => info_only = true,
            "--kernel-check" => kernel_check = true,
            "--device" => device = val()?,
            "--mib" => mib = Some(val()?.parse::<usize>()?),
            "--reps" => reps = val()?.parse()?,
            "--model" => model = Some(PathBuf::from(val()?)),
            "--tokens" => tokens = val()?.parse()?,
            "--runs" => runs = val()?.parse()?,
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    if reps == 0 || runs == 0 {
        return Err("--reps and --runs must be at least 1".into());
    }
    let gpu_available = mlx_tensor::gpu_available();
    let gpu = match device.as_str() {
        "cpu" => false,
        "gpu" if !gpu_available => {
            return Err("--device gpu: this MLX build has no GPU backend".into());
        }
        "gpu" => true,
        "auto" => gpu_available,
        other => return Err(format!("--device {other}: cpu, gpu or auto").into()),
    };
    mlx_tensor::set_default_device(if gpu { Device::Gpu } else { Device::Cpu })?;
    emit(
        &json!({"bench": "floor", "kind": "device", "gpu_available": gpu_available,
        "device": if gpu { "gpu" } else { "cpu" },
        "device_name": mlx_tensor::device_name().unwrap_or_default(),
        "mlx_version": mlx_tensor::mlx_version()}),
    )?;
    if kernel_check {
        // Our CUDA kernels against the ops they replace (nothing where none runs).
        for c in runner::kernel_checks()? {
            emit(
                &json!({"bench": "floor", "kind": "kernel-check", "kernel": c.kernel,
                         "dtype": c.dtype, "rel_err": c.rel_err, "tolerance": c.tolerance,
                         "passed": c.passed()}),
            )?;
        }
    }
    if !info_only && !kernel_check {
        // Big enough to leave the caches (the H200's L2 is 50-60 MB).
        let gbs = bandwidth(mib.unwrap_or(if gpu { 1024 } else { 256 }), reps)?;
        let per_op = overhead(reps)?;
        if let Some(dir) = &model {
            decode_floor(dir, tokens, runs, gbs, per_op)?;
        }
    }
    // Skip static destructors: OpenBLAS's exit-time shutdown can hang (see `exit_now`).
    std::io::Write::flush(&mut std::io::stdout())?;
    mlx_tensor::exit_now(0)
}
