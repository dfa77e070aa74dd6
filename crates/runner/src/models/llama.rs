//! The Llama family: Llama 2/3, Mistral, Qwen2/2.5 (q/k/v bias), Qwen3 (q/k RMSNorm),
//! and their mixture-of-experts members Qwen2-MoE and Qwen3-MoE (`models/moe.rs`).

use mlx_tensor::Array;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::models::Model;
use crate::models::attention::AttentionCore;
use crate::models::layers::{
    FusedLinear, Linear, LinearLayout, Mlp, RmsNorm, embedding, linear, pre_norm_block,
    quantized_or_same, rms_norm,
};
use crate::models::moe::{FeedForward, MoeBlock, MoeConfig, MoeDefaults, Scoring};
use crate::models::mtp::{MtpHead, MtpLayout};
use crate::models::rope::Rope;
use crate::models::trunk_ends::{TrunkEnds, load_lm_head, note_missing_mtp};
use crate::quant::QuantParams;
use crate::weights::{Vars, Weights};
use kvcache::{Cache, KvCache, RotatingKvCache};

/// What distinguishes the members of the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Variant {
    /// q/k/v projections carry a bias (Qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Which layers attend over a sliding window.
    pub window: WindowRule,
    /// Mixture-of-experts feed-forward layers, softmax-routed, where the
    /// config's sparse-layer rules say (Qwen2-MoE, Qwen3-MoE).
    pub moe: bool,
}

/// How a member of the family reads `sliding_window` (transformers' rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WindowRule {
    /// No sliding window (Llama).
    Never,
    /// Every layer, when `sliding_window` is set (Mistral).
    Always,
    /// The layers `layer_types` marks `sliding_attention`; without
    /// `layer_types`, those the member's rule picks when `use_sliding_window`.
    LayerTypes(Unlisted),
}

/// Which layers attend over the window when `use_sliding_window` is true and
/// config.json lists no `layer_types`: the `layer_types` each transformers 5
/// config class derives (`max_window_layers` 28 when absent: `config::defaults`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unlisted {
    /// Layers at or after `max_window_layers` (Qwen2, Qwen3).
    FromMaxWindowLayers,
    /// Even-indexed layers below `max_window_layers` (Qwen2-MoE).
    EvenBelowMaxWindowLayers,
    /// Every layer (Qwen3-MoE reads no `max_window_layers`).
    Every,
}

const LLAMA: Variant = Variant {
    qkv_bias: false,
    qk_norm: false,
    window: WindowRule::Never,
    moe: false,
};

/// Builds Llama (`attention_bias` puts a bias on q/k/v/o, `mlp_bias` on the MLP).
pub(crate) fn build_llama(
    c: &ModelConfig,
    w: &mut Weights,
    l: LinearLayout,
) -> Result<Box<dyn Model>> {
    Ok(Box::new(Llama::load(c, w, LLAMA, l)?))
}

/// Builds Mistral: Llama with `sliding_window` attention on every layer.
pub(crate) fn build_mistral(
    c: &ModelConfig,
    w: &mut Weights,
    l: LinearLayout,
) -> Result<Box<dyn Model>> {
    let v = Variant {
        window: WindowRule::Always,
        ..LLAMA
    };
    Ok(Box::new(Llama::load(c, w, v, l)?))
}

/// Builds Qwen2 / Qwen2.5, and MiMo (a Qwen2 trunk with `model.mtp_layers.*`).
pub(crate) fn build_qwen2(
    c: &ModelConfig,
    w: &mut Weights,
    l: LinearLayout,
) -> Result<Box<dyn Model>> {
    let v = Variant {
        qkv_bias: true,
        window: WindowRule::LayerTypes(Unlisted::FromMaxWindowLayers),
        ..LLAMA
    };
    Ok(Box::new(Llama::load(c, w, v, l)?))
}

/// Builds Qwen3.
pub(crate) fn build_qwen3(
    c: &ModelConfig,
    w: &mut Weights,
    l: LinearLayout,
) -> Result<Box<dyn Model>> {
    let v = Variant {
        qk_norm: true,
        window: WindowRule::LayerTypes(Unlisted::FromMaxWindowLayers),
        ..LLAMA
    };
    Ok(Box::new(Llama::load(c, w, v, l)?))
}

/// Builds Qwen2-MoE: Qwen2 with MoE layers and a sigmoid-gated shared expert.
pub(crate) fn build_qwen2_moe(
    c: &ModelConfig,
    w: &mut Weights,
    l: LinearLayout,
) -> Result<Box<dyn Model>> {
    let v = Variant {
        qkv_bias: true,
        window: WindowRule::LayerTypes(Unlisted::EvenBelowMaxWindowLayers),
        moe: true,
        ..LLAMA
    };
    Ok(Box::new(Llama::load(c, w, v, l)?))
}

