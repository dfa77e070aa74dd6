//! Quantized checkpoints: `quantize_folder` → load → generate, logits against f32, bad input.

use crate::common;
use crate::common::Generate;

use std::collections::BTreeMap;
use std::path::Path;

use mlx_tensor::ops::QuantMode;
use mlx_tensor::{Array, Dtype, ops};
use runner::SamplingOptions as Options;
use runner::testing::{Arch, Fixture};
use runner::testing::{QuantConfig, QuantParams};
use runner::{GenerateOptions, Model, Session};
use runner::{QuantizeOptions, quantize_folder};
use serde_json::{Value, json};

fn tokens(n: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 11) % 250) as u32).collect()
}

fn logits(m: &dyn Model, ids: &[u32]) -> Vec<f32> {
    let a = Array::from_slice(ids, &[ids.len() as i32]).unwrap();
    let h = m.forward(&a, &mut m.new_caches()).unwrap();
    m.unembed(&h).unwrap().to_vec::<f32>().unwrap()
}

fn opts(bits: u32, group_size: u32) -> QuantizeOptions {
    QuantizeOptions {
        bits,
        group_size,
        keep_mtp_precision: false,
        ..QuantizeOptions::default()
    }
}

/// Quantizes `src` into a fresh temporary folder.
fn quantize(src: &Path, o: QuantizeOptions) -> tempfile::TempDir {
    let dst = tempfile::tempdir().unwrap();
    quantize_folder(src, dst.path(), &o).unwrap();
    dst
}

fn greedy_tokens(m: &runner::LoadedModel, prompt: &str, n: usize) -> Vec<u32> {
    let ids = m.tokenizer.encode(prompt, false).unwrap();
    let o = GenerateOptions {
        max_tokens: n,
        sampling: Options::greedy(),
        ..GenerateOptions::default()
    };
    let g = Session::new(m.model.as_ref())
        .run(&m.tokenizer, &ids, &o)
        .unwrap();
    g.token_ids
}

fn read_config(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap()
}

/// The tensors of a folder's model.safetensors, by name.
fn tensors(dir: &Path) -> BTreeMap<String, Array> {
    mlx_tensor::io::load_safetensors(&dir.join("model.safetensors"))
        .unwrap()
        .tensors
}

/// Writes a dense f32 copy of the quantized folder `q`: every triple dequantized.
fn dequantized_copy(q: &Path, params: QuantParams) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    let t = tensors(q);
    let mut dense = Vec::new();
    for (name, a) in &t {
        if name.ends_with(".scales") || name.ends_with(".biases") {
            continue;
        }
        let a = match name.strip_suffix(".weight") {
            Some(m) if t.contains_key(&format!("{m}.scales")) => {
                let scales = &t[&format!("{m}.scales")];
                // Affine scales are floats; the floating-point modes' stay uint8.
                let scales = match params.mode {
                    QuantMode::Affine => scales.as_type(Dtype::Float32).unwrap(),
                    _ => scales.clone(),
                };
                let biases = t
                    .get(&format!("{m}.biases"))
                    .map(|b| b.as_type(Dtype::Float32).unwrap());
                ops::dequantize_mode(
                    a,
                    &scales,
                    biases.as_ref(),
                    params.group_size as i32,
                    params.bits as i32,
                    params.mode,
                    Dtype::Float32,
                )
                .unwrap()
            }
            _ => a.as_type(Dtype::Float32).unwrap(),
        };
        dense.push((name.clone(), a));
    }
    mlx_tensor::io::save_safetensors(
        &out.path().join("model.safetensors"),
        dense.iter().map(|(n, a)| (n.as_str(), a)),
    )
    .unwrap();
    let mut c = read_config(q);
    let o = c.as_object_mut().unwrap();
    o.remove("quantization");
    o.remove("quantization_config");
    std::fs::write(out.path().join("config.json"), c.to_string()).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(q.join(f), out.path().join(f)).unwrap();
    }
    out
}

/// Largest |a - b| over the largest |b|: the error as a fraction of the logit scale.
fn relative_error(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0.0f32, |m, x| m.max(x.abs()));
    common::max_abs_diff(a, b) / scale
}

#[test]
fn every_family_loads_quantized_and_generates() {
    for arch in Arch::ALL {
        for tied in [false, true] {
            let fx = Fixture {
                tied,
                ..Fixture::new(arch)
            };
            let src = common::write(&fx, 21);
            let q = quantize(src.path(), opts(4, 32));
            let m = common::load(q.path());
            let out = greedy_tokens(&m, "hello world", 10);
            assert!(
                !out.is_empty() && out.len() <= 10,
                "{arch:?} tied={tied}: {out:?}"
            );
            assert!(out.iter().all(|&t| (t as usize) < fx.vocab));
            // The packed codes reach the model: 4-bit weights are uint32 with 8 codes each.
            let t = tensors(q.path());
            let w = &t["model.layers.0.mlp.down_proj.weight"];
            assert_eq!(w.dtype(), Dtype::Uint32);
            assert_eq!(w.shape().to_vec(), vec![64, 128 / 8]);
            assert_eq!(
                t.contains_key("lm_head.weight"),
                !tied,
                "{arch:?}: a tied model stores no lm_head"
            );
        }
    }
}

