//! Bad input: each case is a clear error naming the file, tensor or option
//! (truncated files, wrong dtypes and shapes, NaN/Inf weights, lying index
//! files, prompts at and past the context), or a defined result (max_tokens 0).

use crate::common;
use crate::common::Generate;

use std::path::Path;

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
                // YaRN is implemented now; LongRoPE is still refused by name.
                v["rope_scaling"] = serde_json::json!({"type": "longrope", "factor": 4.0})
            })
        },
        &["rope_scaling", "longrope"],
    );
    check(
        |d| std::fs::write(d.join("config.json"), "{not json").unwrap(),
        &["config.json", "line 1"],
    );
    // JSON, but not an object: named as such, not as an unknown architecture.
    check(
        |d| std::fs::write(d.join("config.json"), "[1, 2, 3]").unwrap(),
        &["config.json", "top level is an array, not an object"],
    );
    // A value of the wrong type names its key (serde alone names only the type).
    check(
        |d| edit_json(&d.join("config.json"), |v| v["vocab_size"] = "4".into()),
        &["config.json", "key `vocab_size`", "expected usize"],
    );
    check(
        |d| {
            edit_json(&d.join("config.json"), |v| {
                v["rope_scaling"] = "yarn".into()
            })
        },
        &["key `rope_scaling`", "an object such as"],
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
    // A lying shape: the byte range no longer matches shape × dtype. The
    // error names the tensor that lies (the safetensors crate names none).
    let lie = |d: &Path| -> String {
        let b = std::fs::read(st(d)).unwrap();
        let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        let h = String::from_utf8(b[8..8 + n].to_vec()).unwrap();
        let h = h.replacen("[64]", "[65]", 1);
        assert_eq!(h.len(), n);
        let mut out = b[..8].to_vec();
        out.extend(h.as_bytes());
        out.extend(&b[8 + n..]);
        std::fs::write(st(d), out).unwrap();
        let v: serde_json::Value = serde_json::from_str(&h).unwrap();
        let lied = v.as_object().unwrap().iter();
        let mut lied = lied.filter(|(_, e)| e["shape"] == serde_json::json!([65]));
        lied.next().unwrap().0.clone()
    };
    let name = std::cell::RefCell::new(String::new());
    check(
        |d| *name.borrow_mut() = lie(d),
        &["model.safetensors", "corrupt", "does not fill"],
    );
    let name = name.into_inner();
    check(
        |d| {
            lie(d);
        },
        &[&format!("tensor `{name}`: shape [65]")],
    );
}

#[test]
fn end_token_ids_are_token_ids_inside_the_vocabulary() {
    // Not an id: the error says what a token id is and shows the value.
    for bad in [serde_json::json!(-5), serde_json::json!([1, "two"])] {
        let shown = bad.to_string();
        check(
            |d| edit_json(&d.join("config.json"), |v| v["eos_token_id"] = bad),
            &["config.json", "token id", "eos_token_id", &shown],
        );
    }
    // An id past the vocabulary loads, and is not an end id (the model can
    // never produce it); the ids inside it stay.
    let dir = common::write(&Fixture::new(Arch::Qwen3), 1);
    let vocab = {
        let text = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v["vocab_size"].as_u64().unwrap() as u32
    };
    edit_json(&dir.path().join("config.json"), |v| {
        v["eos_token_id"] = serde_json::json!([1, vocab, vocab + 1000])
    });
    let m = common::load(dir.path());
    let eos = m.tokenizer.eos_ids();
    assert!(eos.contains(&1), "{eos:?}");
    assert!(eos.iter().all(|&e| e < vocab), "{eos:?} (vocab {vocab})");
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
        .run(&m.tokenizer, &prompt, &opts)
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
    let e = runner::apply_chat_template(&m.tokenizer, &[runner::Message::new("user", "hi")])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("tokenizer_config.json") && e.contains("chat_template"),
        "{e}"
    );
}

