//! `cargo xtask gpu-check`: end-to-end parity and losslessness checks on a GPU (Metal, or MLX's CUDA build), with a JSON summary.
//!
//! The rules:
//! * The device must really be a GPU (MLX's device info, through the
//!   `bandwidth --info` example). Without one the command says so, writes a
//!   `"status": "no-gpu"` summary and exits with [`NO_GPU`]; it never reports a
//!   check it did not run.
//! * Plain greedy output on the GPU is compared with a token stream recorded on
//!   the CPU ([`REFERENCE`], made by `--record-reference`). On a GPU, bf16/TF32
//!   numerics may legitimately diverge from the CPU after some tokens, so this
//!   reports the first divergence position and does not fail.
//! * Speculative output (MTP, draft model, n-gram at depths 1..4 and auto) must
//!   equal plain output on the same GPU in f32 with TF32 off
//!   (`MLX_ENABLE_TF32=0`): that is the losslessness promise, and a difference
//!   fails the command (exit 1). The same comparison with TF32 on (MLX's
//!   default) is reported, not enforced: a batched verify and a one-token step
//!   may then round differently.
//! * Each of our CUDA kernels must agree with the ops it replaces within its
//!   stated tolerance (`bandwidth --kernel-check`): the bf16 kernels that a
//!   default CUDA run takes are checked only here, since the enforced
//!   speculative runs are f32.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::bins::{self, BANDWIDTH, MTP_RUNNER};
use crate::{cmd, machine};

/// Exit status when the loaded MLX has no GPU (distinct from pass 0 and fail 1).
pub(crate) const NO_GPU: i32 = 3;

/// The CPU reference token streams, relative to the workspace root.
pub(crate) const REFERENCE: &str = "xtask/assets/gpu-reference.json";

const MODEL: &str = "models/tiny-mtp";
/// The bundled hybrid model, checked for losslessness too (recurrent-state rewind).
const HYBRID: &str = "models/tiny-hybrid-mtp";
const DRAFT: &str = "models/tiny-draft";
const TOKENS: usize = 128;
const PROMPTS: &[&str] = &[
    "Once upon a time",
    "The cat sat on the mat. The dog sat on the log. The cat sat on the",
];
const METHODS: &[&str] = &["mtp", "draft-model", "ngram"];
const DEPTHS: &[&str] = &["1", "2", "3", "4", "auto"];

const USAGE: &str = "\
usage: cargo xtask gpu-check [--bin-dir DIR] [--mlx-cuda-dir SP] [--json FILE]
       cargo xtask gpu-check --record-reference     (on a CPU: rewrites the reference fixture)
exit: 0 all checks passed, 1 a check failed (or could not run), 3 no GPU";

/// Runs the checks; exits the process with 1 or [`NO_GPU`] when they do not pass.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let args = bins::take_flags(args)?;
    let (mut json_out, mut record) = (None, false);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => json_out = Some(PathBuf::from(it.next().context("--json needs a file")?)),
            "--record-reference" => record = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown gpu-check option `{other}`\n{USAGE}"),
        }
    }
    if record {
        return record_reference();
    }
    let device = device_info()?;
    let (summary, code) = if device["gpu_available"] != json!(true) {
        let msg = format!(
            "no GPU: MLX reports no GPU backend (running on {} `{}`). Nothing was checked. \
             On Linux point --mlx-cuda-dir (or MTP_MLX_CUDA_DIR) at the unpacked mlx-cuda-13 \
             wheel; see docs/gpu.md",
            device["device"].as_str().unwrap_or("?"),
            device["device_name"].as_str().unwrap_or("?")
        );
        eprintln!("gpu-check: {msg}");
        (
            json!({"check": "gpu", "status": "no-gpu", "exit": NO_GPU, "message": msg, "device": device}),
            NO_GPU,
        )
    } else {
        eprintln!(
            "gpu-check: device {} (MLX {})",
            device["device_name"], device["mlx_version"]
        );
        checks(device)?
    };
    let mut summary = summary;
    merge(&mut summary, machine::stamp());
    let text = serde_json::to_string_pretty(&summary)?;
    println!("{text}");
    if let Some(f) = json_out {
        std::fs::write(&f, format!("{text}\n"))
            .with_context(|| format!("writing {}", f.display()))?;
    }
    if code != 0 {
        std::process::exit(code);
    }
    Ok(())
}

/// The `device` line of `bandwidth --info`.
pub(crate) fn device_info() -> Result<Value> {
    let out = cmd::output(
        "device info",
        &mut bins::command(BANDWIDTH, &["--info".into()])?,
    )?;
    out.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["kind"] == "device")
        .context("`bandwidth --info` printed no device line")
}