/// The quantized path (quantized_matmul, dequantized embedding rows) computes
/// the same function as a dense f32 model holding the dequantized weights.
/// Both run f32 math on identical values and differ only in summation order:
/// measured ≤ 5e-7 of the logit scale; the bound is 1e-4.
#[test]
fn quantized_matmul_equals_dense_math_on_dequantized_weights() {
    for (arch, bits, group_size) in [
        (Arch::Qwen3, 4, 32),
        (Arch::Llama, 8, 64),
        (Arch::Qwen2, 4, 64),
    ] {
        let src = common::write(&Fixture::new(arch), 5);
        let q = quantize(src.path(), opts(bits, group_size));
        let dense = dequantized_copy(q.path(), QuantParams::affine(group_size, bits));
        let ids = tokens(9);
        let a = logits(common::load(q.path()).model.as_ref(), &ids);
        let b = logits(common::load(dense.path()).model.as_ref(), &ids);
        let e = relative_error(&a, &b);
        assert!(
            e < 1e-4,
            "{arch:?} q{bits} g{group_size}: relative error {e}"
        );
    }
}

/// quantize → load against the f32 model on one fixture (2 layers, logits of
/// order 10, seed 5, 9 tokens × 272 vocab, group 64). Measured relative errors
/// (max |Δlogit| / max |logit|): q8 0.0072, q4 0.124. Bounds: q8 < 0.02, q4 < 0.25,
/// and q4 must be worse than q8 (the control: a quantizer that did nothing would pass
/// the bounds but not this).
#[test]
fn round_trip_logits_are_close_to_f32() {
    let src = common::write(&Fixture::new(Arch::Qwen3), 5);
    let ids = tokens(9);
    let f32_logits = logits(common::load(src.path()).model.as_ref(), &ids);
    let err = |bits| {
        let q = quantize(src.path(), opts(bits, 64));
        relative_error(
            &logits(common::load(q.path()).model.as_ref(), &ids),
            &f32_logits,
        )
    };
    let (e8, e4) = (err(8), err(4));
    assert!(e8 < 0.02, "q8 relative error {e8}");
    assert!(e4 < 0.25, "q4 relative error {e4}");
    assert!(
        e4 > 2.0 * e8,
        "q4 ({e4}) should be clearly worse than q8 ({e8})"
    );
    assert!(e8 > 0.0, "q8 changed nothing: was anything quantized?");
}

/// `quantize --mode` in each of MLX's floating-point modes writes mlx-lm's
/// layout (uint8 scales, no biases, the mode in the config block, its fixed
/// sizes), the folder loads, its logits are the dense model's on the
/// dequantized weights, and its error against f32 orders as the bits do.
#[test]
fn floating_point_modes_quantize_load_and_compute_their_dequantized_weights() {
    let src = common::write(&Fixture::new(Arch::Qwen3), 5);
    let ids = tokens(9);
    let f32_logits = logits(common::load(src.path()).model.as_ref(), &ids);
    let mut errors = BTreeMap::new();
    for mode in [QuantMode::Mxfp4, QuantMode::Mxfp8, QuantMode::Nvfp4] {
        let case = mode.name();
        let o = QuantizeOptions::for_mode(mode);
        let q = quantize(src.path(), o);
        let c = read_config(q.path());
        let (g, b) = mode.fixed().unwrap();
        assert_eq!(c["quantization"]["mode"], case, "{case}");
        assert_eq!(c["quantization"]["group_size"], g, "{case}");
        assert_eq!(c["quantization"]["bits"], b, "{case}");
        let t = tensors(q.path());
        let scales: Vec<_> = t.iter().filter(|(n, _)| n.ends_with(".scales")).collect();
        assert!(!scales.is_empty(), "{case}: nothing was quantized");
        for (name, a) in scales {
            assert_eq!(a.dtype(), Dtype::Uint8, "{case}: {name}");
        }
        assert!(
            !t.keys().any(|n| n.ends_with(".biases")),
            "{case}: a floating-point mode stores no biases"
        );
        let got = logits(common::load(q.path()).model.as_ref(), &ids);
        let dense = dequantized_copy(q.path(), fp_params(mode));
        let want = logits(common::load(dense.path()).model.as_ref(), &ids);
        let same = relative_error(&got, &want);
        assert!(same < 1e-4, "{case}: {same} from its dequantized weights");
        errors.insert(case, relative_error(&got, &f32_logits));
    }
    let (mx4, mx8, nv4) = (errors["mxfp4"], errors["mxfp8"], errors["nvfp4"]);
    assert!(mx8 > 0.0 && mx8 < 0.05, "mxfp8 relative error {mx8}");
    assert!(mx4 < 0.3 && nv4 < 0.3, "fp4 relative errors {mx4}, {nv4}");
    assert!(
        mx4 > 2.0 * mx8,
        "mxfp4 ({mx4}) should be clearly worse than mxfp8 ({mx8})"
    );
    // A mode's sizes are its own: other bits or groups are refused by name.
    let fresh = tempfile::tempdir().unwrap();
    let out = fresh.path().join("out");
    for (o, needles) in [
        (
            QuantizeOptions {
                bits: 8,
                ..QuantizeOptions::for_mode(QuantMode::Mxfp4)
            },
            ["--bits", "mxfp4", "always 4"],
        ),
        (
            QuantizeOptions {
                group_size: 64,
                ..QuantizeOptions::for_mode(QuantMode::Nvfp4)
            },
            ["--group-size", "nvfp4", "always 16"],
        ),
    ] {
        let e = quantize_folder(src.path(), &out, &o)
            .unwrap_err()
            .to_string();
        for n in needles {
            assert!(e.contains(n), "{o:?}: `{e}` should mention `{n}`");
        }
    }
    assert!(
        !out.exists(),
        "a rejected run must not create the output folder"
    );
}

