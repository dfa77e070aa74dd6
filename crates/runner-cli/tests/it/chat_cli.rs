//! `mtp-runner chat` end to end: the scripted JSON turns with a growing
//! reused prefix, the interactive form with `/stats`, and the error for a
//! model without a chat template.

use std::process::Output;

use runner::testing::{Arch, Fixture, write_checkpoint};

use crate::common;
use common::run_with_stdin;

const TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/tiny-mtp");

fn run(args: &[&str], stdin: &str) -> Output {
    run_with_stdin(args, stdin.as_bytes())
}

#[test]
fn a_scripted_conversation_reuses_a_growing_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("turns.txt");
    std::fs::write(
        &script,
        "Tell me about a cat.\nWhat did it eat?\n\nAnd then?\nWhere did it sleep?\nHow does it end?\n",
    )
    .unwrap();
    let out = run(
        &[
            "chat",
            "--model",
            TINY,
            "--script",
            script.to_str().unwrap(),
            "-n",
            "12",
            "--temperature",
            "0",
            "--speculative",
            "mtp",
            "--draft-tokens",
            "3",
        ],
        "",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {err}");
    let turns: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(turns.len(), 5, "one object per non-empty line");
    let mut last_reused = 0;
    let mut last_prompt = 0;
    for (i, t) in turns.iter().enumerate() {
        for key in [
            "turn",
            "text",
            "token_ids",
            "prompt_tokens",
            "reused_tokens",
            "decode_tps",
            "speculation",
        ] {
            assert!(t.get(key).is_some(), "turn {i}: missing {key} in {t}");
        }
        assert_eq!(t["turn"], i + 1);
        assert_eq!(t["speculation"]["method"], "mtp");
        let (prompt, reused) = (
            t["prompt_tokens"].as_u64().unwrap(),
            t["reused_tokens"].as_u64().unwrap(),
        );
        assert!(reused < prompt, "turn {i}: reused {reused} of {prompt}");
        assert!(prompt > last_prompt);
        if i > 0 {
            // At least the previous prompt is reused.
            assert!(
                reused >= last_prompt && reused > last_reused,
                "turn {i}: reused {reused}"
            );
            assert_eq!(t["reuse_source"], "live");
        }
        (last_reused, last_prompt) = (reused, prompt);
    }
}

#[test]
fn interactive_chat_streams_replies_and_prints_stats_on_request() {
    let out = run(
        &["chat", "--model", TINY, "-n", "6", "--temperature", "0"],
        "Hello there\n/stats\nAnd again\n/stats\n/quit\nnot read\n/stats\n",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {err}");
    assert!(!out.stdout.is_empty(), "replies are streamed to stdout");
    // One /stats line per turn asked for; nothing after /quit runs.
    assert_eq!(err.matches("turn 1: prompt").count(), 1, "{err}");
    assert_eq!(err.matches("turn 2: prompt").count(), 1, "{err}");
    assert!(!err.contains("turn 3:"), "{err}");
    assert!(err.contains("prefix cache:"), "{err}");
}

#[test]
fn a_model_without_a_chat_template_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fx = Fixture {
        chat_template: false,
        ..Fixture::new(Arch::Llama)
    };
    write_checkpoint(dir.path(), &fx, 3).unwrap();
    let out = run(&["chat", "--model", dir.path().to_str().unwrap()], "hi\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {err}");
    assert!(err.contains("chat_template"), "{err}");
    assert!(out.stdout.is_empty());
}
