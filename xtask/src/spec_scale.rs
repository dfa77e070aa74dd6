//! `cargo xtask bench spec-scale`: plain vs MTP speculation at real model sizes, on function-preserving upscales of tiny-mtp (and tiny-moe-mtp), ours and mlx-lm on the same weights.
//!
//! `bench spec-scale [--shapes tiny,24l] [--dtypes bf16,f32] [--tokens 256] [--prompts 3]
//! [--budget-s S] [--stage-cap-s S] [--work DIR] [--rows FILE] [--engines ours,mlx-lm]
//! [--mlx-lm-plain] [--passes N] [--depths auto,6,5,4,3,2,1] [--out FILE] [--no-report]`
//!
//! `--depths` (ours only) sets the drafting depths ours times besides plain
//! (0 there is a speculative session held at plain: its plain stretches);
//! the default (`scale-bench`'s own), `auto,6,5,4,3,2,1`, gives every depth
//! the auto controller may choose (at most 6) its own fixed case, so the `auto-vs-best` row prices
//! auto's rounds at measured costs at every depth (with fixed depths 1-4
//! only, depths 5-6 are priced on the line through depths 3-4, which was
//! 8-11 % cheap on this CPU at tiny and dear at 1.7b on an H100, session 32).
//!
//! `--passes N` (default 1) runs ours N times over the prompts; its cases run
//! interleaved request by request either way (see the runner example
//! `scale-bench`), so a drift of the machine's speed falls on every case alike.
//!
//! `--mlx-lm-plain` runs mlx-lm plain only (no draft-model speculation: at the
//! big shapes it takes most of a stage and its figures are known).
//!
//! * Shapes: `tiny` is models/tiny-mtp itself; `24l`, `1.7b` and `8b` are
//!   built by [`crate::upscale`] into `--work` (default `target/bench/spec-scale`)
//!   right before their first stage. Defaults: `tiny,24l` on a CPU,
//!   `tiny,1.7b,8b` on a GPU. mlx-lm's draft model is models/tiny-draft for
//!   `tiny` and `24l` (same vocabulary) and tiny-draft upscaled to `0.6b` for
//!   the two 151,936-row shapes.
//! * `moe` is models/tiny-moe-mtp upscaled by [`crate::upscale::moe`]
//!   (Qwen3.5-35B-A3B's per-token widths, experts duplicated so each token
//!   reads 16 experts). mlx-lm runs it plain only (no draft model shares its
//!   248,320-row vocabulary), and ours profiles every fixed depth
//!   (`--profile-depth 1,2,3,4`: `round-profile` rows with the device time of
//!   the verify per depth), since a MoE verify of `k + 1` rows reads up to
//!   `k + 1` tokens' experts and so grows with the depth.
//! * Stages, in this order: every shape in bf16 (ours, then mlx-lm), then every
//!   shape in f32. Ours is the runner example `scale-bench` (plain, MTP at auto
//!   and depths 6..1, TTFT at 1,000 and 600 prompt tokens), mlx-lm is
//!   `mlx_lm_scale.py` (plain, draft-model at 2, 3, 4); each loads its model
//!   once. On a CPU the non-tiny shapes run f32 only (MLX's CPU bf16 matmuls
//!   are many times slower than f32, and no CPU user runs them); at `8b` f32
//!   runs half the tokens (31 GB of weights, twice bf16's step time).
//! * Time guards: with `--budget-s`, a stage that has under 20 s left is
//!   skipped, each child gets the time left (at most `--stage-cap-s`) as its
//!   own `--deadline-s` (it skips the cases that would pass it) and is killed
//!   5 s after. Every row is stamped and appended to `--rows FILE` (JSON
//!   lines) as it arrives, so a killed run keeps what it measured.
//! * `--trace-depth tiny,8b`: those shapes' runs of ours log the auto
//!   controller's decisions and rounds (`RUST_LOG=runner::depth=trace`) to the
//!   run's stderr, the log.
//! * Greedy speculative output must equal plain output per shape in f32 (ours;
//!   an error otherwise); in bf16 it is reported (`greedy_equal_plain`).
//! * The rows (suite `spec-scale`) are merged into docs/bench/results.json (or
//!   `--out`), replacing this machine's earlier spec-scale rows of the same
//!   shape, dtype and engine (a run of `--shapes tiny` keeps the 24l rows),
//!   and the report is redrawn unless `--no-report`.

