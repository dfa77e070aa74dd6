//! Qwen3.5 dense text models: a hybrid stack of Gated DeltaNet layers
//! (recurrent) and gated full-attention layers, zero-centred RMSNorms,
//! partial RoPE, and an `mtp.*` head whose block is a gated full-attention
//! layer. The checkpoint format is in `docs/hybrid-format.md`.

use kvcache::{Cache, KvCache, RecurrentCache};
use mlx_tensor::Array;

use crate::config::{HybridConfig, LayerKind, ModelConfig};
use crate::error::{Error, Result};
use crate::model::Model;
use crate::models::gated_attention::{GatedLayer, load_norm};
use crate::models::gated_delta::GatedDeltaNet;
use crate::models::layers::{Embedding, LinearLayout, Mlp, RmsNorm, pre_norm_block};
use crate::models::rope::Rope;
use crate::models::trunk_ends::{TrunkEnds, load_lm_head, warn_unused};
use crate::mtp::{MtpHead, MtpLayout};
use crate::weights::Weights;

/// Builds a Qwen3.5 dense text model.
pub fn build_qwen3_5(c: &ModelConfig, w: &mut Weights, l: LinearLayout) -> Result<Box<dyn Model>> {
    Ok(Box::new(Qwen35::load(c, w, l)?))
}

/// A linear-attention decoder block: pre-norm Gated DeltaNet and pre-norm SwiGLU.
#[derive(Debug, Clone)]
struct LinearLayer {
    input_norm: RmsNorm,
    mixer: GatedDeltaNet,
    post_norm: RmsNorm,
    mlp: Mlp,
}

#[derive(Debug, Clone)]
enum Layer {
    Linear(LinearLayer),
    Full(GatedLayer),
}

/// A Qwen3.5 hybrid decoder.
#[derive(Debug)]
pub struct Qwen35 {
    ends: TrunkEnds,
    layers: Vec<Layer>,
    rope: Rope,
}

impl Qwen35 {
    /// Takes the family's tensors out of `w`, checking every shape against `c`.
    pub fn load(c: &ModelConfig, w: &mut Weights, layout: LinearLayout) -> Result<Qwen35> {
        let hybrid: &HybridConfig = c.hybrid.as_ref().ok_or_else(|| Error::InvalidConfig {
            path: "config.json".into(),
            key: "layer_types",
            message: format!(
                "model_type `{}` is a hybrid model but config.json declares no linear-attention \
                 layers (layer_types / linear_num_key_heads ...)",
                c.model_type
            ),
        })?;
        let h = c.hidden_size;
        let eps = c.rms_norm_eps;
        // Qwen3RMSNorm of the HF checkpoint computes x · (1 + w): shift once.
        let shift = true;
        let embed = Embedding::load(w, "model.embed_tokens", c.vocab_size, h)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for (i, kind) in hybrid.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            layers.push(match kind {
                LayerKind::Full => Layer::Full(GatedLayer::load(c, w, &p, shift, layout)?),
                LayerKind::Linear => Layer::Linear(LinearLayer {
                    input_norm: load_norm(
                        w,
                        &format!("{p}.input_layernorm.weight"),
                        h,
                        eps,
                        shift,
                    )?,
                    mixer: GatedDeltaNet::load(c, hybrid, w, &format!("{p}.linear_attn"), layout)?,
                    post_norm: load_norm(
                        w,
                        &format!("{p}.post_attention_layernorm.weight"),
                        h,
                        eps,
                        shift,
                    )?,
                    mlp: Mlp::load(w, &format!("{p}.mlp"), h, c.intermediate_size, layout)?,
                }),
            });
        }
        let norm = load_norm(w, "model.norm.weight", h, eps, shift)?;
        let lm_head = load_lm_head(c, w, &embed, layout)?;
        let rotary = (c.head_dim as f32 * c.partial_rotary_factor) as usize;
        let rope = Rope::new(rotary, c.rope_theta, &c.rope_scaling)?;
        let mtp = match MtpLayout::detect(c, |name| w.contains(name)) {
            Some(MtpLayout::Qwen) => {
                Some(MtpHead::load_gated(c, w, layout, &embed, &lm_head, &rope)?)
            }
            Some(other) => {
                tracing::warn!(
                    layout = other.name(),
                    "MTP layout not wired for qwen3_5; no head"
                );
                None
            }
            None => None,
        };
        warn_unused(w);
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
        mlx_tensor::eval(&m.arrays())?;
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
        let mut x = self.ends.embed(tokens, caches.len(), self.layers.len())?;
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            x = match layer {
                Layer::Full(b) => b.forward(&x, cache.as_mut(), &self.rope)?,
                Layer::Linear(b) => pre_norm_block(
                    &x,
                    &b.input_norm,
                    |n| b.mixer.forward(n, cache.as_mut()),
                    &b.post_norm,
                    &b.mlp,
                )?,
            };
        }
        self.ends.finish(&x)
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
}