fn bundled() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../models/tiny-mtp"
    ))
}

/// The bundled tiny-mtp quantized to q4 and q8 (group 64) loads and generates;
/// q8's greedy text stays on the f32 model's track (measured: 16 of 16 tokens
/// equal; q4: 3 of 16, so q4 is only required to generate).
#[test]
fn bundled_model_q4_and_q8_load_and_generate() {
    let prompt = "def f(";
    let reference = greedy_tokens(&common::load(bundled()), prompt, 16);
    for bits in [4, 8] {
        let q = quantize(bundled(), opts(bits, 64));
        let c = read_config(q.path());
        assert_eq!(c["quantization"]["bits"], bits);
        assert_eq!(c["quantization_config"], c["quantization"]);
        for f in [
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
            "README.md",
        ] {
            assert!(q.path().join(f).is_file(), "q{bits}: {f} missing");
        }
        let m = common::load(q.path());
        let out = greedy_tokens(&m, prompt, 16);
        assert_eq!(out.len(), 16, "q{bits}: {out:?}");
        let same = out
            .iter()
            .zip(&reference)
            .take_while(|(a, b)| a == b)
            .count();
        if bits == 8 {
            assert!(
                same >= 8,
                "q8 diverged after {same} tokens: {out:?} vs {reference:?}"
            );
        }
    }
}

#[test]
fn keep_mtp_precision_leaves_the_head_dense_and_marks_it_false() {
    let fx = Fixture {
        mtp: true,
        ..Fixture::new(Arch::Qwen3)
    };
    let src = common::write(&fx, 3);
    for keep in [false, true] {
        let dst = tempfile::tempdir().unwrap();
        let o = QuantizeOptions {
            keep_mtp_precision: keep,
            ..opts(4, 64)
        };
        let r = quantize_folder(src.path(), dst.path(), &o).unwrap();
        let t = tensors(dst.path());
        let q = &read_config(dst.path())["quantization"];
        assert_eq!(t.contains_key("mtp.fc.scales"), !keep);
        assert_eq!(t["mtp.fc.weight"].dtype() == Dtype::Uint32, !keep);
        assert_eq!(q.get("mtp.fc") == Some(&json!(false)), keep, "{q}");
        // The fixture's head is complete: its projection and its block's linears.
        if keep {
            assert!(r.kept.iter().all(|m| m.starts_with("mtp.")), "{:?}", r.kept);
            assert!(r.kept.iter().any(|m| m == "mtp.fc"), "{:?}", r.kept);
            assert!(
                r.kept.iter().any(|m| m == "mtp.layers.0.self_attn.q_proj"),
                "{:?}",
                r.kept
            );
            assert!(!t.contains_key("mtp.layers.0.mlp.up_proj.scales"));
        } else {
            assert!(r.kept.is_empty(), "{:?}", r.kept);
            assert!(t.contains_key("mtp.layers.0.mlp.up_proj.scales"));
        }
        // Norms are never quantized.
        assert!(!t.contains_key("mtp.norm.scales"));
        assert!(t.contains_key("model.layers.0.mlp.up_proj.scales"));
    }
}

/// Bad options and folders are errors naming the option and the fix.
#[test]
fn bad_quantize_options_are_errors() {
    let src = common::write(&Fixture::new(Arch::Llama), 1);
    let check = |o: QuantizeOptions, dst: &Path, needles: &[&str]| {
        let e = quantize_folder(src.path(), dst, &o)
            .unwrap_err()
            .to_string();
        for n in needles {
            assert!(e.contains(n), "{o:?}: `{e}` should mention `{n}`");
        }
    };
    let fresh = tempfile::tempdir().unwrap();
    let out = fresh.path().join("out");
    check(opts(3, 64), &out, &["--bits", "3", "use 4 or 8"]);
    check(opts(16, 64), &out, &["--bits", "16"]);
    check(opts(4, 48), &out, &["--group-size", "48", "32, 64 or 128"]);
    check(opts(8, 16), &out, &["--group-size", "16"]);
    // hidden_size 64 is not a multiple of 128.
    check(
        opts(4, 128),
        &out,
        &["--group-size", "hidden_size 64", "128"],
    );
    assert!(
        !out.exists(),
        "a rejected run must not create the output folder"
    );
    // The output folder exists and is not empty.
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "x").unwrap();
    check(opts(4, 64), &out, &["--out", "not empty", "new folder"]);
    // An already quantized model.
    let q = quantize(src.path(), opts(4, 64));
    let e = quantize_folder(q.path(), &fresh.path().join("again"), &opts(8, 64))
        .unwrap_err()
        .to_string();
    assert!(e.contains("already quantized"), "{e}");
}

/// Rewrites one tensor of a quantized folder's model.safetensors.
fn replace_tensor(dir: &Path, name: &str, f: impl FnOnce(&Array) -> Array) {
    let mut t = tensors(dir);
    let a = f(&t[name]);
    t.insert(name.to_owned(), a);
    mlx_tensor::io::save_safetensors(
        &dir.join("model.safetensors"),
        t.iter().map(|(n, a)| (n.as_str(), a)),
    )
    .unwrap();
}

fn load_err(dir: &Path) -> String {
    runner::load(dir, runner::LoadOptions::default(), |_, _| {})
        .unwrap_err()
        .to_string()
}