/// The chat template is found where transformers looks: `chat_template.jinja`
/// first (also when tokenizer_config.json has one), else tokenizer_config's;
/// a list of named templates without `default` is refused when chat is used.
#[test]
fn chat_template_sources_follow_transformers() {
    let hi = [runner::Message::new("user", "hi")];
    let render = |dir: &Path| {
        let m = common::load(dir);
        runner::apply_chat_template(&m.tokenizer, &hi).map_err(|e| e.to_string())
    };
    // Only in chat_template.jinja (as newer checkpoints ship it).
    let dir = common::write(
        &Fixture {
            chat_template: false,
            ..Fixture::new(Arch::Qwen3)
        },
        2,
    );
    let jinja = |d: &Path| {
        std::fs::write(d.join("chat_template.jinja"), "J:{{ messages[0].content }}").unwrap();
        render(d)
    };
    assert_eq!(jinja(dir.path()).unwrap(), "J:hi");
    // Both: the .jinja file wins.
    let dir = common::write(&Fixture::new(Arch::Qwen3), 2);
    let config_one = render(dir.path()).unwrap();
    assert_ne!(config_one, "J:hi");
    assert_eq!(jinja(dir.path()).unwrap(), "J:hi");
    // Named templates: `default` is used; without it, an error naming them.
    let dir = common::write(&Fixture::new(Arch::Qwen3), 2);
    let named = |list: serde_json::Value| {
        edit_json(&dir.path().join("tokenizer_config.json"), |v| {
            v["chat_template"] = list
        });
        render(dir.path())
    };
    let got = named(serde_json::json!([
        {"name": "tool_use", "template": "T"},
        {"name": "default", "template": "D:{{ messages[0].content }}"}
    ]));
    assert_eq!(got.unwrap(), "D:hi");
    let e = named(serde_json::json!([{"name": "other", "template": "O"}])).unwrap_err();
    assert!(e.contains("`other`") && e.contains("`default`"), "{e}");
}

/// Keeps the first `keep` of `file`'s bytes (`keep` < 1 is a fraction of its length).
fn truncate(dir: &Path, file: &str, keep: f64) {
    let p = dir.join(file);
    let b = std::fs::read(&p).unwrap();
    let n = if keep < 1.0 {
        (b.len() as f64 * keep) as usize
    } else {
        keep as usize
    };
    std::fs::write(&p, &b[..n]).unwrap();
}

/// Sets element 5 of tensor `name` to `value`.
fn poison(t: &mut [(String, mlx_tensor::Array)], name: &str, value: f32) {
    let (_, a) = t.iter_mut().find(|(n, _)| n == name).unwrap();
    let mut v: Vec<f32> = a.to_vec().unwrap();
    v[5] = value;
    *a = mlx_tensor::Array::from_slice(&v, &a.shape()).unwrap();
}

#[test]
fn truncated_files_name_the_file() {
    for (file, keep, expected) in [
        ("config.json", 0.5, &["config.json", "EOF"][..]),
        ("config.json", 0.0, &["config.json", "EOF"]),
        (
            "tokenizer.json",
            0.5,
            &["tokenizer.json", "cannot load tokenizer"],
        ),
        (
            "tokenizer_config.json",
            0.5,
            &["tokenizer_config.json", "EOF"],
        ),
        // Inside the length field, inside the header, inside the data.
        (
            "model.safetensors",
            5.0,
            &["model.safetensors", "shorter than the 8-byte"],
        ),
        (
            "model.safetensors",
            40.0,
            &["model.safetensors", "header claims"],
        ),
        (
            "model.safetensors",
            0.9,
            &["model.safetensors", "data bytes"],
        ),
    ] {
        check(|d| truncate(d, file, keep), expected);
    }
}

#[test]
fn wrong_dtypes_and_shapes_name_the_tensor() {
    let retype = |dtype: mlx_tensor::Dtype| {
        move |d: &Path| {
            rewrite_weights(d, |t| {
                let (_, a) = t
                    .iter_mut()
                    .find(|(n, _)| n == "model.norm.weight")
                    .unwrap();
                *a = a.as_type(dtype).unwrap();
            })
        }
    };
    check(
        retype(mlx_tensor::Dtype::Int32),
        &["model.norm.weight", "I32", "supported: F32, F16, BF16"],
    );
    check(
        retype(mlx_tensor::Dtype::Int64),
        &["model.norm.weight", "I64", "supported"],
    );
    // More layers than the checkpoint has.
    check(
        |d| {
            edit_json(&d.join("config.json"), |v| {
                v["num_hidden_layers"] = 3.into()
            })
        },
        &["model.layers.2.", "not found"],
    );
    // A wider residual stream than the embedding.
    check(
        |d| edit_json(&d.join("config.json"), |v| v["hidden_size"] = 96.into()),
        &["model.embed_tokens.weight", "[272, 64]", "[272, 96]"],
    );
    // A vocabulary larger than the embedding.
    check(
        |d| edit_json(&d.join("config.json"), |v| v["vocab_size"] = 300.into()),
        &["model.embed_tokens.weight", "[272, 64]", "[300, 64]"],
    );
    // Sizes MLX cannot hold.
    check(
        |d| {
            edit_json(&d.join("config.json"), |v| {
                v["intermediate_size"] = serde_json::json!(1u64 << 40)
            })
        },
        &["config.json", "intermediate_size", "exceeds"],
    );
}

