//! The binary end to end: exit codes, JSON keys, streaming, stdin, Ctrl-C.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use runner::testing::{Arch, Fixture};

use crate::common;
use common::{BIN, check, fixture, generate_args};

#[test]
fn json_output_has_the_documented_keys() {
    let dir = fixture(&Fixture::new(Arch::Qwen3));
    let out = check(
        &generate_args(dir.path(), &["--prompt", "hi", "-n", "6", "--json"]),
        0,
        &[],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "text",
        "token_ids",
        "prompt_tokens",
        "generated_tokens",
        "prefill_tps",
        "decode_tps",
        "peak_memory_bytes",
        "finish_reason",
    ] {
        assert!(v.get(key).is_some(), "missing key {key} in {v}");
    }
    assert_eq!(v["prompt_tokens"], 2);
    assert!(v["generated_tokens"].as_u64().unwrap() <= 6);
    assert!(v["peak_memory_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn streamed_text_equals_json_text_and_stdin_works() {
    let dir = fixture(&Fixture::new(Arch::Llama));
    let args = generate_args(
        dir.path(),
        &[
            "--prompt",
            "abc",
            "-n",
            "10",
            "--seed",
            "1",
            "--temperature",
            "0.8",
        ],
    );
    let streamed = check(&args, 0, &[]);
    let mut json_args = args.clone();
    json_args.push("--json");
    let j: serde_json::Value = serde_json::from_slice(&check(&json_args, 0, &[]).stdout).unwrap();
    let text = String::from_utf8(streamed.stdout).unwrap();
    assert_eq!(
        text.strip_suffix('\n').unwrap(),
        j["text"].as_str().unwrap()
    );
    // The same prompt through stdin.
    let mut child = Command::new(BIN)
        .args(generate_args(
            dir.path(),
            &["-n", "10", "--seed", "1", "--temperature", "0.8", "--json"],
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"abc").unwrap();
    let out = common::output_within(child);
    assert_eq!(out.status.code(), Some(0));
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["token_ids"], j["token_ids"]);
}

#[test]
fn bad_input_exits_2_with_a_named_cause() {
    let dir = fixture(&Fixture::new(Arch::Qwen3));
    let d = dir.path();
    check(
        &generate_args(Path::new("/nonexistent/model"), &["--prompt", "x"]),
        2,
        &["config.json"],
    );
    check(
        &generate_args(d, &["--prompt", "x", "--top-p", "0"]),
        2,
        &["top_p"],
    );
    check(
        &generate_args(d, &["--prompt", "x", "--temperature", "-1"]),
        2,
        &["temperature"],
    );
    check(
        &generate_args(d, &["--prompt", "x", "--bogus"]),
        2,
        &["--bogus"],
    );
    check(
        &generate_args(d, &["--prompt", "x", "--dtype", "f8"]),
        2,
        &["f8"],
    );
    check(&["info", "--model", "/nonexistent"], 2, &["config.json"]);
    let long = "x".repeat(600);
    check(&generate_args(d, &["--prompt", &long]), 2, &["600", "512"]);
    let corrupt = fixture(&Fixture::new(Arch::Llama));
    std::fs::write(
        corrupt.path().join("model.safetensors"),
        b"\x10\0\0\0\0\0\0\0{}",
    )
    .unwrap();
    check(
        &generate_args(corrupt.path(), &["--prompt", "x"]),
        2,
        &["model.safetensors", "corrupt"],
    );
    let plain = fixture(&Fixture {
        chat_template: false,
        ..Fixture::new(Arch::Qwen2)
    });
    check(
        &generate_args(plain.path(), &["--prompt", "x", "--chat"]),
        2,
        &["chat_template"],
    );
}

#[test]
fn info_reports_mtp_head_and_context() {
    let dir = fixture(&Fixture {
        mtp: true,
        ..Fixture::new(Arch::Qwen3)
    });
    let out = check(
        &["info", "--model", dir.path().to_str().unwrap(), "--json"],
        0,
        &[],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["architecture"], "Qwen3ForCausalLM");
    assert_eq!(v["mtp_head"], true);
    assert_eq!(v["context_length"], 512);
    assert!(v["parameter_count"].as_u64().unwrap() > 90_000);
    let plain = fixture(&Fixture::new(Arch::Mistral));
    let out = check(&["info", "--model", plain.path().to_str().unwrap()], 0, &[]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("MTP head:       none"), "{text}");
}

#[test]
fn help_lists_examples_and_exit_codes() {
    let out = check(&["--help"], 0, &[]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("EXAMPLES") && text.contains("EXIT CODES"),
        "{text}"
    );
}

#[test]
fn ctrl_c_exits_130_after_printing_what_was_generated() {
    // A context long enough that generation cannot finish before the signal lands.
    let dir = fixture(&Fixture {
        context: 400_000,
        ..Fixture::new(Arch::Llama)
    });
    let mut child = Command::new(BIN)
        .args(generate_args(
            dir.path(),
            &[
                &["--prompt", "go", "-n", "300000", "--json", "--verbose"][..],
                &common::ENDLESS,
            ]
            .concat(),
        ))
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    // Wait (by event, not by time) for the loop to start.
    while !line.contains("generating") {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "child exited before generating"
        );
    }
    let kill = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let out = common::output_within(child);
    assert_eq!(out.status.code(), Some(130));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["finish_reason"], "cancelled");
    assert!(v["generated_tokens"].as_u64().unwrap() < 300_000);
}