#[test]
fn mis_shaped_quantized_tensors_are_errors() {
    let src = common::write(&Fixture::new(Arch::Llama), 2);
    let module = "model.layers.1.mlp.gate_proj";
    // Scales of a group size of 32 under a config saying 64: [128, 1] expected, [128, 2] found.
    let q = quantize(src.path(), opts(4, 64));
    replace_tensor(q.path(), &format!("{module}.scales"), |s| {
        ops::concatenate(&[s.clone(), s.clone()], 1).unwrap()
    });
    let e = load_err(q.path());
    assert!(
        e.contains(&format!("{module}.scales")) && e.contains("[128, 1]") && e.contains("[128, 2]"),
        "{e}"
    );
    // A config whose bits disagree with the packed width.
    let q = quantize(src.path(), opts(4, 64));
    let mut c = read_config(q.path());
    c["quantization"]["bits"] = json!(8);
    c.as_object_mut().unwrap().remove("quantization_config");
    std::fs::write(q.path().join("config.json"), c.to_string()).unwrap();
    let e = load_err(q.path());
    assert!(
        e.contains("model.embed_tokens.weight")
            && e.contains("[272, 16]")
            && e.contains("[272, 8]"),
        "{e}"
    );
    // A module marked false whose scales are present.
    let q = quantize(src.path(), opts(4, 64));
    let mut c = read_config(q.path());
    c["quantization"][module] = json!(false);
    std::fs::write(q.path().join("config.json"), c.to_string()).unwrap();
    let e = load_err(q.path());
    assert!(e.contains(module) && e.contains("marked false"), "{e}");
    // Packed weights but no quantization block.
    let q = quantize(src.path(), opts(4, 64));
    let mut c = read_config(q.path());
    c.as_object_mut().unwrap().remove("quantization");
    c.as_object_mut().unwrap().remove("quantization_config");
    std::fs::write(q.path().join("config.json"), c.to_string()).unwrap();
    let e = load_err(q.path());
    assert!(e.contains("quantization") && e.contains("absent"), "{e}");
    // A uint32 weight with no scales at all.
    let q = quantize(src.path(), opts(4, 64));
    let mut t = tensors(q.path());
    t.remove(&format!("{module}.scales"));
    mlx_tensor::io::save_safetensors(
        &q.path().join("model.safetensors"),
        t.iter().map(|(n, a)| (n.as_str(), a)),
    )
    .unwrap();
    let e = load_err(q.path());
    assert!(
        e.contains(&format!("{module}.weight")) && e.contains("U32"),
        "{e}"
    );
}

