//! Qwen3.5 text models, dense and MoE: a hybrid stack of Gated DeltaNet
//! layers (recurrent) and gated full-attention layers, zero-centred
//! RMSNorms, partial RoPE, and an `mtp.*` head whose block is a gated
//! full-attention layer. Qwen3.5-MoE (`qwen3_5_moe`) makes every layer's
//! `mlp`, the head's too, a mixture-of-experts block (`models/moe.rs`). The
//! checkpoint format is in `docs/hybrid-format.md`.

use kvcache::{Cache, KvCache, RecurrentCache};
use mlx_tensor::Array;

use crate::config::{HybridConfig, LayerKind, ModelConfig};
use crate::error::{Error, Result};
use crate::models::Model;
use crate::models::gated_attention::{GatedLayer, load_norm};
use crate::models::gated_delta::{GatedDeltaNet, InProj};
use crate::models::layers::{LinearLayout, RmsNorm, embedding, pre_norm_block};
use crate::models::moe::{FeedForward, MoeConfig, MoeDefaults, Scoring};
use crate::models::mtp::{MtpHead, MtpLayout};
use crate::models::rope::Rope;
use crate::models::trunk_ends::{TrunkEnds, load_lm_head, note_missing_mtp, wrong_mtp_layout};
use crate::weights::Weights;

/// Whether the trunk's RMSNorms are stored zero-centred (`x · (1 + w)`, as
/// transformers saves Qwen3.5) and need the +1 once.
///
/// mlx-lm's `sanitize` moves `conv1d.weight` from `[C, 1, K]` to `[C, K, 1]`
/// and, exactly when it did, adds 1 to the trunk norms: so a `[C, K, 1]`
/// conv means the norms are already shifted and must not be shifted again.
/// A model without linear layers gives no evidence; mlx-lm then shifts
/// nothing either, so its norms are still zero-centred.
pub(crate) fn zero_centred_trunk(h: &HybridConfig, w: &Weights, trunk: &str) -> bool {
    // Every conv should agree; the majority decides, so a stray one is the
    // tensor the loader names.
    let (mut mlx, mut hf) = (0, 0);
    for (i, _) in h
        .layers
        .iter()
        .enumerate()
        .filter(|(_, k)| **k == LayerKind::Linear)
    {
        let name = format!("{trunk}.layers.{i}.linear_attn.conv1d.weight");
        match w.stored_shape(&name).as_deref() {
            Some([_, k, 1]) if *k == h.conv_kernel && *k != 1 => mlx += 1,
            Some([_, 1, _]) => hf += 1,
            // Missing or odd: the loader names the tensor and the shape it expects.
            _ => {}
        }
    }
    match (mlx, hf) {
        // A model without linear layers gives no evidence; mlx-lm then shifts
        // nothing either, so its norms are still zero-centred.
        (0, 0) => true,
        (m, f) => f >= m,
    }
}

/// Builds a Qwen3.5 dense text model.
pub(crate) fn build_qwen3_5(
    c: &ModelConfig,
    w: &mut Weights,
    l: LinearLayout,
) -> Result<Box<dyn Model>> {
    Ok(Box::new(Qwen35::load(c, w, l)?))
}

/// Builds a Qwen3.5-MoE text model (refusing a config without experts).
pub(crate) fn build_qwen3_5_moe(
    c: &ModelConfig,
    w: &mut Weights,
    l: LinearLayout,
) -> Result<Box<dyn Model>> {
    if moe_config(c)?.is_none() {
        return Err(c.unsupported_key(
            "num_experts",
            format!(
                "model_type `{}` is a mixture-of-experts model but config.json declares no \
                 experts (num_experts, num_experts_per_tok, moe_intermediate_size)",
                c.model_type
            ),
        ));
    }
    Ok(Box::new(Qwen35::load(c, w, l)?))
}

/// The MoE part of a Qwen3.5 config: softmax routing, renormalised unless
/// `norm_topk_prob` says otherwise (transformers always renormalises).
fn moe_config(c: &ModelConfig) -> Result<Option<MoeConfig>> {
    MoeConfig::parse(
        c,
        MoeDefaults {
            scoring: Scoring::Softmax,
            norm_topk_prob: true,
        },
    )
}

/// A linear-attention decoder block: pre-norm Gated DeltaNet and a pre-norm
/// feed-forward (SwiGLU, or MoE in Qwen3.5-MoE).
#[derive(Debug, Clone)]
struct LinearLayer {
    input_norm: RmsNorm,
    mixer: GatedDeltaNet,
    post_norm: RmsNorm,
    mlp: FeedForward,
}

#[derive(Debug, Clone)]
enum Layer {
    Linear(LinearLayer),
    Full(GatedLayer),
}

/// A Qwen3.5 hybrid decoder.
#[derive(Debug)]
pub(crate) struct Qwen35 {
    ends: TrunkEnds,
    layers: Vec<Layer>,
    rope: Rope,
}

