//! `--speculative draft-model|ngram|auto` and `--draft-model` end to end: the
//! method reported in `--json`, greedy text equal to plain decoding, and the
//! exit code 2 for a missing or mismatched draft model.

use std::process::Output;

use runner::testing::{Arch, Fixture, write_checkpoint};

use crate::common;
use common::{bundled, generate_args};

fn model_dir(name: &str) -> String {
    bundled(name).display().to_string()
}

/// Runs `generate` on `model` and checks the exit code; stderr must mention each of `needles`.
fn check(model: &str, rest: &[&str], code: i32, needles: &[&str]) -> Output {
    common::check(&generate_args(model, rest), code, needles)
}

/// `(speculation.method, text)` of a greedy `--json` run.
fn greedy_json(model: &str, rest: &[&str]) -> (String, String) {
    let mut args = vec![
        "--prompt",
        "Tom and Sam went to the park. Tom and Sam",
        "-n",
        "24",
    ];
    args.extend_from_slice(&["--temperature", "0", "--json"]);
    args.extend_from_slice(rest);
    let out = check(model, &args, 0, &[]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        v["speculation"]["method"].as_str().unwrap().to_owned(),
        v["text"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn each_drafter_reports_its_method_and_matches_plain_text() {
    let target = model_dir("tiny-mtp");
    let draft = model_dir("tiny-draft");
    let (_, plain) = greedy_json(&target, &["--speculative", "off"]);
    let cases: [(&[&str], &str); 4] = [
        (&["--speculative", "mtp"], "mtp"),
        (
            &["--speculative", "draft-model", "--draft-model", &draft],
            "draft-model",
        ),
        (&["--speculative", "ngram"], "ngram"),
        // Auto prefers the MTP head over a given draft model.
        (&["--draft-model", &draft], "mtp"),
    ];
    for (args, method) in cases {
        let (got, text) = greedy_json(&target, args);
        assert_eq!(got, method, "{args:?}");
        assert_eq!(text, plain, "{args:?}");
    }
    // A model without a head: auto takes the draft model when given, else n-gram lookup.
    assert_eq!(
        greedy_json(&draft, &["--draft-model", &draft]).0,
        "draft-model"
    );
    assert_eq!(greedy_json(&draft, &[]).0, "ngram");
}

#[test]
fn a_missing_or_mismatched_draft_model_is_bad_input() {
    let target = model_dir("tiny-mtp");
    check(
        &target,
        &["--prompt", "hi", "--speculative", "draft-model"],
        2,
        &["--draft-model DIR"],
    );
    let other = tempfile::tempdir().unwrap();
    write_checkpoint(other.path(), &Fixture::new(Arch::Qwen3), 3).unwrap();
    let other_dir = other.path().display().to_string();
    check(
        &target,
        &[
            "--prompt",
            "hi",
            "--speculative",
            "draft-model",
            "--draft-model",
            &other_dir,
        ],
        2,
        &["does not share the tokenizer", &other_dir, &target],
    );
}

/// `(speculation.method, text)` of each turn of a greedy scripted `chat`.
fn chat_turns(model: &str, rest: &[&str]) -> Vec<(String, String)> {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("turns.txt");
    std::fs::write(&script, "Tell me about Tom.\nAnd Sam?\n").unwrap();
    let mut args = vec![
        "chat",
        "--model",
        model,
        "--script",
        script.to_str().unwrap(),
        "-n",
        "12",
        "--temperature",
        "0",
    ];
    args.extend_from_slice(rest);
    let out = common::check(&args, 0, &[]);
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let method = v["speculation"]["method"].as_str().unwrap().to_owned();
            (method, v["text"].as_str().unwrap().to_owned())
        })
        .collect()
}

#[test]
fn chat_drafts_with_the_draft_model_as_generate_does() {
    let target = model_dir("tiny-mtp");
    let draft = model_dir("tiny-draft");
    let plain: Vec<String> = chat_turns(&target, &["--speculative", "off"])
        .into_iter()
        .map(|(method, text)| {
            assert_eq!(method, "off");
            text
        })
        .collect();
    assert_eq!(plain.len(), 2, "one object per turn");
    // `--speculative draft-model` drafts with the given model (it used to
    // fail with "needs --draft-model DIR"), with the plain text.
    let turns = chat_turns(
        &target,
        &["--speculative", "draft-model", "--draft-model", &draft],
    );
    let texts: Vec<String> = turns.iter().map(|(_, t)| t.clone()).collect();
    assert!(turns.iter().all(|(m, _)| m == "draft-model"), "{turns:?}");
    assert_eq!(texts, plain);
    // `auto` on a model without a head takes the draft model (it used to
    // ignore it and fall back to n-gram lookup), and n-gram without one.
    let auto = chat_turns(&draft, &["--speculative", "auto", "--draft-model", &draft]);
    assert!(auto.iter().all(|(m, _)| m == "draft-model"), "{auto:?}");
    let ngram = chat_turns(&draft, &["--speculative", "auto"]);
    assert!(ngram.iter().all(|(m, _)| m == "ngram"), "{ngram:?}");
}
