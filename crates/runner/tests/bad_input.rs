//! Bad input: each case is a clear error naming the file, tensor or option.

mod common;

use std::path::Path;
use std::sync::atomic::AtomicBool;

use runner::testing::{Arch, Fixture};
use runner::{GenerateOptions, LoadOptions, SamplingOptions, Session};

fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, v.to_string()).unwrap();
}

fn rewrite_weights(dir: &Path, f: impl FnOnce(&mut Vec<(String, mlx_tensor::Array)>)) {
    let mut t = Fixture::new(Arch::Qwen3).tensors(1).unwrap();
    f(&mut t);
    mlx_tensor::io::save_safetensors(
        &dir.join("model.safetensors"),
        t.iter().map(|(n, a)| (n.as_str(), a)),
    )
    .unwrap();
}

/// Writes a Qwen3 fixture, applies `mutate`, loads it and expects an error containing
/// every one of `expected`.
fn check(mutate: impl FnOnce(&Path), expected: &[&str]) {
    let dir = common::write(&Fixture::new(Arch::Qwen3), 1);
    mutate(dir.path());
    let err = match runner::load(dir.path(), LoadOptions::default(), |_, _| {}) {
        Ok(_) => panic!("expected an error containing {expected:?}"),
        Err(e) => e.to_string(),
    };
    for e in expected {
        assert!(err.contains(e), "error `{err}` should mention `{e}`");
    }
}

#[test]
fn missing_files() {
    check(
        |d| std::fs::remove_file(d.join("config.json")).unwrap(),
        &["config.json", "not found"],
    );
    check(
        |d| std::fs::remove_file(d.join("tokenizer.json")).unwrap(),
        &["tokenizer.json", "not found"],
    );
    check(
        |d| std::fs::remove_file(d.join("model.safetensors")).unwrap(),
        &["safetensors"],
    );
}

#[test]
fn config_errors_name_the_key() {
    check(
        |d| {
            edit_json(&d.join("config.json"), |v| {
                v["architectures"] = serde_json::json!(["FooForCausalLM"]);
                v["model_type"] = serde_json::json!("foo");
            })
        },
        &["unknown architecture", "FooForCausalLM", "Qwen3ForCausalLM"],
    );
    check(
        |d| {
            edit_json(&d.join("config.json"), |v| {
                v.as_object_mut().unwrap().remove("hidden_size");
            })
        },
        &["config.json", "hidden_size"],
    );
    check(
        |d| {
            edit_json(&d.join("config.json"), |v| {
                v["num_key_value_heads"] = 3.into()
            })
        },
        &["config.json", "num_key_value_heads", "3"],
    );
    check(
        |d| {
            edit_json(&d.join("config.json"), |v| {
                v["rope_scaling"] = serde_json::json!({"type": "yarn", "factor": 4.0})
            })
        },
        &["rope_scaling", "yarn"],
    );
    check(
        |d| std::fs::write(d.join("config.json"), "{not json").unwrap(),
        &["config.json", "line 1"],
    );
}

#[test]
fn missing_tensor_is_named() {
    check(
        |d| {
            rewrite_weights(d, |t| {
                t.retain(|(n, _)| n != "model.layers.1.self_attn.k_norm.weight")
            })
        },
        &["model.layers.1.self_attn.k_norm.weight", "not found"],
    );
}

#[test]
fn misshaped_tensor_names_both_shapes() {
    check(
        |d| {
            edit_json(&d.join("config.json"), |v| {
                v["intermediate_size"] = 96.into()
            })
        },
        &[
            "model.layers.0.mlp.gate_proj.weight",
            "[128, 64]",
            "[96, 64]",
        ],
    );
}