/// The `kernel-check` lines of `bandwidth --kernel-check`: each of our CUDA
/// kernels against the ops it replaces (`runner::kernel_checks`).
fn kernel_checks() -> Result<Vec<Value>> {
    let out = cmd::output(
        "kernel checks",
        &mut bins::command(BANDWIDTH, &["--kernel-check".into()])?,
    )?;
    Ok(out
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["kind"] == "kernel-check")
        .collect())
}

/// A failure line for each kernel check past its tolerance (or without a
/// number: a NaN error reads as `null`).
fn kernel_failures(checks: &[Value]) -> Vec<String> {
    checks
        .iter()
        .filter(|c| c["passed"] != json!(true))
        .map(|c| {
            format!(
                "the {} kernel differs from the ops it replaces in {}: {} of the output range \
                 (tolerance {})",
                c["kernel"].as_str().unwrap_or("?"),
                c["dtype"].as_str().unwrap_or("?"),
                c["rel_err"],
                c["tolerance"]
            )
        })
        .collect()
}

/// Parity against the CPU reference and losslessness per method and depth.
fn checks(device: Value) -> Result<(Value, i32)> {
    let reference = load_reference()?;
    let mut parity = Vec::new();
    let mut lossless = Vec::new();
    let mut failures = Vec::new();
    for case in reference["cases"]
        .as_array()
        .context("reference has no cases")?
    {
        let prompt = case["prompt"].as_str().context("case without prompt")?;
        let want: Vec<u64> = ids(&case["token_ids"]);
        for tf32 in [false, true] {
            let plain = generate(MODEL, prompt, "off", None, "gpu", tf32)?;
            let got = ids(&plain["token_ids"]);
            parity.push(json!({
                "prompt": prompt, "tf32": tf32, "tokens": got.len(),
                "first_divergence": first_divergence(&want, &got),
            }));
            // With TF32 on, only the plain parity row: the speculative rows there are
            // not enforced (batched verify and single-token steps round differently).
            for method in METHODS.iter().filter(|_| !tf32) {
                for depth in DEPTHS {
                    let spec = generate(MODEL, prompt, method, Some(depth), "gpu", tf32)?;
                    let s = ids(&spec["token_ids"]);
                    let diverge = first_divergence(&got, &s);
                    let row = json!({
                        "prompt": prompt, "method": method, "depth": depth, "tf32": tf32,
                        "identical": diverge.is_none(), "first_divergence": diverge,
                        "enforced": !tf32, "speculation": spec["speculation"],
                    });
                    if diverge.is_some() && !tf32 {
                        failures.push(format!(
                            "{method} depth {depth} differs from plain at token {} (prompt {prompt:?})",
                            diverge.unwrap_or_default()
                        ));
                    }
                    lossless.push(row);
                }
            }
        }
    }
    hybrid_lossless(&reference, &mut lossless, &mut failures)?;
    // Our CUDA kernels against the ops they replace (none runs on Metal).
    let kernels = kernel_checks()?;
    failures.extend(kernel_failures(&kernels));
    for f in &failures {
        eprintln!("gpu-check: FAIL: {f}");
    }
    let status = if failures.is_empty() { "pass" } else { "fail" };
    eprintln!(
        "gpu-check: {status}: {} speculative runs against plain ({} enforced, f32 without TF32); \
         CPU parity reported per prompt",
        lossless.len(),
        lossless.iter().filter(|r| r["enforced"] == true).count()
    );
    let code = i32::from(!failures.is_empty());
    Ok((
        json!({"check": "gpu", "status": status, "exit": code, "device": device,
               "failures": failures, "parity": parity, "lossless": lossless, "kernels": kernels,
               "rule": "speculative == plain on the same GPU in f32 with MLX_ENABLE_TF32=0 (enforced); \
                        GPU vs CPU reference and TF32-on rows are reported only"}),
        code,
    ))
}

/// The hybrid (Gated DeltaNet) model's enforced MTP rows: its
/// recurrent-state rewind on the device.
fn hybrid_lossless(
    reference: &Value,
    lossless: &mut Vec<Value>,
    failures: &mut Vec<String>,
) -> Result<()> {
    for case in reference["cases"].as_array().into_iter().flatten() {
        let prompt = case["prompt"].as_str().context("case without prompt")?;
        let plain = ids(&generate(HYBRID, prompt, "off", None, "gpu", false)?["token_ids"]);
        for depth in DEPTHS {
            let spec = generate(HYBRID, prompt, "mtp", Some(depth), "gpu", false)?;
            let diverge = first_divergence(&plain, &ids(&spec["token_ids"]));
            if let Some(at) = diverge {
                failures.push(format!(
                    "hybrid mtp depth {depth} differs from plain at token {at} (prompt {prompt:?})"
                ));
            }
            lossless.push(json!({
                "model": HYBRID, "prompt": prompt, "method": "mtp", "depth": depth, "tf32": false,
                "identical": diverge.is_none(), "first_divergence": diverge,
                "enforced": true, "speculation": spec["speculation"],
            }));
        }
    }
    Ok(())
}