/// `QuantConfig::from_config` on config.json snippets: `Ok(expected)` or an error mentioning `needle`.
#[test]
fn quantization_blocks_parse_as_mlx_lm_writes_them() {
    fn check(config: Value, expected: Result<Option<QuantConfig>, &str>) {
        let got = QuantConfig::from_config(&config, Path::new("m/config.json"));
        match (got, expected) {
            (Ok(g), Ok(e)) => assert_eq!(g, e, "{config}"),
            (Err(g), Err(needle)) => {
                let g = g.to_string();
                assert!(
                    g.contains(needle) && g.contains("m/config.json"),
                    "{config}: `{g}` lacks `{needle}`"
                );
            }
            (g, e) => panic!("{config}: got {g:?}, expected {e:?}"),
        }
    }
    let p = |group_size, bits| QuantParams::affine(group_size, bits);
    let cfg = |default, overrides: &[(&str, Option<QuantParams>)]| {
        Ok(Some(QuantConfig {
            default,
            overrides: overrides.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        }))
    };
    check(json!({}), Ok(None));
    check(json!({"quantization": null}), Ok(None));
    check(
        json!({"quantization": {"group_size": 64, "bits": 4}}),
        cfg(p(64, 4), &[]),
    );
    check(
        json!({"quantization_config": {"group_size": 32, "bits": 8, "mode": "affine"}}),
        cfg(p(32, 8), &[]),
    );
    check(
        json!({"quantization": {"group_size": 64, "bits": 4, "mtp.fc": false,
            "lm_head": {"bits": 8}, "model.embed_tokens": {"group_size": 32, "bits": 6}}}),
        cfg(
            p(64, 4),
            &[
                ("mtp.fc", None),
                ("lm_head", Some(p(64, 8))),
                ("model.embed_tokens", Some(p(32, 6))),
            ],
        ),
    );
    // `quantization` wins over `quantization_config`.
    check(
        json!({"quantization": {"group_size": 128, "bits": 4}, "quantization_config": {"quant_method": "awq"}}),
        cfg(p(128, 4), &[]),
    );
    check(
        json!({"quantization": {"bits": 4}}),
        Err("`group_size` is missing"),
    );
    check(
        json!({"quantization": {"group_size": 48, "bits": 4}}),
        Err("`group_size` is 48"),
    );
    check(
        json!({"quantization": {"group_size": 64, "bits": 7}}),
        Err("`bits` is 7"),
    );
    check(
        json!({"quantization": {"group_size": 64, "bits": "4"}}),
        Err("positive integer"),
    );
    check(json!({"quantization": 4}), Err("must be an object"));
    // MLX's floating-point modes: each fixes its group size and bits.
    let fp = |mode, group_size, bits| QuantParams {
        group_size,
        bits,
        mode,
    };
    let (mxfp4, mxfp8, nvfp4) = (
        fp(QuantMode::Mxfp4, 32, 4),
        fp(QuantMode::Mxfp8, 32, 8),
        fp(QuantMode::Nvfp4, 16, 4),
    );
    check(
        json!({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4"}}),
        cfg(mxfp4, &[]),
    );
    check(
        json!({"quantization_config": {"group_size": 32, "bits": 8, "mode": "mxfp8"}}),
        cfg(mxfp8, &[]),
    );
    check(json!({"quantization": {"mode": "nvfp4"}}), cfg(nvfp4, &[]));
    check(
        json!({"quantization": {"group_size": 64, "bits": 4, "mode": "mxfp4"}}),
        Err("`group_size` is 64; MLX's mxfp4 mode supports [32]"),
    );
    check(
        json!({"quantization": {"group_size": 16, "bits": 8, "mode": "nvfp4"}}),
        Err("`bits` is 8; MLX's nvfp4 mode supports [4]"),
    );
    check(
        json!({"quantization": {"group_size": 32, "bits": 4, "mode": "int4"}}),
        Err("mode \"int4\" is not an MLX quantization mode"),
    );
    // Per-module modes. A module without one is affine, as mlx-lm's
    // `to_quantized` reads it: its MoE predicate writes the routers as
    // `{"group_size": 64, "bits": 8}` inside an mxfp4 model. A module in
    // another mode than the default takes that mode's sizes where it names none.
    check(
        json!({"quantization": {"group_size": 64, "bits": 4,
            "lm_head": {"group_size": 32, "bits": 8, "mode": "mxfp8"},
            "model.embed_tokens": {"mode": "nvfp4"}}}),
        cfg(
            p(64, 4),
            &[
                ("lm_head", Some(mxfp8)),
                ("model.embed_tokens", Some(nvfp4)),
            ],
        ),
    );
    check(
        json!({"quantization": {"group_size": 32, "bits": 4, "mode": "mxfp4",
            "model.layers.1.mlp.gate": {"group_size": 64, "bits": 8},
            "lm_head": {"bits": 8}}}),
        cfg(
            mxfp4,
            &[
                ("model.layers.1.mlp.gate", Some(p(64, 8))),
                ("lm_head", Some(p(64, 8))),
            ],
        ),
    );
    check(
        json!({"quantization": {"group_size": 16, "bits": 4, "mode": "nvfp4",
            "lm_head": {"group_size": 32, "mode": "nvfp4"}, "mtp.fc": false}}),
        Err("module `lm_head`: `group_size` is 32; MLX's nvfp4 mode supports [16]"),
    );
    check(
        json!({"quantization": {"group_size": 16, "bits": 4, "mode": "nvfp4",
            "lm_head": {"group_size": 64, "bits": 8, "mode": "affine"}, "mtp.fc": false}}),
        cfg(nvfp4, &[("lm_head", Some(p(64, 8))), ("mtp.fc", None)]),
    );
    // An nvfp4 expert stack with a per-expert tensor scale: MLX has it on the GPU only.
    check(
        json!({"quantization": {"group_size": 16, "bits": 4, "mode": "nvfp4",
            "model.layers.0.mlp.switch_mlp.up_proj":
                {"group_size": 16, "bits": 4, "mode": "nvfp4", "global_scale": true}}}),
        Err("module `model.layers.0.mlp.switch_mlp.up_proj`: `global_scale`"),
    );
    check(
        json!({"quantization_config": {"quant_method": "gptq", "bits": 4}}),
        Err("gptq"),
    );
    check(
        json!({"quantization": {"group_size": 64, "bits": 4,
            "lm_head": {"group_size": 32, "bits": 3, "mode": "affine"}}}),
        cfg(p(64, 4), &[("lm_head", Some(p(32, 3)))]),
    );
    check(
        json!({"quantization": {"group_size": 64, "bits": 4, "lm_head": {"bits": 3, "group_size": 96}}}),
        Err("module `lm_head`"),
    );
    check(
        json!({"quantization": {"group_size": 64, "bits": 4, "lm_head": "no"}}),
        Err("module `lm_head`"),
    );
}

/// Layers built directly: a quantized `Linear` and `Embedding` read the packed
/// tensors of every MLX mode (affine with biases; mxfp4, mxfp8 and nvfp4 with
/// uint8 scales and none) and agree with dense math on the dequantized matrix
/// (f32; 1e-4 absolute for outputs of order 1; embedding rows exactly), for 3
/// rows and for a 40-row prefill (the CPU's sliced affine kernel).
#[test]
fn quantized_layers_match_dense_layers_on_the_dequantized_matrix() {
    use runner::LinearLayout;
    use runner::testing::{Embedding, Linear, QuantizedTensor, Weights};
    let key = mlx_tensor::random::key(9).unwrap();
    let dense = mlx_tensor::random::normal(&[48, 64], Dtype::Float32, &key).unwrap();
    for params in [
        QuantParams::affine(64, 4),
        QuantParams::affine(32, 8),
        fp_params(QuantMode::Mxfp4),
        fp_params(QuantMode::Mxfp8),
        fp_params(QuantMode::Nvfp4),
    ] {
        let case = format!("{params:?}");
        let q = QuantizedTensor::quantize(&dense, params).unwrap();
        assert_eq!(
            q.biases.is_some(),
            params.mode == QuantMode::Affine,
            "{case}"
        );
        let deq = q.dequantize().unwrap();
        assert_eq!(deq.dtype(), Dtype::Float32, "{case}");
        let mut map = std::collections::HashMap::new();
        let stored = [("weight", Some(&q.weight)), ("scales", Some(&q.scales))];
        for (suffix, a) in stored.into_iter().chain([("biases", q.biases.as_ref())]) {
            if let Some(a) = a {
                map.insert(format!("mtp.fc.{suffix}"), a.clone());
                map.insert(format!("emb.{suffix}"), a.clone());
            }
        }
        let quant = QuantConfig {
            default: params,
            overrides: BTreeMap::new(),
        };
        let mut w = Weights::from_map(map, Dtype::Float32).with_quantization(Some(quant));
        let lin = Linear::load(&mut w, "mtp.fc", 64, 48, false, LinearLayout::DEFAULT).unwrap();
        let emb = Embedding::load(&mut w, "emb", 48, 64).unwrap();
        assert!(lin.is_quantized() && emb.is_quantized(), "{case}");
        assert!(w.remaining().is_empty(), "{case}: {:?}", w.remaining());
        for rows in [3, 40] {
            let x = mlx_tensor::random::normal(&[rows, 64], Dtype::Float32, &key).unwrap();
            let want = Linear::from_weight(&deq, None, LinearLayout::DEFAULT)
                .unwrap()
                .forward(&x)
                .unwrap();
            let got = lin.forward(&x).unwrap();
            let d = common::max_abs_diff(
                &got.to_vec::<f32>().unwrap(),
                &want.to_vec::<f32>().unwrap(),
            );
            assert!(d < 1e-4, "{case}, {rows} rows: linear {d}");
        }
        let ids = Array::from_slice(&[0u32, 47, 5], &[3]).unwrap();
        let got = emb.forward(&ids).unwrap().to_vec::<f32>().unwrap();
        let want = deq.take(&ids, 0).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(got, want, "{case}: embedding rows are the dequantized rows");
        let tied = emb.as_linear(LinearLayout::DEFAULT).unwrap();
        assert!(tied.is_quantized(), "{case}: the tied head stays quantized");
    }
}

/// The group size and bits MLX's floating-point `mode` fixes.
fn fp_params(mode: QuantMode) -> QuantParams {
    let (group_size, bits) = mode.fixed().unwrap();
    QuantParams {
        group_size: group_size as u32,
        bits: bits as u32,
        mode,
    }
}

/// A floating-point-mode product of more rows than a step or a verify
/// takes, the CPU's dense route (`W` dequantized into f32 a block of output
/// rows at a time, MLX's f32 matmul, the blocks joined along the last
/// axis), equals `x @ W.T` on the dequantized matrix, in every mode: through
/// `dense_matmul_t` in blocks of 16 of 50 output rows (16 + 16 + 16 + 2,
/// one matmul node each) and through `matmul_t` as routed. f32, inputs of
/// order 1, 64 products per output: tolerance 1e-5 of the largest output
/// (the same f32 math in OpenBLAS's order; measured 2.6e-7 in blocks, 0 in
/// one block). A bf16 input gives a bf16 product within bf16 rounding of
/// the f32 one (half an ulp, 2^-8 of the largest output; measured 2.0e-3
/// of it; MLX's bf16 `quantized_matmul`, the route before, misses it:
/// 8.5e-3 in mxfp4).
/// `dense` quantized in `mode`, `x` times its dequantized transpose (the
/// reference product) and that product's largest magnitude.
fn fp_quantized_and_product(
    dense: &Array,
    x: &Array,
    mode: QuantMode,
) -> (runner::testing::QuantizedTensor, Vec<f32>, f32) {
    let q = runner::testing::QuantizedTensor::quantize(dense, fp_params(mode)).unwrap();
    mlx_tensor::eval(&q.arrays()).unwrap();
    let want = x.matmul(&q.dequantize().unwrap().t().unwrap()).unwrap();
    let want = want.to_vec::<f32>().unwrap();
    let scale = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    (q, want, scale)
}

/// A random f32 `[50, 64]` weight and a `[1, rows, 64]` input from `seed`.
fn fp_weight_and_input(seed: u64, rows: i32) -> (Array, Array) {
    let key = mlx_tensor::random::key(seed).unwrap();
    let dense = mlx_tensor::random::normal(&[50, 64], Dtype::Float32, &key).unwrap();
    let x = mlx_tensor::random::normal(&[1, rows, 64], Dtype::Float32, &key).unwrap();
    x.eval().unwrap();
    (dense, x)
}

#[test]
fn fp_products_of_many_rows_equal_the_dense_product_on_the_dequantized_weight() {
    let rows = ops::ROWS_MATMUL_MAX_ROWS * 2 + 6;
    let (dense, x) = fp_weight_and_input(11, rows);
    for mode in [QuantMode::Mxfp4, QuantMode::Mxfp8, QuantMode::Nvfp4] {
        let case = mode.name();
        let (q, want, scale) = fp_quantized_and_product(&dense, &x, mode);
        assert!(
            scale > 1.0,
            "{case}: outputs of order 1 expected, max {scale}"
        );
        let blocked = q.dense_matmul_t(&x, 16).unwrap();
        assert_eq!(
            common::census(&blocked).get("Matmul"),
            Some(&4),
            "{case}: one per block"
        );
        let routed = q.matmul_t(&x).unwrap();
        for (path, got) in [("blocks of 16", blocked), ("matmul_t", routed)] {
            assert_eq!(got.shape().to_vec(), vec![1, rows, 50], "{case}, {path}");
            assert_eq!(got.dtype(), Dtype::Float32, "{case}, {path}");
            let d = common::max_abs_diff(&got.to_vec::<f32>().unwrap(), &want);
            assert!(d <= 1e-5 * scale, "{case}, {path}: {d} against {scale}");
        }
        let half = x.as_type(Dtype::Bfloat16).unwrap();
        let got = q.matmul_t(&half).unwrap();
        assert_eq!(got.dtype(), Dtype::Bfloat16, "{case}: the input's dtype");
        let want = half
            .as_type(Dtype::Float32)
            .unwrap()
            .matmul(&q.dequantize().unwrap().t().unwrap())
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let got = got
            .as_type(Dtype::Float32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let d = common::max_abs_diff(&got, &want);
        assert!(d <= scale / 256.0, "{case}, bf16: {d} against {scale}");
    }
}

/// Which kernel a product takes, read from its lazy graph (no timing). On
/// the CPU a floating-point mode takes our rows kernel (`QuantRowsMatmulT`,
/// no `QuantizedMatmul`) up to `ROWS_MATMUL_MAX_ROWS` rows (a step, a
/// verify, a draft: its rows do not depend on each other) and from one row
/// more (a prefill chunk) the dense product: a `Matmul` node and neither
/// kernel. An affine product takes our rows kernel at every row count and
/// never goes dense. With the rows kernel switched off (for measurement)
/// the few-row products are MLX's `QuantizedMatmul` again. On a GPU every
/// quantized product keeps MLX's kernel.
#[test]
fn long_floating_point_products_on_the_cpu_go_dense() {
    let key = mlx_tensor::random::key(12).unwrap();
    let dense = mlx_tensor::random::normal(&[48, 64], Dtype::Float32, &key).unwrap();
    let few = ops::ROWS_MATMUL_MAX_ROWS;
    let cpu = mlx_tensor::default_device() == mlx_tensor::Device::Cpu;
    for params in [
        fp_params(QuantMode::Mxfp4),
        fp_params(QuantMode::Mxfp8),
        fp_params(QuantMode::Nvfp4),
        QuantParams::affine(64, 4),
    ] {
        let q = runner::testing::QuantizedTensor::quantize(&dense, params).unwrap();
        mlx_tensor::eval(&q.arrays()).unwrap();
        for rows in [1, 5, few, few + 1, 200] {
            for rows_kernel_on in [true, false] {
                runner::set_cpu_quant_rows(rows_kernel_on);
                let case = format!(
                    "{} bits {}, {rows} rows, rows kernel {rows_kernel_on}",
                    params.mode.name(),
                    params.bits
                );
                let x = mlx_tensor::random::normal(&[rows, 64], Dtype::Float32, &key).unwrap();
                x.eval().unwrap();
                let nodes = common::census(&q.matmul_t(&x).unwrap());
                let fp = params.mode != QuantMode::Affine;
                let want_dense = cpu && fp && rows > few;
                let want_rows = cpu && rows_kernel_on && !want_dense;
                assert_eq!(
                    nodes.contains_key("Matmul"),
                    want_dense,
                    "{case}: {nodes:?}"
                );
                assert_eq!(
                    nodes.contains_key("QuantRowsMatmulT"),
                    want_rows,
                    "{case}: {nodes:?}"
                );
                assert_eq!(
                    nodes.contains_key("QuantizedMatmul"),
                    !want_dense && !want_rows,
                    "{case}: {nodes:?}"
                );
            }
        }
    }
    runner::set_cpu_quant_rows(true);
}

/// A few-row floating-point product on the CPU (our rows kernel) equals
/// the f32 product on MLX's dequantized weight within summation order
/// (1e-5 of the largest output), and each row of a verify-sized product is
/// the one-row product bit for bit (on the CPU; a GPU keeps MLX's kernel).
#[test]
fn few_row_floating_point_products_match_the_dequantized_weight_row_by_row() {
    let rows = 7;
    let (dense, x) = fp_weight_and_input(13, rows);
    for mode in [QuantMode::Mxfp4, QuantMode::Mxfp8, QuantMode::Nvfp4] {
        let case = mode.name();
        let (q, want, scale) = fp_quantized_and_product(&dense, &x, mode);
        let got = q.matmul_t(&x).unwrap();
        assert_eq!(got.shape().to_vec(), vec![1, rows, 50], "{case}");
        let got = got.to_vec::<f32>().unwrap();
        let d = common::max_abs_diff(&got, &want);
        assert!(d <= 1e-5 * scale, "{case}: {d} against {scale}");
        let cpu = mlx_tensor::default_device() == mlx_tensor::Device::Cpu;
        for r in (0..rows).filter(|_| cpu) {
            let one = q.matmul_t(&x.slice_axis(1, r, r + 1).unwrap()).unwrap();
            let one = one.to_vec::<f32>().unwrap();
            let at = r as usize * 50;
            assert_eq!(one[..], got[at..at + 50], "{case}: row {r} alone");
        }
    }
}

/// An mlx-lm mxfp4 checkpoint (uint8 scales, no biases) whose config names
/// the wrong mode is refused naming the tensor and the mode, not read as
/// garbage: as affine (the scales' dtype), and a stray `.biases` in fp mode.
#[test]
fn a_floating_point_checkpoint_with_the_wrong_mode_is_refused() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/formats/qwen3-mlx-mxfp4");
    let q = crate::formats::prepared(&fixture);
    let good = read_config(q.path());
    let mut affine = good.clone();
    affine["quantization"] = json!({"group_size": 32, "bits": 4, "mode": "affine"});
    affine["quantization_config"] = affine["quantization"].clone();
    std::fs::write(q.path().join("config.json"), affine.to_string()).unwrap();
    let e = runner::load(q.path(), runner::LoadOptions::default(), |_, _| {})
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains(".scales") && e.contains("mode \"affine\" stores float scales"),
        "{e}"
    );
    std::fs::write(q.path().join("config.json"), good.to_string()).unwrap();
    let module = "model.layers.0.mlp.up_proj";
    let mut t = tensors(q.path());
    let scales = t[&format!("{module}.scales")]
        .as_type(Dtype::Float32)
        .unwrap();
    t.insert(format!("{module}.biases"), scales);
    mlx_tensor::io::save_safetensors(
        &q.path().join("model.safetensors"),
        t.iter().map(|(n, a)| (n.as_str(), a)),
    )
    .unwrap();
    let e = runner::load(q.path(), runner::LoadOptions::default(), |_, _| {})
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains(&format!("`{module}.biases`")) && e.contains("mxfp4"),
        "{e}"
    );
}

