//! `cargo xtask bench <suite>`: benchmark suites, each printing JSON lines on stdout.
//!
//! To add a suite, write a `fn(&[String]) -> Result<()>` and add a row to [`SUITES`].

use anyhow::{Result, bail};

use crate::cmd;

/// One benchmark suite: its name, a one-line description, and how to run it.
struct Suite {
    name: &'static str,
    about: &'static str,
    run: fn(&[String]) -> Result<()>,
}

/// The suites `cargo xtask bench` knows, in the order `bench list` shows them.
const SUITES: &[Suite] = &[
    Suite {
        name: "gemm",
        about: "x[m,2048] @ w[2048,2048] for m = 1, 4, 8 in f32 and bf16 (mlx-tensor example `gemm`)",
        run: gemm,
    },
    Suite {
        name: "decode",
        about: "plain greedy decode tokens/s on models/tiny-mtp: ours and mlx-lm's in one run, with the ratio",
        run: decode,
    },
    Suite {
        name: "spec",
        about: "plain vs speculative decoding (MTP per depth, draft model, n-gram; q8/q4 rows) on models/tiny-mtp, and mlx-lm draft-model speculation in the same run",
        run: spec,
    },
];

/// Dispatches to the named suite, passing the remaining arguments through.
pub fn run(args: &[String]) -> Result<()> {
    let Some((name, rest)) = args.split_first() else {
        list();
        bail!("`bench` needs a suite name");
    };
    if name == "list" {
        list();
        return Ok(());
    }
    match SUITES.iter().find(|s| s.name == name) {
        Some(suite) => (suite.run)(rest),
        None => {
            list();
            bail!("unknown bench suite `{name}`")
        }
    }
}

fn list() {
    eprintln!("bench suites:");
    for s in SUITES {
        eprintln!("  {:<8} {}", s.name, s.about);
    }
}

/// `cargo run --release` of an example with `args` passed through.
fn example_command(package: &str, example: &str, args: &[String]) -> std::process::Command {
    let mut c = cmd::cargo();
    c.args([
        "run",
        "--quiet",
        "--release",
        "-p",
        package,
        "--example",
        example,
        "--",
    ])
    .args(args);
    c
}

/// A release build of an example, its output streamed.
fn release_example(package: &str, example: &str, args: &[String]) -> Result<()> {
    cmd::run(
        &format!("bench {example}"),
        &mut example_command(package, example, args),
    )
}

fn gemm(args: &[String]) -> Result<()> {
    release_example("mlx-tensor", "gemm", args)
}

/// The bundled model the model benchmarks run on unless `--model` is given.
const BUNDLED: &str = "models/tiny-mtp";

fn with_default_model(args: &[String]) -> Vec<String> {
    let mut out = args.to_vec();
    if !args.iter().any(|a| a == "--model") {
        out.extend([
            "--model".to_owned(),
            cmd::root().join(BUNDLED).display().to_string(),
        ]);
    }
    out
}

/// Ours (runner example `decode-bench`) then mlx-lm's (`mlx_lm_decode.py`) on the
/// same weights, prompt and token count; then one summary line with the ratio.
fn decode(args: &[String]) -> Result<()> {
    let args = with_default_model(args);
    let ours = capture_example("runner", "decode-bench", &args)?;
    print!("{ours}");
    let theirs = run_mlx_lm("crates/runner/examples/mlx_lm_decode.py", &args)?;
    if let Some(t) = &theirs {
        print!("{t}");
    }
    let ours_tps = median_field(&ours, "decode_tps");
    let theirs_tps = theirs
        .as_deref()
        .and_then(|t| median_field(t, "decode_tps"));
    let summary = serde_json::json!({
        "bench": "decode",
        "summary": true,
        "ours_decode_tps": ours_tps,
        "mlx_lm_decode_tps": theirs_tps,
        "mlx_lm_blas": if crate::setup::openblas_path().is_some() { "OpenBLAS (LD_PRELOAD)" } else { "bundled reference BLAS" },
        "ratio_ours_over_mlx_lm": match (ours_tps, theirs_tps) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        },
    });
    println!("{summary}");
    Ok(())
}