#[test]
fn corrupt_safetensors_headers() {
    let st = |d: &Path| d.join("model.safetensors");
    // Header length larger than the file: must not allocate what it claims.
    check(
        |d| {
            let mut b = std::fs::read(st(d)).unwrap();
            b[..8].copy_from_slice(&(1u64 << 60).to_le_bytes());
            std::fs::write(st(d), b).unwrap();
        },
        &["model.safetensors", "corrupt", "header claims"],
    );
    // Truncated data: offsets point past the end.
    check(
        |d| {
            let b = std::fs::read(st(d)).unwrap();
            std::fs::write(st(d), &b[..b.len() - 100]).unwrap();
        },
        &["model.safetensors", "corrupt", "data bytes"],
    );
    // Garbage JSON inside a well-sized header.
    check(
        |d| {
            let mut b = std::fs::read(st(d)).unwrap();
            b[8] = b'!';
            std::fs::write(st(d), b).unwrap();
        },
        &["model.safetensors", "corrupt", "header"],
    );
    // Shorter than the length field.
    check(
        |d| std::fs::write(st(d), [1u8, 2, 3]).unwrap(),
        &["model.safetensors", "shorter than"],
    );
    // A lying shape: the byte range no longer matches shape × dtype.
    check(
        |d| {
            let b = std::fs::read(st(d)).unwrap();
            let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
            let h = String::from_utf8(b[8..8 + n].to_vec()).unwrap();
            let h = h.replacen("[64]", "[65]", 1);
            assert_eq!(h.len(), n);
            let mut out = b[..8].to_vec();
            out.extend(h.as_bytes());
            out.extend(&b[8 + n..]);
            std::fs::write(st(d), out).unwrap();
        },
        &["model.safetensors", "corrupt"],
    );
}

#[test]
fn tokenizer_larger_than_vocab_is_a_mismatch() {
    check(
        |d| {
            edit_json(&d.join("config.json"), |v| v["vocab_size"] = 200.into());
            rewrite_weights(d, |t| {
                for (n, a) in t.iter_mut() {
                    if n == "model.embed_tokens.weight" {
                        *a = a.slice_axis(0, 0, 200).unwrap();
                    }
                }
            });
        },
        &["tokenizer mismatch", "259", "200"],
    );
}

fn generate_err(fx: Fixture, prompt_len: usize, opts: GenerateOptions) -> String {
    let dir = common::write(&fx, 2);
    let m = common::load(dir.path());
    let prompt: Vec<u32> = (0..prompt_len as u32).map(|i| i % 200).collect();
    let mut s = Session::new(m.model.as_ref());
    let e = s
        .generate(
            &m.tokenizer,
            &prompt,
            &opts,
            &AtomicBool::new(false),
            |_| {},
        )
        .expect_err("generation should fail")
        .to_string();
    assert_eq!(s.offset(), 0, "a rejected request leaves the caches empty");
    e
}

#[test]
fn prompt_longer_than_context_names_both_numbers() {
    let fx = Fixture {
        context: 32,
        ..Fixture::new(Arch::Llama)
    };
    let e = generate_err(fx, 40, GenerateOptions::default());
    assert!(e.contains("40") && e.contains("32"), "{e}");
    let e = generate_err(Fixture::new(Arch::Llama), 0, GenerateOptions::default());
    assert!(e.contains("empty"), "{e}");
}

#[test]
fn invalid_sampling_options_name_the_option() {
    for (opts, name) in [
        (
            SamplingOptions {
                temperature: -1.0,
                ..Default::default()
            },
            "temperature",
        ),
        (
            SamplingOptions {
                top_p: 0.0,
                ..Default::default()
            },
            "top_p",
        ),
        (
            SamplingOptions {
                min_p: 1.5,
                ..Default::default()
            },
            "min_p",
        ),
        (
            SamplingOptions {
                repeat_penalty: 0.0,
                ..Default::default()
            },
            "repeat_penalty",
        ),
    ] {
        let g = GenerateOptions {
            sampling: opts,
            ..GenerateOptions::default()
        };
        let e = generate_err(Fixture::new(Arch::Qwen3), 4, g);
        assert!(e.contains(name), "`{e}` should name {name}");
    }
}

#[test]
fn chat_without_template_is_an_error() {
    let fx = Fixture {
        chat_template: false,
        ..Fixture::new(Arch::Qwen3)
    };
    let dir = common::write(&fx, 2);
    let m = common::load(dir.path());
    let e = runner::chat::apply_chat_template(
        &m.tokenizer,
        &[runner::chat::Message::new("user", "hi")],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("tokenizer_config.json") && e.contains("chat_template"),
        "{e}"
    );
}
