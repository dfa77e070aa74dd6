//! Cost of a verify forward (`L` rows) against a one-token step, per attention
//! path, with the key length growing every round as in speculative decoding;
//! and prefill time for two prompt lengths in a row (the second must not pay
//! a per-length rebuild). One JSON line per measurement.
//!
//! `cargo run --release -p runner --features testing --example verify-probe --
//! [--model DIR | --shape tiny|1.7b|8b] [--dtype bf16|f32] [--rounds N]
//! [--paths fused,explicit,short,padded] [--host-only]`
//!
//! `--delta-check DIR` (a Gated DeltaNet model, f32) only compares the
//! logits of a prefill, a 5-row verify and a one-row step with the CUDA
//! gated delta kernel on and off (`"probe":"delta-kernel"`), and fails past
//! [`DELTA_TOLERANCE`].
//!
//! First, always: our CUDA kernels against the ops they replace
//! (`runner::kernel_checks`, `"probe":"kernel-check"`; one past its
//! tolerance, and nothing else runs; none on a CPU); then the host cost of a
//! one-token step (`"probe":"host"`).
//!
//! Without `--model` a random-weight Qwen3 checkpoint of `--shape` is written
//! to a temporary folder first (the timings do not depend on the values).
use std::path::PathBuf;
use std::time::Instant;

use mlx_tensor::{Array, Dtype};
use runner::testing::{Arch, Fixture, write_checkpoint};
use runner::{
    AttentionPath, LoadOptions, Model, set_attention_path, set_delta_kernel, set_rows_kernel,
    set_rows_kernel_max_mib, set_rows_kernel_one_row,
};
use serde_json::json;

#[path = "support/host.rs"]
mod host;
use host::median;

fn shape(name: &str) -> Option<Fixture> {
    let base = Fixture::new(Arch::Qwen3);
    let (hidden, layers, heads, kv_heads, head_dim, intermediate, vocab) = match name {
        "tiny" => (256, 6, 8, 4, 32, 768, 8192),
        "1.7b" => (2048, 28, 32, 16, 64, 6144, 151_936),
        "8b" => (4096, 36, 64, 16, 64, 12_288, 151_936),
        _ => return None,
    };
    Some(Fixture {
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim,
        intermediate,
        vocab,
        context: 8192,
        dtype: Dtype::Bfloat16,
        tied: false,
        ..base
    })
}

/// The few-rows kernel on or off for every row count and weight it takes
/// (one row and weights over the default cap included).
fn rows_kernel(on: bool) {
    set_rows_kernel(on);
    set_rows_kernel_one_row(on);
    set_rows_kernel_max_mib(None);
}

/// Milliseconds of one evaluated forward of `ids` at the caches' offset.
/// The largest `|want|` and the largest `|want - got|` (a NaN difference is
/// passed over, as `f32::max` does; callers check `got`'s length and finiteness).
fn range_and_diff(want: &[f32], got: &[f32]) -> (f32, f32) {
    let range = want.iter().fold(0.0f32, |a, x| a.max(x.abs()));
    let diff = want
        .iter()
        .zip(got)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    (range, diff)
}

fn timed(m: &dyn Model, caches: &mut [Box<dyn kvcache::Cache>], ids: &[u32]) -> f64 {
    let t = Array::from_slice(ids, &[ids.len() as i32]).expect("tokens");
    let start = Instant::now();
    let h = m.forward(&t, caches).expect("forward");
    let l = h.dim(0);
    let logits = m
        .unembed(&h.slice_axis(0, l - 1, l).expect("slice"))
        .expect("unembed");
    logits
        .argmax(-1, false)
        .expect("argmax")
        .eval()
        .expect("eval");
    start.elapsed().as_secs_f64() * 1e3
}

/// Times `rounds` verify forwards of `rows` tokens after a 1,000-token prompt
/// (two untimed first), the key length growing every round; returns the caches.
fn verify_rounds(
    m: &dyn Model,
    ids: &dyn Fn(usize, u32) -> Vec<u32>,
    rows: usize,
    rounds: usize,
) -> (Vec<Box<dyn kvcache::Cache>>, Vec<f64>) {
    let mut caches = m.new_caches();
    timed(m, &mut caches, &ids(1000, 9));
    let times = (0..rounds + 2)
        .map(|r| timed(m, &mut caches, &ids(rows, r as u32)))
        .skip(2)
        .collect();
    (caches, times)
}