use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::bins::{self, BANDWIDTH, SCALE_BENCH};
use crate::{bench, cmd, machine};

/// The benchmark prompts: held-out code (4 of crates/runner/tests/fixtures/heldout_prompts.json).
const PROMPTS: &str = include_str!("../assets/spec-scale-prompts.json");
const MLX_LM_SCRIPT: &str = "crates/runner/examples/mlx_lm_scale.py";
const TINY: &str = "models/tiny-mtp";
const TINY_DRAFT: &str = "models/tiny-draft";
const TINY_MOE: &str = "models/tiny-moe-mtp";
/// A stage with less than this left is skipped rather than started.
const MIN_STAGE: Duration = Duration::from_secs(20);
/// How long past its own deadline a child may run before it is killed.
const GRACE: Duration = Duration::from_secs(5);

/// Options of one run.
#[derive(Debug)]
struct Opts {
    shapes: Vec<String>,
    dtypes: Option<Vec<String>>,
    tokens: usize,
    prompts: usize,
    budget: Option<Duration>,
    stage_cap: Option<Duration>,
    work: PathBuf,
    rows: Option<PathBuf>,
    engines: Vec<String>,
    out: PathBuf,
    report: bool,
    /// mlx-lm plain only (`--mlx-lm-plain`).
    mlx_lm_plain: bool,
    passes: usize,
    /// The drafting depths ours times besides plain (`--depths`; `None`:
    /// `scale-bench`'s default).
    depths: Option<String>,
    /// Shapes whose runs of ours log the auto controller's rounds to the log
    /// (`--trace-depth tiny,8b`: `RUST_LOG=runner::depth=trace`).
    trace_depth: Vec<String>,
}

fn parse(args: &[String], on_gpu: bool) -> Result<Opts> {
    let list = |s: &str| {
        s.split(',')
            .map(|x| x.trim().to_owned())
            .filter(|x| !x.is_empty())
            .collect()
    };
    let secs = |s: &str, what: &str| -> Result<Duration> {
        Ok(Duration::from_secs_f64(
            s.parse().with_context(|| format!("{what}: seconds"))?,
        ))
    };
    let mut o = Opts {
        shapes: list(if on_gpu { "tiny,1.7b,8b" } else { "tiny,24l" }),
        dtypes: None,
        tokens: 256,
        prompts: 3,
        budget: None,
        stage_cap: None,
        work: std::env::var_os("MTP_SCALE_WORK").map_or_else(
            || cmd::root().join("target/bench/spec-scale"),
            PathBuf::from,
        ),
        rows: None,
        engines: list("ours,mlx-lm"),
        out: cmd::root().join(bench::RESULTS),
        report: true,
        mlx_lm_plain: false,
        passes: 1,
        depths: None,
        trace_depth: Vec::new(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("`{a}` needs a value"));
        match a.as_str() {
            "--shapes" => o.shapes = list(val()?),
            "--dtypes" => o.dtypes = Some(list(val()?)),
            "--tokens" => o.tokens = val()?.parse().context("--tokens: a whole number")?,
            "--prompts" => o.prompts = val()?.parse().context("--prompts: a whole number")?,
            "--budget-s" => o.budget = Some(secs(val()?, "--budget-s")?),
            "--stage-cap-s" => o.stage_cap = Some(secs(val()?, "--stage-cap-s")?),
            "--work" => o.work = PathBuf::from(val()?),
            "--rows" => o.rows = Some(PathBuf::from(val()?)),
            "--engines" => o.engines = list(val()?),
            "--out" => o.out = PathBuf::from(val()?),
            "--no-report" => o.report = false,
            "--mlx-lm-plain" => o.mlx_lm_plain = true,
            "--trace-depth" => o.trace_depth = list(val()?),
            "--depths" => o.depths = Some(depths(val()?)?),
            "--passes" => {
                o.passes = val()?.parse().context("--passes: a whole number")?;
                if o.passes == 0 {
                    bail!("--passes: at least 1");
                }
            }
            other => bail!(
                "unknown spec-scale option `{other}` (known: --shapes, --dtypes, --tokens, --prompts, \
                 --budget-s, --stage-cap-s, --work, --rows, --engines, --mlx-lm-plain, --passes, --depths, --trace-depth, --out, --no-report)"
            ),
        }
    }
    for s in &o.shapes {
        if s != "tiny" && !is_dense(s) && !is_moe(s) {
            bail!("spec-scale: unknown shape `{s}` (tiny, 24l, 1.7b, 8b, moe)");
        }
    }
    for d in o.dtypes.iter().flatten() {
        if d != "bf16" && d != "f32" {
            bail!("spec-scale: --dtypes takes bf16 and f32, not `{d}`");
        }
    }
    let all: Vec<Value> =
        serde_json::from_str(PROMPTS).context("the bundled spec-scale prompts")?;
    if o.prompts == 0 || o.prompts > all.len() {
        bail!("spec-scale: --prompts takes 1 to {}", all.len());
    }
    Ok(o)
}