/// Builds Qwen3-MoE: Qwen3 with MoE layers (no shared expert).
pub(crate) fn build_qwen3_moe(
    c: &ModelConfig,
    w: &mut Weights,
    l: LinearLayout,
) -> Result<Box<dyn Model>> {
    let v = Variant {
        qk_norm: true,
        window: WindowRule::LayerTypes(Unlisted::Every),
        moe: true,
        ..LLAMA
    };
    Ok(Box::new(Llama::load(c, w, v, l)?))
}

/// The MoE config of a MoE member: softmax routing, `norm_topk_prob`
/// false unless the config says so (transformers' Qwen2/3-MoE default);
/// an error when the config declares no experts.
fn moe_config(c: &ModelConfig) -> Result<MoeConfig> {
    let defaults = MoeDefaults {
        scoring: Scoring::Softmax,
        norm_topk_prob: false,
    };
    MoeConfig::parse(c, defaults)?.ok_or_else(|| {
        c.unsupported_key(
            "num_experts",
            format!(
                "model_type `{}` is a mixture-of-experts model but config.json declares no \
                 experts (num_experts, num_experts_per_tok, moe_intermediate_size)",
                c.model_type
            ),
        )
    })
}

/// Refuses the config keys that change this family's computation and are
/// not implemented; returns each layer's attention window (`None`: full).
// Long: one refusal per unimplemented config key, then the window rule of each member.
fn check_config(c: &ModelConfig, v: Variant) -> Result<Vec<Option<usize>>> {
    let raw = &c.raw;
    if c.partial_rotary_factor != 1.0 {
        return Err(c.unsupported_key(
            "partial_rotary_factor",
            format!(
                "{} is not implemented for this family (RoPE over the whole head only)",
                c.partial_rotary_factor
            ),
        ));
    }
    for key in ["num_experts", "num_local_experts", "n_routed_experts"] {
        let read = v.moe && key != "n_routed_experts";
        if !read && raw[key].as_u64().is_some_and(|n| n > 0) {
            return Err(c.unsupported_key(
                "num_experts",
                format!(
                    "`{key}` = {}: mixture-of-experts layers are not implemented for `{}`; \
                     is `architectures` right?",
                    raw[key], c.architecture
                ),
            ));
        }
    }
    for key in ["attn_logit_softcapping", "final_logit_softcapping"] {
        if !raw[key].is_null() {
            return Err(c.unsupported_key(
                "attn_logit_softcapping",
                format!(
                    "`{key}` = {} (logit soft-capping) is not implemented",
                    raw[key]
                ),
            ));
        }
    }
    let n = c.num_hidden_layers;
    let window = c.sliding_window;
    let layer_types: Vec<&str> = raw["layer_types"]
        .as_array()
        .map(|a| a.iter().map(|t| t.as_str().unwrap_or("?")).collect())
        .unwrap_or_default();
    Ok(match v.window {
        // transformers' Llama has no sliding window; mlx-lm's slides the
        // layers `layer_types` marks: refused rather than either.
        WindowRule::Never if window.is_some() && layer_types.contains(&"sliding_attention") => {
            return Err(c.unsupported_key(
                "layer_types",
                format!(
                    "marks sliding_attention layers, which `{}` does not have in transformers \
                     (mlx-lm slides them over sliding_window {}); set sliding_window to null \
                     for full attention",
                    c.model_type,
                    window.unwrap_or_default()
                ),
            ));
        }
        WindowRule::Never => vec![None; n],
        WindowRule::Always => vec![window; n],
        WindowRule::LayerTypes(_) if !layer_types.is_empty() => {
            if layer_types.len() != n {
                return Err(c.unsupported_key(
                    "layer_types",
                    format!(
                        "has {} entries but num_hidden_layers is {n}: give one per layer",
                        layer_types.len()
                    ),
                ));
            }
            layer_types
                .iter()
                .map(|t| match (*t, window) {
                    ("full_attention", _) => Ok(None),
                    ("sliding_attention", Some(w)) => Ok(Some(w)),
                    ("sliding_attention", None) => Err(c.unsupported_key(
                        "sliding_window",
                        "layer_types has sliding_attention layers but sliding_window is null"
                            .into(),
                    )),
                    (other, _) => Err(c.unsupported_key(
                        "layer_types",
                        format!(
                            "`{other}` is not a layer type (full_attention, sliding_attention)"
                        ),
                    )),
                })
                .collect::<Result<_>>()?
        }
        WindowRule::LayerTypes(rule) => {
            let max = raw["max_window_layers"].as_u64().unwrap_or(0) as usize;
            let on = raw["use_sliding_window"].as_bool().unwrap_or(false);
            (0..n)
                .map(|i| {
                    let slides = match rule {
                        Unlisted::FromMaxWindowLayers => i >= max,
                        Unlisted::EvenBelowMaxWindowLayers => i % 2 == 0 && i < max,
                        Unlisted::Every => true,
                    };
                    if on && slides { window } else { None }
                })
                .collect()
        }
    })
}

