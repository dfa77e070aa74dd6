//! The Llama family: Llama 2/3, Mistral, Qwen2/2.5 (q/k/v bias), Qwen3 (q/k RMSNorm).

use mlx_tensor::Array;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::model::Model;
use crate::models::attention::AttentionCore;
use crate::models::layers::{Embedding, Linear, LinearLayout, Mlp, RmsNorm, pre_norm_block};
use crate::models::rope::Rope;
use crate::models::trunk_ends::{TrunkEnds, load_lm_head, warn_unused};
use crate::mtp::{MtpHead, MtpLayout};
use crate::weights::Weights;
use kvcache::{Cache, KvCache};

/// What distinguishes the members of the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    /// q/k/v projections carry a bias (Qwen2).
    pub qkv_bias: bool,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
}

/// Builds Llama or Mistral (`attention_bias` puts a bias on q/k/v/o).
pub fn build_llama(c: &ModelConfig, w: &mut Weights, l: LinearLayout) -> Result<Box<dyn Model>> {
    let v = Variant {
        qkv_bias: false,
        qk_norm: false,
    };
    Ok(Box::new(Llama::load(c, w, v, l)?))
}

/// Builds Qwen2 / Qwen2.5.
pub fn build_qwen2(c: &ModelConfig, w: &mut Weights, l: LinearLayout) -> Result<Box<dyn Model>> {
    let v = Variant {
        qkv_bias: true,
        qk_norm: false,
    };
    Ok(Box::new(Llama::load(c, w, v, l)?))
}

/// Builds Qwen3.
pub fn build_qwen3(c: &ModelConfig, w: &mut Weights, l: LinearLayout) -> Result<Box<dyn Model>> {
    let v = Variant {
        qkv_bias: false,
        qk_norm: true,
    };
    Ok(Box::new(Llama::load(c, w, v, l)?))
}

#[derive(Debug, Clone)]
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    core: AttentionCore,
}

impl Attention {
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

/// One decoder block: pre-norm attention and pre-norm SwiGLU, each with a residual.
///
/// Shared with the MTP heads, whose block is the trunk family's layer.
#[derive(Debug, Clone)]
pub(crate) struct Layer {
    input_norm: RmsNorm,
    attn: Attention,
    post_norm: RmsNorm,
    mlp: Mlp,
}

impl Layer {
    /// Takes `{prefix}.input_layernorm`, `{prefix}.self_attn.*`,
    /// `{prefix}.post_attention_layernorm` and `{prefix}.mlp.*`.
    pub(crate) fn load(
        c: &ModelConfig,
        w: &mut Weights,
        prefix: &str,
        variant: Variant,
        layout: LinearLayout,
    ) -> Result<Layer> {
        let h = c.hidden_size;
        let d = c.head_dim;
        let (nq, nkv) = (c.num_attention_heads, c.num_key_value_heads);
        let eps = c.rms_norm_eps;
        let bias_all = c.attention_bias.unwrap_or(false);
        let qkv_bias = variant.qkv_bias || bias_all;
        let a = format!("{prefix}.self_attn");
        let (q_norm, k_norm) = if variant.qk_norm {
            (
                Some(RmsNorm::load(w, &format!("{a}.q_norm.weight"), d, eps)?),
                Some(RmsNorm::load(w, &format!("{a}.k_norm.weight"), d, eps)?),
            )
        } else {
            (None, None)
        };
        let attn = Attention {
            q: Linear::load(w, &format!("{a}.q_proj"), h, nq * d, qkv_bias, layout)?,
            k: Linear::load(w, &format!("{a}.k_proj"), h, nkv * d, qkv_bias, layout)?,
            v: Linear::load(w, &format!("{a}.v_proj"), h, nkv * d, qkv_bias, layout)?,
            o: Linear::load(w, &format!("{a}.o_proj"), nq * d, h, bias_all, layout)?,
            core: AttentionCore::new(c, q_norm, k_norm),
        };
        Ok(Layer {
            input_norm: RmsNorm::load(w, &format!("{prefix}.input_layernorm.weight"), h, eps)?,
            attn,
            post_norm: RmsNorm::load(
                w,
                &format!("{prefix}.post_attention_layernorm.weight"),
                h,
                eps,
            )?,
            mlp: Mlp::load(w, &format!("{prefix}.mlp"), h, c.intermediate_size, layout)?,
        })
    }

    /// The block over `x` `[1, L, H]`, appending its keys and values to `cache`.
    pub(crate) fn forward(&self, x: &Array, cache: &mut dyn Cache, rope: &Rope) -> Result<Array> {
        pre_norm_block(
            x,
            &self.input_norm,
            |n| self.attn.forward(n, cache, rope),
            &self.post_norm,
            &self.mlp,
        )
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
pub struct Llama {
    ends: TrunkEnds,
    layers: Vec<Layer>,
    rope: Rope,
}

impl Llama {
    /// Takes the family's tensors out of `w`, checking every shape against `c`.
    pub fn load(
        c: &ModelConfig,
        w: &mut Weights,
        variant: Variant,
        layout: LinearLayout,
    ) -> Result<Llama> {
        let h = c.hidden_size;
        let embed = Embedding::load(w, "model.embed_tokens", c.vocab_size, h)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        for i in 0..c.num_hidden_layers {
            layers.push(Layer::load(
                c,
                w,
                &format!("model.layers.{i}"),
                variant,
                layout,
            )?);
        }
        let norm = RmsNorm::load(w, "model.norm.weight", h, c.rms_norm_eps)?;
        let lm_head = load_lm_head(c, w, &embed, layout)?;
        let rope = Rope::new(c.head_dim, c.rope_theta, &c.rope_scaling)?;
        // The head is gated on its tensors, not on the config's announcement.
        let mtp = match MtpLayout::detect(c, |name| w.contains(name)) {
            Some(kind) => Some(MtpHead::load(
                kind, c, w, variant, layout, &embed, &lm_head, &rope,
            )?),
            None => {
                if c.mtp_layers > 0 {
                    tracing::warn!(
                        declared = c.mtp_layers,
                        "config announces MTP layers but no MTP tensors were found"
                    );
                }
                None
            }
        };
        warn_unused(w);
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
        };
        mlx_tensor::eval(&m.arrays())?;
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
        let mut x = self.ends.embed(tokens, caches.len(), self.layers.len())?;
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            x = layer.forward(&x, cache.as_mut(), &self.rope)?;
        }
        self.ends.finish(&x)
    }

    fn unembed(&self, hidden: &Array) -> Result<Array> {
        self.ends.unembed(hidden)
    }

    fn new_caches(&self) -> Vec<Box<dyn Cache>> {
        (0..self.layers.len())
            .map(|_| Box::new(KvCache::new()) as Box<dyn Cache>)
            .collect()
    }

    fn config(&self) -> &ModelConfig {
        &self.ends.config
    }

    fn mtp_head(&self) -> Option<Box<dyn mtp_draft::DraftHead>> {
        self.ends.mtp_head()
    }
}
