//! `quantize_folder` on the trained MoE model (`models/tiny-moe-mtp`, hub
//! layout with fused experts), at 4 and 8 bits: every expert stack is
//! written packed in mlx-lm's `switch_mlp` layout (routers at 8 bits), the
//! file holds exactly the packed bytes, the output loads and stays near the
//! dense model's logits, and greedy MTP equals plain on it; and every
//! expert layout of the format fixtures quantizes and loads.
// The measured figures are reported on stderr (`-- --nocapture` shows them).
#![allow(clippy::print_stderr)]

use crate::common;
use crate::moe_model::{argmax, dir, last_logits, load};

use std::collections::BTreeMap;
use std::path::Path;

use common::parity::{depths, heldout_prompts, sweep};
use mlx_tensor::{Array, Dtype};
use runner::{QuantizeOptions, quantize_folder};
use serde_json::Value;

/// Layers holding experts: 6 trunk layers and the MTP layer.
const MOE_LAYERS: usize = 7;
/// Experts per layer, hidden width, expert inner width (config.json).
const E: usize = 8;
const H: usize = 256;
const I: usize = 64;

fn quantized(bits: u32) -> tempfile::TempDir {
    let q = tempfile::tempdir().unwrap();
    let o = QuantizeOptions {
        bits,
        group_size: 64,
        keep_mtp_precision: false,
        ..QuantizeOptions::default()
    };
    quantize_folder(&dir(), q.path(), &o).unwrap();
    q
}

fn tensors(dir: &Path) -> BTreeMap<String, Array> {
    mlx_tensor::io::load_safetensors(&dir.join("model.safetensors"))
        .unwrap()
        .tensors
}

fn shape(a: &Array) -> Vec<usize> {
    a.shape().iter().map(|&d| d as usize).collect()
}

/// True for the router and the shared-expert gate (8 bits in every output).
fn is_router(name: &str) -> bool {
    name.ends_with("mlp.gate.weight") || name.ends_with("shared_expert_gate.weight")
}

/// The data bytes a `bits`-bit copy of the source should hold, from the
/// source's shapes alone: every 2-D `.weight` and 3-D expert tensor packed
/// (`bits / 8` bytes a weight, routers 1 byte, plus a bf16 scale and bias
/// per 64 weights), everything else as stored.
fn expected_bytes(bits: usize) -> usize {
    let src = mlx_tensor::io::load_safetensors(&dir().join("model.safetensors"))
        .unwrap()
        .tensors;
    src.iter()
        .map(|(name, a)| {
            let n: usize = shape(a).iter().product();
            let expert = name.contains(".experts.") && a.ndim() == 3;
            if !(expert || name.ends_with(".weight") && a.ndim() == 2) {
                return a.nbytes();
            }
            let b = if is_router(name) { 8 } else { bits };
            n * b / 8 + 2 * (n / 64) * 2
        })
        .sum()
}

