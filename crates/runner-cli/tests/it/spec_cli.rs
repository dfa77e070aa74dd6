//! `mtp-runner generate --speculative ... --draft-tokens ... --draft-quant ...`
//! end to end: the `speculation` object of `--json` on the bundled tiny-mtp,
//! greedy output equal to `--speculative off` (with a quantized draft head too,
//! chosen by the flag or `MTP_DRAFT_QUANT`), and the usage errors (exit 2,
//! naming the flag).
// The measured figures are reported on stderr (`-- --nocapture` shows them).
#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::Output;

use runner::testing::{Arch, Fixture, write_checkpoint};

use crate::common;
use common::{bundled, generate_args};
use serde_json::Value;

fn tiny() -> PathBuf {
    bundled("tiny-mtp")
}

/// Runs `generate --model dir rest..`; checks the exit code and that stderr names each needle.
fn check(dir: &Path, rest: &[&str], code: i32, needles: &[&str]) -> Output {
    common::check(&generate_args(dir, rest), code, needles)
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).expect("--json prints one JSON object")
}

const PROMPT: [&str; 6] = [
    "--prompt",
    "def add(a, b):\n",
    "-n",
    "48",
    "--temperature",
    "0",
];

fn generate(speculative: &str, draft_tokens: &str) -> Value {
    let mut args = PROMPT.to_vec();
    args.extend([
        "--json",
        "--speculative",
        speculative,
        "--draft-tokens",
        draft_tokens,
    ]);
    json(&check(&tiny(), &args, 0, &[]))
}

fn as_f64(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("`{key}` is not a number in {v}"))
}

fn as_usize(v: &Value, key: &str) -> usize {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("`{key}` is not a count in {v}")) as usize
}

/// Checks the `speculation` object's keys and their consistency; returns it.
fn check_speculation(out: &Value, max_depth: usize) -> Value {
    let s = out["speculation"].clone();
    assert_eq!(s["method"], "mtp", "{s}");
    let (rounds, drafted, accepted) = (
        as_usize(&s, "rounds"),
        as_usize(&s, "drafted"),
        as_usize(&s, "accepted"),
    );
    assert!(rounds >= 1 && accepted <= drafted, "{s}");
    let rate = as_f64(&s, "acceptance_rate");
    assert!((0.0..=1.0).contains(&rate), "acceptance_rate {rate}");
    if drafted > 0 {
        // Tolerance: the ratio of two counts printed as a float, 1e-9.
        assert!(
            (rate - accepted as f64 / drafted as f64).abs() < 1e-9,
            "{s}"
        );
    }
    let mal = as_f64(&s, "mean_accepted_length");
    assert!(mal >= 1.0, "mean_accepted_length {mal}");
    let generated = as_usize(out, "generated_tokens");
    assert!(
        (mal * rounds as f64 - generated as f64).abs() < 1e-6,
        "mean_accepted_length × rounds = generated tokens: {s}"
    );
    let depths: Vec<usize> = s["depth_over_time"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(depths.len(), rounds, "len(depth_over_time) == rounds: {s}");
    assert_eq!(depths.iter().sum::<usize>(), drafted, "{s}");
    assert!(depths.iter().all(|&d| d <= max_depth), "{depths:?}");
    let histogram: Vec<usize> = s["depth_histogram"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect();
    assert_eq!(
        histogram.iter().sum::<usize>(),
        rounds,
        "histogram counts rounds: {s}"
    );
    for (d, &n) in histogram.iter().enumerate() {
        let seen = depths.iter().filter(|&&x| x == d).count();
        assert_eq!(n, seen, "rounds at depth {d}: {s}");
    }
    let per_position = s["per_position_acceptance"].as_array().unwrap();
    assert_eq!(
        per_position.len(),
        depths.iter().copied().max().unwrap_or(0),
        "{s}"
    );
    for p in per_position {
        let p = p.as_f64().unwrap();
        assert!((0.0..=1.0).contains(&p), "per-position acceptance {p}");
    }
    s
}

#[test]
fn mtp_json_reports_speculation_and_matches_plain_greedy_output() {
    let plain = generate("off", "auto");
    let auto = generate("mtp", "auto");
    let fixed = generate("mtp", "3");
    for v in [&auto, &fixed] {
        assert_eq!(
            v["token_ids"], plain["token_ids"],
            "speculative greedy output differs"
        );
        assert_eq!(v["text"], plain["text"]);
    }
    let s = check_speculation(&auto, 6);
    let f = check_speculation(&fixed, 3);
    assert!(as_usize(&f, "drafted") > 0, "depth 3 drafted nothing: {f}");
    eprintln!("auto: {s}\nfixed 3: {f}");
    // `auto` on a model with a head is MTP too.
    let picked = generate("auto", "2");
    check_speculation(&picked, 2);
    assert_eq!(picked["token_ids"], plain["token_ids"]);
}

#[test]
fn mtp_without_a_head_is_a_usage_error_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &Fixture::new(Arch::Qwen3), 3).unwrap();
    check(
        dir.path(),
        &["--prompt", "hi", "-n", "4", "--speculative", "mtp"],
        2,
        &["--speculative"],
    );
}

#[test]
fn draft_tokens_out_of_range_is_a_usage_error() {
    for bad in ["99", "-1", "many"] {
        let out = check(
            &tiny(),
            &[
                "--prompt",
                "hi",
                "-n",
                "4",
                "--speculative",
                "mtp",
                "--draft-tokens",
                bad,
            ],
            2,
            &["--draft-tokens"],
        );
        assert!(
            out.stdout.is_empty(),
            "nothing generated for --draft-tokens {bad}"
        );
    }
}

