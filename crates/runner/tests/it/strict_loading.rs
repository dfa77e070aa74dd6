//! Loading refuses what would be silently wrong, and `info` fails exactly
//! where loading does: a tensor in two shards, tensors the config does not
//! describe (fewer layers declared, Qwen3 weights declared as Llama, biases
//! the config does not announce), unimplemented config keys, and
//! architectures that are recognised but not implemented. Quantizing a
//! multimodal hub folder keeps the MTP head and leaves the vision tower out.

use crate::common;

use std::path::{Path, PathBuf};

use runner::testing::{Arch, Fixture};
use runner::{Error, LoadOptions};
use runner::{QuantizeOptions, quantize_folder};
use serde_json::json;

pub(super) fn edit_config(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

/// `load` and `inspect` both fail on `dir`, with messages holding every `needle`.
pub(super) fn refused(dir: &Path, needles: &[&str]) -> Error {
    let err = runner::load(dir, LoadOptions::default(), |_, _| {}).expect_err("load must fail");
    let info = runner::inspect(dir).expect_err("info must fail too");
    for (what, msg) in [("load", err.to_string()), ("info", info.to_string())] {
        for n in needles {
            assert!(msg.contains(n), "{what}: `{msg}` should mention `{n}`");
        }
    }
    assert!(err.is_bad_input(), "bad input (exit 2): {err}");
    err
}

#[test]
fn a_tensor_in_two_shards_names_both_files() {
    let dir = common::write(&Fixture::new(Arch::Qwen3), 2);
    let t = Fixture::new(Arch::Qwen3).tensors(2).unwrap();
    let (a, b): (Vec<_>, Vec<_>) = t.iter().enumerate().partition(|(i, _)| i % 2 == 0);
    let mut b: Vec<(String, mlx_tensor::Array)> = b
        .into_iter()
        .map(|(_, (n, x))| (n.clone(), x.clone()))
        .collect();
    let a: Vec<(String, mlx_tensor::Array)> = a
        .into_iter()
        .map(|(_, (n, x))| (n.clone(), x.clone()))
        .collect();
    // The same embedding, stale, in the second shard too.
    b.push(a[0].clone());
    let dup = a[0].0.clone();
    let mut map = serde_json::Map::new();
    for (file, part) in [
        ("model-00001-of-00002.safetensors", &a),
        ("model-00002-of-00002.safetensors", &b),
    ] {
        mlx_tensor::io::save_safetensors(
            &dir.path().join(file),
            part.iter().map(|(n, x)| (n.as_str(), x)),
        )
        .unwrap();
        for (n, _) in part.iter() {
            map.insert(n.clone(), json!(file));
        }
    }
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    let err = refused(
        dir.path(),
        &[
            &dup,
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        ],
    );
    assert!(matches!(err, Error::DuplicateTensor { .. }), "{err}");
}

#[test]
fn fewer_layers_declared_than_stored_is_an_error_unless_allowed() {
    let dir = common::write(&Fixture::new(Arch::Qwen3), 3);
    edit_config(dir.path(), |v| v["num_hidden_layers"] = json!(1));
    let err = refused(
        dir.path(),
        &["model.layers.1.", "qwen3", "--allow-unused-tensors"],
    );
    assert!(matches!(err, Error::UnusedTensors { .. }), "{err}");
    let opts = LoadOptions {
        allow_unused_tensors: true,
        ..LoadOptions::default()
    };
    let m = runner::load(dir.path(), opts, |_, _| {}).expect("the opt-out loads");
    assert_eq!(m.model.new_caches().len(), 1);
}

#[test]
fn qwen3_weights_declared_as_llama_are_refused() {
    let dir = common::write(&Fixture::new(Arch::Qwen3), 4);
    edit_config(dir.path(), |v| {
        v["architectures"] = json!(["LlamaForCausalLM"]);
        v["model_type"] = json!("llama");
    });
    refused(dir.path(), &["q_norm", "llama"]);
}

#[test]
fn biases_the_config_does_not_announce_are_refused() {
    // Qwen2 weights carry q/k/v biases; as Llama without attention_bias they would be dropped.
    let dir = common::write(&Fixture::new(Arch::Qwen2), 5);
    edit_config(dir.path(), |v| {
        v["architectures"] = json!(["LlamaForCausalLM"]);
        v["model_type"] = json!("llama");
    });
    refused(dir.path(), &["self_attn.q_proj.bias"]);
}

#[test]
fn unimplemented_config_keys_are_named() {
    let cases: Vec<(&str, serde_json::Value, &str)> = vec![
        ("hidden_act", json!("gelu"), "hidden_act"),
        // mlx-lm's interleaved RoPE: transformers has no such key, and run
        // half-split the weights of a Meta conversion give other numbers.
        ("rope_traditional", json!(true), "rope_traditional"),
        (
            "attn_logit_softcapping",
            json!(50.0),
            "attn_logit_softcapping",
        ),
        ("num_experts", json!(8), "num_experts"),
        ("partial_rotary_factor", json!(0.5), "partial_rotary_factor"),
        (
            "rope_scaling",
            json!({"rope_type": "dynamic", "factor": 2.0}),
            "dynamic",
        ),
        // Incomplete scaling is refused, not run unscaled (transformers
        // refuses these too).
        ("rope_scaling", json!({"type": "linear"}), "needs factor"),
        (
            "rope_scaling",
            json!({"rope_type": "llama3", "factor": 8.0}),
            "needs low_freq_factor, high_freq_factor, original_max_position_embeddings",
        ),
        ("rope_scaling", json!({"type": "yarn"}), "needs factor"),
        ("rope_scaling", json!({"factor": 2.0}), "without `type`"),
        // Llama 3's bands blend over high - low: an empty or reversed band
        // would divide by zero or blend backwards.
        (
            "rope_scaling",
            json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
            "high_freq_factor 4 must be greater than low_freq_factor 4",
        ),
        (
            "rope_scaling",
            json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 0}),
            "original_max_position_embeddings must be at least 1",
        ),
    ];
    for (key, value, needle) in cases {
        let dir = common::write(&Fixture::new(Arch::Qwen3), 6);
        edit_config(dir.path(), |v| v[key] = value.clone());
        refused(dir.path(), &[needle]);
    }
}

