//! Config keys that real checkpoints vary: what a family's transformers
//! config class fills in for a key config.json leaves out, keys given in two
//! places (top level, `rope_scaling`, `rope_parameters`, `text_config`) that
//! must agree, which layers slide when only `use_sliding_window` says so, and
//! keys whose meaning the references do not share. Each numeric case compares
//! logits with the same checkpoint's value written out, beside a control that
//! must differ.

use crate::common;
use crate::formats::prepared;
use crate::strict_loading::{edit_config, refused};

use std::path::{Path, PathBuf};

use mlx_tensor::Array;
use runner::testing::{Arch, Fixture};
use runner::{ModelConfig, RopeScaling};
use serde_json::{Value, json};

fn formats(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/formats")
        .join(name)
}

/// Logits of every position of a 12-token prompt, f32.
fn logits(dir: &Path) -> Vec<f32> {
    let m = common::load(dir);
    let prompt = [5u32, 9, 200, 3, 17, 42, 8, 99, 150, 61, 7, 230];
    let ids = Array::from_slice(&prompt, &[prompt.len() as i32]).unwrap();
    let h = m.model.forward(&ids, &mut m.model.new_caches()).unwrap();
    m.model.unembed(&h).unwrap().to_vec::<f32>().unwrap()
}

/// The logits of the format fixture `name` with its config edited by `edit`.
fn edited(name: &str, edit: impl FnOnce(&mut Value)) -> Vec<f32> {
    let dir = prepared(&formats(name));
    edit_config(dir.path(), edit);
    logits(dir.path())
}

fn remove(v: &mut Value, key: &str) {
    v.as_object_mut().unwrap().remove(key);
}

#[test]
fn absent_keys_compute_what_the_config_class_defaults_to() {
    // Qwen3.5 rotates a quarter of each head when no factor is named.
    let q35 = "qwen3_5-hf-f32";
    fn rope(v: &mut Value) -> &mut Value {
        &mut v["text_config"]["rope_parameters"]
    }
    let written = edited(q35, |_| {});
    assert_eq!(
        edited(q35, |v| remove(rope(v), "partial_rotary_factor")),
        written,
        "qwen3_5: absent partial_rotary_factor must be 0.25"
    );
    assert_ne!(
        edited(q35, |v| rope(v)["partial_rotary_factor"] = json!(1.0)),
        written,
        "control: whole-head RoPE must differ"
    );
    // GLM-4.5 normalises with 1e-5 and rotates half of each head.
    let glm = "glm4_moe-hf-f32";
    let eps5 = edited(glm, |v| v["rms_norm_eps"] = json!(1e-5));
    assert_eq!(
        edited(glm, |v| remove(v, "rms_norm_eps")),
        eps5,
        "glm4_moe: absent rms_norm_eps must be 1e-5"
    );
    assert_ne!(edited(glm, |_| {}), eps5, "control: the fixture's 1e-6");
    assert_eq!(
        edited(glm, |v| remove(v, "partial_rotary_factor")),
        edited(glm, |_| {}),
        "glm4_moe: absent partial_rotary_factor must be 0.5"
    );
}