/// `generate --json` on tiny-mtp with [`PROMPT`] and `rest`, `MTP_DRAFT_QUANT`
/// set to `env` in the child only; checks the exit code and that stderr
/// names each needle.
fn draft_quant_run(rest: &[&str], env: Option<&str>, code: i32, needles: &[&str]) -> Output {
    let dir = tiny();
    let mut args = PROMPT.to_vec();
    args.push("--json");
    args.extend(rest);
    let mut cmd = std::process::Command::new(common::BIN);
    // Plain log lines (tracing reads NO_COLOR), so `-v`'s fields can be matched.
    cmd.args(generate_args(&dir, &args))
        .env_remove("MTP_DRAFT_QUANT")
        .env_remove("MTP_DRAFT_VOCAB")
        .env("NO_COLOR", "1");
    if let Some(v) = env {
        cmd.env("MTP_DRAFT_QUANT", v);
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(code),
        "{rest:?} {env:?}: stderr {err}"
    );
    for n in needles {
        assert!(
            err.contains(n),
            "{rest:?} {env:?}: stderr `{err}` should name `{n}`"
        );
    }
    out
}

/// What `-v` logs when the MTP head is given quantized drafting weights.
const QUANTIZED_LOG: &str = "MTP head drafts with quantized weights";

/// A quantized draft head, chosen by the flag or by `MTP_DRAFT_QUANT` under
/// `--draft-quant auto`, drafts (drafted > 0) and leaves greedy output equal
/// to `--speculative off`; the flag wins over the variable. Whether the head
/// was quantized is read from the `-v` log (bits included).
#[test]
fn draft_quant_keeps_greedy_output_and_the_variable_is_read_under_auto() {
    let plain = json(&draft_quant_run(&["--speculative", "off"], None, 0, &[]));
    // (flags, MTP_DRAFT_QUANT, the bits the head is quantized to).
    let cases: [(&[&str], Option<&str>, Option<u32>); 6] = [
        (&["--draft-quant", "q4"], None, Some(4)),
        (&["--draft-quant", "q8"], None, Some(8)),
        (&["--draft-quant", "off"], Some("q4"), None),
        (&["--draft-quant", "q4"], Some("not-a-precision"), Some(4)),
        (&["--draft-quant", "auto"], Some("q4"), Some(4)),
        (&[], Some("Q8"), Some(8)),
    ];
    for (flags, env, bits) in cases {
        let mut rest = vec!["-v", "--speculative", "mtp", "--draft-tokens", "3"];
        rest.extend(flags);
        let out = draft_quant_run(&rest, env, 0, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        let case = format!("{flags:?} MTP_DRAFT_QUANT={env:?}");
        match bits {
            Some(b) => assert!(
                err.contains(&format!("{QUANTIZED_LOG} bits={b} group_size=64")),
                "{case}: stderr should log a q{b} head: {err}"
            ),
            None => assert!(!err.contains(QUANTIZED_LOG), "{case}: {err}"),
        }
        let v = json(&out);
        assert_eq!(
            v["token_ids"], plain["token_ids"],
            "{case}: greedy output differs"
        );
        let s = check_speculation(&v, 3);
        assert!(as_usize(&s, "drafted") > 0, "{case}: {s}");
    }
}

#[test]
fn bad_draft_quant_is_a_usage_error_naming_the_accepted_values() {
    for bad in ["q9", "q3", "eight", ""] {
        let out = draft_quant_run(
            &["--draft-quant", bad],
            None,
            2,
            &["--draft-quant", "possible values: auto, off, q8, q4"],
        );
        assert!(out.stdout.is_empty(), "nothing generated for {bad:?}");
    }
    // Under `auto` a bad variable is refused at load, naming it and its values.
    let out = draft_quant_run(
        &[],
        Some("q9"),
        2,
        &["MTP_DRAFT_QUANT", "`q9`", "auto, off, q8, q4"],
    );
    assert!(out.stdout.is_empty());
}

/// `--draft-vocab N` drafts over a subset (logged with its size: 1,024 ids
/// and tiny-mtp's special tokens) and keeps greedy output equal to
/// `--speculative off`; a count of 0 or a word is a usage error naming the
/// value, and so is a bad `MTP_DRAFT_VOCAB` under `auto`.
#[test]
fn draft_vocab_keeps_greedy_output_and_bad_values_are_usage_errors() {
    let plain = json(&draft_quant_run(&["--speculative", "off"], None, 0, &[]));
    let rest = [
        "-v",
        "--speculative",
        "mtp",
        "--draft-tokens",
        "3",
        "--draft-vocab",
        "1024",
    ];
    let out = draft_quant_run(&rest, None, 0, &["drafts over a vocabulary subset ids=10"]);
    let v = json(&out);
    assert_eq!(v["token_ids"], plain["token_ids"], "greedy output differs");
    assert!(as_usize(&check_speculation(&v, 3), "drafted") > 0);
    for bad in ["0", "lots"] {
        let named = format!("`{bad}`");
        let out = draft_quant_run(&["--draft-vocab", bad], None, 2, &["--draft-vocab", &named]);
        assert!(out.stdout.is_empty(), "nothing generated for {bad:?}");
    }
    let dir = tiny();
    let mut args = PROMPT.to_vec();
    args.push("--json");
    let out = std::process::Command::new(common::BIN)
        .args(generate_args(&dir, &args))
        .env_remove("MTP_DRAFT_QUANT")
        .env("MTP_DRAFT_VOCAB", "-5")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("MTP_DRAFT_VOCAB") && err.contains("`-5`"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}