/// `--depths`: `auto` and depths 0 to 16, comma-separated, at least one.
/// Depth 0 is a speculative session held at plain (its plain stretches), a
/// case apart from the `off` loop that every run times anyway.
fn depths(v: &str) -> Result<String> {
    let items: Vec<&str> = v.split(',').map(str::trim).collect();
    for d in &items {
        let ok = *d == "auto" || d.parse::<usize>().is_ok_and(|n| n <= 16);
        if !ok {
            bail!("--depths: `{d}` is not `auto` or a depth from 0 to 16 (e.g. auto,6,5,4,3,2,1)");
        }
    }
    Ok(items.join(","))
}

/// A named upscale of tiny-mtp.
fn is_dense(shape: &str) -> bool {
    crate::upscale::widen::NAMED
        .iter()
        .any(|(n, _)| *n == shape)
}

/// A named upscale of tiny-moe-mtp.
fn is_moe(shape: &str) -> bool {
    crate::upscale::moe::NAMED.iter().any(|(n, _)| *n == shape)
}

/// Extra `scale-bench` flags for `shape`: a MoE profiles every fixed depth.
fn ours_extra(shape: &str) -> Vec<String> {
    if is_moe(shape) {
        vec!["--profile-depth".into(), "1,2,3,4".into()]
    } else {
        Vec::new()
    }
}

/// `bench spec-scale`: runs, merges into the results file and redraws.
pub(crate) fn main(args: &[String]) -> Result<()> {
    let device = crate::gpu_check::device_info()?;
    let on_gpu = device["device"] == "gpu";
    let o = parse(args, on_gpu)?;
    let rows = run_with(&o, &device)?;
    let failures: Vec<String> = rows
        .iter()
        .filter(|r| r["enforced"] == true && r["greedy_equal_plain"] == false)
        .map(|r| {
            format!(
                "{} {} mtp depth {} differs from plain at {}",
                r["shape"], r["dtype"], r["depth"], r["first_divergence"]
            )
        })
        .collect();
    let merged = bench::merge_rows(bench::read_rows(&o.out)?, rows);
    bench::write_rows(&o.out, &merged)?;
    eprintln!(
        "xtask: spec-scale: {} rows in {}",
        merged.len(),
        o.out.display()
    );
    if o.report {
        crate::report::render(&o.out)?;
    }
    if !failures.is_empty() {
        bail!(
            "greedy speculative output differs from plain in f32: {}",
            failures.join("; ")
        );
    }
    Ok(())
}

