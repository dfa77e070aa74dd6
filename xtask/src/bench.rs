//! `cargo xtask bench`: benchmark suites (JSON lines), and the all-suites run that feeds docs/bench.
//!
//! * `bench <suite> [args]` runs one suite and prints its JSON lines.
//! * `bench [all] [--out FILE] [--no-report] [--suites a,b]` runs every suite
//!   (or the listed ones), stamps each
//!   row (machine, device, date, commit, load, command to rerun), merges the
//!   rows into `docs/bench/results.json` (or FILE), replacing this machine's
//!   earlier rows, and redraws docs/bench/README.md and its plots.
//! * `bench --merge FILE...` merges rows measured elsewhere (the H200's
//!   `results-gpu.json`, or spec-scale's `.jsonl` rows) and redraws; `bench report [FILE]`
//!   only redraws (the README and plots beside FILE, default docs/bench/results.json).
//!
//! `--bin-dir DIR` / `--mlx-cuda-dir SP` (see [`crate::bins`]) run prebuilt binaries.
//! To add a suite, write a `fn(&[String]) -> Result<Vec<Value>>` and add a row to [`SUITES`].

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::bins::{self, BANDWIDTH, DECODE_BENCH, MTP_RUNNER, SPEC_BENCH};
use crate::{cmd, machine};

/// One benchmark suite: its name, a one-line description, and how to run it.
struct Suite {
    name: &'static str,
    about: &'static str,
    /// Runs it, printing JSON lines; returns them.
    run: fn(&[String]) -> Result<Vec<Value>>,
    /// Needs cargo (not in the GPU bundle).
    cargo_only: bool,
    /// Left out of the all-suites run unless `--suites` names it (it takes long).
    opt_in: bool,
}

/// The suites `cargo xtask bench` knows, in the order `bench list` shows them.
const SUITES: &[Suite] = &[
    Suite {
        name: "gemm",
        about: "x[m,2048] @ w[2048,2048] for m = 1, 4, 8 in f32 and bf16 (mlx-tensor example `gemm`)",
        run: gemm,
        cargo_only: true,
        opt_in: false,
    },
    Suite {
        name: "decode",
        about: "plain greedy decode tokens/s on models/tiny-mtp: ours and mlx-lm's in one run, with the ratio",
        run: decode,
        cargo_only: false,
        opt_in: false,
    },
    Suite {
        name: "spec",
        about: "plain vs speculative decoding (MTP per depth, draft model, n-gram; q8/q4 rows) on models/tiny-mtp, MTP rows on tiny-hybrid-mtp and tiny-moe-mtp (dense and q4), and mlx-lm draft-model speculation in the same run",
        run: spec,
        cargo_only: false,
        opt_in: false,
    },
    Suite {
        name: "floor",
        about: "memory bandwidth, launch overhead, and the decode step time against its floor (weight bytes / bandwidth + ops x per-op cost)",
        run: floor,
        cargo_only: false,
        opt_in: false,
    },
    Suite {
        name: "spec-scale",
        about: "plain vs MTP per depth and TTFT on function-preserving upscales of tiny-mtp (CPU: tiny, 24l; GPU: tiny, 1.7b, 8b), ours and mlx-lm, bf16 and f32; stamps and merges its rows itself (opt-in)",
        run: crate::spec_scale::suite,
        cargo_only: false,
        opt_in: true,
    },
    Suite {
        name: "serve",
        about: "`mtp-runner serve` on a scripted multi-turn chat workload: requests/s and per-request tokens/s, speculation on/off x prefix reuse on/off (runner-cli example `serve-bench`)",
        run: serve,
        cargo_only: true,
        opt_in: false,
    },
];

/// Where the all-suites run keeps its rows.
pub(crate) const RESULTS: &str = "docs/bench/results.json";

