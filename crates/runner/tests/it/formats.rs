//! Checkpoints as users download them, against the references' own greedy ids.
//!
//! Every folder under `fixtures/formats/` was written by `cargo xtask
//! ref-formats` (xtask/train/ref_formats.py): transformers' own classes
//! (`save_pretrained` in f32, bf16 and sharded with an index) and
//! `mlx_lm.convert` (f32, 4-bit, 8-bit), with norms and biases moved off their
//! initial values; `expected.json` holds the prompt and the reference's
//! greedy ids (transformers for hub layouts, mlx-lm for converted ones, both
//! computed in f32). Each folder must load, pass `info`'s validation and give
//! exactly those ids in f32; a folder with MTP tensors must also decode the
//! same tokens speculatively, with drafts actually proposed.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use mlx_tensor::Array;
use runner::DepthPolicy;
use runner::testing::tokenizer_json;
use runner::{GenerateOptions, LoadOptions, LoadedModel, SamplingOptions, Session};
use serde_json::{Value, json};

fn fixtures() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/formats");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("expected.json").is_file())
        .collect();
    v.sort();
    v
}

/// A copy of the fixture folder with the test tokenizer added (the
/// fixtures store only config, weights and expectations).
pub(crate) fn prepared(src: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.path().join(p.file_name().unwrap())).unwrap();
    }
    let write = |name: &str, v: &Value| {
        std::fs::write(dir.path().join(name), v.to_string()).unwrap();
    };
    write("tokenizer.json", &tokenizer_json());
    write(
        "tokenizer_config.json",
        &json!({"eos_token": "<|endoftext|>", "bos_token": null}),
    );
    dir
}

/// Plain greedy decoding through the model's forward, without the session
/// (no EOS handling: every position is compared).
fn greedy(m: &LoadedModel, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut caches = m.model.new_caches();
    let mut next = Array::from_slice(prompt, &[prompt.len() as i32]).unwrap();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let h = m.model.forward(&next, &mut caches).unwrap();
        let last = h.slice_axis(0, h.dim(0) - 1, h.dim(0)).unwrap();
        let logits: Vec<f32> = m.model.unembed(&last).unwrap().to_vec().unwrap();
        let id = logits
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
                if v > best.1 { (i, v) } else { best }
            })
            .0 as u32;
        out.push(id);
        next = Array::from_slice(&[id], &[1]).unwrap();
    }
    out
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The mixture-of-experts MTP families, checked by their own test.
const MOE_FAMILIES: &[&str] = &["qwen3_next-", "glm4_moe-"];
/// The multi-head latent attention families (also MoE with MTP), checked by theirs.
const MLA_FAMILIES: &[&str] = &["deepseek_v3-", "glm4_moe_lite-"];

fn is_family(p: &Path, families: &[&str]) -> bool {
    let name = p.file_name().unwrap().to_string_lossy();
    families.iter().any(|f| name.starts_with(f))
}

fn is_moe_family(p: &Path) -> bool {
    is_family(p, MOE_FAMILIES) || is_family(p, MLA_FAMILIES)
}

#[test]
fn every_format_matches_its_reference_token_for_token() {
    let all: Vec<PathBuf> = fixtures()
        .into_iter()
        .filter(|p| !is_moe_family(p))
        .collect();
    assert!(
        all.len() >= 30,
        "expected the committed format fixtures, found {}",
        all.len()
    );
    check_all(&all);
}

/// Qwen3-Next and GLM-4.5 (hub f32, bf16, sharded; mlx-lm f32, q4, q8): token
/// for token against transformers / mlx-lm, and greedy MTP equal to plain on
/// the hub folders, which keep their MTP heads.
#[test]
fn moe_families_match_their_references_token_for_token() {
    let all: Vec<PathBuf> = fixtures()
        .into_iter()
        .filter(|p| is_family(p, MOE_FAMILIES))
        .collect();
    assert_eq!(all.len(), 12, "six folders per family: {all:?}");
    check_all(&all);
}

/// DeepSeek-V3 (query low rank, values narrower than keys, YaRN with
/// `mscale_all_dim`) and GLM-4.7-Flash (one `q_proj`, `mlp_layer_types`):
/// hub f32, bf16 and sharded token for token against transformers, mlx-lm's
/// f32, q4 and q8 conversions (stacked experts, `kv_b_proj` split into
/// `embed_q` / `unembed_out`) against mlx-lm, and greedy MTP equal to plain
/// on the hub folders, whose MTP block is itself an MLA + MoE layer.
#[test]
fn mla_families_match_their_references_token_for_token() {
    let all: Vec<PathBuf> = fixtures()
        .into_iter()
        .filter(|p| is_family(p, MLA_FAMILIES))
        .collect();
    assert_eq!(all.len(), 12, "six folders per family: {all:?}");
    check_all(&all);
}

fn check_all(all: &[PathBuf]) {
    let mut failures = Vec::new();
    for src in all {
        let name = src.file_name().unwrap().to_string_lossy().into_owned();
        let e: Value =
            serde_json::from_str(&std::fs::read_to_string(src.join("expected.json")).unwrap())
                .unwrap();
        let dir = prepared(src);
        let info = runner::inspect(dir.path()).unwrap_or_else(|err| panic!("{name}: info: {err}"));
        let m = runner::load(dir.path(), LoadOptions::default(), |_, _| {})
            .unwrap_or_else(|err| panic!("{name}: load: {err}"));
        let prompt = ids(&e["prompt"]);
        let want = ids(&e["ids"]);
        let got = greedy(&m, &prompt, want.len());
        if got != want {
            failures.push(format!(
                "{name} ({}): got {got:?}, want {want:?}",
                e["reference"]
            ));
        }
        let mtp = e["mtp"].as_bool().unwrap_or(false);
        assert_eq!(info.mtp_head, mtp, "{name}: info's MTP head");
        assert_eq!(m.model.mtp_head().is_some(), mtp, "{name}: loaded MTP head");
        if name.starts_with("qwen3_5-hf") {
            assert!(info.skipped.0 > 0, "{name}: the vision tower is left out");
            assert_eq!(info.tensor_layout, "transformers-multimodal", "{name}");
        }
        if name.starts_with("qwen3_5-mlx") {
            assert_eq!(info.tensor_layout, "mlx-lm-multimodal", "{name}");
            let note = info
                .mtp_note
                .unwrap_or_else(|| panic!("{name}: no MTP note"));
            assert!(note.contains("mtp-runner quantize"), "{name}: {note}");
        }
        if mtp {
            check_speculation(&name, &m, &prompt);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// MTP speculation at depth 2 equals plain greedy decoding and drafts.
pub(super) fn check_speculation(name: &str, m: &LoadedModel, prompt: &[u32]) {
    let opts = GenerateOptions {
        max_tokens: 16,
        sampling: SamplingOptions::greedy(),
        depth: DepthPolicy::Fixed(2),
        ..GenerateOptions::default()
    };
    let stop = AtomicBool::new(false);
    let model = m.model.as_ref();
    let plain = Session::new(model)
        .generate(&m.tokenizer, prompt, &opts, &stop, |_| {})
        .unwrap();
    let spec = Session::with_mtp(model)
        .unwrap()
        .generate(&m.tokenizer, prompt, &opts, &stop, |_| {})
        .unwrap();
    let s = crate::common::parity::same_as_plain(name, &spec, &plain);
    assert!(s.drafted > 0, "{name}: the MTP head drafted nothing");
}