/// The suite entry for `bench all --suites spec-scale` (default options).
pub(crate) fn suite(args: &[String]) -> Result<Vec<Value>> {
    let device = crate::gpu_check::device_info()?;
    let o = parse(args, device["device"] == "gpu")?;
    run_with(&o, &device)
}

/// One child's work: a shape, a dtype, an engine.
struct Stage {
    shape: String,
    dtype: &'static str,
    engine: &'static str,
}

fn stages(o: &Opts, on_gpu: bool) -> Vec<Stage> {
    let mut v = Vec::new();
    for dtype in ["bf16", "f32"] {
        for shape in &o.shapes {
            let wanted = match &o.dtypes {
                Some(d) => d.iter().any(|x| x == dtype),
                // A CPU runs the big shapes in f32 only.
                None => on_gpu || shape == "tiny" || dtype == "f32",
            };
            if !wanted {
                continue;
            }
            for engine in ["ours", "mlx-lm"] {
                if o.engines.iter().any(|e| e == engine) {
                    v.push(Stage {
                        shape: shape.clone(),
                        dtype,
                        engine,
                    });
                }
            }
        }
    }
    v
}

/// Appends stamped rows to the `--rows` file as they come.
struct Sink<'a> {
    file: Option<std::fs::File>,
    stamp: Value,
    device: &'a Value,
    rows: Vec<Value>,
}

impl Sink<'_> {
    fn push(&mut self, row: Value) -> Result<()> {
        let r = bench::stamped(row, "spec-scale", &self.stamp, self.device);
        println!("{r}");
        if let Some(f) = &mut self.file {
            writeln!(f, "{r}")?;
            f.flush()?;
        }
        self.rows.push(r);
        Ok(())
    }
}