/// Dispatches to the named suite, passing the remaining arguments through.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let args = bins::take_flags(args)?;
    match args.first().map(String::as_str) {
        Some("list") => {
            list();
            Ok(())
        }
        Some("report") => crate::report::render(
            &args
                .get(1)
                .map_or_else(|| cmd::root().join(RESULTS), PathBuf::from),
        ),
        Some("--merge") => merge_files(&args[1..]),
        // Runs long and stamps, merges and redraws by itself (rows arrive incrementally).
        Some("spec-scale") => crate::spec_scale::main(&args[1..]),
        None | Some("all") => all(args.get(1..).unwrap_or_default()),
        Some(a) if a.starts_with("--") => all(&args),
        Some(name) => match SUITES.iter().find(|s| s.name == name) {
            Some(suite) => (suite.run)(&args[1..]).map(drop),
            None => {
                list();
                bail!("unknown bench suite `{name}`")
            }
        },
    }
}

fn list() {
    eprintln!("bench suites (`cargo xtask bench` runs them all):");
    for s in SUITES {
        eprintln!("  {:<8} {}", s.name, s.about);
    }
}

/// Every suite, stamped, merged into the results file; then the report.
fn all(args: &[String]) -> Result<()> {
    let (mut out, mut report, mut only) = (cmd::root().join(RESULTS), true, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => out = PathBuf::from(it.next().context("--out needs a file")?),
            "--no-report" => report = false,
            "--suites" => only = Some(it.next().context("--suites needs a list")?.clone()),
            other => bail!(
                "unknown `bench` option `{other}` (known: --out FILE, --no-report, --suites a,b)"
            ),
        }
    }
    let device = crate::gpu_check::device_info()?;
    let stamp = machine::stamp();
    let (mut rows, mut failed) = (Vec::new(), Vec::new());
    for s in SUITES {
        let named = only.as_ref().map(|o| o.split(',').any(|n| n == s.name));
        if named == Some(false) || (s.opt_in && named.is_none()) {
            continue;
        }
        if s.cargo_only && bins::bin_dir().is_some() {
            eprintln!("xtask: bench: skipping `{}` (needs cargo)", s.name);
            continue;
        }
        match (s.run)(&[]) {
            Ok(got) => rows.extend(got.into_iter().map(|r| stamped(r, s.name, &stamp, &device))),
            // One failing suite does not lose the others' rows: it leaves an error row.
            Err(e) => {
                eprintln!("xtask: bench: suite `{}` failed: {e:#}", s.name);
                failed.push(s.name);
                let row = json!({"bench": s.name, "error": format!("{e:#}")});
                rows.push(stamped(row, s.name, &stamp, &device));
            }
        }
    }
    let merged = merge_rows(read_rows(&out)?, rows);
    write_rows(&out, &merged)?;
    eprintln!("xtask: bench: {} rows in {}", merged.len(), out.display());
    if report {
        crate::report::render(&out)?;
    }
    if !failed.is_empty() {
        bail!(
            "bench suites failed: {} (error rows in {})",
            failed.join(", "),
            out.display()
        );
    }
    Ok(())
}

/// `row` with the suite, the run's stamp, the MLX device and the command to rerun.
pub(crate) fn stamped(row: Value, suite: &str, stamp: &Value, device: &Value) -> Value {
    let mut m = match row {
        Value::Object(m) => m,
        other => [("value".to_owned(), other)].into_iter().collect(),
    };
    m.insert("suite".into(), suite.into());
    if let Value::Object(s) = stamp {
        m.extend(s.clone());
    }
    let on_gpu = device["device"] == "gpu";
    m.insert("device".into(), device["device"].clone());
    m.insert("device_name".into(), device["device_name"].clone());
    let rerun = if on_gpu && cfg!(target_os = "linux") {
        "cargo xtask gpu-bundle, then the device calls it prints (docs/gpu.md)".to_owned()
    } else {
        format!("cargo xtask bench {suite}")
    };
    m.insert("command".into(), rerun.into());
    Value::Object(m)
}

