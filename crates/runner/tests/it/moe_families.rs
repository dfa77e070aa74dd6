//! Qwen3-Next and GLM-4.5 refuse bad configs with errors that name the key
//! or tensor, starting from the committed hub fixtures (`cargo xtask
//! ref-formats`, `xtask/train/ref_moe_families.py`); `formats.rs` checks the
//! same folders token for token.

use std::path::Path;

use serde_json::{Value, json};

use crate::formats::{check_speculation, prepared};
use crate::strict_loading::{edit_config, refused};

fn fixture(name: &str) -> tempfile::TempDir {
    prepared(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/formats")
            .join(name),
    )
}

/// Each case edits one key of the fixture's config (`Value::Null` removes it)
/// and names what the error must mention.
fn check(folder: &str, key: &str, value: Value, needles: &[&str]) {
    let dir = fixture(folder);
    edit_config(dir.path(), |v| {
        let m = v.as_object_mut().unwrap();
        if value.is_null() {
            m.remove(key);
        } else {
            m.insert(key.into(), value.clone());
        }
    });
    refused(dir.path(), needles);
}

#[test]
fn the_unedited_fixtures_load() {
    for name in ["qwen3_next-hf-f32", "glm4_moe-hf-f32", "qwen3_next-mlx-q4"] {
        let dir = fixture(name);
        runner::load(dir.path(), runner::LoadOptions::default(), |_, _| {})
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn qwen3_next_bad_configs_name_the_key_or_tensor() {
    let q = "qwen3_next-hf-f32";
    // No linear-attention shapes: the hybrid stack cannot be built.
    check(
        q,
        "linear_num_key_heads",
        Value::Null,
        &["linear_num_key_heads"],
    );
    // Wider value heads: the fused projection no longer matches its rows.
    check(
        q,
        "linear_value_head_dim",
        json!(16),
        &["in_proj_qkvz", "[160, 64]"],
    );
    check(
        q,
        "linear_num_value_heads",
        json!(3),
        &["linear_num_value_heads", "multiple"],
    );
    check(q, "decoder_sparse_step", json!(0), &["decoder_sparse_step"]);
    check(q, "num_experts_per_tok", json!(9), &["num_experts_per_tok"]);
    // Layer 0 marked dense: its experts are left over, and its dense MLP missing.
    check(
        q,
        "mlp_only_layers",
        json!([0]),
        &["model.layers.0.mlp.gate_proj.weight"],
    );
}

#[test]
fn glm4_moe_bad_configs_name_the_key_or_tensor() {
    let g = "glm4_moe-hf-f32";
    check(
        g,
        "scoring_func",
        json!("softmax"),
        &["scoring_func", "softmax"],
    );
    check(g, "n_group", json!(3), &["n_group"]);
    // Without q/k norm or biases the checkpoint's tensors are left over.
    check(g, "use_qk_norm", json!(false), &["q_norm"]);
    check(g, "attention_bias", json!(false), &["q_proj.bias"]);
    // Layer 0 is the dense one: made sparse, its router is missing.
    check(
        g,
        "first_k_dense_replace",
        json!(0),
        &["model.layers.0.mlp.gate.weight"],
    );
}

/// GLM-4.5's MTP layer may come without its copies of the embedding and the
/// LM head (`model.layers.{N}.embed_tokens`, `shared_head.head`: llama.cpp
/// loads both as optional); the head then uses the trunk's, still drafts,
/// and greedy MTP still equals plain decoding.
#[test]
fn glm4_moe_head_without_its_optional_copies_uses_the_trunks() {
    let dir = fixture("glm4_moe-hf-f32");
    let path = dir.path().join("model.safetensors");
    let mut file = mlx_tensor::io::load_safetensors(&path).unwrap();
    for name in [
        "model.layers.2.embed_tokens.weight",
        "model.layers.2.shared_head.head.weight",
    ] {
        assert!(
            file.tensors.remove(name).is_some(),
            "the fixture has {name}"
        );
    }
    mlx_tensor::io::save_safetensors(&path, file.tensors.iter().map(|(n, a)| (n.as_str(), a)))
        .unwrap();
    let m = runner::load(dir.path(), runner::LoadOptions::default(), |_, _| {}).unwrap();
    assert!(m.model.mtp_head().is_some(), "the MTP head loads");
    let prompt = [5, 77, 130, 9, 201, 44, 3, 250];
    check_speculation("glm4_moe-hf-f32 without copies", &m, &prompt);
}
