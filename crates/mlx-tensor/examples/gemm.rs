//! GEMM micro-benchmark: `x[m, k] @ w[k, n]` for m = 1, 4, 8 in f32 and bf16, one JSON object per line.
//!
//! This is the cost of verifying several draft tokens at once: with a good
//! BLAS, m = 8 costs little more than m = 1. On the CPU each case is timed
//! twice: `"kernel":"matmul"` (MLX's matmul) and `"kernel":"rows"` (our
//! few-rows kernel, `ops::rows_matmul_t`, over the `[n, k]` weight). Weights are evaluated before
//! timing; each round builds the product, evaluates it and waits (so the
//! figure includes one eval round trip, as a decode step pays it); the median
//! of the rounds is printed. `--weights N` multiplies `x` by N distinct
//! weights per round, evaluated together: past the caches' size that reads
//! the weights from memory, as a decode step does.
//!
//! Run with `cargo xtask bench gemm` (a release build), or
//! `cargo run --release -p mlx-tensor --example gemm -- [--rounds N] [--k K] [--n N] [--m 1,4,8] [--dtypes f32,bf16] [--weights N]`.
//!
//! `--fp mxfp4,mxfp8,nvfp4` adds, on the CPU, each of MLX's floating-point
//! quantization modes of the `[n, k]` weights: `fp-qmm-MODE` (MLX's
//! `quantized_matmul`, which runs each row of `x` through the whole weight)
//! against `fp-rows-MODE` (our rows kernel, `ops::quant_rows_matmul_t_mode`,
//! up to `ops::ROWS_MATMUL_MAX_ROWS` rows: the route `runner` takes for a
//! step or a verify) and `fp-deq-MODE` (the weight dequantized into f32
//! every round, then MLX's f32 matmul: the route `runner` takes for a
//! prefill chunk, there in blocks of 16 MiB of f32 weight).
//!
//! `--keys S [--heads Hq,Hkv,D]` times the CPU attention instead
//! (`"bench":"attention"`): `m` query rows over `S` cached keys
//! (`ops::attention_rows_cpu_cached`), one cache per `--weights` (a layer
//! each), evaluated together, as a verify (`m` = depth + 1) or a step pays it.

use std::io::Write;
use std::time::Instant;

use mlx_tensor::ops::QuantMode;
use mlx_tensor::{Array, Dtype, Result, random};

/// A quantized weight: codes, scales, biases.
type Packed = (Array, Array, Array);

/// The weights in one floating-point mode: codes and uint8 scales each.
type FpPacked = (QuantMode, Vec<(Array, Array)>);

struct Options {
    rounds: usize,
    k: i32,
    n: i32,
    ms: Vec<i32>,
    dtypes: Vec<Dtype>,
    /// Distinct weights multiplied per round (more than the caches hold
    /// read from memory, as a decode step's layers do).
    weights: usize,
    /// With `--keys`: time the CPU attention instead (`m` query rows over
    /// this many cached keys, one cache per `--weights`).
    keys: Option<i32>,
    /// Query heads, KV heads and head width of `--keys`.
    heads: (i32, i32, i32),
    /// Floating-point quantization modes to time on the CPU (`--fp`).
    fp: Vec<QuantMode>,
}

fn parse() -> std::result::Result<Options, String> {
    let mut o = Options {
        rounds: 15,
        k: 2048,
        n: 2048,
        ms: vec![1, 4, 8],
        dtypes: vec![Dtype::Float32, Dtype::Bfloat16],
        weights: 1,
        keys: None,
        heads: (16, 8, 64),
        fp: Vec::new(),
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let int = |v: &str| v.parse::<i32>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--rounds" => o.rounds = int(&value)?.max(1) as usize,
            "--k" => o.k = int(&value)?,
            "--weights" => o.weights = int(&value)?.max(1) as usize,
            "--n" => o.n = int(&value)?,
            "--keys" => o.keys = Some(int(&value)?),
            "--heads" => {
                let v = value
                    .split(',')
                    .map(int)
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                let [hq, hkv, d] = v[..] else {
                    return Err(format!("--heads {value}: want Hq,Hkv,D"));
                };
                o.heads = (hq, hkv, d);
            }
            "--fp" => {
                o.fp = value
                    .split(',')
                    .map(|m| match QuantMode::from_name(m) {
                        Some(mode) if mode.fixed().is_some() => Ok(mode),
                        _ => Err(format!("--fp {m}: use mxfp4, mxfp8 or nvfp4")),
                    })
                    .collect::<std::result::Result<_, _>>()?
            }
            "--m" => {
                o.ms = value
                    .split(',')
                    .map(int)
                    .collect::<std::result::Result<_, _>>()?
            }
            "--dtypes" => {
                o.dtypes = value
                    .split(',')
                    .map(|d| match d {
                        "f32" => Ok(Dtype::Float32),
                        "bf16" => Ok(Dtype::Bfloat16),
                        "f16" => Ok(Dtype::Float16),
                        other => Err(format!("unknown dtype {other} (use f32, bf16 or f16)")),
                    })
                    .collect::<std::result::Result<_, _>>()?
            }
            other => {
                return Err(format!(
                    "unknown option {other}; options: --rounds --k --n --m --dtypes --weights --keys --heads --fp"
                ));
            }
        }
    }
    Ok(o)
}