/// `old` without the (machine, device, suite, shape, dtype, engine, kind)
/// groups that `new` brings, then `new`. The last four are absent (null)
/// outside `spec-scale`, whose runs of some shapes, dtypes or engines
/// (`--shapes tiny --engines ours`) so keep the others' rows. `kind` keeps
/// a run's by-products apart from its matrix: an f32 run's bf16
/// kernel-unit rows replace the kernel-unit rows only, not a bf16 run's
/// decode rows.
pub(crate) fn merge_rows(old: Vec<Value>, new: Vec<Value>) -> Vec<Value> {
    let key = |r: &Value| {
        let kind = if r["suite"] == "spec-scale" {
            r["kind"].clone()
        } else {
            Value::Null
        };
        let [m, d, s, sh, dt, e] =
            ["machine", "device", "suite", "shape", "dtype", "engine"].map(|k| r[k].clone());
        [m, d, s, sh, dt, e, kind]
    };
    let replaced: Vec<_> = new.iter().map(key).collect();
    old.into_iter()
        .filter(|r| !replaced.contains(&key(r)))
        .chain(new)
        .collect()
}

/// The rows of a results file (none when it does not exist yet).
pub(crate) fn read_rows(path: &Path) -> Result<Vec<Value>> {
    if !path.is_file() {
        return Ok(Vec::new());
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    // JSON lines (spec-scale's incremental `--rows` file): one stamped row a line.
    if path.extension().is_some_and(|e| e == "jsonl") {
        return text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .with_context(|| format!("{} line {}: not a JSON row", path.display(), i + 1))
            })
            .collect();
    }
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    v["rows"]
        .as_array()
        .cloned()
        .with_context(|| format!("{} has no `rows` array", path.display()))
}

/// Writes `rows` as a results file.
pub(crate) fn write_rows(path: &Path, rows: &[Value]) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let doc = json!({
        "about": "mtp-runner benchmark rows; every row names its machine, device, date, commit and the command to rerun it. Written by `cargo xtask bench`, merged with `cargo xtask bench --merge FILE`.",
        "rows": rows,
    });
    std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

/// `bench --merge FILE...`: adds other machines' rows to docs/bench/results.json and redraws.
fn merge_files(files: &[String]) -> Result<()> {
    if files.is_empty() {
        bail!(
            "`bench --merge` needs one or more results files (for example the H200's results-gpu.json)"
        );
    }
    let out = cmd::root().join(RESULTS);
    let mut rows = read_rows(&out)?;
    for f in files {
        let new = read_rows(Path::new(f))?;
        eprintln!("xtask: bench: merging {} rows from {f}", new.len());
        rows = merge_rows(rows, new);
    }
    write_rows(&out, &rows)?;
    crate::report::render(&out)
}

/// JSON lines of `text` (other lines skipped), each printed as it is kept.
fn lines(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .inspect(|v| println!("{v}"))
        .collect()
}

fn gemm(args: &[String]) -> Result<Vec<Value>> {
    let mut c = cmd::release_example("mlx-tensor", "gemm", args);
    let rows = lines(&cmd::output("bench gemm", &mut c)?);
    Ok(rows
        .into_iter()
        .map(|mut r| {
            r["bench"] = "gemm".into();
            r
        })
        .collect())
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

/// One of our binaries, its stdout captured.
fn capture(b: bins::Bin, args: &[String]) -> Result<String> {
    cmd::output(&format!("bench {}", b.name), &mut bins::command(b, args)?)
}

/// Ours (runner example `decode-bench`) then mlx-lm's (`mlx_lm_decode.py`) on the
/// same weights, prompt and token count; then one summary line with the ratio.
fn decode(args: &[String]) -> Result<Vec<Value>> {
    let args = with_default_model(args);
    let mut rows = lines(&capture(DECODE_BENCH, &args)?);
    let theirs = run_mlx_lm("crates/runner/examples/mlx_lm_decode.py", &args)?
        .map(|t| lines(&t))
        .unwrap_or_default();
    let ours_tps = median_field(&rows, "decode_tps");
    let theirs_tps = median_field(&theirs, "decode_tps");
    rows.extend(theirs);
    let summary = json!({
        "bench": "decode",
        "summary": true,
        "ours_decode_tps": ours_tps,
        "mlx_lm_decode_tps": theirs_tps,
        "mlx_lm_blas": if crate::setup::openblas_path().is_some() { "OpenBLAS (LD_PRELOAD)" } else { "bundled BLAS" },
        "ratio_ours_over_mlx_lm": match (ours_tps, theirs_tps) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        },
    });
    println!("{summary}");
    rows.push(summary);
    Ok(rows)
}

