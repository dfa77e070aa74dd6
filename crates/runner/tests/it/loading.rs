//! Loading: config parsing cases, sharded checkpoints, generation_config defaults.

use crate::common;

use std::path::Path;

use mlx_tensor::Array;
use runner::testing::{Arch, Fixture};
use runner::{GenerationConfig, ModelConfig};
use runner::{RopeScaling, TokenIds};
use serde_json::json;

const BASE: &str = r#"{"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
  "intermediate_size": 128, "vocab_size": 300}"#;

/// Parses BASE with `extra` merged in and hands the config to `expect`.
fn check(extra: serde_json::Value, expect: impl FnOnce(ModelConfig)) {
    let mut v: serde_json::Value = serde_json::from_str(BASE).unwrap();
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    expect(ModelConfig::from_json(&v.to_string(), Path::new("config.json")).unwrap());
}

#[test]
fn config_defaults_and_variants() {
    check(json!({}), |c| {
        assert_eq!(c.head_dim, 16, "hidden / heads");
        assert_eq!(c.num_key_value_heads, 4, "defaults to the query heads");
        assert_eq!(c.rope_scaling, RopeScaling::None);
        assert!(c.eos_token_id.is_empty());
        assert!(!c.tie_word_embeddings);
    });
    check(json!({"eos_token_id": 7, "bos_token_id": [1]}), |c| {
        assert_eq!(c.eos_token_id, vec![7]);
        assert_eq!(c.bos_token_id, vec![1]);
    });
    check(
        json!({"eos_token_id": [7, 8], "head_dim": 32, "num_key_value_heads": 2}),
        |c| {
            assert_eq!(c.eos_token_id, vec![7, 8]);
            assert_eq!(c.head_dim, 32);
            assert_eq!(c.num_key_value_heads, 2);
        },
    );
    check(
        json!({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}),
        |c| {
            assert_eq!(
                c.rope_scaling,
                RopeScaling::Llama3 {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 8192
                }
            )
        },
    );
    check(
        json!({"rope_scaling": {"type": "linear", "factor": 2.0}}),
        |c| assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 2.0 }),
    );
    check(
        json!({"num_nextn_predict_layers": 1, "attention_bias": true}),
        |c| {
            assert_eq!(c.mtp_layers, 1);
            assert_eq!(c.attention_bias, Some(true));
        },
    );
}

#[test]
fn generation_config_is_optional() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        GenerationConfig::load(dir.path()).unwrap(),
        GenerationConfig::default()
    );
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"temperature": 0.6, "top_p": 0.9, "eos_token_id": [1, 2], "do_sample": true}"#,
    )
    .unwrap();
    let g = GenerationConfig::load(dir.path()).unwrap();
    assert_eq!(g.temperature, Some(0.6));
    assert_eq!(g.eos_token_id, Some(TokenIds::Many(vec![1, 2])));
}

fn last_logits(dir: &Path) -> Vec<f32> {
    let m = common::load(dir);
    let ids = Array::from_slice(&[5u32, 9, 200, 3], &[4]).unwrap();
    let h = m.model.forward(&ids, &mut m.model.new_caches()).unwrap();
    m.model.unembed(&h).unwrap().to_vec::<f32>().unwrap()
}

#[test]
fn sharded_checkpoint_loads_like_a_single_file() {
    let fx = Fixture::new(Arch::Mistral);
    let single = common::write(&fx, 21);
    let sharded = common::write(&fx, 21);
    let d = sharded.path();
    std::fs::remove_file(d.join("model.safetensors")).unwrap();
    let tensors = fx.tensors(21).unwrap();
    let (a, b) = tensors.split_at(tensors.len() / 2);
    let mut map = serde_json::Map::new();
    for (file, part) in [
        ("model-00001-of-00002.safetensors", a),
        ("model-00002-of-00002.safetensors", b),
    ] {
        mlx_tensor::io::save_safetensors(&d.join(file), part.iter().map(|(n, x)| (n.as_str(), x)))
            .unwrap();
        for (n, _) in part {
            map.insert(n.clone(), json!(file));
        }
    }
    std::fs::write(
        d.join("model.safetensors.index.json"),
        json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    // Same weights, same graph: bit-identical logits.
    assert_eq!(last_logits(single.path()), last_logits(d));
    // A shard listed in the index but missing is named.
    std::fs::remove_file(d.join("model-00002-of-00002.safetensors")).unwrap();
    let e = runner::load(d, runner::LoadOptions::default(), |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(e.contains("model-00002-of-00002.safetensors"), "{e}");
}
