//! MTP head layouts from small generated checkpoints: Qwen3.5 (`mtp.*`),
//! DeepSeek-V3 (`model.layers.{N}.{enorm,hnorm,eh_proj,shared_head.*}` with
//! `num_nextn_predict_layers`) and MiMo (`model.mtp_layers.0.*` on a qwen2
//! trunk) are detected, load, and decode speculatively with greedy parity; the
//! three give the same head logits for the same weights (which pins MiMo's
//! hidden-first concatenation and DeepSeek's norm-in-head); a config that only
//! announces MTP gives no head; zero-centred norms are loaded with a +1 shift.

use crate::common;
use crate::common::Generate;

use std::path::Path;

use mlx_tensor::{Array, Dtype, ops, random};
use mtp_draft::DraftHead;
use runner::DepthPolicy;
use runner::testing::{Arch, Fixture, tokenizer_json};
use runner::testing::{MtpLayout, zero_centred_norms};
use runner::{Error, GenerateOptions, LoadedModel, ModelConfig, SamplingOptions, Session};
use serde_json::{Value, json};

/// Logits are O(1–10) in f32; graphs that differ only in tensor names (or in the
/// order of a concatenation matched by permuted weights) agree to rounding, ~1e-6.
const LOGIT_TOL: f32 = 1e-4;

/// Deterministic random tensors.
struct Rand {
    seed: u64,
    n: u64,
}

impl Rand {
    fn new(seed: u64) -> Rand {
        Rand { seed, n: 0 }
    }

    fn normal(&mut self, shape: &[i32], std: f32, mean: f32) -> Array {
        self.n += 1;
        let key = random::key(self.seed.wrapping_mul(7_919).wrapping_add(self.n)).unwrap();
        random::normal(shape, Dtype::Float32, &key)
            .unwrap()
            .multiply(&Array::from_f32(std).unwrap())
            .unwrap()
            .add(&Array::from_f32(mean).unwrap())
            .unwrap()
    }
}

/// The tensors of a head, by role; each layout names them differently.
struct HeadWeights {
    embed_norm: Array,
    hidden_norm: Array,
    /// `[H, 2H]` acting on `[embedding, hidden]` (columns swapped for MiMo's order).
    proj: Array,
    /// Block tensors, named relative to the block prefix.
    block: Vec<(String, Array)>,
    final_norm: Array,
}

impl HeadWeights {
    fn random(fx: &Fixture, seed: u64) -> HeadWeights {
        let mut r = Rand::new(seed);
        let (h, d) = (fx.hidden as i32, fx.head_dim as i32);
        let (nq, nkv, inter) = (fx.heads as i32, fx.kv_heads as i32, fx.intermediate as i32);
        let lin = |i: i32| 1.0 / (i as f32).sqrt();
        let mut block = vec![
            (
                "input_layernorm.weight".to_owned(),
                r.normal(&[h], 0.1, 1.0),
            ),
            (
                "post_attention_layernorm.weight".to_owned(),
                r.normal(&[h], 0.1, 1.0),
            ),
        ];
        for (name, out) in [("q_proj", nq * d), ("k_proj", nkv * d), ("v_proj", nkv * d)] {
            block.push((
                format!("self_attn.{name}.weight"),
                r.normal(&[out, h], lin(h), 0.0),
            ));
            if fx.arch == Arch::Qwen2 {
                block.push((format!("self_attn.{name}.bias"), r.normal(&[out], 0.1, 0.0)));
            }
        }
        block.push((
            "self_attn.o_proj.weight".to_owned(),
            r.normal(&[h, nq * d], lin(nq * d), 0.0),
        ));
        if fx.arch == Arch::Qwen3 {
            block.push((
                "self_attn.q_norm.weight".to_owned(),
                r.normal(&[d], 0.1, 1.0),
            ));
            block.push((
                "self_attn.k_norm.weight".to_owned(),
                r.normal(&[d], 0.1, 1.0),
            ));
        }
        block.push((
            "mlp.gate_proj.weight".to_owned(),
            r.normal(&[inter, h], lin(h), 0.0),
        ));
        block.push((
            "mlp.up_proj.weight".to_owned(),
            r.normal(&[inter, h], lin(h), 0.0),
        ));
        block.push((
            "mlp.down_proj.weight".to_owned(),
            r.normal(&[h, inter], lin(inter), 0.0),
        ));
        HeadWeights {
            embed_norm: r.normal(&[h], 0.1, 1.0),
            hidden_norm: r.normal(&[h], 0.1, 1.0),
            proj: r.normal(&[h, 2 * h], lin(2 * h), 0.0),
            block,
            final_norm: r.normal(&[h], 0.1, 1.0),
        }
    }