#[derive(Debug, Clone)]
struct Attention {
    /// `q_proj`, `k_proj`, `v_proj` over the same input, stacked (one matmul).
    qkv: FusedLinear,
    o: Linear,
    core: AttentionCore,
}

impl Attention {
    fn forward(&self, x: &Array, cache: &mut dyn Cache, rope: &Rope) -> Result<Array> {
        let c = &self.core;
        let parts = match self.qkv.joint_product(x)? {
            Some((y, widths)) => {
                // The fused heads kernel reads q, k and v straight from `y`.
                if let Some(o) = c.attend_joint(&y, cache, rope)? {
                    return self.o.forward(&o);
                }
                crate::models::layers::split_widths(&y, widths)?
            }
            None => self.qkv.forward(x)?,
        };
        let [q, k, v]: [Array; 3] = parts.try_into().expect("three projections");
        let q = c.split(&q, c.heads)?;
        let k = c.split(&k, c.kv_heads)?;
        let v = c.split(&v, c.kv_heads)?;
        self.o.forward(&c.attend(&q, &k, &v, cache, rope)?)
    }

    fn arrays(&self) -> Vec<Array> {
        let mut v = self.qkv.arrays();
        v.extend(self.o.arrays());
        v
    }

    fn quantized_copy(&self, p: QuantParams) -> Result<Attention> {
        Ok(Attention {
            qkv: self
                .qkv
                .quantized_copy(p)?
                .unwrap_or_else(|| self.qkv.clone()),
            o: quantized_or_same(&self.o, p)?,
            core: self.core.clone(),
        })
    }
}

/// One decoder block: pre-norm attention and pre-norm SwiGLU, each with a residual.
///
/// Shared with the MTP heads, whose block is the trunk family's layer.
#[derive(Debug, Clone)]
pub(crate) struct Layer {
    input_norm: RmsNorm,
    attn: Attention,
    post_norm: RmsNorm,
    mlp: FeedForward,
}

impl Layer {
    /// The decoder layer at `vb`: `input_layernorm`, `self_attn.{q,k,v,o}_proj`
    /// (and `q_norm`/`k_norm`), `post_attention_layernorm`, `mlp.*` (a MoE
    /// block of `moe` when given).
    pub(crate) fn load(
        c: &ModelConfig,
        mut vb: Vars<'_>,
        variant: Variant,
        layout: LinearLayout,
        moe: Option<&MoeConfig>,
    ) -> Result<Layer> {
        let h = c.hidden_size;
        let d = c.head_dim;
        let (nq, nkv) = (c.num_attention_heads, c.num_key_value_heads);
        let eps = c.rms_norm_eps;
        let bias_all = c.attention_bias.unwrap_or(false);
        let qkv_bias = variant.qkv_bias || bias_all;
        let mut a = vb.pp("self_attn");
        let (q_norm, k_norm) = if variant.qk_norm {
            (
                Some(rms_norm(a.pp("q_norm"), d, eps)?),
                Some(rms_norm(a.pp("k_norm"), d, eps)?),
            )
        } else {
            (None, None)
        };
        let q = linear(a.pp("q_proj"), h, nq * d, qkv_bias, layout)?;
        let k = linear(a.pp("k_proj"), h, nkv * d, qkv_bias, layout)?;
        let v = linear(a.pp("v_proj"), h, nkv * d, qkv_bias, layout)?;
        let (wq, wkv) = ((nq * d) as i32, (nkv * d) as i32);
        let attn = Attention {
            qkv: FusedLinear::new(vec![q, k, v], vec![wq, wkv, wkv])?,
            o: linear(a.pp("o_proj"), nq * d, h, bias_all, layout)?,
            core: AttentionCore::new(c, q_norm, k_norm),
        };
        Ok(Layer {
            input_norm: rms_norm(vb.pp("input_layernorm"), h, eps)?,
            attn,
            post_norm: rms_norm(vb.pp("post_attention_layernorm"), h, eps)?,
            mlp: match moe {
                Some(m) => {
                    FeedForward::Sparse(Box::new(MoeBlock::load(m, vb.pp("mlp"), h, layout)?))
                }
                None => FeedForward::Dense(Mlp::new(
                    vb.pp("mlp"),
                    h,
                    c.intermediate_size,
                    c.mlp_bias,
                    layout,
                )?),
            },
        })
    }

