//! GLM-4.5 / GLM-4.5-Air (`Glm4MoeForCausalLM`): grouped-query attention with
//! q/k/v biases (none on `o_proj`), optional per-head q/k RMSNorm
//! (`use_qk_norm`), RoPE over the first `partial_rotary_factor` of each head
//! in the half-split layout (transformers' `rotate_half`, mlx-lm's
//! `traditional=False`), dense MLPs before `first_k_dense_replace` and
//! DeepSeek-style MoE after it (sigmoid router with `e_score_correction_bias`,
//! `n_group` / `topk_group`, `routed_scaling_factor`, ungated
//! `shared_experts`); the MTP layer sits at `model.layers.{num_hidden_layers}`
//! in the DeepSeek layout, its block a MoE decoder layer.
//!
//! DeepSeek-V3 (`DeepseekV3ForCausalLM`) and GLM-4.7-Flash
//! (`Glm4MoeLiteForCausalLM`) are the same decoder, MoE and MTP layout with
//! multi-head latent attention (`models/mla.rs`) in place of the GQA block;
//! GLM-4.7-Flash says which layers are sparse by `mlp_layer_types`.

use std::rc::Rc;

use kvcache::{Cache, KvCache};
use mlx_tensor::Array;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::models::Model;
use crate::models::attention::AttentionCore;
use crate::models::layers::{
    Linear, LinearLayout, RmsNorm, embedding, linear, pre_norm_block, rms_norm,
};
use crate::models::mla::{MlaAttention, MlaConfig};
use crate::models::moe::{FeedForward, MoeConfig, MoeDefaults, Scoring};
use crate::models::mtp::{HeadBlock, MtpHead, MtpLayout};
use crate::models::rope::Rope;
use crate::models::trunk_ends::{TrunkEnds, load_lm_head, note_missing_mtp, wrong_mtp_layout};
use crate::weights::{Vars, Weights};

/// Builds a GLM-4.5 model.
pub(crate) fn build_glm4_moe(
    c: &ModelConfig,
    w: &mut Weights,
    l: LinearLayout,
) -> Result<Box<dyn Model>> {
    Ok(Box::new(Glm4Moe::load(c, w, l, Variant::Glm45)?))
}

/// Builds a DeepSeek-V3 model.
pub(crate) fn build_deepseek_v3(
    c: &ModelConfig,
    w: &mut Weights,
    l: LinearLayout,
) -> Result<Box<dyn Model>> {
    Ok(Box::new(Glm4Moe::load(c, w, l, Variant::DeepseekV3)?))
}

/// Builds a GLM-4.7-Flash model.
pub(crate) fn build_glm4_moe_lite(
    c: &ModelConfig,
    w: &mut Weights,
    l: LinearLayout,
) -> Result<Box<dyn Model>> {
    Ok(Box::new(Glm4Moe::load(c, w, l, Variant::Glm47Flash)?))
}

/// The families this decoder serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Variant {
    /// GLM-4.5: GQA attention.
    Glm45,
    /// DeepSeek-V3: MLA, dense layers before `first_k_dense_replace`.
    DeepseekV3,
    /// GLM-4.7-Flash: MLA, sparse layers by `mlp_layer_types`.
    Glm47Flash,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Glm45 => "GLM-4.5",
            Variant::DeepseekV3 => "DeepSeek-V3",
            Variant::Glm47Flash => "GLM-4.7-Flash",
        }
    }
}

/// The MoE block config of the `config.json`, refusing the router variants
/// that are not implemented; the transformers config class's defaults where
/// keys are absent (`norm_topk_prob` true; DeepSeek-V3's 8 groups, 4 kept,
/// scale 2.5; GLM-4.7-Flash's scale 1.8).
fn moe_config(c: &ModelConfig, variant: Variant) -> Result<Option<MoeConfig>> {
    let raw = &c.raw;
    for (key, want) in [("scoring_func", "sigmoid"), ("topk_method", "noaux_tc")] {
        if let Some(v) = raw[key].as_str()
            && v != want
        {
            return Err(c.unsupported_key(
                key,
                format!(
                    "`{v}` is not implemented ({} routes with `{want}`)",
                    variant.name()
                ),
            ));
        }
    }
    let (n_group, topk_group, routed_scaling_factor) = match variant {
        Variant::Glm45 => (1, 1, 1.0),
        Variant::DeepseekV3 => (8, 4, 2.5),
        Variant::Glm47Flash => (1, 1, 1.8),
    };
    let defaults = MoeDefaults {
        scoring: Scoring::GroupedSigmoid {
            n_group,
            topk_group,
            routed_scaling_factor,
        },
        norm_topk_prob: true,
    };
    // `first_k_dense_replace` and `n_shared_experts` when absent come from
    // `config::defaults`.
    let mut moe = MoeConfig::parse(c, defaults)?;
    if variant == Variant::Glm47Flash
        && let Some(m) = moe.as_mut()
    {
        m.sparse.first_dense = 0;
        m.sparse.dense = dense_layers(c)?;
    }
    Ok(moe)
}