// A benchmark binary: notes go to stderr, results to stdout.
#[allow(clippy::print_stdout, clippy::print_stderr)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut model, mut shape_name, mut dtype, mut rounds) =
        (None, "tiny".to_owned(), Dtype::Bfloat16, 24usize);
    let mut host_only = false;
    let mut paths = vec![
        AttentionPath::Fused,
        AttentionPath::Explicit,
        AttentionPath::Short,
        AttentionPath::Padded,
    ];
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--model" => model = Some(PathBuf::from(val()?)),
            "--shape" => shape_name = val()?,
            "--dtype" => {
                dtype = match val()?.as_str() {
                    "bf16" => Dtype::Bfloat16,
                    "f32" => Dtype::Float32,
                    d => return Err(format!("--dtype {d}: bf16 or f32").into()),
                }
            }
            "--rounds" => rounds = val()?.parse()?,
            "--host-only" => host_only = true,
            "--delta-check" => {
                let worst = delta_check(&PathBuf::from(val()?))?;
                if worst > DELTA_TOLERANCE {
                    return Err(format!(
                        "the gated delta kernel differs from the ops path by {worst:.2e} of the logit range (> {DELTA_TOLERANCE:e})"
                    )
                    .into());
                }
                return Ok(());
            }
            "--paths" => {
                paths = val()?
                    .split(',')
                    .map(|p| AttentionPath::parse(p).ok_or(format!("--paths: unknown `{p}`")))
                    .collect::<Result<_, _>>()?
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let tmp;
    let dir = match model {
        Some(d) => d,
        None => {
            let fx = shape(&shape_name).ok_or(format!("--shape {shape_name}: tiny, 1.7b, 8b"))?;
            tmp = std::env::temp_dir().join(format!("verify-probe-{shape_name}"));
            if !tmp.join("config.json").exists() {
                let start = Instant::now();
                write_checkpoint(&tmp, &fx, 7)?;
                eprintln!(
                    "wrote {} in {:.1} s",
                    tmp.display(),
                    start.elapsed().as_secs_f64()
                );
            }
            tmp.clone()
        }
    };
    let opts = LoadOptions {
        dtype,
        ..LoadOptions::default()
    };
    let loaded = runner::load(&dir, opts, |_, _| {})?;
    let m = loaded.model.as_ref();
    let vocab = m.config().vocab_size as u32;
    let ids = |n: usize, salt: u32| -> Vec<u32> {
        (0..n as u32)
            .map(|i| (i * 7919 + salt) % (vocab - 3) + 3)
            .collect()
    };
    let dt = format!("{dtype:?}");
    // Our CUDA kernels against the ops they replace (nothing runs on a CPU):
    // a kernel past its tolerance stops the probe before anything is timed.
    for c in runner::kernel_checks()? {
        println!(
            "{}",
            json!({"probe": "kernel-check", "kernel": c.kernel, "dtype": c.dtype,
                   "rel_err": c.rel_err, "tolerance": c.tolerance, "passed": c.passed()})
        );
        if !c.passed() {
            return Err(format!(
                "the {} kernel differs from the ops it replaces in {} by {:.2e} of the output range (> {:e})",
                c.kernel, c.dtype, c.rel_err, c.tolerance
            )
            .into());
        }
    }
    let host = host::probe(m, &|n, salt| ids(n, salt), rounds.max(32));
    println!("{}", json!({"probe": "host", "dtype": dt, "host": host}));
    if host_only {
        return Ok(());
    }
    for &path in &paths {
        set_attention_path(path);
        let p = format!("{path:?}").to_lowercase();
        // Prefill: a 1,000-token prompt, then another of 777 in fresh caches.
        for (i, n) in [1000usize, 777, 1000].into_iter().enumerate() {
            let mut caches = m.new_caches();
            let ms = timed(m, &mut caches, &ids(n, i as u32));
            println!(
                "{}",
                json!({"probe":"prefill","path":p,"dtype":dt,"prompt_tokens":n,"request":i,"ms":ms})
            );
        }
        for rows in 1..=5usize {
            let (_, times) = verify_rounds(m, &ids, rows, rounds);
            println!(
                "{}",
                json!({"probe":"verify","path":p,"dtype":dt,"rows":rows,"median_ms":median(times.clone()),
                       "max_ms":times.iter().cloned().fold(0.0, f64::max),"rounds":rounds})
            );
        }
    }
    // The few-rows kernel against MLX's matmul (GEMV for one row, cuBLASLt
    // for more), same bf16 inputs: the largest difference in units of the
    // output's magnitude (bf16 keeps 8 bits), and the weight read rate of
    // each over enough copies of the weight (about 1 GiB) that launches do
    // not count.
    for (n, k) in [
        (4096, 4096),
        (24_576, 4096),
        (4096, 12_288),
        (151_936, 4096),
    ] {
        let copies = (1usize << 30).div_ceil(n as usize * k as usize * 2).max(1);
        let lins = (0..copies)
            .map(|c| {
                let w = mlx_tensor::random::normal(
                    &[n, k],
                    Dtype::Bfloat16,
                    &mlx_tensor::random::key(3 + c as u64)?,
                )?;
                w.eval()?;
                Ok(runner::testing::Linear::from_weight(
                    &w,
                    None,
                    runner::LinearLayout::TransposedView,
                )?)
            })
            .collect::<Result<Vec<_>, Box<dyn std::error::Error>>>()?;
        let bytes = (copies * n as usize * k as usize * 2) as f64;
        for rows in [1, 2, 3, 4, 5, 6, 8] {
            let x = mlx_tensor::random::normal(
                &[1, rows, k],
                Dtype::Bfloat16,
                &mlx_tensor::random::key(4)?,
            )?;
            let mut runs = Vec::new();
            for on in [false, true] {
                rows_kernel(on);
                let y = lins[0]
                    .forward(&x)?
                    .as_type(Dtype::Float32)?
                    .to_vec::<f32>()?;
                let mut times = Vec::new();
                for _ in 0..7 {
                    let start = Instant::now();
                    let ys = lins
                        .iter()
                        .map(|l| l.forward(&x))
                        .collect::<Result<Vec<_>, _>>()?;
                    mlx_tensor::eval(&ys)?;
                    times.push(start.elapsed().as_secs_f64() * 1e3);
                }
                runs.push((y, median(times[1..].to_vec())));
            }
            rows_kernel(false);
            let (scale, diff) = range_and_diff(&runs[0].0, &runs[1].0);
            let finite =
                runs[1].0.iter().all(|v| v.is_finite()) && runs[1].0.len() == runs[0].0.len();
            println!(
                "{}",
                json!({"probe":"rows-kernel-unit","n":n,"k":k,"rows":rows,"max_abs_diff":diff,"max_abs":scale,
                       "rel":diff / scale.max(1e-30),"finite":finite,
                       "mlx_ms":runs[0].1,"kernel_ms":runs[1].1,
                       "mlx_gb_s":bytes / runs[0].1 / 1e6,"kernel_gb_s":bytes / runs[1].1 / 1e6})
            );
        }
    }
    // The few-rows CUDA matmul kernel against MLX's matmul in a whole
    // forward (one row: a plain step through the kernel's one-row case):
    // verify time and the largest logit difference of the same verify.
    set_attention_path(AttentionPath::Auto);
    for rows in 1..=6usize {
        let mut out = Vec::new();
        for on in [false, true] {
            rows_kernel(on);
            let (mut caches, times) = verify_rounds(m, &ids, rows, rounds);
            let t = Array::from_slice(&ids(rows, 99), &[rows as i32])?;
            let logits = m.unembed(&m.forward(&t, &mut caches)?)?.to_vec::<f32>()?;
            out.push((median(times), logits));
        }
        rows_kernel(false);
        let (range, diff) = range_and_diff(&out[0].1, &out[1].1);
        println!(
            "{}",
            json!({"probe":"rows-kernel","dtype":dt,"rows":rows,"cublas_ms":out[0].0,"kernel_ms":out[1].0,
                   "max_logit_diff":diff,"logit_range":range})
        );
    }
    Ok(())
}