fn name(d: Dtype) -> &'static str {
    match d {
        Dtype::Bfloat16 => "bf16",
        Dtype::Float16 => "f16",
        _ => "f32",
    }
}

/// The median of `rounds` timed calls of `f`, in µs, after two warm-up calls
/// (first-touch allocations and thread start-up).
fn median_us(rounds: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..2 {
        f()?;
    }
    let mut times: Vec<f64> = (0..rounds)
        .map(|_| {
            let t = Instant::now();
            f()?;
            Ok(t.elapsed().as_secs_f64() * 1e6)
        })
        .collect::<Result<_>>()?;
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// `--keys`: the CPU attention of `m` query rows over `keys` cached keys
/// (`ops::attention_rows_cpu_cached`), one cache per `--weights`, all
/// evaluated together, as a verify (m = k + 1) or a step (m = 1) pays it.
fn attention(o: &Options, keys: i32, out: &mut impl Write) -> Result<()> {
    let (hq, hkv, d) = o.heads;
    let capacity = keys + 256;
    for &dtype in &o.dtypes {
        let caches = (0..o.weights)
            .map(|i| {
                let kv = |s: u64| -> Result<Array> {
                    let a =
                        random::normal(&[1, hkv, capacity, d], Dtype::Float32, &random::key(s)?)?
                            .as_type(dtype)?;
                    a.eval()?;
                    Ok(a)
                };
                Ok((kv(2 * i as u64)?, kv(2 * i as u64 + 1)?))
            })
            .collect::<Result<Vec<_>>>()?;
        for &m in &o.ms {
            let q = random::normal(&[1, hq, m, d], Dtype::Float32, &random::key(99)?)?
                .as_type(dtype)?;
            q.eval()?;
            let scale = 1.0 / (d as f32).sqrt();
            let us = median_us(o.rounds, || {
                let outs = caches
                    .iter()
                    .map(|(k, v)| mlx_tensor::ops::attention_rows_cpu_cached(&q, k, v, keys, scale))
                    .collect::<Result<Vec<_>>>()?;
                mlx_tensor::eval(&outs)
            })?;
            let _ = writeln!(
                out,
                r#"{{"bench":"attention","dtype":"{}","m":{m},"keys":{keys},"heads":[{hq},{hkv},{d}],"layers":{},"us":{us:.1}}}"#,
                name(dtype),
                o.weights
            );
        }
    }
    Ok(())
}

/// `x @ W.T` for each floating-point-quantized `W` in `q`, evaluated
/// together, by `kernel`: `fp-qmm` (MLX's `quantized_matmul`), `fp-rows`
/// (our rows kernel, `ops::quant_rows_matmul_t_mode`), or `fp-deq` (`W`
/// dequantized into f32 and MLX's f32 matmul, the product rounded back to
/// `x`'s dtype).
fn fp_product(x: &Array, q: &[(Array, Array)], mode: QuantMode, kernel: &str) -> Result<()> {
    let (g, b) = mode.fixed().expect("an fp mode");
    let outs = q
        .iter()
        .map(|(w, s)| {
            match kernel {
                "fp-qmm" => {
                    return mlx_tensor::ops::quantized_matmul_mode(x, w, s, None, true, g, b, mode);
                }
                "fp-rows" => {
                    return mlx_tensor::ops::quant_rows_matmul_t_mode(x, w, s, None, g, b, mode);
                }
                _ => {}
            }
            let w = mlx_tensor::ops::dequantize_mode(w, s, None, g, b, mode, Dtype::Float32)?;
            x.as_type(Dtype::Float32)?
                .matmul(&w.t()?)?
                .as_type(x.dtype())
        })
        .collect::<Result<Vec<_>>>()?;
    mlx_tensor::eval(&outs)
}

/// The `[n, k]` weights (`ws`' second half, present on the CPU only) in
/// each `--fp` mode: codes and uint8 scales, evaluated.
fn fp_weights(modes: &[QuantMode], ws: &[(Array, Option<Array>)]) -> Result<Vec<FpPacked>> {
    let mut fps = Vec::new();
    for &mode in modes {
        let (g, b) = mode.fixed().expect("parse keeps fp modes only");
        let mut v = Vec::with_capacity(ws.len());
        for w_rows in ws.iter().filter_map(|(_, w)| w.as_ref()) {
            let (q, s, _) = w_rows.quantize_mode(g, b, mode)?;
            mlx_tensor::eval(&[q.clone(), s.clone()])?;
            v.push((q, s));
        }
        if !v.is_empty() {
            fps.push((mode, v));
        }
    }
    Ok(fps)
}

/// One result line of a product case.
fn gemm_line(o: &Options, kernel: &str, dtype: Dtype, m: i32, us: f64) -> String {
    format!(
        r#"{{"bench":"gemm","kernel":"{kernel}","dtype":"{}","m":{m},"k":{},"n":{},"weights":{},"us":{us:.1}}}"#,
        name(dtype),
        o.k,
        o.n,
        o.weights
    )
}

// Long: one loop over dtypes and row counts that times every kernel's case in turn.
fn main() -> Result<()> {
    let o = match parse() {
        Ok(o) => o,
        Err(msg) => {
            let _ = writeln!(std::io::stderr(), "gemm: {msg}");
            std::process::exit(2);
        }
    };
    let _ = writeln!(
        std::io::stderr(),
        "gemm: MLX {} with {}",
        mlx_tensor::mlx_version(),
        mlx_tensor::blas_info()
    );
    let mut out = std::io::stdout().lock();
    if let Some(keys) = o.keys {
        return attention(&o, keys, &mut out);
    }
    for &dtype in &o.dtypes {
        let mut ws = Vec::with_capacity(o.weights);
        for i in 0..o.weights {
            let w = random::normal(&[o.k, o.n], Dtype::Float32, &random::key(i as u64)?)?
                .as_type(dtype)?;
            w.eval()?;
            // On the CPU, the `[n, k]` layout the rows kernel reads (a copy, evaluated now).
            let w_rows = if mlx_tensor::default_device() == mlx_tensor::Device::Cpu {
                let w_rows = w.t()?.contiguous()?;
                w_rows.eval()?;
                Some(w_rows)
            } else {
                None
            };
            ws.push((w, w_rows));
        }
        // The `[n, k]` weights quantized (group 64) at 8 and 4 bits, for the
        // quantized cases on the CPU: `qrows-N` (`ops::quant_rows_matmul_t`)
        // against `qmm-N` (MLX's `quantized_matmul`).
        let mut qs: Vec<(i32, Vec<Packed>)> = Vec::new();
        if ws[0].1.is_some() {
            for bits in [8, 4] {
                let mut v = Vec::with_capacity(ws.len());
                for (_, w_rows) in &ws {
                    let (q, s, b) = w_rows.as_ref().expect("CPU").quantize(64, bits)?;
                    mlx_tensor::eval(&[q.clone(), s.clone(), b.clone()])?;
                    v.push((q, s, b));
                }
                qs.push((bits, v));
            }
        }
        let fps = fp_weights(&o.fp, &ws)?;
        for &m in &o.ms {
            let x = random::normal(&[m, o.k], Dtype::Float32, &random::key(m as u64)?)?
                .as_type(dtype)?;
            x.eval()?;
            let rows_kernel =
                ws[0].1.is_some() && (1..=mlx_tensor::ops::ROWS_MATMUL_MAX_ROWS).contains(&m);
            for kernel in ["matmul", "rows"] {
                if kernel == "rows" && !rows_kernel {
                    continue;
                }
                // Every weight's product, evaluated together.
                let product = || -> Result<()> {
                    let outs = ws
                        .iter()
                        .map(|(w, w_rows)| match w_rows {
                            Some(w_rows) if kernel == "rows" => {
                                mlx_tensor::ops::rows_matmul_t(&x, w_rows)
                            }
                            _ => x.matmul(w),
                        })
                        .collect::<Result<Vec<_>>>()?;
                    mlx_tensor::eval(&outs)
                };
                let us = median_us(o.rounds, product)?;
                let _ = writeln!(out, "{}", gemm_line(&o, kernel, dtype, m, us));
            }
            for (bits, q) in &qs {
                for kernel in ["qrows", "qmm"] {
                    if kernel == "qrows" && !rows_kernel {
                        continue;
                    }
                    let product = || -> Result<()> {
                        let outs = q
                            .iter()
                            .map(|(w, s, b)| match kernel {
                                "qrows" => {
                                    mlx_tensor::ops::quant_rows_matmul_t(&x, w, s, b, 64, *bits)
                                }
                                _ => {
                                    mlx_tensor::ops::quantized_matmul(&x, w, s, b, true, 64, *bits)
                                }
                            })
                            .collect::<Result<Vec<_>>>()?;
                        mlx_tensor::eval(&outs)
                    };
                    let us = median_us(o.rounds, product)?;
                    let kernel = format!("{kernel}-{bits}");
                    let _ = writeln!(out, "{}", gemm_line(&o, &kernel, dtype, m, us));
                }
            }
            for (mode, q) in &fps {
                for kernel in ["fp-qmm", "fp-rows", "fp-deq"] {
                    if kernel == "fp-rows" && !rows_kernel {
                        continue;
                    }
                    let us = median_us(o.rounds, || fp_product(&x, q, *mode, kernel))?;
                    let kernel = format!("{kernel}-{}", mode.name());
                    let _ = writeln!(out, "{}", gemm_line(&o, &kernel, dtype, m, us));
                }
            }
        }
    }
    Ok(())
}