/// Speculative greedy (MTP head, depth 3) over two prompts, 48 tokens each:
/// asserts it equals plain greedy on the same model, returns the acceptance rate.
fn speculative_acceptance(dir: &Path) -> f64 {
    use runner::DepthPolicy;
    let m = common::load(dir);
    let o = GenerateOptions {
        max_tokens: 48,
        sampling: Options::greedy(),
        depth: DepthPolicy::Fixed(3),
        ..GenerateOptions::default()
    };
    let (mut accepted, mut drafted) = (0, 0);
    for prompt in ["def f(", "Once upon a time"] {
        let ids = m.tokenizer.encode(prompt, false).unwrap();
        let plain = Session::new(m.model.as_ref())
            .run(&m.tokenizer, &ids, &o)
            .unwrap();
        let spec = Session::with_mtp(m.model.as_ref())
            .unwrap()
            .run(&m.tokenizer, &ids, &o)
            .unwrap();
        let case = format!("{}: {prompt:?}", dir.display());
        let s = common::parity::same_as_plain(&case, &spec, &plain);
        accepted += s.accepted;
        drafted += s.drafted;
    }
    accepted as f64 / drafted as f64
}

/// The bundled model's MTP head, quantized with the trunk (q4, group 64) or kept
/// dense (`--keep-mtp-precision`), drafts for speculative decoding: greedy output
/// equals the same model's plain greedy output, and drafts are accepted. Measured
/// acceptance (2 prompts × 48 tokens, depth 3): unquantized 0.67, q4 0.50, q4 with
/// the head kept 0.53. Bound: > 0.35. Control: the q4 head with `mtp.fc.scales`
/// zeroed (the "acceptance near 0" damage) must fall below the bound, and stays lossless.
#[test]
fn quantized_mtp_head_speculates_losslessly() {
    for keep in [false, true] {
        let q = quantize(
            bundled(),
            QuantizeOptions {
                keep_mtp_precision: keep,
                ..opts(4, 64)
            },
        );
        let rate = speculative_acceptance(q.path());
        assert!(rate > 0.35, "keep={keep}: acceptance {rate}");
        if !keep {
            replace_tensor(q.path(), "mtp.fc.scales", |s| {
                ops::zeros(&s.shape(), s.dtype()).unwrap()
            });
            let damaged = speculative_acceptance(q.path());
            assert!(damaged < 0.35, "damaged head: acceptance {damaged}");
        }
    }
}