    /// The same head with every RMSNorm weight (head norms, block norms, q/k norms) plus `delta`.
    fn norms_shifted(&self, delta: f32) -> HeadWeights {
        let add = |a: &Array| a.add(&Array::from_f32(delta).unwrap()).unwrap();
        HeadWeights {
            embed_norm: add(&self.embed_norm),
            hidden_norm: add(&self.hidden_norm),
            proj: self.proj.clone(),
            block: self
                .block
                .iter()
                .map(|(n, a)| {
                    let a = if n.ends_with("norm.weight") {
                        add(a)
                    } else {
                        a.clone()
                    };
                    (n.clone(), a)
                })
                .collect(),
            final_norm: add(&self.final_norm),
        }
    }

    /// Named tensors of `layout` for a trunk of `fx` (`lm_head` is DeepSeek's `shared_head.head`).
    fn named(
        &self,
        layout: MtpLayout,
        fx: &Fixture,
        lm_head: Option<&Array>,
    ) -> Vec<(String, Array)> {
        let h = fx.hidden as i32;
        let (embed_norm, hidden_norm, proj, block, final_norm) = match layout {
            MtpLayout::Qwen => (
                "mtp.pre_fc_norm_embedding.weight".to_owned(),
                "mtp.pre_fc_norm_hidden.weight".to_owned(),
                "mtp.fc.weight".to_owned(),
                "mtp.layers.0".to_owned(),
                "mtp.norm.weight".to_owned(),
            ),
            MtpLayout::DeepSeek => {
                let p = format!("model.layers.{}", fx.layers);
                (
                    format!("{p}.enorm.weight"),
                    format!("{p}.hnorm.weight"),
                    format!("{p}.eh_proj.weight"),
                    p.clone(),
                    format!("{p}.shared_head.norm.weight"),
                )
            }
            MtpLayout::Mimo => {
                let p = "model.mtp_layers.0".to_owned();
                (
                    format!("{p}.token_layernorm.weight"),
                    format!("{p}.hidden_layernorm.weight"),
                    format!("{p}.input_proj.weight"),
                    p.clone(),
                    format!("{p}.final_layernorm.weight"),
                )
            }
        };
        // MiMo concatenates [hidden, embedding]: swap the projection's column halves.
        let proj_w = if layout == MtpLayout::Mimo {
            let e = self.proj.slice_axis(1, 0, h).unwrap();
            let g = self.proj.slice_axis(1, h, 2 * h).unwrap();
            ops::concatenate(&[g, e], 1).unwrap()
        } else {
            self.proj.clone()
        };
        let mut t = vec![
            (embed_norm, self.embed_norm.clone()),
            (hidden_norm, self.hidden_norm.clone()),
            (proj, proj_w),
            (final_norm, self.final_norm.clone()),
        ];
        t.extend(
            self.block
                .iter()
                .map(|(n, a)| (format!("{block}.{n}"), a.clone())),
        );
        if let (MtpLayout::DeepSeek, Some(w)) = (layout, lm_head) {
            t.push((format!("{block}.shared_head.head.weight"), w.clone()));
        }
        t
    }
}

/// Writes a model folder: the fixture trunk, `extra` tensors, and `config` merged into its config.
fn write(dir: &Path, fx: &Fixture, extra: Vec<(String, Array)>, config: Value) {
    let mut c = fx.config_json();
    for (k, v) in config.as_object().unwrap() {
        c[k] = v.clone();
    }
    std::fs::write(dir.join("config.json"), c.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json().to_string()).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        json!({"eos_token": "<|im_end|>", "bos_token": null}).to_string(),
    )
    .unwrap();
    let mut tensors = fx.tensors(11).unwrap();
    tensors.extend(extra);
    mlx_tensor::io::save_safetensors(
        &dir.join("model.safetensors"),
        tensors.iter().map(|(n, a)| (n.as_str(), a)),
    )
    .unwrap();
}