// Long: the spec-scale stages in order, each behind its time guard.
fn run_with(o: &Opts, device: &Value) -> Result<Vec<Value>> {
    let start = Instant::now();
    let on_gpu = device["device"] == "gpu";
    std::fs::create_dir_all(&o.work).with_context(|| format!("creating {}", o.work.display()))?;
    let prompts_file = o.work.join("prompts.json");
    let all: Vec<Value> = serde_json::from_str(PROMPTS)?;
    std::fs::write(&prompts_file, serde_json::to_string(&all[..o.prompts])?)?;
    let file = match &o.rows {
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("opening {}", p.display()))?,
        ),
        None => None,
    };
    let mut sink = Sink {
        file,
        stamp: machine::stamp(),
        device,
        rows: Vec::new(),
    };
    let left = |now: Instant| {
        o.budget
            .map(|b| b.saturating_sub(now.duration_since(start)))
    };

    // The measured read bandwidth, for the floor: weight bytes ÷ bandwidth.
    match cmd::output("bandwidth", &mut bins::command(BANDWIDTH, &[])?) {
        Ok(text) => {
            for mut r in text
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            {
                if r["kind"] == "bandwidth" || r["kind"] == "overhead" {
                    r["bench"] = "spec-scale".into();
                    sink.push(r)?;
                }
            }
        }
        Err(e) => eprintln!("xtask: spec-scale: bandwidth probe failed: {e:#}"),
    }

    let python = if o.engines.iter().any(|e| e == "mlx-lm") {
        let p = crate::python::mlx_lm_interpreter();
        if p.is_none() {
            eprintln!(
                "xtask: spec-scale: mlx-lm not found (MTP_PYTHON, or `cargo xtask setup --python`): ours only"
            );
        }
        p
    } else {
        None
    };
    for st in stages(o, on_gpu) {
        if st.engine == "mlx-lm" && python.is_none() {
            continue;
        }
        let remaining = left(Instant::now());
        if remaining.is_some_and(|r| r < MIN_STAGE) {
            sink.push(json!({"bench": "spec-scale", "kind": "skipped", "shape": st.shape, "dtype": st.dtype,
                             "engine": engine_name(st.engine), "reason": "the --budget-s left under 20 s for this stage"}))?;
            continue;
        }
        let (model, draft) = match models(o, &st.shape, st.engine == "mlx-lm", &mut sink) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("xtask: spec-scale: building {}: {e:#}", st.shape);
                sink.push(
                    json!({"bench": "spec-scale", "kind": "error", "shape": st.shape,
                                 "error": format!("building the shape: {e:#}")}),
                )?;
                continue;
            }
        };
        if !on_gpu && let Some(why) = too_big_for_memory(&model, st.dtype) {
            eprintln!(
                "xtask: spec-scale: {} {} {}: skipped: {why}",
                st.shape, st.dtype, st.engine
            );
            sink.push(json!({"bench": "spec-scale", "kind": "skipped", "shape": st.shape, "dtype": st.dtype,
                             "engine": engine_name(st.engine), "reason": why}))?;
            continue;
        }
        let tokens = if st.shape == "8b" && st.dtype == "f32" {
            o.tokens / 2
        } else {
            o.tokens
        };
        let limit = match (left(Instant::now()), o.stage_cap) {
            (Some(r), Some(c)) => Some(r.min(c)),
            (r, c) => r.or(c),
        };
        let mut args: Vec<String> = vec![
            "--model".into(),
            model.display().to_string(),
            "--prompts".into(),
            prompts_file.display().to_string(),
            "--shape".into(),
            st.shape.clone(),
            "--dtype".into(),
            st.dtype.into(),
            "--tokens".into(),
            tokens.to_string(),
        ];
        if let Some(l) = limit {
            args.extend(["--deadline-s".into(), format!("{:.0}", l.as_secs_f64())]);
        }
        let mut c = if st.engine == "ours" {
            args.extend(ours_extra(&st.shape));
            args.extend(["--passes".into(), o.passes.to_string()]);
            if let Some(d) = &o.depths {
                args.extend(["--depths".into(), d.clone()]);
            }
            let mut c = bins::command(SCALE_BENCH, &args)?;
            if o.trace_depth.contains(&st.shape) {
                c.env("RUST_LOG", "runner::depth=trace");
            }
            c
        } else {
            let mut c = Command::new(python.as_ref().expect("checked above"));
            c.current_dir(cmd::root())
                .arg(cmd::root().join(MLX_LM_SCRIPT))
                .args(&args);
            if let Some(d) = draft.as_ref().filter(|_| !o.mlx_lm_plain) {
                c.arg("--draft-model").arg(d);
            }
            bins::child_env(&mut c);
            if let Some(blas) = crate::setup::openblas_path() {
                c.env("LD_PRELOAD", blas);
            }
            c
        };
        eprintln!(
            "xtask: spec-scale: {} {} {} ({tokens} tokens x {} prompts{})",
            st.shape,
            st.dtype,
            st.engine,
            o.prompts,
            limit
                .map(|l| format!(", {:.0} s left", l.as_secs_f64()))
                .unwrap_or_default()
        );
        let enforced = st.engine == "ours" && st.dtype == "f32";
        let outcome = stream(&mut c, limit, GRACE, |mut r| {
            if r["kind"] == "decode" {
                r["enforced"] = json!(enforced && r["method"] != "off");
            }
            sink.push(r)
        });
        if let Err(e) = outcome {
            eprintln!(
                "xtask: spec-scale: {} {} {}: {e:#}",
                st.shape, st.dtype, st.engine
            );
            sink.push(
                json!({"bench": "spec-scale", "kind": "error", "shape": st.shape, "dtype": st.dtype,
                             "engine": engine_name(st.engine), "error": format!("{e:#}")}),
            )?;
        }
    }
    eprintln!(
        "xtask: spec-scale: done in {:.0} s",
        start.elapsed().as_secs_f64()
    );
    Ok(sink.rows)
}

/// Why the weights of `model` in `dtype` would not fit this machine's
/// available memory (`/proc/meminfo`; no check where it is absent), or `None`.
fn too_big_for_memory(model: &Path, dtype: &str) -> Option<String> {
    let available = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| mem_available(&m))?;
    let elements = match weight_elements(model) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("xtask: spec-scale: sizing {}: {e:#}", model.display());
            return None;
        }
    };
    let size = if dtype == "f32" { 4 } else { 2 };
    does_not_fit(elements * size, available, dtype)
}