/// A source the loader would refuse is refused by `quantize_folder` too,
/// before any output exists: a broken generation_config.json or
/// tokenizer.json (files it copies) and a NaN in a weight (which packing
/// would turn into codes and scales that look valid).
#[test]
fn a_source_the_loader_refuses_is_not_quantized() {
    let damaged = |damage: &dyn Fn(&Path)| {
        let src = common::write(&Fixture::new(Arch::Llama), 1);
        damage(src.path());
        assert!(
            runner::load(src.path(), runner::LoadOptions::default(), |_, _| {}).is_err(),
            "the damaged fixture must not load"
        );
        let fresh = tempfile::tempdir().unwrap();
        let out = fresh.path().join("out");
        let e = quantize_folder(src.path(), &out, &opts(4, 64))
            .unwrap_err()
            .to_string();
        assert!(!out.exists(), "a refused source left {}", out.display());
        e
    };
    let e = damaged(&|d| std::fs::write(d.join("generation_config.json"), "{bad").unwrap());
    assert!(e.contains("generation_config.json"), "{e}");
    let e = damaged(&|d| {
        let t = std::fs::read(d.join("tokenizer.json")).unwrap();
        std::fs::write(d.join("tokenizer.json"), &t[..t.len() / 2]).unwrap();
    });
    assert!(e.contains("tokenizer.json"), "{e}");
    let e = damaged(&|d| {
        let file = d.join("model.safetensors");
        let mut t = mlx_tensor::io::load_safetensors(&file).unwrap().tensors;
        let norm = t
            .get("model.norm.weight")
            .expect("the fixture's final norm");
        let nan = ops::full(&norm.shape(), f32::NAN, norm.dtype()).unwrap();
        t.insert("model.norm.weight".into(), nan);
        mlx_tensor::eval(t.values()).unwrap();
        mlx_tensor::io::save_safetensors(&file, t.iter().map(|(n, a)| (n.as_str(), a))).unwrap();
    });
    assert!(e.contains("model.norm.weight"), "{e}");
}