/// GLM-4.7-Flash's dense layers from `mlp_layer_types` (`"dense"` or
/// `"sparse"` per layer; absent: layer 0 dense, the rest sparse, as
/// transformers fills it).
fn dense_layers(c: &ModelConfig) -> Result<Vec<usize>> {
    let n = c.num_hidden_layers;
    let Some(types) = c.raw.get("mlp_layer_types").filter(|v| !v.is_null()) else {
        return Ok(vec![0]);
    };
    let bad = |message: String| c.unsupported_key("mlp_layer_types", message);
    let types = types.as_array().filter(|a| a.len() == n).ok_or_else(|| {
        bad(format!(
            "must list \"dense\" or \"sparse\" for each of the {n} layers, found {types}"
        ))
    })?;
    let mut dense = Vec::new();
    for (i, t) in types.iter().enumerate() {
        match t.as_str() {
            Some("dense") => dense.push(i),
            Some("sparse") => {}
            _ => {
                return Err(bad(format!(
                    "layer {i} is {t}, not \"dense\" or \"sparse\""
                )));
            }
        }
    }
    Ok(dense)
}

/// A layer's attention: GLM-4.5's GQA, or multi-head latent attention.
#[derive(Debug, Clone)]
enum Attention {
    Gqa(Gqa),
    Mla(MlaAttention),
}

impl Attention {
    fn load(
        c: &ModelConfig,
        mla: Option<&MlaConfig>,
        a: Vars<'_>,
        layout: LinearLayout,
    ) -> Result<Attention> {
        Ok(match mla {
            None => Attention::Gqa(Gqa::load(c, a, layout)?),
            Some(m) => Attention::Mla(MlaAttention::load(c, m, a, layout)?),
        })
    }

    fn forward(&self, x: &Array, cache: &mut dyn Cache, rope: &Rope) -> Result<Array> {
        match self {
            Attention::Gqa(a) => a.forward(x, cache, rope),
            Attention::Mla(a) => a.forward(x, cache, rope),
        }
    }

    fn arrays(&self) -> Vec<Array> {
        match self {
            Attention::Gqa(a) => a.arrays(),
            Attention::Mla(a) => a.arrays(),
        }
    }
}

/// GQA attention with biased q/k/v and an unbiased output projection.
#[derive(Debug, Clone)]
struct Gqa {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    core: AttentionCore,
}

impl Gqa {
    fn load(c: &ModelConfig, mut a: Vars<'_>, layout: LinearLayout) -> Result<Gqa> {
        let (h, d) = (c.hidden_size, c.head_dim);
        let (nq, nkv) = (c.num_attention_heads, c.num_key_value_heads);
        let bias = c.attention_bias.unwrap_or(false);
        let (q_norm, k_norm) = if c.raw["use_qk_norm"].as_bool().unwrap_or(false) {
            (
                Some(rms_norm(a.pp("q_norm"), d, c.rms_norm_eps)?),
                Some(rms_norm(a.pp("k_norm"), d, c.rms_norm_eps)?),
            )
        } else {
            (None, None)
        };
        Ok(Gqa {
            q: linear(a.pp("q_proj"), h, nq * d, bias, layout)?,
            k: linear(a.pp("k_proj"), h, nkv * d, bias, layout)?,
            v: linear(a.pp("v_proj"), h, nkv * d, bias, layout)?,
            o: linear(a.pp("o_proj"), nq * d, h, false, layout)?,
            core: AttentionCore::new(c, q_norm, k_norm),
        })
    }

    fn forward(&self, x: &Array, cache: &mut dyn Cache, rope: &Rope) -> Result<Array> {
        let c = &self.core;
        let q = c.split(&self.q.forward(x)?, c.heads)?;
        let k = c.split(&self.k.forward(x)?, c.kv_heads)?;
        let v = c.split(&self.v.forward(x)?, c.kv_heads)?;
        self.o.forward(&c.attend(&q, &k, &v, cache, rope)?)
    }

    fn arrays(&self) -> Vec<Array> {
        [&self.q, &self.k, &self.v, &self.o]
            .iter()
            .flat_map(|l| l.arrays())
            .collect()
    }
}

/// One decoder layer (also the MTP head's block).
#[derive(Debug, Clone)]
struct GlmLayer {
    input_norm: RmsNorm,
    attn: Attention,
    post_norm: RmsNorm,
    ffn: FeedForward,
}

impl GlmLayer {
    fn load(
        c: &ModelConfig,
        mut vb: Vars<'_>,
        mla: Option<&MlaConfig>,
        moe: Option<&MoeConfig>,
        layout: LinearLayout,
    ) -> Result<GlmLayer> {
        let (h, eps) = (c.hidden_size, c.rms_norm_eps);
        let input_norm = rms_norm(vb.pp("input_layernorm"), h, eps)?;
        let attn = Attention::load(c, mla, vb.pp("self_attn"), layout)?;
        let post_norm = rms_norm(vb.pp("post_attention_layernorm"), h, eps)?;
        let ffn = FeedForward::load(moe, vb.pp("mlp"), h, c.intermediate_size, layout)?;
        Ok(GlmLayer {
            input_norm,
            attn,
            post_norm,
            ffn,
        })
    }