/// The verdict of [`too_big_for_memory`]: the weights need at most 90 % of
/// the available memory (the caches, the process and the OS take the rest).
fn does_not_fit(needed: u64, available: u64, dtype: &str) -> Option<String> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    (needed as f64 > 0.9 * available as f64).then(|| {
        format!(
            "its weights need {:.1} GiB in {dtype} and {:.1} GiB of memory is available \
             (run it on a machine with more memory, or in bf16 with --dtypes bf16)",
            gib(needed),
            gib(available)
        )
    })
}

/// `MemAvailable` of a `/proc/meminfo` text, in bytes.
fn mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The number of weight elements in the `*.safetensors` files of `dir`,
/// from their headers alone (the upscales are mostly file holes).
fn weight_elements(dir: &Path) -> Result<u64> {
    let mut total = 0u64;
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "safetensors") {
            continue;
        }
        let mut f =
            std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        let mut len = [0u8; 8];
        std::io::Read::read_exact(&mut f, &mut len)
            .with_context(|| format!("{}: no safetensors header", path.display()))?;
        let len = u64::from_le_bytes(len);
        if len > 100 << 20 {
            bail!("{}: a {len}-byte header is not safetensors", path.display());
        }
        let mut header = vec![0u8; len as usize];
        std::io::Read::read_exact(&mut f, &mut header)
            .with_context(|| format!("{}: truncated safetensors header", path.display()))?;
        let header: serde_json::Map<String, Value> = serde_json::from_slice(&header)
            .with_context(|| format!("{}: the safetensors header is not JSON", path.display()))?;
        for (name, t) in header.iter().filter(|(k, _)| *k != "__metadata__") {
            let shape = t["shape"]
                .as_array()
                .with_context(|| format!("{}: tensor {name} has no shape", path.display()))?;
            total += shape
                .iter()
                .map(|d| d.as_u64().unwrap_or(0))
                .product::<u64>();
        }
    }
    Ok(total)
}

fn engine_name(e: &str) -> &'static str {
    if e == "ours" { "mtp-runner" } else { "mlx-lm" }
}

/// The model folder of `shape` (built on first use) and, for mlx-lm, its draft model.
fn models(
    o: &Opts,
    shape: &str,
    draft: bool,
    sink: &mut Sink<'_>,
) -> Result<(PathBuf, Option<PathBuf>)> {
    let root = cmd::root();
    if shape == "tiny" {
        return Ok((root.join(TINY), draft.then(|| root.join(TINY_DRAFT))));
    }
    if is_moe(shape) {
        // No draft model shares the 248,320-row vocabulary: mlx-lm runs plain.
        return Ok((build(&root.join(TINY_MOE), shape, &o.work, sink)?, None));
    }
    let model = build(&root.join(TINY), shape, &o.work, sink)?;
    let draft = match (draft, shape) {
        (false, _) => None,
        // Same 8,192-row vocabulary: the bundled draft as it is.
        (true, "24l") => Some(root.join(TINY_DRAFT)),
        (true, _) => Some(build(&root.join(TINY_DRAFT), "0.6b", &o.work, sink)?),
    };
    Ok((model, draft))
}