/// One `mtp-runner generate --json` on `device`; its JSON report.
fn generate(
    model: &str,
    prompt: &str,
    method: &str,
    depth: Option<&str>,
    device: &str,
    tf32: bool,
) -> Result<Value> {
    let root = cmd::root();
    let mut a: Vec<String> = vec![
        "generate".into(),
        "--model".into(),
        root.join(model).display().to_string(),
        "--prompt".into(),
        prompt.into(),
        "--max-tokens".into(),
        TOKENS.to_string(),
        "--temperature".into(),
        "0".into(),
        "--dtype".into(),
        "f32".into(),
        "--device".into(),
        device.into(),
        "--json".into(),
        "--speculative".into(),
        method.into(),
    ];
    if let Some(d) = depth {
        a.extend(["--draft-tokens".into(), d.into()]);
    }
    if method == "draft-model" {
        a.extend([
            "--draft-model".into(),
            root.join(DRAFT).display().to_string(),
        ]);
    }
    let mut c: Command = bins::command(MTP_RUNNER, &a)?;
    c.env("MLX_ENABLE_TF32", if tf32 { "1" } else { "0" });
    let out = cmd::output(&format!("generate {method} {depth:?}"), &mut c)?;
    serde_json::from_str(out.trim()).with_context(|| format!("mtp-runner printed no JSON: {out}"))
}

/// Token ids of a JSON array (empty when absent).
fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

/// The first index where the streams differ (a shorter stream differs where it ends).
pub(crate) fn first_divergence(a: &[u64], b: &[u64]) -> Option<usize> {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => Some(i),
        None if a.len() != b.len() => Some(a.len().min(b.len())),
        None => None,
    }
}

fn load_reference() -> Result<Value> {
    let path = cmd::root().join(REFERENCE);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "reading {} (make it on a CPU with `cargo xtask gpu-check --record-reference`)",
            path.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Writes [`REFERENCE`]: plain greedy f32 token streams on the CPU.
fn record_reference() -> Result<()> {
    let mut cases = Vec::new();
    for prompt in PROMPTS {
        let r = generate(MODEL, prompt, "off", None, "cpu", false)?;
        cases.push(json!({"prompt": prompt, "token_ids": r["token_ids"]}));
    }
    let doc = json!({
        "about": "plain greedy f32 token streams of models/tiny-mtp on the CPU, the reference `xtask gpu-check` compares the GPU with",
        "model": MODEL, "max_tokens": TOKENS, "dtype": "f32", "device": "cpu",
        "recorded": machine::stamp(),
        "rerun": "cargo xtask gpu-check --record-reference",
        "cases": cases,
    });
    let path: &Path = &cmd::root().join(REFERENCE);
    std::fs::write(path, serde_json::to_string_pretty(&doc)? + "\n")
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("gpu-check: wrote {}", path.display());
    Ok(())
}

/// Adds `extra`'s fields to the object `v`.
fn merge(v: &mut Value, extra: Value) {
    if let (Value::Object(m), Value::Object(e)) = (v, extra) {
        m.extend(e);
    }
}

#[cfg(test)]
mod tests {
    use super::{first_divergence, kernel_failures};
    use serde_json::json;

    /// Only a kernel check that did not pass becomes a failure, and it
    /// names the kernel, the dtype and both numbers.
    #[test]
    fn a_kernel_past_its_tolerance_fails_the_check() {
        let checks = [
            json!({"kind": "kernel-check", "kernel": "fused-heads", "dtype": "f32",
                   "rel_err": 1e-7, "tolerance": 1e-4, "passed": true}),
            json!({"kind": "kernel-check", "kernel": "rows-matmul", "dtype": "bf16",
                   "rel_err": 0.5, "tolerance": 2e-2, "passed": false}),
            json!({"kind": "kernel-check", "kernel": "rows-matmul", "dtype": "bf16",
                   "rel_err": null, "tolerance": 2e-2, "passed": false}),
        ];
        let f = kernel_failures(&checks);
        assert_eq!(f.len(), 2, "{f:?}");
        assert!(f[0].contains("rows-matmul") && f[0].contains("bf16") && f[0].contains("0.5"));
        assert!(f[1].contains("null"));
        assert!(kernel_failures(&checks[..1]).is_empty());
    }

    #[test]
    fn first_divergence_finds_the_first_difference_or_the_shorter_end() {
        let check = |a: &[u64], b: &[u64], want: Option<usize>| {
            assert_eq!(first_divergence(a, b), want, "{a:?} vs {b:?}");
        };
        check(&[1, 2, 3], &[1, 2, 3], None);
        check(&[1, 2, 3], &[1, 9, 3], Some(1));
        check(&[1, 2, 3], &[1, 2], Some(2));
        check(&[], &[], None);
        check(&[5], &[6], Some(0));
    }
}