/// At 4 and 8 bits: no fused or dense expert tensor is left; each layer's
/// `switch_mlp.{gate,up,down}_proj` is a uint32 `[E, out, in · bits / 32]`
/// with bf16 `[E, out, in / 64]` scales and biases; routers are 8-bit and
/// named in the quantization block (mlx-lm's Qwen MoE predicate); and the
/// file's data is exactly the packed size computed from the source shapes
/// (a copied bf16 expert stack would add 4x its packed bytes at q4).
#[test]
fn every_expert_stack_is_packed_at_the_expected_size() {
    for bits in [4, 8] {
        let q = quantized(bits);
        let t = tensors(q.path());
        let left: Vec<&String> = t.keys().filter(|n| n.contains(".experts.")).collect();
        assert!(
            left.is_empty(),
            "q{bits}: expert tensors not packed: {left:?}"
        );
        let stacks: Vec<&String> = t
            .keys()
            .filter(|n| n.contains(".switch_mlp.") && n.ends_with(".weight"))
            .collect();
        assert_eq!(stacks.len(), 3 * MOE_LAYERS, "q{bits}: {stacks:?}");
        for name in stacks {
            let module = name.strip_suffix(".weight").unwrap();
            let (out, input) = if module.ends_with("down_proj") {
                (H, I)
            } else {
                (I, H)
            };
            let w = &t[name];
            assert_eq!(w.dtype(), Dtype::Uint32, "{name}");
            assert_eq!(shape(w), [E, out, input * bits as usize / 32], "{name}");
            for part in ["scales", "biases"] {
                let s = &t[&format!("{module}.{part}")];
                assert_eq!(s.dtype(), Dtype::Bfloat16, "{module}.{part}");
                assert_eq!(shape(s), [E, out, input / 64], "{module}.{part}");
            }
        }
        let config = read_config(q.path());
        let block = &config["quantization"];
        for name in t.keys().filter(|n| is_router(n)) {
            assert_eq!(shape(&t[name])[1], H * 8 / 32, "{name}: not 8-bit");
            let module = name.strip_suffix(".weight").unwrap();
            let expect = if bits == 8 {
                Value::Null
            } else {
                serde_json::json!({"group_size": 64, "bits": 8})
            };
            assert_eq!(block[module], expect, "q{bits}: override of {module}");
        }
        let st = q.path().join("model.safetensors");
        let file = std::fs::metadata(&st).unwrap().len() as usize;
        let data: usize = t.values().map(Array::nbytes).sum();
        let source = std::fs::metadata(dir().join("model.safetensors"))
            .unwrap()
            .len();
        eprintln!("q{bits}: file {file} B (data {data} B) from a {source} B bf16 source");
        assert_eq!(
            data,
            expected_bytes(bits as usize),
            "q{bits}: packed data bytes"
        );
        assert!(
            file - data < 64 * 1024,
            "q{bits}: header of {} B",
            file - data
        );
    }
}

/// Last-position logits of the q4 and q8 copies against the dense f32
/// model on three held-out prompts: q8 within 5 % of the logit range and
/// picking the same next token, q4 within 25 %, and q8 closer than q4 (the
/// control: a writer that packed nothing, or packed garbage, fails one).
/// Measured: q8 1.1 %, 0.9 %, 0.7 %; q4 17 %, 13 %, 10 %.
#[test]
fn quantized_logits_stay_near_the_dense_model() {
    let dense = load(Dtype::Float32);
    let (q4, q8) = (quantized(4), quantized(8));
    let (m4, m8) = (common::load(q4.path()), common::load(q8.path()));
    for (p, prompt) in heldout_prompts(&dense).iter().take(3).enumerate() {
        let want = last_logits(&dense, prompt);
        let range = want.iter().fold(0.0f32, |r, x| r.max(x.abs()));
        let e4 = common::max_abs_diff(&last_logits(&m4, prompt), &want) / range;
        let got8 = last_logits(&m8, prompt);
        let e8 = common::max_abs_diff(&got8, &want) / range;
        eprintln!("prompt {p}: max |d logit| / range: q8 {e8:.4}, q4 {e4:.4} (range {range:.2})");
        assert!(e8 < 0.05, "prompt {p}: q8 error {e8}");
        assert!(e4 < 0.25, "prompt {p}: q4 error {e4}");
        assert!(e8 < e4, "prompt {p}: q8 {e8} not closer than q4 {e4}");
        assert_eq!(argmax(&got8), argmax(&want), "prompt {p}: q8 next token");
    }
}

/// Greedy MTP equals plain at every depth on the q4 and q8 copies (their
/// own plain output, not the dense model's), with drafts accepted: the
/// packed expert stacks run through the same kernel (on the CPU our rows
/// kernel, elsewhere `gather_qmm`) in the verify and the MTP head's MoE
/// alike.
#[test]
fn quantized_moe_speculates_losslessly_on_itself() {
    for bits in [4, 8] {
        let q = quantized(bits);
        let m = common::load(q.path());
        let prompts = heldout_prompts(&m);
        let (totals, compared) = sweep(&m, &prompts[..2], 64);
        for (depth, t) in depths().into_iter().zip(totals) {
            t.report(depth);
            assert!(t.accepted > 0, "q{bits} {depth:?}: {t:?}");
        }
        eprintln!("q{bits}: {compared} tokens compared");
    }
}