/// `src` upscaled to `shape` under `work`, reused when an earlier run of this
/// commit's upscale left it there.
fn build(src: &Path, shape: &str, work: &Path, sink: &mut Sink<'_>) -> Result<PathBuf> {
    let name = src.file_name().and_then(|s| s.to_str()).unwrap_or("model");
    let out = work.join(format!("{name}-{shape}"));
    let stamp = out.join("BUILT");
    let want = format!(
        "{} {}",
        machine::commit(),
        std::fs::metadata(src.join("model.safetensors"))
            .map(|m| m.len())
            .unwrap_or(0)
    );
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == want) {
        return Ok(out);
    }
    // Our own work folder: whatever an interrupted build left there goes.
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    let t = Instant::now();
    let s = crate::upscale::upscale_named(
        src,
        shape,
        &out,
        crate::upscale::widen::OutDtype::Bf16,
        4 << 30,
    )
    .with_context(|| format!("upscaling {} to {shape}", src.display()))?;
    std::fs::write(&stamp, &want)?;
    sink.push(
        json!({"bench": "spec-scale", "kind": "build", "shape": shape, "source": name,
                     "params": s.params, "bytes": s.bytes, "seconds": t.elapsed().as_secs_f64(),
                     "exact_qk": s.exact_qk, "f32_norms": s.f32_norms}),
    )?;
    Ok(out)
}