/// The announcing config key of each layout.
fn announce(layout: MtpLayout) -> Value {
    match layout {
        MtpLayout::Qwen => json!({"mtp_num_hidden_layers": 1}),
        MtpLayout::DeepSeek | MtpLayout::Mimo => json!({"num_nextn_predict_layers": 1}),
    }
}

/// The natural trunk of each layout.
fn trunk(layout: MtpLayout) -> Fixture {
    match layout {
        MtpLayout::Qwen => Fixture::new(Arch::Qwen3),
        MtpLayout::DeepSeek => Fixture::new(Arch::Llama),
        MtpLayout::Mimo => Fixture::new(Arch::Qwen2),
    }
}

/// A checkpoint of `layout` on `fx` with head weights from `seed`; DeepSeek carries
/// its own `shared_head.head`.
fn checkpoint(
    layout: MtpLayout,
    fx: &Fixture,
    head: &HeadWeights,
    config: Value,
) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let own_head = Rand::new(99).normal(&[fx.vocab as i32, fx.hidden as i32], 0.5, 0.0);
    let mut c = announce(layout);
    for (k, v) in config.as_object().unwrap() {
        c[k] = v.clone();
    }
    write(dir.path(), fx, head.named(layout, fx, Some(&own_head)), c);
    dir
}

fn greedy(max_tokens: usize, depth: DepthPolicy) -> GenerateOptions {
    GenerateOptions {
        max_tokens,
        sampling: SamplingOptions::greedy(),
        depth,
        ..GenerateOptions::default()
    }
}

fn generate(
    s: &mut Session<'_>,
    m: &LoadedModel,
    prompt: &[u32],
    opts: &GenerateOptions,
) -> runner::Generation {
    let g = s.run(&m.tokenizer, prompt, opts).unwrap();
    s.offset();
    g
}

/// Head logits of the first `n - 1` pairs of `ids`: token `t[i + 1]` with the trunk hidden at `i`.
pub(crate) fn head_logits(m: &LoadedModel, ids: &[u32]) -> Vec<f32> {
    let model = m.model.as_ref();
    let a = Array::from_slice(ids, &[ids.len() as i32]).unwrap();
    let hidden = model.forward(&a, &mut model.new_caches()).unwrap();
    let n = ids.len() as i32;
    let mut head = model.mtp_head().expect("checkpoint has an MTP head");
    let out = head
        .forward(
            &a.slice_axis(0, 1, n).unwrap(),
            &hidden.slice_axis(0, 0, n - 1).unwrap(),
            0,
        )
        .unwrap();
    head.unembed(&out.out).unwrap().to_vec::<f32>().unwrap()
}

const PROMPTS: [&[u32]; 3] = [
    &[72, 101, 108, 108, 111],
    &[1, 2, 3, 4, 5, 6, 7, 8],
    &[200, 17, 17, 90],
];

#[test]
fn each_layout_is_detected_loads_and_decodes_with_greedy_parity() {
    for layout in [MtpLayout::Qwen, MtpLayout::DeepSeek, MtpLayout::Mimo] {
        let fx = trunk(layout);
        let head = HeadWeights::random(&fx, 5);
        let dir = checkpoint(layout, &fx, &head, json!({}));
        // Detection by tensors present, from config.json and the file's names.
        let text = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
        let config = ModelConfig::from_json(&text, &dir.path().join("config.json")).unwrap();
        assert_eq!(config.mtp_layers, 1, "{layout:?}: announced layers");
        let names: Vec<String> = head
            .named(layout, &fx, None)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(
            MtpLayout::detect(&config, |n| names.iter().any(|x| x == n)),
            Some(layout)
        );
        assert!(
            runner::inspect(dir.path()).unwrap().mtp_head,
            "{layout:?}: inspect"
        );

        let m = common::load(dir.path());
        for prompt in PROMPTS {
            let want = generate(
                &mut Session::new(m.model.as_ref()),
                &m,
                prompt,
                &greedy(24, DepthPolicy::Fixed(0)),
            );
            for depth in [
                DepthPolicy::Fixed(1),
                DepthPolicy::Fixed(3),
                DepthPolicy::default(),
            ] {
                let mut s = Session::with_mtp(m.model.as_ref()).unwrap();
                let got = generate(&mut s, &m, prompt, &greedy(24, depth));
                let st = common::parity::same_as_plain(
                    &format!("{layout:?} {depth:?} prompt {prompt:?}"),
                    &got,
                    &want,
                );
                assert!(st.drafted > 0, "{layout:?} {depth:?}: nothing drafted");
            }
        }
    }
}

