//! Qwen3-Next, GLM-4.5, DeepSeek-V3 and GLM-4.7-Flash beyond `formats.rs` (which checks every folder
//! token for token against transformers / mlx-lm): bad configs refused with
//! errors that name the key or tensor, GLM-4.5's optional MTP copies, and
//! greedy speculation equal to plain decoding at several depths and with
//! draft models. The folders are the committed fixtures of `cargo xtask
//! ref-formats` (`xtask/train/ref_moe_families.py`).

use std::path::Path;
use std::sync::atomic::AtomicBool;

use kvcache::Cache;
use mlx_tensor::Array;
use runner::{DepthPolicy, GenerateOptions, PrefixCache, ReuseSource, SamplingOptions, Session};

use serde_json::{Value, json};

use crate::common::Generate;
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

/// DeepSeek-V3 and GLM-4.7-Flash configs that the MLA decoder cannot
/// compute as transformers does are refused by key, never run.
#[test]
fn mla_bad_configs_name_the_key() {
    let d = "deepseek_v3-hf-f32";
    check(d, "kv_lora_rank", Value::Null, &["kv_lora_rank", "missing"]);
    check(d, "q_lora_rank", Value::Null, &["q_lora_rank", "missing"]);
    check(
        d,
        "topk_method",
        json!("greedy"),
        &["topk_method", "greedy"],
    );
    check(
        d,
        "scoring_func",
        json!("softmax"),
        &["scoring_func", "softmax"],
    );
    check(
        d,
        "partial_rotary_factor",
        json!(0.5),
        &["partial_rotary_factor"],
    );
    check(d, "num_key_value_heads", json!(1), &["num_key_value_heads"]);
    check(d, "rope_interleave", json!("yes"), &["rope_interleave"]);
    // A wrong size is caught by the tensor it shapes.
    check(d, "v_head_dim", json!(32), &["kv_b_proj"]);
    let g = "glm4_moe_lite-hf-f32";
    check(g, "mlp_layer_types", json!(["dense"]), &["mlp_layer_types"]);
    // Layer 1 made dense: its router is left over, its dense MLP missing.
    check(
        g,
        "mlp_layer_types",
        json!(["dense", "dense"]),
        &["model.layers.1.mlp.gate_proj.weight"],
    );
    // An explicit null (one `q_proj`) on a checkpoint with the low-rank pair.
    let dir = fixture(d);
    edit_config(dir.path(), |v| v["q_lora_rank"] = Value::Null);
    refused(dir.path(), &["q_proj"]);
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

/// Greedy MTP equals plain greedy decoding at depths 1, 3 and 4 and under the
/// automatic depth, over 32 tokens (so rejections rewind the recurrent and KV
/// caches many times), for both families' hub folders; every run drafts.
#[test]
fn greedy_mtp_equals_plain_at_every_depth() {
    let prompt = [5, 77, 130, 9, 201, 44, 3, 250, 18, 99];
    for name in ["qwen3_next-hf-f32", "glm4_moe-hf-f32", "deepseek_v3-hf-f32"] {
        let dir = fixture(name);
        let m = runner::load(dir.path(), runner::LoadOptions::default(), |_, _| {}).unwrap();
        let model = m.model.as_ref();
        let stop = AtomicBool::new(false);
        for depth in [
            DepthPolicy::Fixed(1),
            DepthPolicy::Fixed(3),
            DepthPolicy::Fixed(4),
            DepthPolicy::Auto { max: 4 },
        ] {
            let opts = GenerateOptions {
                max_tokens: 32,
                sampling: SamplingOptions::greedy(),
                depth,
                ..GenerateOptions::default()
            };
            let plain = Session::new(model)
                .generate(&m.tokenizer, &prompt, &opts, &stop, |_| {})
                .unwrap();
            let spec = Session::with_mtp(model)
                .unwrap()
                .generate(&m.tokenizer, &prompt, &opts, &stop, |_| {})
                .unwrap();
            assert_eq!(spec.token_ids, plain.token_ids, "{name} at {depth:?}");
            let s = spec.speculation.expect("speculation figures");
            assert!(s.drafted > 0, "{name} at {depth:?}: nothing drafted");
        }
    }
}

/// Bytes per cached position of `caches`, from their live contents.
fn bytes_per_position(caches: &[Box<dyn Cache>]) -> usize {
    caches
        .iter()
        .map(|c| {
            let live = c.live().unwrap();
            live.iter().map(Array::nbytes).sum::<usize>() / c.offset()
        })
        .sum()
}

/// The largest difference between the live contents of two cache stacks at
/// one offset.
fn cache_diff(a: &[Box<dyn Cache>], b: &[Box<dyn Cache>]) -> f32 {
    let mut worst = 0.0f32;
    for (x, y) in a.iter().zip(b) {
        assert_eq!(x.offset(), y.offset(), "cache offsets differ");
        for (p, q) in x.live().unwrap().iter().zip(y.live().unwrap()) {
            let (p, q) = (p.to_vec::<f32>().unwrap(), q.to_vec::<f32>().unwrap());
            worst = worst.max(crate::common::max_abs_diff(&p, &q));
        }
    }
    worst
}

/// The MLA caches hold mlx-lm's compressed form, the normalised latent and
/// the one rotary key per position: on the DeepSeek-V3 fixture (f32,
/// `kv_lora_rank` 32, `qk_rope_head_dim` 16) `(32 + 16) · 4` bytes per
/// layer, not per-head keys and values (`2 · 2 heads · 48 · 4`). A
/// speculative session's caches (rewound by its rejections) then serve a
/// longer prompt through the prefix cache in a fresh session and through a
/// rewind of the live one, each equal to a cold run in tokens and in cache
/// contents (within 1e-4, f32: the warm runs forward the prompt in other
/// chunks).
#[test]
fn mla_caches_hold_the_latent_and_serve_the_next_request() {
    let dir = fixture("deepseek_v3-hf-f32");
    let m = runner::load(dir.path(), runner::LoadOptions::default(), |_, _| {}).unwrap();
    let (model, tok) = (m.model.as_ref(), &m.tokenizer);
    let opts = GenerateOptions {
        max_tokens: 12,
        sampling: SamplingOptions::greedy(),
        depth: DepthPolicy::Fixed(3),
        ..GenerateOptions::default()
    };
    let mut s = Session::with_mtp(model).unwrap();
    s.run(tok, &[5, 77, 130, 9, 201, 44, 3, 250], &opts)
        .unwrap();
    let per_layer = (32 + 16) * 4;
    assert_eq!(bytes_per_position(s.caches()), 2 * per_layer, "2 layers");
    assert_eq!(bytes_per_position(s.draft_caches()), per_layer, "MTP head");

    let held = s.committed().to_vec();
    let mut prompt = held[..held.len() - 2].to_vec();
    prompt.extend([40, 41, 42]);
    let mut c = Session::with_mtp(model).unwrap();
    let cold = c.run(tok, &prompt, &opts).unwrap();
    let mut cache = PrefixCache::new(64 << 20);
    assert!(cache.store(&s).unwrap());
    let mut fresh = Session::with_mtp(model).unwrap();
    let r = cache.prepare(&mut fresh, &prompt).unwrap();
    assert_eq!((r.tokens, r.source), (held.len() - 2, ReuseSource::Stored));
    let warm = fresh.run(tok, &prompt[r.tokens..], &opts).unwrap();
    assert_eq!(
        warm.token_ids, cold.token_ids,
        "restored from the prefix cache"
    );
    let d = cache_diff(fresh.caches(), c.caches());
    assert!(d <= 1e-4, "restored caches differ from cold ones by {d}");
    let n = s.reuse_prefix(&prompt).unwrap();
    assert_eq!(n, held.len() - 2);
    let rewound = s.run(tok, &prompt[n..], &opts).unwrap();
    assert_eq!(
        rewound.token_ids, cold.token_ids,
        "the live session rewound"
    );
    let d = cache_diff(s.caches(), c.caches());
    assert!(d <= 1e-4, "rewound caches differ from cold ones by {d}");
}

/// A prefill chunk long enough to attend over per-head keys and values
/// expanded from the latent (DeepSeek-V3's fixture from 97 rows) gives the
/// hidden state of short chunks, which attend in the absorbed form (within
/// 1e-4, f32).
#[test]
fn mla_expanded_and_absorbed_forms_agree() {
    let dir = fixture("deepseek_v3-hf-f32");
    let m = runner::load(dir.path(), runner::LoadOptions::default(), |_, _| {}).unwrap();
    let prompt: Vec<u32> = (0..120u32).map(|i| 3 + (i * 37 + 11) % 250).collect();
    let stop = AtomicBool::new(false);
    let last = |chunk: usize| -> Vec<f32> {
        let mut s = Session::new(m.model.as_ref());
        let h = s.prefill(&prompt, chunk, &stop).unwrap().unwrap();
        let n = h.dim(0);
        h.slice_axis(0, n - 1, n).unwrap().to_vec::<f32>().unwrap()
    };
    let (expanded, absorbed) = (last(prompt.len()), last(8));
    let worst = crate::common::max_abs_diff(&expanded, &absorbed);
    assert!(worst <= 1e-4, "forms differ by {worst}");
}

/// The random MTP heads above accept almost nothing (each round keeps only
/// the correction token), so keeping several drafts of a round is exercised
/// with draft models: the model itself (every draft accepted), and for
/// GLM-4.5 its 4-bit mlx-lm conversion (the same weights rounded: some drafts
/// accepted, some not). Greedy output must equal plain decoding. Qwen3-Next
/// has no lossy draft here: a hybrid draft model cannot yet rewind its own
/// recurrent caches after a rejection (`drafter/draft_model.rs` schedules no
/// snapshots), a drafter limitation that Qwen3.5 shares.
#[test]
fn draft_model_speculation_keeps_part_of_a_round_and_equals_plain() {
    let prompt = [5, 77, 130, 9, 201, 44, 3, 250, 18, 99];
    for (family, lossy) in [("qwen3_next", None), ("glm4_moe", Some("mlx-q4"))] {
        let load = |d: &Path| runner::load(d, runner::LoadOptions::default(), |_, _| {}).unwrap();
        let target_dir = fixture(&format!("{family}-hf-f32"));
        let target = load(target_dir.path());
        let lossy_dir = lossy.map(|l| fixture(&format!("{family}-{l}")));
        let lossy = lossy_dir.as_ref().map(|d| load(d.path()));
        let opts = GenerateOptions {
            max_tokens: 32,
            sampling: SamplingOptions::greedy(),
            depth: DepthPolicy::Fixed(3),
            ..GenerateOptions::default()
        };
        let stop = AtomicBool::new(false);
        let model = target.model.as_ref();
        let plain = Session::new(model)
            .generate(&target.tokenizer, &prompt, &opts, &stop, |_| {})
            .unwrap();
        let mut drafts = vec![("itself", model)];
        drafts.extend(lossy.as_ref().map(|m| ("its q4", m.model.as_ref())));
        for (what, draft) in drafts {
            let spec = Session::with_draft_model(model, draft)
                .generate(&target.tokenizer, &prompt, &opts, &stop, |_| {})
                .unwrap();
            assert_eq!(
                spec.token_ids, plain.token_ids,
                "{family} drafted by {what}"
            );
            let s = spec.speculation.expect("speculation figures");
            if what == "itself" {
                assert_eq!(
                    s.accepted, s.drafted,
                    "{family}: a self-draft is always accepted"
                );
            } else {
                assert!(
                    0 < s.accepted && s.accepted < s.drafted,
                    "{family} drafted by {what}: {} of {} accepted, want some of them",
                    s.accepted,
                    s.drafted
                );
            }
        }
    }
}

/// A verify's rows must be what single steps compute, bit for bit on the
/// CPU (within rounding on a GPU), or greedy speculation parts from plain
/// decoding at a near-tie: the forward of `k + 1`
/// rows (2 to 17, every verify the CLI allows, at prompt lengths on both
/// sides of a cache growth step) equals `k + 1` one-row steps in f32, for the
/// paths that do not go through the rows kernels: MLA attention (both
/// families) and MLX's floating-point quantized products (mxfp4, mxfp8,
/// nvfp4; dense and experts).
#[test]
fn verify_rows_equal_single_steps_bit_for_bit() {
    for family in [
        "deepseek_v3-hf-f32",
        "glm4_moe_lite-hf-f32",
        "qwen3-mlx-mxfp4",
        "qwen3-mlx-mxfp8",
        "qwen3-mlx-nvfp4",
        "qwen3_moe-mlx-mxfp4",
    ] {
        let dir = fixture(family);
        let m = runner::load(dir.path(), runner::LoadOptions::default(), |_, _| {}).unwrap();
        let model = m.model.as_ref();
        for (prefix_len, rows) in [(9usize, 2usize), (30, 5), (250, 9), (260, 17)] {
            let ids: Vec<u32> = (0..prefix_len + rows)
                .map(|i| 3 + (i as u32 * 53 + 7) % 250)
                .collect();
            let prefill = |caches: &mut Vec<Box<dyn Cache>>| {
                let p = Array::from_slice(&ids[..prefix_len], &[prefix_len as i32]).unwrap();
                model.forward(&p, caches).unwrap().eval().unwrap();
            };
            let mut a = model.new_caches();
            prefill(&mut a);
            let chunk = Array::from_slice(&ids[prefix_len..], &[rows as i32]).unwrap();
            let together: Vec<f32> = model.forward(&chunk, &mut a).unwrap().to_vec().unwrap();
            let mut b = model.new_caches();
            prefill(&mut b);
            let mut alone = Vec::new();
            for &id in &ids[prefix_len..] {
                let one = Array::from_slice(&[id], &[1]).unwrap();
                alone.extend(
                    model
                        .forward(&one, &mut b)
                        .unwrap()
                        .to_vec::<f32>()
                        .unwrap(),
                );
            }
            let differing = together.iter().zip(&alone).filter(|(x, y)| x != y).count();
            if mlx_tensor::default_device() == mlx_tensor::Device::Cpu {
                assert_eq!(
                    differing,
                    0,
                    "{family}: {rows} rows after {prefix_len}: {differing} of {} hidden values differ from single steps",
                    alone.len()
                );
            } else {
                // A GPU's batched products round differently (an H100 in
                // session 36: 120 of 128 values); within rounding there.
                let worst = crate::common::max_abs_diff(&together, &alone);
                let scale = alone.iter().fold(0f32, |m, x| m.max(x.abs()));
                assert!(
                    worst <= 1e-4 * scale.max(1.0),
                    "{family}: {rows} rows after {prefix_len}: off by {worst} (|h| up to {scale})"
                );
            }
        }
    }
}
