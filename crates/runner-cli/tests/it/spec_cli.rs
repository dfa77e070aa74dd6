//! `mtp-runner generate --speculative ... --draft-tokens ...` end to end: the
//! `speculation` object of `--json` on the bundled tiny-mtp, greedy output equal
//! to `--speculative off`, and the usage errors (exit 2, naming the flag).
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