/// Ours (runner example `spec-bench`: plain, MTP per depth, draft model,
/// n-gram), then mlx-lm's draft-model speculative decoding on the same target,
/// draft and prompt (`mlx_lm_spec.py`), then one summary line per depth with
/// the draft-model ratio ours/theirs.
fn spec(args: &[String]) -> Result<Vec<Value>> {
    let user_model = args.iter().any(|a| a == "--model");
    let mut args = with_default_model(args);
    if !args.iter().any(|a| a == "--draft-model") {
        // Named explicitly: spec-bench's own default is a path on the build machine.
        args.extend([
            "--draft-model".to_owned(),
            cmd::root().join("models/tiny-draft").display().to_string(),
        ]);
    }
    let ours = lines(&capture(SPEC_BENCH, &args)?);
    let mut rows = ours.clone();
    if !user_model {
        rows.extend(quantized_rows(&args)?);
    }
    let Some(theirs) = run_mlx_lm("crates/runner/examples/mlx_lm_spec.py", &args)? else {
        return Ok(rows);
    };
    let theirs = lines(&theirs);
    rows.extend(theirs.iter().cloned());
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
        let line = json!({
            "bench": "spec", "summary": true, "method": "draft-model", "depth": t["depth"],
            "ours_tokens_per_s": a, "mlx_lm_tokens_per_s": b,
            "ratio_ours_over_mlx_lm": if b > 0.0 { Some(a / b) } else { None },
        });
        println!("{line}");
        rows.push(line);
    }
    Ok(rows)
}

/// Device bandwidth, launch overhead and the decode floor ratio (example `bandwidth`).
fn floor(args: &[String]) -> Result<Vec<Value>> {
    Ok(lines(&capture(BANDWIDTH, &with_default_model(args))?))
}

/// The multi-turn chat workload over HTTP (runner-cli example `serve-bench`),
/// against the release `mtp-runner`.
fn serve(args: &[String]) -> Result<Vec<Value>> {
    let mut args = with_default_model(args);
    if !args.iter().any(|a| a == "--bin") {
        args.extend([
            "--bin".to_owned(),
            bins::path(MTP_RUNNER)?.display().to_string(),
        ]);
    }
    let mut c = cmd::release_example("runner-cli", "serve-bench", &args);
    Ok(lines(&cmd::output("bench serve", &mut c)?))
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
    bins::child_env(&mut c);
    // A fair race: mlx-lm's libmlx gets the same OpenBLAS our binary links.
    if let Some(blas) = crate::setup::openblas_path() {
        c.env("LD_PRELOAD", blas);
    }
    Ok(Some(cmd::output("mlx-lm", &mut c)?))
}