/// On the CPU the q4 copy's expert stacks go to our gathered rows kernel
/// (`QuantGatherRowsMatmulT`), never MLX's `GatherQMM`, for a one-token
/// step (the broadcast layout) and a three-token verify (the sorted
/// layout); with the rows kernel switched off (for measurement) they are
/// `GatherQMM` again. On a GPU it is `GatherQMM` either way. Both routes
/// give f32 last-position logits within 1e-5 of their range of each other
/// and the same next token (they differ by f32 summation order only;
/// measured 7.7e-7 and 6.4e-7).
#[test]
fn quantized_experts_on_the_cpu_take_the_gathered_rows_kernel() {
    let q = quantized(4);
    let m = common::load(q.path());
    let cpu = mlx_tensor::default_device() == mlx_tensor::Device::Cpu;
    for ids in [&[17_u32][..], &[17, 301, 5]] {
        let mut logits = Vec::new();
        for on in [true, false] {
            runner::set_cpu_quant_rows(on);
            let a = Array::from_slice(ids, &[ids.len() as i32]).unwrap();
            let h = m.model.forward(&a, &mut m.model.new_caches()).unwrap();
            let nodes = common::census(&h);
            let case = format!("{} tokens, rows kernel {on}: {nodes:?}", ids.len());
            let rows = nodes.get("QuantGatherRowsMatmulT").copied().unwrap_or(0);
            let mlx = nodes.get("GatherQMM").copied().unwrap_or(0);
            assert_eq!(rows > 0, cpu && on, "{case}");
            assert_eq!(mlx > 0, !(cpu && on), "{case}");
            assert_eq!(rows + mlx, 6 * 3, "{case}: gate, up, down in 6 layers");
            logits.push(last_logits(&m, ids));
        }
        runner::set_cpu_quant_rows(true);
        let range = logits[1].iter().fold(0.0f32, |r, x| r.max(x.abs()));
        let d = common::max_abs_diff(&logits[0], &logits[1]) / range;
        eprintln!(
            "{} tokens: max |d logit| / range, rows kernel against GatherQMM: {d:.2e}",
            ids.len()
        );
        assert!(d < 1e-5, "{} tokens: {d}", ids.len());
        assert_eq!(
            argmax(&logits[0]),
            argmax(&logits[1]),
            "{} tokens",
            ids.len()
        );
    }
}