    /// The block over `x` `[1, L, H]`, appending its keys and values to `cache`.
    pub(crate) fn forward(&self, x: &Array, cache: &mut dyn Cache, rope: &Rope) -> Result<Array> {
        pre_norm_block(
            x,
            &self.input_norm,
            |n| self.attn.forward(n, cache, rope),
            &self.post_norm,
            |h| self.mlp.forward(h),
        )
    }

    /// The same block with its projections affine-quantized to `p` where
    /// they can be (a MoE feed-forward is kept): the MTP head's cheaper copy.
    pub(crate) fn quantized_copy(&self, p: QuantParams) -> Result<Layer> {
        Ok(Layer {
            input_norm: self.input_norm.clone(),
            attn: self.attn.quantized_copy(p)?,
            post_norm: self.post_norm.clone(),
            mlp: self.mlp.quantized_copy(p)?,
        })
    }

    /// The same block with every RMSNorm weight shifted by one (zero-centred checkpoints).
    pub(crate) fn with_shifted_norms(&self) -> Result<Layer> {
        let shift = |n: &Option<RmsNorm>| n.as_ref().map(RmsNorm::shifted_by_one).transpose();
        let mut out = self.clone();
        out.input_norm = self.input_norm.shifted_by_one()?;
        out.post_norm = self.post_norm.shifted_by_one()?;
        out.attn.core.q_norm = shift(&self.attn.core.q_norm)?;
        out.attn.core.k_norm = shift(&self.attn.core.k_norm)?;
        Ok(out)
    }

    /// The arrays to evaluate at load.
    pub(crate) fn arrays(&self) -> Vec<Array> {
        let mut v = self.attn.arrays();
        v.extend(self.mlp.arrays());
        v
    }
}

/// A Llama-family decoder.
#[derive(Debug)]
pub(crate) struct Llama {
    ends: TrunkEnds,
    layers: Vec<Layer>,
    rope: Rope,
    /// Per layer: the sliding attention window, or `None` for full attention.
    windows: Vec<Option<usize>>,
}

impl Llama {
    /// Takes the family's tensors out of `w`, checking every shape against `c`.
    pub(crate) fn load(
        c: &ModelConfig,
        w: &mut Weights,
        variant: Variant,
        layout: LinearLayout,
    ) -> Result<Llama> {
        let windows = check_config(c, variant)?;
        let moe = variant.moe.then(|| moe_config(c)).transpose()?;
        let h = c.hidden_size;
        let tl = w.layout().clone();
        let mut trunk = w.vars(tl.trunk);
        let embed = embedding(trunk.pp("embed_tokens"), c.vocab_size, h)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            let sparse = moe.as_ref().filter(|m| m.sparse.is_sparse(i));
            layers.push(Layer::load(
                c,
                trunk.pp("layers").pp(i),
                variant,
                layout,
                sparse,
            )?);
        }
        let norm = rms_norm(trunk.pp("norm"), h, c.rms_norm_eps)?;
        let lm_head = load_lm_head(c, w, &embed, layout)?;
        let rope = Rope::new(c.head_dim, c.rope_theta, &c.rope_scaling)?;
        // The head is gated on its tensors, not on the config's announcement.
        let mtp = match MtpLayout::detect(c, |name| w.contains(name)) {
            Some(kind) => Some(MtpHead::load(
                kind,
                c,
                w,
                variant,
                layout,
                &embed,
                &lm_head,
                &rope,
                moe.as_ref(),
            )?),
            None => {
                note_missing_mtp(c, w);
                None
            }
        };
        let m = Llama {
            ends: TrunkEnds {
                config: c.clone(),
                embed,
                norm,
                lm_head,
                mtp,
            },
            layers,
            rope,
            windows,
        };
        if !w.is_dry() {
            mlx_tensor::eval(&m.arrays())?;
        }
        Ok(m)
    }

    fn arrays(&self) -> Vec<Array> {
        let mut v = self.ends.arrays();
        for l in &self.layers {
            v.extend(l.arrays());
        }
        v.extend(self.rope.arrays());
        v
    }
}

impl Model for Llama {
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
        self.windows
            .iter()
            .map(|w| match *w {
                // A window of one sees only the current position: keep 0 is valid.
                Some(n) => Box::new(
                    RotatingKvCache::new(n, 0).expect("a positive window with no kept prefix"),
                ) as Box<dyn Cache>,
                None => Box::new(KvCache::new()) as Box<dyn Cache>,
            })
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