#[test]
fn recognised_but_unimplemented_architectures_say_what_they_need() {
    let cases = [("MixtralForCausalLM", "mixtral", "mixture-of-experts")];
    for (arch, model_type, needs) in cases {
        let dir = common::write(&Fixture::new(Arch::Qwen3), 7);
        // A MoE config has no intermediate_size: the architecture is named first anyway.
        edit_config(dir.path(), |v| {
            v["architectures"] = json!([arch]);
            v["model_type"] = json!(model_type);
            v.as_object_mut().unwrap().remove("intermediate_size");
        });
        let err = refused(dir.path(), &[arch, "not supported yet", needs]);
        assert!(
            matches!(err, Error::UnsupportedArchitecture { .. }),
            "{err}"
        );
    }
}

#[test]
fn info_validates_shapes_without_loading() {
    let dir = common::write(&Fixture::new(Arch::Llama), 8);
    edit_config(dir.path(), |v| v["intermediate_size"] = json!(96));
    refused(dir.path(), &["mlp.gate_proj.weight", "[96, 64]"]);
}

fn formats(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/formats")
        .join(name)
}

#[test]
fn quantizing_a_multimodal_hub_folder_keeps_mtp_and_leaves_vision_out() {
    let src = formats("qwen3_5-hf-f32");
    let out = tempfile::tempdir().unwrap();
    let dst = out.path().join("q8");
    let opts = QuantizeOptions {
        bits: 8,
        group_size: 32,
        keep_mtp_precision: true,
        ..QuantizeOptions::default()
    };
    let r = quantize_folder(&src, &dst, &opts).unwrap();
    assert!(r.skipped > 0, "the vision tower is left out");
    assert!(r.kept.iter().any(|m| m.starts_with("mtp.")), "{:?}", r.kept);
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::write(dst.join(f), "").ok();
    }
    std::fs::write(
        dst.join("tokenizer.json"),
        runner::testing::tokenizer_json().to_string(),
    )
    .unwrap();
    std::fs::write(dst.join("tokenizer_config.json"), "{}").unwrap();
    let info = runner::inspect(&dst).unwrap();
    assert!(info.mtp_head, "the MTP head survives quantization");
    assert_eq!(info.skipped.0, 0, "no vision tensors written");
    let m = runner::load(&dst, LoadOptions::default(), |_, _| {}).unwrap();
    assert!(m.model.mtp_head().is_some());
}

/// Mistral's `sliding_window` is applied (a window shorter than the sequence
/// changes the tokens), and MTP speculation over the rotating caches still
/// equals plain greedy decoding, also after the window has wrapped.
#[test]
fn mistral_sliding_window_is_applied_and_speculation_stays_lossless() {
    use std::sync::atomic::AtomicBool;

    use runner::DepthPolicy;
    use runner::{GenerateOptions, SamplingOptions, Session};

    let fx = Fixture {
        mtp: true,
        ..Fixture::new(Arch::Mistral)
    };
    let run = |window: serde_json::Value, mtp: bool| -> Vec<u32> {
        let dir = common::write(&fx, 9);
        edit_config(dir.path(), |v| {
            v["sliding_window"] = window.clone();
            // Random weights may emit EOS early; the comparison needs length.
            v["eos_token_id"] = json!(null);
        });
        let m = common::load(dir.path());
        let prompt: Vec<u32> = (0..20).map(|i| (i * 37 + 11) % 250).collect();
        let opts = GenerateOptions {
            max_tokens: 24,
            sampling: SamplingOptions::greedy(),
            depth: DepthPolicy::Fixed(2),
            ..GenerateOptions::default()
        };
        let stop = AtomicBool::new(false);
        let model = m.model.as_ref();
        let mut s = if mtp {
            Session::with_mtp(model).unwrap()
        } else {
            Session::new(model)
        };
        s.generate(&m.tokenizer, &prompt, &opts, &stop, |_| {})
            .unwrap()
            .token_ids
    };
    let full = run(json!(null), false);
    let windowed = run(json!(8), false);
    assert_ne!(
        full, windowed,
        "a window of 8 over 44 positions must matter"
    );
    assert_eq!(
        run(json!(8), true),
        windowed,
        "MTP over a sliding window differs from plain"
    );
}