#[test]
fn non_finite_weights_fail_at_load_naming_the_tensor() {
    let name = "model.layers.1.mlp.up_proj.weight";
    for value in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        check(
            |d| rewrite_weights(d, |t| poison(t, name, value)),
            &[name, "NaN or infinite", "damaged"],
        );
    }
    // Finite in the f32 file, infinite once converted to f16.
    let dir = common::write(&Fixture::new(Arch::Qwen3), 1);
    rewrite_weights(dir.path(), |t| poison(t, name, 1e6));
    let opts = LoadOptions {
        dtype: mlx_tensor::Dtype::Float16,
        ..LoadOptions::default()
    };
    let e = runner::load(dir.path(), opts, |_, _| {})
        .unwrap_err()
        .to_string();
    for x in [name, "F32 to F16 overflowed", "--dtype f32"] {
        assert!(e.contains(x), "`{e}` should mention `{x}`");
    }
    // The same file loads in f32.
    assert!(runner::load(dir.path(), LoadOptions::default(), |_, _| {}).is_ok());
}

#[test]
fn index_files_name_the_shard_or_the_key() {
    let index = |map: serde_json::Value| {
        move |d: &Path| {
            let v = serde_json::json!({"metadata": {}, "weight_map": map});
            std::fs::write(d.join("model.safetensors.index.json"), v.to_string()).unwrap();
        }
    };
    check(
        index(serde_json::json!({"a": "model-00002-of-00002.safetensors"})),
        &[
            "model-00002-of-00002.safetensors",
            "not found",
            "download every shard",
        ],
    );
    check(
        index(serde_json::json!({"a": "../model.safetensors"})),
        &[
            "index.json",
            "weight_map",
            "../model.safetensors",
            "beside the index",
        ],
    );
    check(
        index(serde_json::json!({})),
        &["index.json", "weight_map", "lists no tensors"],
    );
}

#[test]
fn an_index_beside_a_single_file_loads_the_index_shards() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    for f in ["model.safetensors", "model-00001-of-00001.safetensors"] {
        std::fs::write(d.join(f), b"").unwrap();
    }
    let v = serde_json::json!({"weight_map": {"a": "model-00001-of-00001.safetensors"}});
    std::fs::write(d.join("model.safetensors.index.json"), v.to_string()).unwrap();
    assert_eq!(
        runner::testing::weight_files(d).unwrap(),
        [d.join("model-00001-of-00001.safetensors")]
    );
    // Without the index, model.safetensors alone (the stray shard is warned of).
    std::fs::remove_file(d.join("model.safetensors.index.json")).unwrap();
    assert_eq!(
        runner::testing::weight_files(d).unwrap(),
        [d.join("model.safetensors")]
    );
}

/// Generates from a fresh plain session of a Qwen3 fixture with `context`
/// positions: the result, and the session's offset afterwards.
fn generate(
    context: usize,
    prompt_len: usize,
    max_tokens: usize,
) -> (runner::Result<runner::Generation>, usize) {
    let fx = Fixture {
        context,
        ..Fixture::new(Arch::Qwen3)
    };
    let dir = common::write(&fx, 2);
    let m = common::load(dir.path());
    let prompt: Vec<u32> = (0..prompt_len as u32).map(|i| 32 + i % 90).collect();
    let mut s = Session::new(m.model.as_ref());
    let opts = GenerateOptions {
        max_tokens,
        sampling: SamplingOptions::greedy(),
        ..GenerateOptions::default()
    };
    let g = s.run(&m.tokenizer, &prompt, &opts);
    (g, s.offset())
}

#[test]
fn prompt_at_and_past_the_context_and_max_tokens_zero() {
    use runner::FinishReason;
    // One position left: exactly one token, then the context is full.
    let (g, offset) = generate(32, 31, 100);
    let g = g.unwrap();
    assert_eq!(
        (g.stats.generated_tokens, g.finish),
        (1, FinishReason::Length)
    );
    assert_eq!(
        offset, 31,
        "the prompt is in the cache; the sampled token is not forwarded"
    );
    // Exactly at the context, and one past it: no room to generate.
    for len in [32, 33] {
        let (g, offset) = generate(32, len, 100);
        let e = g.unwrap_err().to_string();
        assert!(
            e.contains(&format!("prompt has {len} tokens")) && e.contains("context is 32"),
            "{e}"
        );
        assert_eq!(offset, 0, "a rejected prompt leaves the caches empty");
    }
    // max_tokens 0 is a defined empty result, not an error.
    let (g, offset) = generate(32, 5, 0);
    let g = g.unwrap();
    assert_eq!(g.finish, FinishReason::Length);
    assert!(g.token_ids.is_empty() && g.text.is_empty());
    assert_eq!(g.stats.generated_tokens, 0);
    assert_eq!(offset, 4, "all but the last prompt token are prefilled");
    // An empty prompt is an error naming the fix.
    let e = generate(32, 0, 4).0.unwrap_err().to_string();
    assert!(
        e.contains("prompt is empty") && e.contains("at least one token"),
        "{e}"
    );
}
