//! Every attention path (fused, explicit, padded) gives a verify over `k + 1`
//! rows the logits of `k + 1` single steps (`runner::set_attention_path`).

use mlx_tensor::{Array, Dtype};
use runner::{AttentionPath, LoadOptions, load, set_attention_path};

/// A verify over `k + 1` rows gives the logits of `k + 1` single steps,
/// on every path, for a KV-cache family (tiny-mtp, Qwen3) and the gated
/// attention of the hybrid (tiny-hybrid-mtp). Tolerance 1e-4 in f32 (BLAS
/// rounds a row of a multi-row matmul differently from a one-row one) and
/// 3 % of the logit range in bf16.
#[test]
fn verify_rows_equal_single_steps_on_every_path() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
    let prompt: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 200 + 3).collect();
    let run: Vec<u32> = vec![17, 99, 4, 250, 31];
    for name in ["tiny-mtp", "tiny-hybrid-mtp"] {
        for dtype in [Dtype::Float32, Dtype::Bfloat16] {
            let opts = LoadOptions {
                dtype,
                ..LoadOptions::default()
            };
            let m = load(&root.join(name), opts, |_, _| {}).unwrap().model;
            let fwd = |caches: &mut [Box<dyn kvcache::Cache>], ids: &[u32]| {
                let t = Array::from_slice(ids, &[ids.len() as i32]).unwrap();
                m.unembed(&m.forward(&t, caches).unwrap()).unwrap()
            };
            // Reference: fused kernel, one token at a time.
            set_attention_path(AttentionPath::Fused);
            let mut caches = m.new_caches();
            fwd(&mut caches, &prompt);
            let steps: Vec<f32> = run
                .iter()
                .flat_map(|&t| fwd(&mut caches, &[t]).to_vec::<f32>().unwrap())
                .collect();
            let range = steps.iter().fold(0.0f32, |a, x| a.max(x.abs()));
            let tol = if dtype == Dtype::Float32 {
                1e-4
            } else {
                0.03 * range
            };
            for path in [
                AttentionPath::Fused,
                AttentionPath::Explicit,
                AttentionPath::Padded,
            ] {
                set_attention_path(path);
                let mut caches = m.new_caches();
                fwd(&mut caches, &prompt);
                let rows = fwd(&mut caches, &run).to_vec::<f32>().unwrap();
                let d = rows
                    .iter()
                    .zip(&steps)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                assert!(
                    d <= tol,
                    "{name} {dtype:?} {path:?}: max |d logit| {d} > {tol}"
                );
            }
            set_attention_path(AttentionPath::Auto);
        }
    }
}