#[test]
fn the_three_layouts_compute_the_same_head() {
    // One qwen2 trunk (tied: DeepSeek's shared_head.head is the embedding, as the
    // other two layouts use the trunk's head); the same head weights renamed, MiMo's
    // projection columns swapped to match its [hidden, embedding] order.
    let fx = Fixture::new(Arch::Qwen2);
    let head = HeadWeights::random(&fx, 8);
    let embed = fx
        .tensors(11)
        .unwrap()
        .into_iter()
        .find(|(n, _)| n == "model.embed_tokens.weight")
        .unwrap()
        .1;
    let mut logits = Vec::new();
    for layout in [MtpLayout::Qwen, MtpLayout::DeepSeek, MtpLayout::Mimo] {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            &fx,
            head.named(layout, &fx, Some(&embed)),
            announce(layout),
        );
        let m = common::load(dir.path());
        logits.push((layout, head_logits(&m, &[3, 141, 59, 26, 5, 35, 89, 79])));
    }
    let (_, qwen) = &logits[0];
    assert_eq!(qwen.len(), 7 * fx.vocab);
    for (layout, l) in &logits[1..] {
        let d = common::max_abs_diff(qwen, l);
        assert!(
            d < LOGIT_TOL,
            "{layout:?} head logits differ from Qwen's by {d}"
        );
    }
    // The control: MiMo weights written without the column swap give another head.
    let dir = tempfile::tempdir().unwrap();
    let mut unswapped = head.named(MtpLayout::Mimo, &fx, None);
    for (n, a) in &mut unswapped {
        if n.ends_with("input_proj.weight") {
            *a = head.proj.clone();
        }
    }
    write(dir.path(), &fx, unswapped, announce(MtpLayout::Mimo));
    let d = common::max_abs_diff(
        qwen,
        &head_logits(&common::load(dir.path()), &[3, 141, 59, 26, 5, 35, 89, 79]),
    );
    assert!(d > 1e-2, "concatenation order made no difference ({d})");
}

#[test]
fn an_announced_head_without_tensors_gives_no_head() {
    for layout in [MtpLayout::Qwen, MtpLayout::DeepSeek, MtpLayout::Mimo] {
        let fx = trunk(layout);
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &fx, Vec::new(), announce(layout));
        let info = runner::inspect(dir.path()).unwrap();
        assert_eq!(
            (info.mtp_head, info.mtp_layers_declared),
            (false, 1),
            "{layout:?}"
        );
        let m = common::load(dir.path());
        assert!(m.model.mtp_head().is_none(), "{layout:?}");
        let err = Session::with_mtp(m.model.as_ref()).unwrap_err();
        assert!(matches!(err, Error::NoMtpHead), "{layout:?}: {err}");
        assert!(err.to_string().contains("--speculative off"), "{err}");
    }
}

