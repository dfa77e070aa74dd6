//! Gathered quantized product micro-benchmark: one MoE projection on the
//! CPU, `x[b] @ W[e_b].T` over a stack of `E` quantized `[n, k]` experts,
//! `m` rows each routed to `top` experts, one JSON object per line.
//!
//! Each case is timed three ways: `"kernel":"gather-qmm"` (MLX's
//! `gather_qmm`, what `runner` called before), `"kernel":"gather-rows"`
//! (`ops::quant_gather_rows_matmul_t`, our rows kernel grouped by expert)
//! and `"kernel":"rows-loop"` (one `ops::quant_rows_matmul_t_mode` per
//! chosen expert over its slice of the stack, the experts read back on the
//! host first: the route without a gathered primitive). Weights are
//! evaluated before timing; each round builds the product, evaluates it and
//! waits; the median of the rounds is printed, in milliseconds.
//!
//! `cargo run --release -p mlx-tensor --example gather_rows -- [--rounds N] [--experts E] [--n N] [--k K] [--top T] [--m 1,4]`

use std::io::Write;
use std::time::Instant;

use mlx_tensor::ops::{self, QuantMode, QuantizedStack};
use mlx_tensor::{Array, Dtype, Result, random};

fn arg(args: &[String], name: &str, default: &str) -> String {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
        .unwrap_or_else(|| default.to_owned())
}

fn median_ms(rounds: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut t = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let start = Instant::now();
        f()?;
        t.push(start.elapsed().as_secs_f64() * 1e3);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[rounds / 2])
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let num =
        |name: &str, default: &str| arg(&args, name, default).parse::<i32>().expect("a number");
    let rounds = num("--rounds", "31") as usize;
    let (e, n, k, top) = (
        num("--experts", "8"),
        num("--n", "1024"),
        num("--k", "512"),
        num("--top", "2"),
    );
    let ms: Vec<i32> = arg(&args, "--m", "1,4")
        .split(',')
        .map(|v| v.parse().expect("a row count"))
        .collect();
    let key = random::key(3)?;
    let dense = random::normal(&[e, n, k], Dtype::Float32, &key)?;
    for (mode, group, bits) in [
        (QuantMode::Affine, 64, 4),
        (QuantMode::Affine, 64, 8),
        (QuantMode::Mxfp4, 32, 4),
    ] {
        let (w, scales, biases) = dense.quantize_mode(group, bits, mode)?;
        let mut all = vec![w.clone(), scales.clone()];
        all.extend(biases.clone());
        mlx_tensor::eval(&all)?;
        let stack = QuantizedStack {
            w: &w,
            scales: &scales,
            biases: biases.as_ref(),
            group_size: group,
            bits,
            mode,
        };
        for &m in &ms {
            // Row `r` picks experts `(r + j · 3) % E`: distinct within a row.
            let picks: Vec<u32> = (0..m)
                .flat_map(|r| (0..top).map(move |j| ((r + 3 * j) % e) as u32))
                .collect();
            let x = random::normal(&[m * top, 1, k], Dtype::Float32, &key)?;
            let idx = Array::from_slice(&picks, &[m * top])?;
            mlx_tensor::eval(&[x.clone(), idx.clone()])?;
            let gather = median_ms(rounds, || {
                ops::gather_qmm(&x, stack, None, Some(&idx), true, false)?.eval()
            })?;
            let rows = median_ms(rounds, || {
                ops::quant_gather_rows_matmul_t(&x, stack, &idx)?.eval()
            })?;
            let lp = median_ms(rounds, || {
                let chosen = idx.to_vec::<u32>()?;
                let mut outs = Vec::new();
                for (r, &ex) in chosen.iter().enumerate() {
                    let one =
                        |a: &Array| a.take(&Array::from_slice(&[ex], &[1])?, 0)?.squeeze(&[0]);
                    let xr = x.slice_axis(0, r as i32, r as i32 + 1)?.reshape(&[1, k])?;
                    let b = biases.as_ref().map(one).transpose()?;
                    outs.push(ops::quant_rows_matmul_t_mode(
                        &xr,
                        &one(&w)?,
                        &one(&scales)?,
                        b.as_ref(),
                        group,
                        bits,
                        mode,
                    )?);
                }
                mlx_tensor::eval(&outs)
            })?;
            for (kernel, t) in [
                ("gather-qmm", gather),
                ("gather-rows", rows),
                ("rows-loop", lp),
            ] {
                let _ = writeln!(
                    std::io::stdout(),
                    "{{\"bench\":\"gather\",\"mode\":\"{}\",\"bits\":{bits},\"experts\":{e},\"n\":{n},\"k\":{k},\"top\":{top},\"m\":{m},\"kernel\":\"{kernel}\",\"ms\":{t:.4}}}",
                    mode.name()
                );
            }
        }
    }
    Ok(())
}
