//! Qwen3.5-MoE (and Qwen3-MoE, Qwen2-MoE) on the `fixtures/formats/*moe-*`
//! folders (`cargo xtask ref-formats`, xtask/train/ref_moe.py): every expert
//! layout loads (the
//! token-for-token check against transformers and mlx-lm is
//! `formats.rs`'s); several rows at once equal single steps (the sorted
//! expert gather); greedy MTP equals plain at every depth; and a 4-bit model's
//! peak memory stays within 10% of the bytes it holds.
// The measured figures are reported on stderr (`-- --nocapture` shows them).
#![allow(clippy::print_stderr)]

use crate::common;
use crate::formats::prepared;

use std::path::{Path, PathBuf};

use common::parity::{depths, sweep};
use mlx_tensor::{Array, Dtype, memory};
use runner::{GenerateOptions, LoadOptions, SamplingOptions, Session};
use serde_json::{Value, json};

fn folder(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/formats")
        .join(name)
}

const FOLDERS: [(&str, bool); 4] = [
    ("qwen3_5_moe-hub-f32", true),
    ("qwen3_5_moe-hf-f32", true),
    ("qwen3_5_moe-mlx-f32", false),
    ("qwen3_5_moe-mlx-q4", false),
];

/// Each layout is the one its writer produces, and `info` names the family.
#[test]
fn every_expert_layout_is_present_and_loads() {
    let expect = |name: &str, needle: &str| {
        let st = std::fs::read_dir(folder(name)).unwrap().find_map(|e| {
            let p = e.unwrap().path();
            (p.extension().is_some_and(|x| x == "safetensors")).then_some(p)
        });
        let header = mlx_tensor::io::load_safetensors(&st.unwrap()).unwrap();
        assert!(
            header.tensors.keys().any(|k| k.contains(needle)),
            "{name}: no `{needle}` tensor"
        );
    };
    expect("qwen3_5_moe-hub-f32", "mlp.experts.gate_up_proj");
    expect("qwen3_5_moe-hf-f32", "mlp.experts.3.down_proj.weight");
    expect("qwen3_5_moe-mlx-f32", "mlp.switch_mlp.gate_proj.weight");
    expect("qwen3_5_moe-mlx-q4", "mlp.switch_mlp.gate_proj.scales");
    for (name, mtp) in FOLDERS {
        let dir = prepared(&folder(name));
        let info = runner::inspect(dir.path()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(info.family, "qwen3_5_moe", "{name}");
        assert_eq!(info.mtp_head, mtp, "{name}");
    }
    // Qwen3-MoE and Qwen2-MoE (no MTP): the same four layouts, one family each.
    for family in ["qwen3_moe", "qwen2_moe"] {
        expect(&format!("{family}-hub-f32"), "mlp.experts.gate_up_proj");
        expect(
            &format!("{family}-hf-f32"),
            "mlp.experts.3.down_proj.weight",
        );
        expect(
            &format!("{family}-mlx-q4"),
            "mlp.switch_mlp.down_proj.scales",
        );
        for fmt in ["hub-f32", "hf-f32", "mlx-f32", "mlx-q4"] {
            let name = format!("{family}-{fmt}");
            let dir = prepared(&folder(&name));
            let info = runner::inspect(dir.path()).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(info.family, family, "{name}");
        }
    }
}

/// The prompt forwarded at once (experts gathered for 12 rows, sorted by
/// expert) gives the hiddens of 12 single steps, within 1e-4 (f32; only
/// summation order differs), for dense and 4-bit experts, hybrid and
/// attention-only trunks.
#[test]
fn prompt_at_once_equals_single_steps() {
    let prompt: Vec<u32> = vec![5, 77, 130, 9, 201, 44, 3, 250, 18, 99, 61, 120];
    let names = [
        "qwen3_5_moe-hub-f32",
        "qwen3_5_moe-mlx-q4",
        "qwen3_moe-hf-f32",
        "qwen2_moe-mlx-q4",
    ];
    for name in names {
        let dir = prepared(&folder(name));
        let m = common::load(dir.path());
        let mut caches = m.model.new_caches();
        let all = Array::from_slice(&prompt, &[prompt.len() as i32]).unwrap();
        let at_once: Vec<f32> = m
            .model
            .forward(&all, &mut caches)
            .unwrap()
            .to_vec()
            .unwrap();
        let mut caches = m.model.new_caches();
        let mut steps = Vec::new();
        for &t in &prompt {
            let one = Array::from_slice(&[t], &[1]).unwrap();
            let h = m.model.forward(&one, &mut caches).unwrap();
            steps.extend(h.to_vec::<f32>().unwrap());
        }
        let diff = common::max_abs_diff(&at_once, &steps);
        assert!(diff < 1e-4, "{name}: max diff {diff}");
    }
}

/// Greedy MTP equals plain greedy at depths 1–4 and auto on both folders
/// with a (MoE-block) MTP head, 32 tokens from four prompts each.
#[test]
fn greedy_mtp_equals_plain_on_the_moe_head() {
    let prompts: Vec<Vec<u32>> = vec![
        vec![5, 77, 130, 9, 201, 44],
        vec![3, 250, 18, 99, 61, 120, 7],
        vec![1, 2, 3],
        vec![200, 100, 50, 25, 12, 6, 3, 1, 140],
    ];
    for name in ["qwen3_5_moe-hub-f32", "qwen3_5_moe-hf-f32"] {
        let dir = prepared(&folder(name));
        let m = common::load(dir.path());
        let (totals, compared) = sweep(&m, &prompts, 32);
        for (depth, t) in depths().into_iter().zip(totals) {
            t.report(depth);
            assert!(t.drafted > 0, "{name} {depth:?}: nothing drafted");
        }
        eprintln!("{name}: {compared} tokens compared");
        assert!(
            compared >= prompts.len() * 5 * 8,
            "{name}: {compared} tokens compared"
        );
    }
}

/// Experts per layer in the widened 4-bit model of the memory test.
const WIDE_EXPERTS: i32 = 256;

/// The 4-bit fixture with [`WIDE_EXPERTS`] experts per layer (the fixture's
/// four tiled, a fresh 8-bit router), so that the expert stacks dominate
/// the model's bytes as in a real checkpoint.
fn widened_q4() -> tempfile::TempDir {
    let dir = prepared(&folder("qwen3_5_moe-mlx-q4"));
    let st = dir.path().join("model.safetensors");
    let mut t = mlx_tensor::io::load_safetensors(&st).unwrap().tensors;
    let names: Vec<String> = t.keys().cloned().collect();
    let mut seed = 0;
    for name in names {
        let a = t[&name].clone();
        if name.contains(".switch_mlp.") {
            let reps = (WIDE_EXPERTS / a.dim(0)) as usize;
            let tiled = mlx_tensor::ops::concatenate(&vec![a; reps], 0).unwrap();
            t.insert(name, tiled);
        } else if name.ends_with("mlp.gate.weight") {
            seed += 1;
            let h = a.dim(1) * 32 / 8;
            let key = mlx_tensor::random::key(seed).unwrap();
            let dense =
                mlx_tensor::random::normal(&[WIDE_EXPERTS, h], Dtype::Float32, &key).unwrap();
            let (w, s, b) = dense.quantize(64, 8).unwrap();
            let module = name.strip_suffix(".weight").unwrap().to_owned();
            t.insert(name, w);
            t.insert(format!("{module}.scales"), s);
            t.insert(format!("{module}.biases"), b);
        }
    }
    mlx_tensor::io::save_safetensors(&st, t.iter().map(|(k, v)| (k.as_str(), v))).unwrap();
    let cfg = dir.path().join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["text_config"]["num_experts"] = json!(WIDE_EXPERTS);
    std::fs::write(&cfg, v.to_string()).unwrap();
    dir
}

#[test]
fn q4_moe_peak_memory_is_its_bytes_within_ten_percent() {
    // MLX's memory figures are per process.
    common::own_process(
        "moe::q4_moe_peak_memory_is_its_bytes_within_ten_percent",
        q4_moe_peak_memory_alone,
    );
}

fn q4_moe_peak_memory_alone() {
    let dir = widened_q4();
    let label = format!("q4 MoE ({WIDE_EXPERTS} experts)");
    peak_memory_is_its_bytes(&label, dir.path(), LoadOptions::default());
}

#[test]
fn q4_trained_moe_peak_memory_is_its_bytes_within_ten_percent() {
    common::own_process(
        "moe::q4_trained_moe_peak_memory_is_its_bytes_within_ten_percent",
        q4_trained_moe_peak_memory_alone,
    );
}

/// The same bound on `models/tiny-moe-mtp` as `mtp-runner quantize` writes
/// it at 4 bits (fused hub experts packed into `switch_mlp`), loaded in
/// bf16, its stored dtype (in f32 its scales, biases and norms double:
/// measured 5.2 MB held from a 4.7 MB file).
fn q4_trained_moe_peak_memory_alone() {
    let q = tempfile::tempdir().unwrap();
    let o = runner::QuantizeOptions::default();
    assert_eq!((o.bits, o.group_size), (4, 64));
    runner::quantize_folder(&crate::moe_model::dir(), q.path(), &o).unwrap();
    let bf16 = LoadOptions {
        dtype: Dtype::Bfloat16,
        ..LoadOptions::default()
    };
    peak_memory_is_its_bytes("q4 tiny-moe-mtp (bf16)", q.path(), bf16);
}

/// Peak MLX memory over load and a 64-token generation is at most 10% above
/// what the model and the session hold at the end (weights + caches, by
/// MLX's active-memory counter); and the weights held are within 10% of the
/// 4-bit file's bytes, which fails if any expert stack were dequantized (f32
/// experts would be about 6x as large).
fn peak_memory_is_its_bytes(label: &str, dir: &Path, load: LoadOptions) {
    let file_bytes: u64 = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum();
    let before = memory::active();
    memory::reset_peak();
    let m = runner::load(dir, load, |_, _| {}).unwrap();
    let load_peak = memory::peak();
    let weights = memory::active() - before;
    let opts = GenerateOptions {
        max_tokens: 64,
        sampling: SamplingOptions::greedy(),
        ..GenerateOptions::default()
    };
    let mut s = Session::new(m.model.as_ref());
    let prompt: Vec<u32> = vec![5, 77, 130, 9, 201, 44, 3, 250, 18, 99, 61, 120];
    let g = s
        .generate(&m.tokenizer, &prompt, &opts, &Default::default(), |_| {})
        .unwrap();
    let held = memory::active() - before;
    let peak = load_peak
        .max(g.stats.peak_memory_bytes)
        .saturating_sub(before);
    eprintln!(
        "{label}: file {file_bytes} B, weights {weights} B, weights + \
         caches {held} B, peak {peak} B (load {load_peak} B), {} tokens",
        g.token_ids.len()
    );
    assert!(!g.token_ids.is_empty());
    assert!(
        (weights as f64) <= 1.10 * file_bytes as f64,
        "weights {weights} B vs a {file_bytes} B 4-bit file: experts were not kept quantized"
    );
    assert!(
        (weights as f64) >= 0.90 * file_bytes as f64,
        "weights {weights} B vs a {file_bytes} B file: the counter missed the model"
    );
    assert!(
        (peak as f64) <= 1.10 * held as f64,
        "peak {peak} B is more than 10% above the {held} B of weights and caches"
    );
}