impl Qwen35 {
    /// Takes the family's tensors out of `w`, checking every shape against `c`.
    // Long: reads like the checkpoint: config refusals, trunk, head, MTP, in tensor order.
    pub(crate) fn load(c: &ModelConfig, w: &mut Weights, layout: LinearLayout) -> Result<Qwen35> {
        let hybrid: &HybridConfig = c.hybrid.as_ref().ok_or_else(|| Error::InvalidConfig {
            path: "config.json".into(),
            key: "layer_types",
            message: format!(
                "model_type `{}` is a hybrid model but config.json declares no linear-attention \
                 layers (layer_types / linear_num_key_heads ...)",
                c.model_type
            ),
        })?;
        if !hybrid.attn_output_gate {
            return Err(c.unsupported_key(
                "attn_output_gate",
                "false is not implemented (full attention is always gated here)".into(),
            ));
        }
        if c.raw["mtp_use_dedicated_embeddings"].as_bool() == Some(true) {
            return Err(c.unsupported_key(
                "mtp_use_dedicated_embeddings",
                "true is not implemented (the MTP head shares the trunk's embedding)".into(),
            ));
        }
        let moe = moe_config(c)?;
        let h = c.hidden_size;
        let eps = c.rms_norm_eps;
        let tl = w.layout().clone();
        let shift = zero_centred_trunk(hybrid, w, tl.trunk);
        let mlx_conv = !shift && hybrid.layers.contains(&LayerKind::Linear);
        let mut trunk = w.vars(tl.trunk);
        let embed = embedding(trunk.pp("embed_tokens"), c.vocab_size, h)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut stack = trunk.pp("layers");
        for (i, kind) in hybrid.layers.iter().enumerate() {
            let mut p = stack.pp(i);
            let sparse = moe.as_ref().filter(|m| m.sparse.is_sparse(i));
            layers.push(match kind {
                LayerKind::Full => Layer::Full(GatedLayer::load(c, p, shift, layout, sparse)?),
                LayerKind::Linear => Layer::Linear(LinearLayer {
                    input_norm: load_norm(p.pp("input_layernorm"), h, eps, shift)?,
                    mixer: GatedDeltaNet::load(
                        c,
                        hybrid,
                        p.pp("linear_attn"),
                        InProj::Split,
                        mlx_conv,
                        layout,
                    )?,
                    post_norm: load_norm(p.pp("post_attention_layernorm"), h, eps, shift)?,
                    mlp: FeedForward::load(sparse, p.pp("mlp"), h, c.intermediate_size, layout)?,
                }),
            });
        }
        drop(stack);
        let norm = load_norm(trunk.pp("norm"), h, eps, shift)?;
        let lm_head = load_lm_head(c, w, &embed, layout)?;
        let rotary = (c.head_dim as f32 * c.partial_rotary_factor) as usize;
        let rope = Rope::new(rotary, c.rope_theta, &c.rope_scaling)?;
        let mtp = match MtpLayout::detect(c, |name| w.contains(name)) {
            Some(MtpLayout::Qwen) => {
                // The head's block is a MoE layer whenever the trunk has experts.
                let m = moe.as_ref();
                Some(MtpHead::load_gated(
                    c, w, layout, &embed, &lm_head, &rope, m,
                )?)
            }
            Some(other) => {
                return Err(wrong_mtp_layout(
                    c,
                    "mtp_num_hidden_layers",
                    other,
                    "`mtp.*`",
                ));
            }
            None => {
                note_missing_mtp(c, w);
                None
            }
        };
        let m = Qwen35 {
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
            match l {
                Layer::Linear(l) => {
                    v.extend(l.mixer.arrays());
                    v.extend(l.mlp.arrays());
                }
                Layer::Full(l) => v.extend(l.arrays()),
            }
        }
        v
    }
}

impl Model for Qwen35 {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn Cache>]) -> Result<Array> {
        self.ends.forward(
            tokens,
            caches,
            &self.layers,
            |layer, x, cache| match layer {
                Layer::Full(b) => b.forward(x, cache, &self.rope),
                Layer::Linear(b) => pre_norm_block(
                    x,
                    &b.input_norm,
                    |n| b.mixer.forward(n, cache),
                    &b.post_norm,
                    |h| b.mlp.forward(h),
                ),
            },
        )
    }

    fn unembed(&self, hidden: &Array) -> Result<Array> {
        self.ends.unembed(hidden)
    }

    fn new_caches(&self) -> Vec<Box<dyn Cache>> {
        self.layers
            .iter()
            .map(|l| match l {
                Layer::Linear(_) => Box::new(RecurrentCache::new()) as Box<dyn Cache>,
                Layer::Full(_) => Box::new(KvCache::new()) as Box<dyn Cache>,
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
