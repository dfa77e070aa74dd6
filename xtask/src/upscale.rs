//! `cargo xtask upscale`: a trained Qwen3 (+ MTP) model widened to a benchmark shape without changing what it computes.
//!
//! `upscale --model DIR --shape NAME --out DIR [--dtype bf16|f32] [--shard-mib N]`
//!
//! The rules live in [`widen`] (Qwen3 + MTP) and [`moe`] (Qwen3.5-MoE + MTP,
//! chosen when the source's `model_type` is `qwen3_5_moe`). The GPU bundle carries this xtask, so `gpu.sh`
//! builds the big shapes on the device (the 8b shape is 15.6 GB in bf16, but
//! only the source's ~50 MB are written; the zeros are file holes).

pub(crate) mod moe;
pub(crate) mod widen;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};

const USAGE: &str = "\
usage: cargo xtask upscale --model DIR --shape NAME --out DIR [--dtype bf16|f32] [--shard-mib N]
  --shape  24l | 1.7b | 8b | 0.6b, or hidden=N,intermediate=N,layers=N,heads=N,kv_heads=N,vocab=N
           for a qwen3_5_moe source: moe, or hidden=N,layers=N,heads=N,kv_heads=N,linear_key_heads=N,
           linear_value_heads=N,expert_copies=N,moe_intermediate=N,shared_intermediate=N,vocab=N
  --dtype  stored dtype of the weights (default bf16); f32 makes every scaling exact
  --shard-mib  most MiB per safetensors file (default 4096)";

/// Parses the flags and writes the upscale; prints one JSON summary line.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let (mut model, mut shape, mut out, mut dtype, mut shard_mib) =
        (None, None, None, widen::OutDtype::Bf16, 4096u64);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("`{a}` needs a value"));
        match a.as_str() {
            "--model" => model = Some(PathBuf::from(val()?)),
            "--shape" => shape = Some(val()?.clone()),
            "--out" => out = Some(PathBuf::from(val()?)),
            "--dtype" => dtype = widen::OutDtype::parse(val()?)?,
            "--shard-mib" => {
                shard_mib = val()?
                    .parse()
                    .context("--shard-mib: a whole number of MiB")?
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown upscale option `{other}`\n{USAGE}"),
        }
    }
    let (Some(model), Some(shape), Some(out)) = (model, shape, out) else {
        bail!("upscale needs --model, --shape and --out\n{USAGE}");
    };
    let start = Instant::now();
    let s = upscale_named(&model, &shape, &out, dtype, shard_mib.max(1) << 20)
        .with_context(|| format!("upscaling {} to {}", model.display(), out.display()))?;
    let line = serde_json::json!({
        "upscale": out.display().to_string(), "source": model.display().to_string(),
        "params": s.params, "bytes": s.bytes, "files": s.files.len(),
        "exact_qk": s.exact_qk, "f32_norms": s.f32_norms, "bias_channel": s.bias_channel,
        "seconds": start.elapsed().as_secs_f64(),
    });
    println!("{line}");
    Ok(())
}