/// Every expert layout of the `fixtures/formats/*moe-*` folders (random
/// weights, hidden 64, experts 32 wide) quantized to 8 bits in groups of
/// 32: no expert tensor is left dense (hub fused stacks become packed
/// `switch_mlp`, mlx-lm's dense `switch_mlp` is packed under its names,
/// per-expert matrices are packed one by one), the router is 8-bit except
/// GLM-4-MoE's, which mlx-lm never quantizes (kept dense, marked `false`),
/// and the output loads and stays within 5 % of the dense logits' range
/// (measured: 1.1 % to 1.9 %).
#[test]
fn every_expert_layout_quantizes_and_loads() {
    let cases = [
        ("qwen3_5_moe-hub-f32", true),
        ("qwen3_5_moe-mlx-f32", true),
        ("qwen3_moe-hub-f32", true),
        ("qwen2_moe-hub-f32", true),
        ("glm4_moe-hf-f32", false),
    ];
    for (name, router_packed) in cases {
        let src = crate::formats::prepared(
            &Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/formats")
                .join(name),
        );
        let q = tempfile::tempdir().unwrap();
        let o = QuantizeOptions {
            bits: 8,
            group_size: 32,
            keep_mtp_precision: false,
            ..QuantizeOptions::default()
        };
        quantize_folder(src.path(), q.path(), &o).unwrap_or_else(|e| panic!("{name}: {e}"));
        let t = tensors(q.path());
        let experts: Vec<&String> = t
            .keys()
            .filter(|n| {
                (n.contains(".experts.") || n.contains(".switch_mlp.")) && n.ends_with(".weight")
            })
            .collect();
        assert!(!experts.is_empty(), "{name}: no expert tensors");
        for n in experts {
            assert_eq!(t[n].dtype(), Dtype::Uint32, "{name}: {n} not packed");
        }
        assert!(
            !t.keys()
                .any(|n| n.ends_with("experts.gate_up_proj") || n.ends_with("experts.down_proj")),
            "{name}: a fused hub stack was copied"
        );
        let block = &read_config(q.path())["quantization"];
        for n in t.keys().filter(|n| n.ends_with("mlp.gate.weight")) {
            let module = n.strip_suffix(".weight").unwrap();
            if router_packed {
                assert_eq!(t[n].dtype(), Dtype::Uint32, "{name}: {n}");
                assert_eq!(block[module]["bits"], 8, "{name}: {module}");
            } else {
                assert_eq!(t[n].dtype(), Dtype::Float32, "{name}: {n}");
                assert_eq!(block[module], false, "{name}: {module}");
            }
        }
        let (dense, packed) = (common::load(src.path()), common::load(q.path()));
        let prompt = [5, 77, 130, 9, 201, 44, 3, 250];
        let want = last_logits(&dense, &prompt);
        let range = want.iter().fold(0.0f32, |r, x| r.max(x.abs()));
        let e = common::max_abs_diff(&last_logits(&packed, &prompt), &want) / range;
        eprintln!("{name}: q8 max |d logit| / range {e:.4}");
        assert!(e < 0.05, "{name}: q8 error {e}");
    }
}

fn read_config(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap()
}

/// `--keep-mtp-precision` on the MoE model: the MTP layer's fused hub
/// expert stacks stay bf16 under their hub names (the trunk's are packed
/// `switch_mlp`), its other matrices are marked `false`, and the mixed
/// folder loads and speculates losslessly (one prompt, every depth).
#[test]
fn keep_mtp_precision_leaves_the_moe_head_dense() {
    let q = tempfile::tempdir().unwrap();
    let o = QuantizeOptions {
        bits: 4,
        group_size: 64,
        keep_mtp_precision: true,
        ..QuantizeOptions::default()
    };
    let report = quantize_folder(&dir(), q.path(), &o).unwrap();
    // The routers are reported as packed at 8 bits, and only they.
    assert!(!report.other_precision.is_empty());
    for (m, bits, group) in &report.other_precision {
        assert!(
            is_router(&format!("{m}.weight")),
            "{m} packed at {bits} bits"
        );
        assert_eq!((*bits, *group), (8, 64), "{m}");
    }
    let t = tensors(q.path());
    for name in [
        "mtp.layers.0.mlp.experts.gate_up_proj",
        "mtp.layers.0.mlp.experts.down_proj",
    ] {
        assert_eq!(t[name].dtype(), Dtype::Bfloat16, "{name}");
        assert!(
            report.kept.iter().any(|k| k == name),
            "{name} not reported kept"
        );
    }
    assert!(
        !t.keys()
            .any(|n| n.starts_with("mtp.") && n.contains("switch_mlp"))
    );
    let w = &t["model.language_model.layers.0.mlp.switch_mlp.down_proj.weight"];
    assert_eq!(w.dtype(), Dtype::Uint32);
    assert_eq!(read_config(q.path())["quantization"]["mtp.fc"], false);
    let m = common::load(q.path());
    let prompts = heldout_prompts(&m);
    let (totals, _) = sweep(&m, &prompts[..1], 32);
    for (depth, t) in depths().into_iter().zip(totals) {
        assert!(t.accepted > 0, "{depth:?}: {t:?}");
    }
}
