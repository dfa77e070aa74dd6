//! Block-scaled fp8 checkpoints (`quant_method: "fp8"`, `F8_E4M3` weights with
//! `weight_scale_inv`), as DeepSeek-V3 and the `-FP8` releases are stored.
//!
//! `fixtures/fp8/` was written by `xtask/train/ref_fp8.py` from the sharded
//! hub fixtures of Qwen3.5 (hybrid, MTP head) and DeepSeek-V3 (MLA, MoE, MTP
//! layer): `<family>-hf-fp8` holds the trunk's and the MTP head's linear
//! weights (23 and 49) as fp8 in 16 × 24 blocks (partial on both axes), with
//! every scale in the last shard; `<family>-fp8-dequantized` holds the same
//! model with each weight decoded and scaled in f32 by `ml_dtypes`, an
//! implementation of the format independent of MLX's.

use std::path::{Path, PathBuf};

use mlx_tensor::{Array, Dtype};
use runner::{LoadOptions, LoadedModel, QuantizeOptions};
use serde_json::Value;

use crate::formats::{check_speculation, prepared};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fp8")
        .join(name)
}

fn load(dir: &Path, dtype: Dtype) -> LoadedModel {
    let opts = LoadOptions {
        dtype,
        ..LoadOptions::default()
    };
    runner::load(dir, opts, |_, _| {}).unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// The prompt's logits at every position, as f32.
fn logits(m: &LoadedModel, prompt: &[u32]) -> Vec<f32> {
    let mut caches = m.model.new_caches();
    let ids = Array::from_slice(prompt, &[prompt.len() as i32]).unwrap();
    let h = m.model.forward(&ids, &mut caches).unwrap();
    m.model
        .unembed(&h)
        .unwrap()
        .as_type(Dtype::Float32)
        .unwrap()
        .to_vec()
        .unwrap()
}

/// The error's message; a success fails the test.
fn refusal<T>(r: runner::Result<T>) -> String {
    match r {
        Ok(_) => panic!("an inconsistent checkpoint was accepted"),
        Err(e) => e.to_string(),
    }
}

fn meta(family: &str) -> (Vec<u32>, Value) {
    let path = fixture(&format!("{family}-hf-fp8/fp8.json"));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let prompt = v["prompt"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect();
    (prompt, v)
}

/// Loaded in f32 and in bf16, the fp8 folder computes exactly what its
/// independently dequantized copy computes (the same weights, rounded once),
/// `info` reads it without data, and the MTP head (fp8 too) drafts and
/// speculation equals plain decoding.
#[test]
fn an_fp8_checkpoint_loads_as_its_dequantized_weights() {
    for family in ["qwen3_5", "deepseek_v3"] {
        let (prompt, meta) = meta(family);
        let name = format!("{family}-hf-fp8");
        let fp8 = prepared(&fixture(&name));
        let reference = prepared(&fixture(&format!("{family}-fp8-dequantized")));
        let info = runner::inspect(fp8.path()).unwrap();
        assert_eq!(
            info.dtypes.get("F8_E4M3").copied(),
            meta["fp8_weights"].as_u64().map(|n| n as usize),
            "{name}: {:?}",
            info.dtypes
        );
        assert!(info.mtp_head, "{name}");
        for dtype in [Dtype::Float32, Dtype::Bfloat16] {
            let a = load(fp8.path(), dtype);
            let b = load(reference.path(), dtype);
            let (la, lb) = (logits(&a, &prompt), logits(&b, &prompt));
            assert_eq!(la.len(), lb.len());
            let differing = la.iter().zip(&lb).filter(|(x, y)| x != y).count();
            assert_eq!(
                differing, 0,
                "{name} {dtype:?}: logits differ from the dequantized copy's"
            );
            if dtype == Dtype::Float32 {
                check_speculation(&name, &a, &prompt);
            }
        }
    }
}

/// Checkpoints whose fp8 parts do not fit together are refused before any
/// data is read, naming the tensor or key: fp8 weights under a config that
/// declares no fp8 quantization, and a block size the scales disagree with.
#[test]
fn inconsistent_fp8_checkpoints_are_refused_by_name() {
    let edit = |f: &dyn Fn(&mut Value)| {
        let dir = prepared(&fixture("qwen3_5-hf-fp8"));
        let path = dir.path().join("config.json");
        let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        f(&mut c);
        std::fs::write(&path, c.to_string()).unwrap();
        let err = refusal(runner::load(dir.path(), LoadOptions::default(), |_, _| {}));
        let info = refusal(runner::inspect(dir.path()));
        (err, info)
    };
    let (err, info) = edit(&|c| {
        c.as_object_mut().unwrap().remove("quantization_config");
    });
    for e in [&err, &info] {
        assert!(
            e.contains("F8_E4M3") && e.contains("quantization_config"),
            "{e}"
        );
    }
    let (err, _) =
        edit(&|c| c["quantization_config"]["weight_block_size"] = serde_json::json!([32, 32]));
    assert!(
        err.contains("weight_scale_inv") && err.contains("weight_block_size"),
        "{err}"
    );
    let (err, _) = edit(&|c| c["quantization_config"]["activation_scheme"] = "static".into());
    assert!(err.contains("activation_scheme"), "{err}");
}

/// `mtp-runner quantize` takes an fp8 source: dequantized (to bf16) as it is
/// read, then packed; the output declares MLX quantization only and loads.
#[test]
fn an_fp8_source_quantizes_to_an_mlx_model() {
    let (prompt, _) = meta("qwen3_5");
    let src = prepared(&fixture("qwen3_5-hf-fp8"));
    let out = tempfile::tempdir().unwrap();
    let dst = out.path().join("q8");
    let opts = QuantizeOptions {
        bits: 8,
        group_size: 32,
        keep_mtp_precision: false,
        ..QuantizeOptions::default()
    };
    runner::quantize_folder(src.path(), &dst, &opts).unwrap();
    let c: Value =
        serde_json::from_str(&std::fs::read_to_string(dst.join("config.json")).unwrap()).unwrap();
    assert_eq!(c["quantization_config"]["bits"], 8, "{c}");
    assert!(
        c["quantization_config"].get("quant_method").is_none(),
        "{c}"
    );
    let q = load(&dst, Dtype::Float32);
    let reference_dir = prepared(&fixture("qwen3_5-fp8-dequantized"));
    let reference = load(reference_dir.path(), Dtype::Float32);
    // 8-bit codes of the same weights: close to the dequantized model's logits.
    let (lq, lr) = (logits(&q, &prompt), logits(&reference, &prompt));
    let worst = lq
        .iter()
        .zip(&lr)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    let scale = lr.iter().map(|x| x.abs()).fold(0f32, f32::max);
    assert!(
        worst < 0.05 * scale,
        "worst {worst} against |logits| {scale}"
    );
}