/// Largest logit difference allowed between the gated delta kernel and the
/// ops path in f32, in units of the logit range (summation order only).
const DELTA_TOLERANCE: f32 = 1e-3;

/// The logits of a 40-token prefill, then a 5-row verify, then one step of
/// the model at `dir` in f32, with the gated delta kernel on and off; prints
/// one line per forward and returns the worst relative difference.
#[allow(clippy::print_stdout)]
fn delta_check(dir: &std::path::Path) -> Result<f32, Box<dyn std::error::Error>> {
    let opts = LoadOptions {
        dtype: Dtype::Float32,
        ..LoadOptions::default()
    };
    let m = runner::load(dir, opts, |_, _| {})?;
    let model = m.model.as_ref();
    let vocab = model.config().vocab_size as u32;
    let ids = |n: u32, salt: u32| -> Vec<u32> {
        (0..n)
            .map(|i| (i * 7919 + salt) % (vocab - 3) + 3)
            .collect()
    };
    let inputs = [ids(40, 1), ids(5, 2), ids(1, 3)];
    let mut logits: [Vec<Vec<f32>>; 2] = [Vec::new(), Vec::new()];
    for (i, on) in [false, true].into_iter().enumerate() {
        set_delta_kernel(on);
        let mut caches = model.new_caches();
        for t in &inputs {
            let x = Array::from_slice(t, &[t.len() as i32])?;
            let h = model.forward(&x, &mut caches)?;
            logits[i].push(model.unembed(&h)?.to_vec::<f32>()?);
        }
    }
    let mut worst = 0.0f32;
    for (j, name) in ["prefill-40", "verify-5", "step-1"].iter().enumerate() {
        let (range, diff) = range_and_diff(&logits[0][j], &logits[1][j]);
        let rel = if diff.is_finite() {
            diff / range.max(1e-30)
        } else {
            1.0
        };
        worst = worst.max(rel);
        println!(
            "{}",
            json!({"probe":"delta-kernel","gpu":mlx_tensor::gpu_available(),"model":dir.display().to_string(),"forward":name,"max_abs_diff":diff,"logit_range":range,"rel":rel})
        );
    }
    Ok(worst)
}