/// Runs `c`, passing each JSON line of its stdout to `each` as it arrives; kills
/// it `limit` + `grace` after the start. Stderr is inherited (the log).
fn stream(
    c: &mut Command,
    limit: Option<Duration>,
    grace: Duration,
    mut each: impl FnMut(Value) -> Result<()>,
) -> Result<()> {
    c.stdout(Stdio::piped());
    let mut child = c
        .spawn()
        .with_context(|| format!("starting {:?}", c.get_program()))?;
    let out = child.stdout.take().context("child stdout")?;
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(out)
            .lines()
            .map_while(std::result::Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let start = Instant::now();
    let hard = limit.map(|l| l + grace);
    let mut killed = false;
    loop {
        let wait = match hard {
            Some(h) => match h.checked_sub(start.elapsed()) {
                Some(w) => w,
                None => {
                    let _ = child.kill();
                    killed = true;
                    break;
                }
            },
            None => Duration::from_secs(3600),
        };
        match rx.recv_timeout(wait) {
            Ok(line) => {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    each(v)?;
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    // Lines already read before the kill still count.
    for line in rx.try_iter() {
        if let Ok(v) = serde_json::from_str::<Value>(&line) {
            each(v)?;
        }
    }
    let status = child.wait()?;
    if killed {
        // The reader may wait on a grandchild that still holds the pipe: leave it.
        bail!(
            "killed after {:.0} s (the time guard)",
            start.elapsed().as_secs_f64()
        );
    }
    let _ = reader.join();
    if !status.success() {
        bail!("exited with {status}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_run_bf16_first_and_keep_cpus_to_f32_on_big_shapes() {
        let o = parse(&[], false).unwrap();
        let got: Vec<String> = stages(&o, false)
            .iter()
            .map(|s| format!("{}/{}/{}", s.shape, s.dtype, s.engine))
            .collect();
        assert_eq!(
            got,
            [
                "tiny/bf16/ours",
                "tiny/bf16/mlx-lm",
                "tiny/f32/ours",
                "tiny/f32/mlx-lm",
                "24l/f32/ours",
                "24l/f32/mlx-lm"
            ]
        );
        let o = parse(
            &[
                "--shapes".into(),
                "1.7b,8b".into(),
                "--engines".into(),
                "ours".into(),
            ],
            true,
        )
        .unwrap();
        let got: Vec<String> = stages(&o, true)
            .iter()
            .map(|s| format!("{}/{}", s.shape, s.dtype))
            .collect();
        assert_eq!(got, ["1.7b/bf16", "8b/bf16", "1.7b/f32", "8b/f32"]);
    }

    #[test]
    fn depths_pass_through_checked_and_bad_ones_are_named() {
        let with = |v: &str| parse(&["--depths".into(), v.into()], true);
        assert_eq!(
            with(" auto, 6,5 ,1").unwrap().depths.as_deref(),
            Some("auto,6,5,1")
        );
        assert_eq!(parse(&[], true).unwrap().depths, None);
        // Depth 0 is the speculative session held at plain, not the `off` loop.
        assert_eq!(
            with("auto,4,0").unwrap().depths.as_deref(),
            Some("auto,4,0")
        );
        for bad in ["auto,-1", "auto,17", "auto,,2", "deep", ""] {
            let e = format!("{:#}", with(bad).unwrap_err());
            assert!(
                e.contains("--depths") && e.contains("0 to 16"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_shape_too_big_for_memory_is_named_with_its_sizes() {
        let meminfo =
            "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20971520 kB\n";
        let avail = mem_available(meminfo).unwrap();
        assert_eq!(avail, 20 << 30);
        // 6.6 B parameters in f32 (the moe shape) do not fit 20 GiB; in bf16 they do.
        let why = does_not_fit(6_600_000_000 * 4, avail, "f32").unwrap();
        assert!(
            why.contains("24.6 GiB in f32") && why.contains("20.0 GiB"),
            "{why}"
        );
        assert!(does_not_fit(6_600_000_000 * 2, avail, "bf16").is_none());
        assert_eq!(mem_available("MemTotal: 1 kB\n"), None);

        // Element counts come from the headers, over every shard.
        let dir = std::env::temp_dir().join(format!("mtp-spec-scale-size-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let shard = |name: &str, json: &str| {
            let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
            bytes.extend_from_slice(json.as_bytes());
            std::fs::write(dir.join(name), bytes).unwrap();
        };
        shard(
            "a.safetensors",
            r#"{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[3,4],"data_offsets":[0,48]}}"#,
        );
        shard(
            "b.safetensors",
            r#"{"v":{"dtype":"BF16","shape":[5],"data_offsets":[0,10]}}"#,
        );
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        assert_eq!(weight_elements(&dir).unwrap(), 17);
        shard("c.safetensors", "not json");
        let err = format!("{:#}", weight_elements(&dir).unwrap_err());
        assert!(
            err.contains("c.safetensors") && err.contains("not JSON"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_moe_shape_is_known_and_profiles_every_depth() {
        let a: Vec<String> = ["--shapes", "moe", "--dtypes", "bf16"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let o = parse(&a, true).unwrap();
        let got: Vec<String> = stages(&o, true)
            .iter()
            .map(|s| format!("{}/{}/{}", s.shape, s.dtype, s.engine))
            .collect();
        assert_eq!(got, ["moe/bf16/ours", "moe/bf16/mlx-lm"]);
        assert_eq!(ours_extra("moe"), ["--profile-depth", "1,2,3,4"]);
        assert!(ours_extra("8b").is_empty());
        // Its source is a Qwen3.5-MoE, which the MoE rules take.
        assert!(crate::upscale::moe::is_moe_model(
            &cmd::root().join(TINY_MOE)
        ));
    }

    #[test]
    fn bad_options_name_the_option() {
        let err = |a: &[&str]| {
            let a: Vec<String> = a.iter().map(|s| (*s).to_owned()).collect();
            parse(&a, false).unwrap_err().to_string()
        };
        assert!(err(&["--shapes", "9b"]).contains("unknown shape `9b` (tiny, 24l, 1.7b, 8b, moe)"));
        assert!(err(&["--dtypes", "f16"]).contains("not `f16`"));
        assert!(err(&["--prompts", "0"]).contains("--prompts takes 1 to 4"));
        assert!(err(&["--frobnicate"]).contains("unknown spec-scale option"));
        assert!(err(&["--passes", "0"]).contains("--passes: at least 1"));
        assert!(err(&["--passes", "two"]).contains("--passes: a whole number"));
    }

    #[test]
    fn a_child_past_its_limit_is_killed_and_its_earlier_lines_kept() {
        let mut c = Command::new("sh");
        c.args(["-c", "echo '{\"a\":1}'; sleep 30; echo '{\"a\":2}'"]);
        let mut got = Vec::new();
        let t = Instant::now();
        let r = stream(
            &mut c,
            Some(Duration::from_millis(200)),
            Duration::ZERO,
            |v| {
                got.push(v);
                Ok(())
            },
        );
        assert!(r.unwrap_err().to_string().contains("time guard"));
        assert_eq!(got, [json!({"a": 1})]);
        assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    }
}