/// The median of a numeric field over rows.
fn median_field(rows: &[Value], field: &str) -> Option<f64> {
    let mut v: Vec<f64> = rows.iter().filter_map(|j| j[field].as_f64()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// Plain vs MTP rows for the bundled model quantized to 8 and 4 bits (group
/// 64), written once under `target/bench/` by `mtp-runner quantize`, for
/// the bundled hybrid (Qwen3.5, Gated DeltaNet) model, and for the bundled
/// MoE model (Qwen3.5-MoE) dense and at 4 bits (its expert stacks packed);
/// each row gains `"model"` (and `"bits"` when quantized).
fn quantized_rows(args: &[String]) -> Result<Vec<Value>> {
    let mut rows = Vec::new();
    for bits in [8, 4] {
        let name = format!("tiny-mtp-q{bits}");
        let dir = quantized_copy(BUNDLED, &name, bits);
        rows.extend(or_error_row(
            &name,
            dir.and_then(|d| model_rows(args, &d, &name, "auto,3", Some(bits))),
        ));
    }
    let hybrid = cmd::root().join(HYBRID);
    rows.extend(or_error_row(
        "tiny-hybrid-mtp",
        model_rows(args, &hybrid, "tiny-hybrid-mtp", "auto,1,2,3,4", None),
    ));
    let moe = cmd::root().join(MOE);
    rows.extend(or_error_row(
        "tiny-moe-mtp",
        model_rows(args, &moe, "tiny-moe-mtp", "auto,1,2,3,4", None),
    ));
    let name = "tiny-moe-mtp-q4";
    let dir = quantized_copy(MOE, name, 4);
    rows.extend(or_error_row(
        name,
        dir.and_then(|d| model_rows(args, &d, name, "auto,3", Some(4))),
    ));
    Ok(rows)
}

/// `target/bench/{name}`: the model at `src` quantized to `bits` (group 64)
/// by `mtp-runner quantize`, written once and reused by later runs.
fn quantized_copy(src: &str, name: &str, bits: u32) -> Result<PathBuf> {
    let dir = cmd::root().join("target/bench").join(name);
    if !dir.join("config.json").is_file() {
        let _ = std::fs::remove_dir_all(&dir);
        // `quantize` refuses an `--out` whose parent is missing (a fresh clone has no target/bench).
        let parent = dir.parent().context("target/bench has a parent")?;
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        let q: Vec<String> = vec![
            "quantize".into(),
            "--model".into(),
            cmd::root().join(src).display().to_string(),
            "--out".into(),
            dir.display().to_string(),
            "--bits".into(),
            bits.to_string(),
            "--group-size".into(),
            "64".into(),
        ];
        cmd::run(
            &format!("quantize {name}"),
            &mut bins::command(MTP_RUNNER, &q)?,
        )?;
    }
    Ok(dir)
}

/// The rows, or one error row naming the model: one model's failure (say a
/// kernel the device cannot build) does not lose the suite's other rows.
fn or_error_row(model: &str, rows: Result<Vec<Value>>) -> Vec<Value> {
    rows.unwrap_or_else(|e| {
        eprintln!("xtask: bench: {model}: {e:#}");
        vec![json!({"bench": "spec", "model": model, "error": format!("{e:#}")})]
    })
}

/// The bundled hybrid model (Qwen3.5 layout: Gated DeltaNet + gated attention + MTP).
const HYBRID: &str = "models/tiny-hybrid-mtp";

/// The bundled MoE model (Qwen3.5-MoE: the hybrid trunk, 8 experts, top-2, a shared expert, MTP).
const MOE: &str = "models/tiny-moe-mtp";

/// `spec-bench` plain vs MTP rows on `dir` at `depths`, keeping the caller's
/// other flags; each row gains `"model"` (and `"bits"`).
fn model_rows(
    args: &[String],
    dir: &std::path::Path,
    name: &str,
    depths: &str,
    bits: Option<u32>,
) -> Result<Vec<Value>> {
    let mut q_args: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            // The model, methods and depths are this row set's own.
            "--model" | "--methods" | "--depths" | "--draft-model" => {
                it.next();
            }
            _ => q_args.push(a.clone()),
        }
    }
    q_args.extend(["--model".to_owned(), dir.display().to_string()]);
    q_args.extend(["--methods".to_owned(), "off,mtp".to_owned()]);
    q_args.extend(["--depths".to_owned(), depths.to_owned()]);
    let out = capture(SPEC_BENCH, &q_args)?;
    let mut rows = Vec::new();
    for line in out.lines() {
        if let Ok(Value::Object(mut m)) = serde_json::from_str::<Value>(line) {
            m.insert("model".into(), name.into());
            if let Some(bits) = bits {
                m.insert("bits".into(), bits.into());
            }
            let v = Value::Object(m);
            println!("{v}");
            rows.push(v);
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_rows_skips_rows_without_the_field() {
        let rows: Vec<Value> = [
            json!({"decode_tps": 3.0}),
            json!({"decode_tps": 1.0}),
            json!({"x": 9}),
            json!({"decode_tps": 2.0}),
        ]
        .into();
        assert_eq!(median_field(&rows, "decode_tps"), Some(2.0));
        assert_eq!(median_field(&[], "decode_tps"), None);
    }

    #[test]
    fn merging_replaces_only_the_same_machine_device_suite_shape_dtype_and_engine() {
        let row = |m: &str, d: &str, s: &str, v: i32| json!({"machine": m, "device": d, "suite": s, "v": v});
        let old = vec![
            row("epyc", "cpu", "spec", 1),
            row("epyc", "cpu", "decode", 2),
            row("h200", "gpu", "spec", 3),
        ];
        let merged = merge_rows(old, vec![row("epyc", "cpu", "spec", 10)]);
        let vs: Vec<i64> = merged.iter().map(|r| r["v"].as_i64().unwrap()).collect();
        assert_eq!(vs, [2, 3, 10]);
        // spec-scale: a run of one shape, dtype and engine keeps the others.
        let scale = |shape: &str, dtype: &str, engine: &str, v: i32| {
            json!({"machine": "epyc", "device": "cpu", "suite": "spec-scale", "shape": shape,
                   "dtype": dtype, "engine": engine, "v": v})
        };
        let old = vec![
            scale("tiny", "f32", "mtp-runner", 1),
            scale("tiny", "f32", "mlx-lm", 2),
            scale("tiny", "bf16", "mtp-runner", 3),
            scale("24l", "f32", "mtp-runner", 4),
        ];
        let merged = merge_rows(old, vec![scale("tiny", "f32", "mtp-runner", 10)]);
        let vs: Vec<i64> = merged.iter().map(|r| r["v"].as_i64().unwrap()).collect();
        assert_eq!(vs, [2, 3, 4, 10]);
        // An f32 run's bf16 kernel check replaces kernel checks, not the bf16 matrix.
        let kind = |dtype: &str, kind: &str, v: i32| {
            json!({"machine": "h100", "device": "gpu", "suite": "spec-scale", "shape": "tiny",
                   "dtype": dtype, "engine": "mtp-runner", "kind": kind, "v": v})
        };
        let old = vec![kind("bf16", "decode", 1), kind("bf16", "kernel-unit", 2)];
        let new = vec![kind("f32", "decode", 10), kind("bf16", "kernel-unit", 11)];
        let merged = merge_rows(old, new);
        let vs: Vec<i64> = merged.iter().map(|r| r["v"].as_i64().unwrap()).collect();
        assert_eq!(vs, [1, 10, 11]);
    }

    #[test]
    fn stamped_rows_carry_machine_date_commit_and_rerun_command() {
        let stamp = json!({"machine": "cpu x", "date": "2025-11-30T00:00:00Z", "commit": "abc"});
        let device = json!({"device": "cpu", "device_name": "cpu x"});
        let r = stamped(json!({"tokens_per_s": 5.0}), "spec", &stamp, &device);
        for (k, want) in [
            ("suite", json!("spec")),
            ("machine", json!("cpu x")),
            ("date", json!("2025-11-30T00:00:00Z")),
            ("commit", json!("abc")),
            ("command", json!("cargo xtask bench spec")),
            ("tokens_per_s", json!(5.0)),
        ] {
            assert_eq!(r[k], want, "{k}");
        }
    }
}