/// Parses a minimal config of `model_type` with `extra` merged in.
fn config(model_type: &str, extra: Value) -> runner::Result<ModelConfig> {
    let mut v = json!({"model_type": model_type, "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 300});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    ModelConfig::from_json(&v.to_string(), Path::new("config.json"))
}

#[test]
fn each_model_type_gets_its_config_class_defaults() {
    let c = |t: &str, extra: Value| config(t, extra).unwrap();
    // Generic: head_dim = hidden / heads, eps 1e-6, no window.
    let llama = c("llama", json!({}));
    assert_eq!((llama.head_dim, llama.rms_norm_eps), (16, 1e-6));
    assert_eq!(llama.sliding_window, None);
    assert_eq!(c("qwen3", json!({})).head_dim, 128);
    assert_eq!(c("qwen3", json!({"head_dim": 16})).head_dim, 16);
    for t in ["qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_next"] {
        let q = c(t, json!({}));
        assert_eq!((q.head_dim, q.partial_rotary_factor), (256, 0.25), "{t}");
    }
    // An explicit value wins, and an explicit null stays null (1 here, as in transformers).
    let q = c("qwen3_next", json!({"partial_rotary_factor": 0.5}));
    assert_eq!(q.partial_rotary_factor, 0.5);
    let q = c("qwen3_5_text", json!({"partial_rotary_factor": null}));
    assert_eq!(q.partial_rotary_factor, 1.0);
    let g = c("glm4_moe", json!({}));
    assert_eq!((g.rms_norm_eps, g.partial_rotary_factor), (1e-5, 0.5));
    assert_eq!(
        c("glm4_moe", json!({"rms_norm_eps": 1e-6})).rms_norm_eps,
        1e-6
    );
    // DeepSeek-V3 and GLM-4.7-Flash: head_dim is the rotary width, whatever
    // hidden / heads is (GLM-4.7-Flash's 2048 / 20 is not whole).
    let mla = json!({"qk_rope_head_dim": 8, "num_attention_heads": 5});
    assert_eq!(c("deepseek_v3", mla.clone()).head_dim, 8);
    let lite = c("glm4_moe_lite", mla);
    assert_eq!((lite.head_dim, lite.rms_norm_eps), (8, 1e-5));
    assert_eq!(c("deepseek_v3", json!({})).raw["first_k_dense_replace"], 3);
    assert_eq!(c("mistral", json!({})).sliding_window, Some(4096));
    let m = c("mistral", json!({"sliding_window": null}));
    assert_eq!(m.sliding_window, None);
    // transformers 5 writes `torch_dtype` as `dtype`.
    let d = c("llama", json!({"dtype": "bfloat16"}));
    assert_eq!(d.torch_dtype.as_deref(), Some("bfloat16"));
}

#[test]
fn keys_given_in_two_places_must_agree() {
    let refusals: Vec<(Value, &[&str])> = vec![
        // transformers 5 reads rope_parameters' 1e6, mlx-lm the top level's 1e4.
        (
            json!({"rope_theta": 10000, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
            &["key `rope_theta`", "1000000", "10000", "give one value"],
        ),
        (
            json!({"partial_rotary_factor": 0.5,
                   "rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.25}}),
            &["key `partial_rotary_factor`", "0.25", "0.5"],
        ),
        // Qwen's long-context recipe added to a transformers 5 config:
        // transformers would run YaRN at its default rope_theta, mlx-lm at 1e6.
        (
            json!({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
                   "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                    "original_max_position_embeddings": 32768}}),
            &[
                "key `rope_theta`",
                "rope_parameters only",
                "into rope_scaling",
            ],
        ),
        // transformers ties by the outer config, mlx-lm by text_config.
        (
            json!({"tie_word_embeddings": true, "text_config": {"tie_word_embeddings": false}}),
            &["key `tie_word_embeddings`", "text_config"],
        ),
    ];
    for (extra, needles) in refusals {
        let e = config("qwen3", extra.clone())
            .expect_err("must be refused")
            .to_string();
        for n in needles {
            assert!(e.contains(n), "{extra}: `{e}` should mention `{n}`");
        }
    }
    // Places that agree (10000 and 1e4 are one number).
    let c = config(
        "qwen3",
        json!({"rope_theta": 1e6, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000}}),
    )
    .unwrap();
    assert_eq!(c.rope_theta, 1e6);
    // `rope_scaling: null` is unset: rope_parameters' scaling applies.
    let c = config(
        "qwen3",
        json!({"rope_scaling": null,
               "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}}),
    )
    .unwrap();
    assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 2.0 });
    assert_eq!(c.rope_theta, 5e5);
    // rope_theta inside rope_scaling, as transformers 5 reads it.
    let c = config(
        "qwen3",
        json!({"rope_scaling": {"rope_type": "linear", "factor": 2.0, "rope_theta": 5e5}}),
    )
    .unwrap();
    assert_eq!(c.rope_theta, 5e5);
}

#[test]
fn unlisted_sliding_layers_follow_each_config_class() {
    // (fixture, max_window_layers, the layer_types transformers 5.25's config
    // class derives for two layers with `use_sliding_window: true`)
    let cases: [(&str, Option<u64>, [&str; 2]); 3] = [
        // Qwen2: layers at or after max_window_layers.
        (
            "qwen2-yarn-hf-f32",
            Some(1),
            ["full_attention", "sliding_attention"],
        ),
        // Qwen2-MoE: even layers below max_window_layers (28 when absent).
        (
            "qwen2_moe-hf-f32",
            None,
            ["sliding_attention", "full_attention"],
        ),
        // Qwen3-MoE: every layer.
        (
            "qwen3_moe-hf-f32",
            None,
            ["sliding_attention", "sliding_attention"],
        ),
    ];
    for (name, max, expected) in cases {
        let window = |v: &mut Value, types: Option<[&str; 2]>| {
            v["use_sliding_window"] = json!(true);
            v["sliding_window"] = json!(3);
            remove(v, "max_window_layers");
            if let Some(m) = max {
                v["max_window_layers"] = json!(m);
            }
            match types {
                Some(t) => v["layer_types"] = json!(t),
                None => remove(v, "layer_types"),
            }
        };
        let derived = edited(name, |v| window(v, None));
        assert_eq!(
            derived,
            edited(name, |v| window(v, Some(expected))),
            "{name}: the unlisted rule must equal layer_types {expected:?}"
        );
        assert_ne!(
            derived,
            edited(name, |v| window(v, Some(["full_attention"; 2]))),
            "{name}: control: a window of 3 over 12 positions must matter"
        );
    }
}

#[test]
fn keys_the_references_read_differently_are_refused() {
    // transformers' Llama has no sliding layers; mlx-lm's slides these.
    let dir = common::write(&Fixture::new(Arch::Llama), 11);
    edit_config(dir.path(), |v| {
        v["sliding_window"] = json!(4);
        v["layer_types"] = json!(["sliding_attention", "full_attention"]);
    });
    refused(dir.path(), &["layer_types", "sliding_attention", "mlx-lm"]);
    // `swish` is transformers' other name for SiLU: the same numbers.
    let silu = common::write(&Fixture::new(Arch::Qwen3), 12);
    let swish = common::write(&Fixture::new(Arch::Qwen3), 12);
    edit_config(silu.path(), |v| v["hidden_act"] = json!("silu"));
    edit_config(swish.path(), |v| v["hidden_act"] = json!("swish"));
    assert_eq!(logits(swish.path()), logits(silu.path()));
}

/// DeepSeek-V3's config.json as the hub ships it (transformers 4.33 style:
/// no `head_dim`, `rope_interleave` or `qk_head_dim`, YaRN under
/// `rope_scaling` with `type` and integer betas, `torch_dtype`, and the keys
/// of its remote code: `moe_layer_freq`, `scoring_func`, `topk_method`,
/// `seq_aux`, `aux_loss_alpha`, `ep_size`) computes what the transformers-5
/// config of the same fixture does; a top-k method or scoring function the
/// runner does not implement is refused by name.
#[test]
fn a_hub_style_deepseek_v3_config_computes_the_same() {
    let name = "deepseek_v3-hf-f32";
    let written = edited(name, |_| {});
    let hub = |v: &mut Value| {
        for k in ["head_dim", "rope_interleave", "qk_head_dim", "dtype"] {
            remove(v, k);
        }
        let rs = v["rope_scaling"].clone();
        v["rope_scaling"] = json!({
            "type": "yarn", "factor": rs["factor"], "beta_fast": 32, "beta_slow": 1,
            "mscale": rs["mscale"], "mscale_all_dim": rs["mscale_all_dim"],
            "original_max_position_embeddings": rs["original_max_position_embeddings"],
        });
        for (k, x) in [
            ("torch_dtype", json!("float32")),
            ("moe_layer_freq", json!(1)),
            ("scoring_func", json!("sigmoid")),
            ("topk_method", json!("noaux_tc")),
            ("seq_aux", json!(true)),
            ("aux_loss_alpha", json!(0.001)),
            ("ep_size", json!(1)),
        ] {
            v[k] = x;
        }
    };
    assert_eq!(edited(name, hub), written, "hub-style config");
    assert_ne!(
        edited(name, |v| {
            hub(v);
            v["rope_interleave"] = json!(false);
        }),
        written,
        "control: half-split RoPE must differ"
    );
    for (key, value) in [
        ("topk_method", json!("greedy")),
        ("scoring_func", json!("softmax")),
    ] {
        let dir = prepared(&formats(name));
        edit_config(dir.path(), |v| {
            hub(v);
            v[key] = value.clone();
        });
        refused(dir.path(), &[key]);
    }
}