/// Upscales `src` to the shape `name` (named or key=value) by the rules of its
/// family: [`moe`] for a `qwen3_5_moe` source, else [`widen`].
pub(crate) fn upscale_named(
    src: &Path,
    name: &str,
    out: &Path,
    dtype: widen::OutDtype,
    shard_bytes: u64,
) -> Result<widen::Summary> {
    Ok(if moe::is_moe_model(src) {
        moe::upscale(src, &moe::parse_shape(name)?, out, dtype, shard_bytes)?
    } else {
        widen::upscale(src, &widen::parse_shape(name)?, out, dtype, shard_bytes)?
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use serde_json::{Value, json};

    use super::widen::{self, BIAS, FC_GAIN, OutDtype, PAD_WEIGHT, Shape};

    /// A 1-layer Qwen3 + MTP source: hidden 8, MLP 12, heads 4 / 2 of 2, vocab 10;
    /// every value a distinct multiple of 1/8 (exact in bf16).
    fn source(dir: &Path) {
        let (h, i, hd, v) = (8usize, 12usize, 2usize, 10usize);
        let mut shapes: Vec<(String, Vec<usize>)> = vec![
            ("model.embed_tokens.weight".into(), vec![v, h]),
            ("model.norm.weight".into(), vec![h]),
            ("mtp.fc.weight".into(), vec![h, 2 * h]),
            ("mtp.pre_fc_norm_embedding.weight".into(), vec![h]),
            ("mtp.pre_fc_norm_hidden.weight".into(), vec![h]),
            ("mtp.norm.weight".into(), vec![h]),
        ];
        for p in ["model.layers.0", "mtp.layers.0"] {
            for (n, s) in [
                ("input_layernorm.weight", vec![h]),
                ("post_attention_layernorm.weight", vec![h]),
                ("self_attn.q_proj.weight", vec![4 * hd, h]),
                ("self_attn.k_proj.weight", vec![2 * hd, h]),
                ("self_attn.v_proj.weight", vec![2 * hd, h]),
                ("self_attn.o_proj.weight", vec![h, 4 * hd]),
                ("self_attn.q_norm.weight", vec![hd]),
                ("self_attn.k_norm.weight", vec![hd]),
                ("mlp.gate_proj.weight", vec![i, h]),
                ("mlp.up_proj.weight", vec![i, h]),
                ("mlp.down_proj.weight", vec![h, i]),
            ] {
                shapes.push((format!("{p}.{n}"), s));
            }
        }
        let mut header = serde_json::Map::new();
        let mut data = Vec::new();
        for (k, (name, shape)) in shapes.iter().enumerate() {
            let n: usize = shape.iter().product();
            let start = data.len();
            for j in 0..n {
                let x = (1 + (j + 7 * k) % 61) as f32 / 8.0;
                data.extend_from_slice(&((x.to_bits() >> 16) as u16).to_le_bytes());
            }
            header.insert(
                name.clone(),
                json!({"dtype": "BF16", "shape": shape, "data_offsets": [start, data.len()]}),
            );
        }
        let text = Value::Object(header).to_string();
        let mut file = (text.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(text.as_bytes());
        file.extend_from_slice(&data);
        std::fs::write(dir.join("model.safetensors"), file).unwrap();
        let config = json!({
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": h,
            "intermediate_size": i, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": hd, "vocab_size": v, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": true,
        });
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
    }

    fn read(dir: &Path) -> BTreeMap<String, widen::Src> {
        widen::read_safetensors(dir).unwrap()
    }

    /// `t[r, c]` of a 2-D tensor (a vector is one row).
    fn at(t: &widen::Src, r: usize, c: usize) -> f32 {
        t.get(r * t.shape.last().unwrap() + c)
    }

    fn upscaled(hidden: usize) -> (tempfile_dir::Dir, widen::Summary) {
        let d = tempfile_dir::Dir::new();
        source(&d.src);
        let shape = Shape {
            hidden,
            intermediate: 16,
            layers: 2,
            heads: 8,
            kv_heads: 2,
            vocab: 12,
        };
        let s = widen::upscale(&d.src, &shape, &d.out, OutDtype::Bf16, 1 << 30).unwrap();
        (d, s)
    }

    #[test]
    fn tensors_land_where_the_rules_say() {
        let (d, s) = upscaled(32);
        // H'/H = 4: the norm scale 1/2 is exact in bf16, so q/k are scaled and norms stay bf16.
        assert!(s.exact_qk && !s.f32_norms);
        assert_eq!(s.bias_channel, Some(8));
        let (a, b) = (read(&d.src), read(&d.out));
        let q = |t: &str| format!("model.layers.0.self_attn.{t}.weight");
        // Old query head i (group 2) -> 4 * (i / 2) + i % 2 (group 4): 0, 1, 4, 5.
        for (i, j) in [(0, 0), (1, 1), (2, 4), (3, 5)] {
            for r in 0..2 {
                for c in 0..8 {
                    assert_eq!(
                        at(&b[&q("q_proj")], 2 * j + r, c),
                        at(&a[&q("q_proj")], 2 * i + r, c) * 0.5
                    );
                    assert_eq!(
                        at(&b[&q("o_proj")], c, 2 * j + r),
                        at(&a[&q("o_proj")], c, 2 * i + r)
                    );
                }
                assert_eq!(at(&b[&q("q_proj")], 2 * j + r, 8), 0.0);
            }
        }
        for j in [2, 3, 6, 7] {
            assert!(
                (0..32).all(|c| at(&b[&q("q_proj")], 2 * j, c) == 0.0),
                "new head {j}"
            );
        }
        assert_eq!(at(&b[&q("k_proj")], 3, 7), at(&a[&q("k_proj")], 3, 7) * 0.5);
        assert_eq!(at(&b[&q("v_proj")], 3, 7), at(&a[&q("v_proj")], 3, 7));
        assert_eq!(at(&b[&q("q_norm")], 0, 1), at(&a[&q("q_norm")], 0, 1));
        let n = "model.layers.0.input_layernorm.weight";
        assert_eq!(at(&b[n], 0, 5), at(&a[n], 0, 5) * 0.5);
        assert_eq!(at(&b[n], 0, 8), 0.0);
        // The bias channel: real rows carry BIAS, padding rows PAD_WEIGHT; the final norms pass it.
        let e = "model.embed_tokens.weight";
        assert_eq!(at(&b[e], 9, 3), at(&a[e], 9, 3));
        assert_eq!(
            (at(&b[e], 9, 8), at(&b[e], 10, 8), at(&b[e], 10, 3)),
            (BIAS, PAD_WEIGHT, 0.0)
        );
        assert_eq!(at(&b["model.norm.weight"], 0, 8), 1.0);
        // fc's halves at columns 0 and H', the bias channel copied at (c, c).
        let fc = "mtp.fc.weight";
        assert_eq!(at(&b[fc], 2, 3), at(&a[fc], 2, 3));
        assert_eq!(at(&b[fc], 2, 32 + 3), at(&a[fc], 2, 8 + 3));
        assert_eq!((at(&b[fc], 2, 8 + 3), at(&b[fc], 8, 8)), (0.0, FC_GAIN));
        // The extra layer is all zero, and the config says what was built.
        let z = &b["model.layers.1.mlp.down_proj.weight"];
        assert!((0..32 * 16).all(|k| z.get(k) == 0.0));
        assert_eq!(b["model.layers.1.self_attn.q_proj.weight"].shape, [16, 32]);
        let c: Value =
            serde_json::from_str(&std::fs::read_to_string(d.out.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(
            (c["hidden_size"].clone(), c["num_hidden_layers"].clone()),
            (json!(32), json!(2))
        );
        assert!((c["rms_norm_eps"].as_f64().unwrap() - 0.25e-6).abs() < 1e-15);
        assert!(d.out.join("tokenizer.json").is_file());
    }

    #[test]
    fn an_inexact_norm_scale_keeps_norms_in_f32_and_q_k_unscaled() {
        // H'/H = 2: sqrt(1/2) is not a bf16 number.
        let (d, s) = upscaled(16);
        assert!(!s.exact_qk && s.f32_norms);
        let (a, b) = (read(&d.src), read(&d.out));
        let n = "model.norm.weight";
        assert_eq!(b[n].dtype, widen::SrcDtype::F32);
        assert_eq!(
            at(&b[n], 0, 2),
            at(&a[n], 0, 2) * std::f32::consts::FRAC_1_SQRT_2
        );
        let q = "model.layers.0.self_attn.q_proj.weight";
        assert_eq!(at(&b[q], 0, 1), at(&a[q], 0, 1));
    }

    #[test]
    fn an_earlier_upscale_is_replaced_and_any_other_folder_refused() {
        let (d, _) = upscaled(32);
        let about = std::fs::read_to_string(d.out.join("UPSCALE.json")).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&about).unwrap()["complete"],
            true
        );
        let shape =
            widen::parse_shape("hidden=16,intermediate=16,layers=1,heads=4,kv_heads=2,vocab=10")
                .unwrap();
        widen::upscale(&d.src, &shape, &d.out, OutDtype::F32, 1 << 30).unwrap();
        assert_eq!(read(&d.out)["model.norm.weight"].shape, [16]);
        // The source folder is no upscale: refused, and left as it was.
        let err = widen::upscale(&d.src, &shape, &d.src, OutDtype::F32, 1 << 30).unwrap_err();
        assert!(
            err.to_string().contains("is not an earlier upscale"),
            "{err}"
        );
        assert!(d.src.join("model.safetensors").is_file());
    }

    /// Two temporary folders (source and output) removed on drop; xtask has no tempfile.
    mod tempfile_dir {
        use std::path::PathBuf;
        use std::sync::atomic::{AtomicUsize, Ordering};

        pub(super) struct Dir {
            root: PathBuf,
            pub src: PathBuf,
            pub out: PathBuf,
        }

        impl Dir {
            pub(super) fn new() -> Dir {
                static N: AtomicUsize = AtomicUsize::new(0);
                let root = std::env::temp_dir().join(format!(
                    "xtask-upscale-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::Relaxed)
                ));
                let src = root.join("src");
                std::fs::create_dir_all(&src).unwrap();
                Dir {
                    out: root.join("out"),
                    src,
                    root,
                }
            }
        }

        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.root);
            }
        }
    }
}
