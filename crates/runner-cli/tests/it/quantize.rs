//! `mtp-runner quantize` end to end: the written folder generates; bad options exit 2 naming the fix.

use std::path::Path;

use runner::testing::{Arch, Fixture};

use crate::common;
use common::{check, fixture};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `quantize --json` of `src` into `out` with `extra` options, its summary parsed.
fn quantize_json(src: &Path, out: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["quantize", "--model", s(src), "--out", s(out), "--json"];
    args.extend_from_slice(extra);
    let o = check(&args, 0, &[]);
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn quantized_folder_generates_and_json_summary_counts_matrices() {
    let src = fixture(&Fixture::new(Arch::Qwen3));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("q8");
    let v = quantize_json(src.path(), &out, &["--bits", "8", "--group-size", "32"]);
    // Qwen3 fixture, tied: 2 layers × 7 linears + the embedding.
    assert_eq!(v["quantized"], 15, "{v}");
    assert_eq!(v["bits"], 8);
    assert!(v["written_bytes"].as_u64().unwrap() < v["source_bytes"].as_u64().unwrap());
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["quantization"]["group_size"], 32);
    let o = check(
        &[
            "generate",
            "--model",
            s(&out),
            "--prompt",
            "hi",
            "-n",
            "5",
            "--json",
        ],
        0,
        &[],
    );
    let g: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(g["generated_tokens"].as_u64().unwrap() >= 1, "{g}");
    // A floating-point mode takes its own bits and group size.
    let out = tmp.path().join("nvfp4");
    let v = quantize_json(src.path(), &out, &["--mode", "nvfp4"]);
    assert_eq!(
        (&v["mode"], &v["bits"], &v["group_size"]),
        (&"nvfp4".into(), &4.into(), &16.into()),
        "{v}"
    );
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["quantization"]["mode"], "nvfp4");
    check(
        &["generate", "--model", s(&out), "--prompt", "hi", "-n", "3"],
        0,
        &[],
    );
}

#[test]
fn bad_quantize_options_exit_2_naming_the_option() {
    let src = fixture(&Fixture::new(Arch::Llama));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let m = s(src.path());
    let o = s(&out);
    check(
        &["quantize", "--model", m, "--out", o, "--bits", "3"],
        2,
        &["--bits", "use 4 or 8"],
    );
    check(
        &["quantize", "--model", m, "--out", o, "--group-size", "100"],
        2,
        &["--group-size", "32, 64 or 128"],
    );
    check(
        &["quantize", "--model", m, "--out", o, "--group-size", "128"],
        2,
        &["hidden_size 64", "128"],
    );
    check(
        &["quantize", "--model", m, "--out", o, "--mode", "fp4"],
        2,
        &["--mode", "fp4", "mxfp4, mxfp8, nvfp4"],
    );
    check(
        &[
            "quantize", "--model", m, "--out", o, "--mode", "mxfp8", "--bits", "4",
        ],
        2,
        &["--bits", "mxfp8", "always 8"],
    );
    // The output folder is not empty: here, the source itself.
    check(
        &["quantize", "--model", m, "--out", m],
        2,
        &["--out", "not empty"],
    );
    check(
        &[
            "quantize",
            "--model",
            s(&tmp.path().join("nope")),
            "--out",
            o,
        ],
        2,
        &["config.json"],
    );
    assert!(!out.exists());
}