/// Ours (runner example `spec-bench`: plain, MTP per depth, draft model,
/// n-gram), then mlx-lm's draft-model speculative decoding on the same target,
/// draft and prompt (`mlx_lm_spec.py`), then one summary line per depth with
/// the draft-model ratio ours/theirs.
fn spec(args: &[String]) -> Result<()> {
    let user_model = args.iter().any(|a| a == "--model");
    let args = with_default_model(args);
    let ours = capture_example("runner", "spec-bench", &args)?;
    print!("{ours}");
    if !user_model {
        quantized_rows(&args)?;
    }
    let Some(theirs) = run_mlx_lm("crates/runner/examples/mlx_lm_spec.py", &args)? else {
        return Ok(());
    };
    print!("{theirs}");
    let rows = |text: &str| -> Vec<serde_json::Value> {
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let (ours, theirs) = (rows(&ours), rows(&theirs));
    for t in theirs.iter().filter(|t| t["method"] == "draft-model") {
        let o = ours
            .iter()
            .find(|o| o["method"] == "draft-model" && o["depth"] == t["depth"]);
        let (Some(a), Some(b)) = (
            o.and_then(|o| o["tokens_per_s"].as_f64()),
            t["tokens_per_s"].as_f64(),
        ) else {
            continue;
        };
        let line = serde_json::json!({
            "bench": "spec", "summary": true, "method": "draft-model", "depth": t["depth"],
            "ours_tokens_per_s": a, "mlx_lm_tokens_per_s": b,
            "ratio_ours_over_mlx_lm": if b > 0.0 { Some(a / b) } else { None },
        });
        println!("{line}");
    }
    Ok(())
}

/// Runs an mlx-lm script with `args` under the same OpenBLAS as our binaries;
/// `None` (with a note) when no Python with mlx-lm is found.
fn run_mlx_lm(script: &str, args: &[String]) -> Result<Option<String>> {
    let Some(py) = crate::python::mlx_lm_interpreter() else {
        eprintln!(
            "xtask: bench: mlx-lm not found (set MTP_PYTHON to a python with `mlx-lm[cpu]`, \
             or run `cargo xtask setup --python`); printing our figures only"
        );
        return Ok(None);
    };
    let mut c = std::process::Command::new(py);
    c.current_dir(cmd::root())
        .arg(cmd::root().join(script))
        .args(args);
    // A fair race: mlx-lm's libmlx gets the same OpenBLAS our binary links.
    if let Some(blas) = crate::setup::openblas_path() {
        c.env("LD_PRELOAD", blas);
    }
    Ok(Some(cmd::output("mlx-lm", &mut c)?))
}

/// A release build of an example, its stdout captured.
fn capture_example(package: &str, example: &str, args: &[String]) -> Result<String> {
    cmd::output(
        &format!("bench {example}"),
        &mut example_command(package, example, args),
    )
}

/// The median of a numeric field over JSON lines.
fn median_field(lines: &str, field: &str) -> Option<f64> {
    let mut v: Vec<f64> = lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|j| j.get(field).and_then(serde_json::Value::as_f64))
        .collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// Plain vs MTP rows for the bundled model quantized to 8 and 4 bits (group
/// 64), written once under `target/bench/` by `mtp-runner quantize`; each line
/// gains `"model"` and `"bits"`.
fn quantized_rows(args: &[String]) -> Result<()> {
    for bits in [8, 4] {
        let dir = cmd::root().join(format!("target/bench/tiny-mtp-q{bits}"));
        if !dir.join("config.json").is_file() {
            let _ = std::fs::remove_dir_all(&dir);
            cmd::run(
                &format!("quantize q{bits}"),
                cmd::cargo()
                    .args([
                        "run",
                        "--quiet",
                        "--release",
                        "-p",
                        "runner-cli",
                        "--",
                        "quantize",
                    ])
                    .arg("--model")
                    .arg(cmd::root().join(BUNDLED))
                    .arg("--out")
                    .arg(&dir)
                    .args(["--bits", &bits.to_string(), "--group-size", "64"]),
            )?;
        }
        let mut q_args: Vec<String> = Vec::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                // The model, methods and depths are this row set's own.
                "--model" | "--methods" | "--depths" => {
                    it.next();
                }
                _ => q_args.push(a.clone()),
            }
        }
        q_args.extend(["--model".to_owned(), dir.display().to_string()]);
        q_args.extend(["--methods".to_owned(), "off,mtp".to_owned()]);
        q_args.extend(["--depths".to_owned(), "auto,3".to_owned()]);
        let out = capture_example("runner", "spec-bench", &q_args)?;
        for line in out.lines() {
            match serde_json::from_str::<serde_json::Value>(line) {
                Ok(serde_json::Value::Object(mut m)) => {
                    m.insert("model".into(), format!("tiny-mtp-q{bits}").into());
                    m.insert("bits".into(), bits.into());
                    println!("{}", serde_json::Value::Object(m));
                }
                _ => println!("{line}"),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::median_field;

    #[test]
    fn median_of_json_lines_skips_other_lines() {
        let lines = "noise\n{\"decode_tps\": 3.0}\n{\"decode_tps\": 1.0}\n{\"x\": 9}\n{\"decode_tps\": 2.0}\n";
        assert_eq!(median_field(lines, "decode_tps"), Some(2.0));
        assert_eq!(median_field("nothing", "decode_tps"), None);
    }
}