    fn forward(&self, x: &Array, cache: &mut dyn Cache, rope: &Rope) -> Result<Array> {
        pre_norm_block(
            x,
            &self.input_norm,
            |n| self.attn.forward(n, cache, rope),
            &self.post_norm,
            |h| self.ffn.forward(h),
        )
    }

    fn layer_arrays(&self) -> Vec<Array> {
        let mut v = self.attn.arrays();
        v.extend(self.ffn.arrays());
        v
    }
}

impl HeadBlock for GlmLayer {
    fn forward(&self, x: &Array, cache: &mut dyn Cache, rope: &Rope) -> Result<Array> {
        GlmLayer::forward(self, x, cache, rope)
    }

    fn arrays(&self) -> Vec<Array> {
        self.layer_arrays()
    }
}

/// A GLM-4.5 decoder.
#[derive(Debug)]
pub(crate) struct Glm4Moe {
    ends: TrunkEnds,
    layers: Vec<GlmLayer>,
    rope: Rope,
}

impl Glm4Moe {
    /// Takes the family's tensors out of `w`, checking every shape against `c`.
    // Long: reads like the checkpoint: config, trunk, head, MTP, in tensor order.
    pub(crate) fn load(
        c: &ModelConfig,
        w: &mut Weights,
        layout: LinearLayout,
        variant: Variant,
    ) -> Result<Glm4Moe> {
        let moe = moe_config(c, variant)?;
        let mla = match variant {
            Variant::Glm45 => None,
            Variant::DeepseekV3 | Variant::Glm47Flash => Some(MlaConfig::parse(c)?),
        };
        let h = c.hidden_size;
        let tl = w.layout().clone();
        let mut trunk = w.vars(tl.trunk);
        let embed = embedding(trunk.pp("embed_tokens"), c.vocab_size, h)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut stack = trunk.pp("layers");
        for i in 0..c.num_hidden_layers {
            let m = moe.as_ref().filter(|m| m.sparse.is_sparse(i));
            layers.push(GlmLayer::load(c, stack.pp(i), mla.as_ref(), m, layout)?);
        }
        drop(stack);
        let norm = rms_norm(trunk.pp("norm"), h, c.rms_norm_eps)?;
        let lm_head = load_lm_head(c, w, &embed, layout)?;
        let rope = match &mla {
            // GLM-4.5: 0.5 when the config leaves it out (`config::defaults`).
            None => Rope::new(
                (c.head_dim as f32 * c.partial_rotary_factor) as usize,
                c.rope_theta,
                &c.rope_scaling,
            )?,
            Some(m) => m.rope(c)?,
        };
        let mtp = match MtpLayout::detect(c, |name| w.contains(name)) {
            Some(MtpLayout::DeepSeek) => {
                let block = |w: &mut Weights, prefix: &str, _shift: bool| {
                    let has_moe = w.contains(&format!("{prefix}.mlp.gate.weight"));
                    let b = GlmLayer::load(
                        c,
                        Vars::new(w, prefix),
                        mla.as_ref(),
                        moe.as_ref().filter(|_| has_moe),
                        layout,
                    )?;
                    Ok(Rc::new(b) as Rc<dyn HeadBlock>)
                };
                Some(MtpHead::load_family_block(
                    MtpLayout::DeepSeek,
                    c,
                    w,
                    layout,
                    &embed,
                    &lm_head,
                    &rope,
                    block,
                )?)
            }
            Some(other) => {
                let expected = format!("`model.layers.{}.*` with eh_proj", c.num_hidden_layers);
                return Err(wrong_mtp_layout(
                    c,
                    "num_nextn_predict_layers",
                    other,
                    &expected,
                ));
            }
            None => {
                note_missing_mtp(c, w);
                None
            }
        };
        let m = Glm4Moe {
            ends: TrunkEnds {
                config: c.clone(),
                embed,
                norm,
                lm_head,
                mtp,
            },
            layers,
            rope,
        };
        if !w.is_dry() {
            mlx_tensor::eval(&m.arrays())?;
        }
        Ok(m)
    }

    fn arrays(&self) -> Vec<Array> {
        let mut v = self.ends.arrays();
        for l in &self.layers {
            v.extend(l.layer_arrays());
        }
        v
    }
}

impl Model for Glm4Moe {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn Cache>]) -> Result<Array> {
        self.ends
            .forward(tokens, caches, &self.layers, |layer, x, cache| {
                layer.forward(x, cache, &self.rope)
            })
    }

    fn unembed(&self, hidden: &Array) -> Result<Array> {
        self.ends.unembed(hidden)
    }

    fn new_caches(&self) -> Vec<Box<dyn Cache>> {
        self.layers
            .iter()
            .map(|_| Box::new(KvCache::new()) as Box<dyn Cache>)
            .collect()
    }

    fn config(&self) -> &ModelConfig {
        &self.ends.config
    }

    fn mtp_head(&self) -> Option<Box<dyn mtp_draft::DraftHead>> {
        self.ends.mtp_head()
    }

    fn adapt_draft_head(&mut self, s: &crate::DraftHeadSetup) -> Result<bool> {
        self.ends.adapt_mtp(s)
    }
}
