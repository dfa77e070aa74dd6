//! Qwen3.5 dense text models: a hybrid stack of Gated DeltaNet layers
//! (recurrent) and gated full-attention layers, zero-centred RMSNorms,
//! partial RoPE, and an `mtp.*` head whose block is a gated full-attention
//! layer. The checkpoint format is in `docs/hybrid-format.md`.

use kvcache::{Cache, KvCache, RecurrentCache};
use mlx_tensor::{Array, Dtype};

use crate::config::{HybridConfig, LayerKind, ModelConfig};
use crate::error::{Error, Result};
use crate::model::Model;
use crate::models::gated_attention::{GatedLayer, load_norm};
use crate::models::gated_delta::GatedDeltaNet;
use crate::models::layers::{Embedding, Linear, LinearLayout, Mlp, RmsNorm};
use crate::models::rope::Rope;
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
    config: ModelConfig,
    embed: Embedding,
    layers: Vec<Layer>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: Rope,
    mtp: Option<MtpHead>,
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
        let lm_head = if c.tie_word_embeddings {
            let _ = w.take_optional("lm_head.weight", &[c.vocab_size as i32, h as i32])?;
            embed.as_linear(layout)?
        } else {
            Linear::load(w, "lm_head", h, c.vocab_size, false, layout)?
        };
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
        let left = w.remaining();
        if !left.is_empty() {
            tracing::warn!(count = left.len(), first = %left[0], "unused tensors in checkpoint");
        }
        let m = Qwen35 {
            config: c.clone(),
            embed,
            layers,
            norm,
            lm_head,
            rope,
            mtp,
        };
        mlx_tensor::eval(&m.arrays())?;
        Ok(m)
    }

    fn arrays(&self) -> Vec<Array> {
        let mut v = self.embed.arrays();
        for l in &self.layers {
            match l {
                Layer::Linear(l) => {
                    v.extend(l.mixer.arrays());
                    v.extend(l.mlp.arrays());
                }
                Layer::Full(l) => v.extend(l.arrays()),
            }
        }
        v.extend(self.lm_head.arrays());
        v
    }
}

impl Model for Qwen35 {
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn Cache>]) -> Result<Array> {
        assert_eq!(
            caches.len(),
            self.layers.len(),
            "caches ({}) must match layers ({})",
            caches.len(),
            self.layers.len()
        );
        let l = tokens.dim(0);
        let hs = self.config.hidden_size as i32;
        let mut x = self.embed.forward(tokens)?.reshape(&[1, l, hs])?;
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            x = match layer {
                Layer::Full(b) => b.forward(&x, cache.as_mut(), &self.rope)?,
                Layer::Linear(b) => {
                    let r = b
                        .mixer
                        .forward(&b.input_norm.forward(&x)?, cache.as_mut())?;
                    let h = x.add(&r)?;
                    h.add(&b.mlp.forward(&b.post_norm.forward(&h)?)?)?
                }
            };
        }
        Ok(self.norm.forward(&x)?.reshape(&[l, hs])?)
    }

    fn unembed(&self, hidden: &Array) -> Result<Array> {
        let logits = self.lm_head.forward(hidden)?;
        Ok(if logits.dtype() == Dtype::Float32 {
            logits
        } else {
            logits.as_type(Dtype::Float32)?
        })
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
        &self.config
    }

    fn mtp_head(&self) -> Option<Box<dyn mtp_draft::DraftHead>> {
        self.mtp
            .as_ref()
            .map(|h| Box::new(h.fresh()) as Box<dyn mtp_draft::DraftHead>)
    }
}