#[test]
fn fewer_layers_than_declared_are_counted_and_the_head_drafts_with_the_first() {
    for layout in [MtpLayout::Qwen, MtpLayout::DeepSeek, MtpLayout::Mimo] {
        let fx = trunk(layout);
        let head = HeadWeights::random(&fx, 5);
        let key = announce(layout)
            .as_object()
            .unwrap()
            .keys()
            .next()
            .unwrap()
            .clone();
        let one = checkpoint(layout, &fx, &head, json!({}));
        let info = runner::inspect(one.path()).unwrap();
        assert_eq!(
            (info.mtp_layers_declared, info.mtp_layers_present),
            (1, 1),
            "{layout:?}"
        );
        // Three declared, one present: loaded (drafting needs only layer
        // 0), counted, and the same head as when one is declared.
        let three = checkpoint(layout, &fx, &head, json!({ key: 3 }));
        let info = runner::inspect(three.path()).unwrap();
        assert_eq!(
            (
                info.mtp_head,
                info.mtp_layers_declared,
                info.mtp_layers_present
            ),
            (true, 3, 1),
            "{layout:?}"
        );
        // Two present: the second (a copy of layer 0 with other values)
        // loads unused rather than failing as unknown tensors.
        let config =
            ModelConfig::from_json(&fx.config_json().to_string(), Path::new("config.json"))
                .unwrap();
        let (first, second) = (
            layout.layer_prefix(&config, 0),
            layout.layer_prefix(&config, 1),
        );
        let other = HeadWeights::random(&fx, 6).named(layout, &fx, None);
        let extra: Vec<(String, Array)> = other
            .into_iter()
            .filter_map(|(n, a)| n.strip_prefix(&first).map(|r| (format!("{second}{r}"), a)))
            .collect();
        assert!(!extra.is_empty(), "{layout:?}");
        let own_head = Rand::new(99).normal(&[fx.vocab as i32, fx.hidden as i32], 0.5, 0.0);
        let two = tempfile::tempdir().unwrap();
        let mut tensors = head.named(layout, &fx, Some(&own_head));
        tensors.extend(extra);
        write(two.path(), &fx, tensors, announce(layout));
        let info = runner::inspect(two.path()).unwrap();
        assert_eq!(info.mtp_layers_present, 2, "{layout:?}");
        let ids = [9, 8, 7, 100, 101];
        let want = head_logits(&common::load(one.path()), &ids);
        for dir in [&three, &two] {
            let d = common::max_abs_diff(&want, &head_logits(&common::load(dir.path()), &ids));
            assert_eq!(d, 0.0, "{layout:?}");
        }
    }
}

#[test]
fn zero_centred_norms_are_loaded_with_a_one_shift() {
    let fx = trunk(MtpLayout::Qwen);
    let head = HeadWeights::random(&fx, 21);
    let ids = [9, 8, 7, 100, 101, 102, 50];
    let logits = |h: &HeadWeights, zero_centred: bool| {
        let dir = checkpoint(
            MtpLayout::Qwen,
            &fx,
            h,
            json!({"mtp_norm_zero_centered": zero_centred}),
        );
        head_logits(&common::load(dir.path()), &ids)
    };
    // Stored zero-centred weights w load as 1 + w: the same head as plain weights 1 + w.
    let centred = logits(&head.norms_shifted(-1.0), true);
    let plain = logits(&head, false);
    let d = common::max_abs_diff(&centred, &plain);
    assert!(
        d < LOGIT_TOL,
        "zero-centred head differs from its +1 equivalent by {d}"
    );
    // The control: the flag changes the head (it is not ignored).
    let unshifted = logits(&head.norms_shifted(-1.0), false);
    let d = common::max_abs_diff(&centred, &unshifted);
    assert!(d > 1e-2, "mtp_norm_zero_centered made no difference ({d})");
}

#[test]
fn zero_centred_rule_follows_the_config() {
    let check = |extra: Value, want: bool| {
        let mut c = Fixture::new(Arch::Qwen3).config_json();
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        let config = ModelConfig::from_json(&c.to_string(), Path::new("config.json")).unwrap();
        assert_eq!(zero_centred_norms(&config), want, "{extra}");
    };
    check(json!({}), false);
    check(json!({"model_type": "qwen3_next"}), true);
    check(json!({"model_type": "qwen3_5"}), true);
    check(
        json!({"model_type": "qwen3_next", "mtp_norm_zero_centered": false}),
        false,
    );
    check(json!({"mtp_norm_zero_centered": true}), true);
    check(json!({"model_type": "deepseek_v3"}), false);
}