#[test]
fn stop_strings_with_escapes_cut_the_output() {
    let model = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-mtp");
    let dir = model.to_str().unwrap();
    let args = ["--prompt", "def add(a, b):", "-n", "40", "--json"];
    let full: serde_json::Value =
        serde_json::from_slice(&check(&generate_args(Path::new(dir), &args), 0, &[]).stdout)
            .unwrap();
    let text = full["text"].as_str().unwrap();
    let Some(at) = text.find("\n\n") else {
        panic!("the bundled model's greedy continuation has a blank line: {text:?}");
    };
    let mut stop_args = args.to_vec();
    stop_args.extend(["--stop", "\\n\\n"]);
    let cut: serde_json::Value =
        serde_json::from_slice(&check(&generate_args(Path::new(dir), &stop_args), 0, &[]).stdout)
            .unwrap();
    assert_eq!(cut["finish_reason"], "stop");
    assert_eq!(cut["text"].as_str().unwrap(), &text[..at]);
}

/// `info` on checkpoints as downloaded: the hub Qwen3.5 layout reports its
/// left-out vision tower, an mlx-lm conversion says once how to keep the MTP
/// head, and an unimplemented architecture exits 2 naming what it needs.
#[test]
fn info_reports_layouts_and_refuses_unsupported_architectures() {
    let formats = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runner/tests/fixtures/formats");
    let hub = formats.join("qwen3_5-hf-bf16");
    let out = check(&["info", "--model", hub.to_str().unwrap()], 0, &[]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("transformers-multimodal (vision tower left out"),
        "{text}"
    );
    assert!(text.contains("found, qwen3.5 layout"), "{text}");
    let mlx = formats.join("qwen3_5-mlx-q4");
    let out = check(&["info", "--model", mlx.to_str().unwrap()], 0, &[]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("mlx-lm's converter"), "{text}");
    assert!(text.contains("mtp-runner quantize"), "{text}");

    let dir = fixture(&Fixture::new(Arch::Qwen3));
    let cfg = dir.path().join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["architectures"] = serde_json::json!(["MixtralForCausalLM"]);
    v["model_type"] = serde_json::json!("mixtral");
    v.as_object_mut().unwrap().remove("intermediate_size");
    std::fs::write(&cfg, v.to_string()).unwrap();
    for cmd in [
        vec!["info", "--model", dir.path().to_str().unwrap()],
        generate_args(dir.path(), &["--prompt", "hi"]),
    ] {
        check(
            &cmd,
            2,
            &[
                "MixtralForCausalLM",
                "not supported yet",
                "mixture-of-experts",
            ],
        );
    }
}

#[test]
fn a_tied_checkpoint_whose_own_head_differs_from_the_embedding_is_warned_about() {
    // Qwen3 fixtures tie the unembedding to the embedding.
    let fx = Fixture::new(Arch::Qwen3);
    assert!(fx.tied);
    let dir = fixture(&fx);
    let path = dir.path().join("model.safetensors");
    let stored = mlx_tensor::io::load_safetensors(&path).unwrap().tensors;
    let embed = stored["model.embed_tokens.weight"].clone();
    let differing = mlx_tensor::ops::full(&embed.shape(), 0.5, embed.dtype()).unwrap();
    let warning = "tie_word_embeddings to false";
    for (head, warned) in [(&embed, false), (&differing, true)] {
        let mut tensors = stored.clone();
        tensors.insert("lm_head.weight".to_owned(), head.clone());
        mlx_tensor::io::save_safetensors(&path, tensors.iter().map(|(n, a)| (n.as_str(), a)))
            .unwrap();
        let out = check(
            &generate_args(dir.path(), &["--prompt", "hi", "-n", "1"]),
            0,
            &[],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.contains(warning), warned, "{err}");
    }
}
