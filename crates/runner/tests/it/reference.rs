//! Parity with mlx-lm on the bundled models: prompt ids, 64 greedy tokens and the last
//! prompt position's logits, against `fixtures/mlx_lm_reference.json` (regenerate with
//! `fixtures/mlx_lm_reference.py`).

use crate::common;
use crate::common::Generate;

use std::path::PathBuf;

use mlx_tensor::Array;
use runner::{FinishReason, GenerateOptions, SamplingOptions, Session};
use serde_json::Value;

/// Both sides compute in f32 with the same MLX kernels but different graphs (fused vs
/// separate ops); logits are O(10), so 1e-3 absolute is far above the ~1e-5 rounding
/// and far below the gaps that decide an argmax in these cases.
const LOGIT_TOL: f32 = 1e-3;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn bundled_models_match_mlx_lm() {
    let text =
        std::fs::read_to_string(root().join("crates/runner/tests/fixtures/mlx_lm_reference.json"))
            .expect("reference fixture present");
    let reference: Value = serde_json::from_str(&text).unwrap();
    let max_tokens = reference["max_tokens"].as_u64().unwrap() as usize;
    let mut compared = 0;
    for (model_dir, cases) in reference["models"].as_object().unwrap() {
        let m = common::load(&root().join(model_dir));
        let model = m.model.as_ref();
        for case in cases.as_array().unwrap() {
            let prompt = case["prompt"].as_str().unwrap();
            let want_ids = ids(&case["prompt_ids"]);
            let got_ids = m.tokenizer.encode(prompt, true).unwrap();
            assert_eq!(got_ids, want_ids, "{model_dir}: prompt ids of {prompt:?}");

            // Last-position logits.
            let a = Array::from_slice(&got_ids, &[got_ids.len() as i32]).unwrap();
            let h = model.forward(&a, &mut model.new_caches()).unwrap();
            let n = h.dim(0);
            let logits = model.unembed(&h.slice_axis(0, n - 1, n).unwrap()).unwrap();
            let lse = logits
                .logsumexp(&[-1], false)
                .unwrap()
                .item::<f32>()
                .unwrap();
            let logits = logits.to_vec::<f32>().unwrap();
            let top = ids(&case["top_ids"]);
            let top_vals: Vec<f32> = case["top_logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect();
            let ours: Vec<f32> = top.iter().map(|&i| logits[i as usize]).collect();
            let d = common::max_abs_diff(&ours, &top_vals);
            assert!(
                d < LOGIT_TOL,
                "{model_dir} {prompt:?}: top-32 logits differ by {d}"
            );
            let want_lse = case["logsumexp"].as_f64().unwrap() as f32;
            assert!(
                (lse - want_lse).abs() < LOGIT_TOL,
                "{model_dir}: logsumexp {lse} vs {want_lse}"
            );

            // 64 greedy tokens through the pipelined loop (mlx-lm does not stop at EOS).
            let want = ids(&case["greedy"]);
            let opts = GenerateOptions {
                max_tokens,
                sampling: SamplingOptions::greedy(),
                ..GenerateOptions::default()
            };
            let g = Session::new(model)
                .run(&m.tokenizer, &got_ids, &opts)
                .unwrap();
            let mut got = g.token_ids.clone();
            if g.finish == FinishReason::Eos {
                got.push(want[got.len()]);
                assert!(m.tokenizer.eos_ids().contains(got.last().unwrap()));
            } else {
                assert_eq!(got.len(), max_tokens);
            }
            assert_eq!(
                got,
                want[..got.len()],
                "{model_dir}: greedy continuation of {prompt:?}"
            );
            compared += 1;
        }
    }
    assert_eq!(compared, 16, "cases compared");
}
