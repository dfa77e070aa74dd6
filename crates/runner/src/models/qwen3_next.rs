//! Qwen3-Next: the Qwen3.5 hybrid stack (Gated DeltaNet and gated full
//! attention, zero-centred RMSNorms, partial RoPE) with the DeltaNet's input
//! projections fused per key-head group (`in_proj_qkvz`, `in_proj_ba`, split
//! at load), a mixture-of-experts MLP in the sparse layers (softmax router,
//! sigmoid-gated shared expert) and an `mtp.*` head whose block is a MoE
//! full-attention layer. Config keys are transformers 4 style
//! (`full_attention_interval`, top-level `rope_theta`), as the hub checkpoint.

use kvcache::{Cache, KvCache, RecurrentCache};
use mlx_tensor::Array;

use crate::config::{HybridConfig, LayerKind, ModelConfig};
use crate::error::{Error, Result};
use crate::models::Model;
use crate::models::gated_attention::{GatedAttention, load_norm};
use crate::models::gated_delta::{GatedDeltaNet, InProj};
use crate::models::layers::{LinearLayout, RmsNorm, embedding, pre_norm_block};
use crate::models::moe::{FeedForward, MoeConfig, MoeDefaults, Scoring};
use crate::models::mtp::{MtpHead, MtpLayout};
use crate::models::qwen3_5::zero_centred_trunk;
use crate::models::rope::Rope;
use crate::models::trunk_ends::{TrunkEnds, load_lm_head, note_missing_mtp, wrong_mtp_layout};
use crate::weights::{Vars, Weights};

/// Builds a Qwen3-Next model.
pub(crate) fn build_qwen3_next(
    c: &ModelConfig,
    w: &mut Weights,
    l: LinearLayout,
) -> Result<Box<dyn Model>> {
    Ok(Box::new(Qwen3Next::load(c, w, l)?))
}

#[derive(Debug, Clone)]
enum Mixer {
    Linear(GatedDeltaNet),
    Full(GatedAttention),
}

/// One decoder layer: a pre-norm mixer and a pre-norm MLP or MoE block.
#[derive(Debug, Clone)]
struct NextLayer {
    input_norm: RmsNorm,
    mixer: Mixer,
    post_norm: RmsNorm,
    ffn: FeedForward,
}

/// What a layer's load needs beyond its prefix.
#[derive(Debug, Clone, Copy)]
struct LayerPlan<'a> {
    kind: LayerKind,
    /// The MoE config when this layer's MLP is sparse.
    moe: Option<&'a MoeConfig>,
    shift: bool,
    mlx_conv: bool,
}

impl NextLayer {
    fn load(
        c: &ModelConfig,
        hybrid: &HybridConfig,
        mut vb: Vars<'_>,
        plan: LayerPlan<'_>,
        layout: LinearLayout,
    ) -> Result<NextLayer> {
        let (h, eps, shift) = (c.hidden_size, c.rms_norm_eps, plan.shift);
        let input_norm = load_norm(vb.pp("input_layernorm"), h, eps, shift)?;
        let mixer = match plan.kind {
            LayerKind::Full => {
                Mixer::Full(GatedAttention::load(c, vb.pp("self_attn"), shift, layout)?)
            }
            LayerKind::Linear => Mixer::Linear(GatedDeltaNet::load(
                c,
                hybrid,
                vb.pp("linear_attn"),
                InProj::Fused,
                plan.mlx_conv,
                layout,
            )?),
        };
        let post_norm = load_norm(vb.pp("post_attention_layernorm"), h, eps, shift)?;
        let ffn = FeedForward::load(plan.moe, vb.pp("mlp"), h, c.intermediate_size, layout)?;
        Ok(NextLayer {
            input_norm,
            mixer,
            post_norm,
            ffn,
        })
    }

    fn forward(&self, x: &Array, cache: &mut dyn Cache, rope: &Rope) -> Result<Array> {
        pre_norm_block(
            x,
            &self.input_norm,
            |n| match &self.mixer {
                Mixer::Full(a) => a.forward(n, cache, rope),
                Mixer::Linear(m) => m.forward(n, cache),
            },
            &self.post_norm,
            |h| self.ffn.forward(h),
        )
    }

    fn arrays(&self) -> Vec<Array> {
        let mut v = match &self.mixer {
            Mixer::Full(a) => a.arrays(),
            Mixer::Linear(m) => m.arrays(),
        };
        v.extend(self.ffn.arrays());
        v
    }
}

/// A Qwen3-Next hybrid MoE decoder.
#[derive(Debug)]
pub(crate) struct Qwen3Next {
    ends: TrunkEnds,
    layers: Vec<NextLayer>,
    kinds: Vec<LayerKind>,
    rope: Rope,
}

impl Qwen3Next {
    /// Takes the family's tensors out of `w`, checking every shape against `c`.
    // Long: reads like the checkpoint: config, trunk, head, MTP, in tensor order.
    pub(crate) fn load(
        c: &ModelConfig,
        w: &mut Weights,
        layout: LinearLayout,
    ) -> Result<Qwen3Next> {
        let hybrid: &HybridConfig = c.hybrid.as_ref().ok_or_else(|| Error::InvalidConfig {
            path: "config.json".into(),
            key: "linear_num_key_heads",
            message: "qwen3_next is a hybrid model but config.json declares no linear-attention \
                      layers (linear_num_key_heads, full_attention_interval ...)"
                .into(),
        })?;
        let moe = MoeConfig::parse(
            c,
            MoeDefaults {
                scoring: Scoring::Softmax,
                norm_topk_prob: true,
            },
        )?;
        let h = c.hidden_size;
        let tl = w.layout().clone();
        let shift = zero_centred_trunk(hybrid, w, tl.trunk);
        let mlx_conv = !shift && hybrid.layers.contains(&LayerKind::Linear);
        let mut trunk = w.vars(tl.trunk);
        let embed = embedding(trunk.pp("embed_tokens"), c.vocab_size, h)?;
        let mut layers = Vec::with_capacity(c.num_hidden_layers);
        let mut stack = trunk.pp("layers");
        for (i, kind) in hybrid.layers.iter().enumerate() {
            let plan = LayerPlan {
                kind: *kind,
                moe: moe.as_ref().filter(|m| m.sparse.is_sparse(i)),
                shift,
                mlx_conv,
            };
            layers.push(NextLayer::load(c, hybrid, stack.pp(i), plan, layout)?);
        }
        drop(stack);
        let norm = load_norm(trunk.pp("norm"), h, c.rms_norm_eps, shift)?;
        let lm_head = load_lm_head(c, w, &embed, layout)?;
        // 0.25 when the config leaves it out (`config::defaults`).
        let rope = Rope::new(
            (c.head_dim as f32 * c.partial_rotary_factor) as usize,
            c.rope_theta,
            &c.rope_scaling,
        )?;
        let mtp = match MtpLayout::detect(c, |name| w.contains(name)) {
            Some(MtpLayout::Qwen) => {
                // The head's block is a gated full-attention layer, sparse
                // when the checkpoint gave it a router.
                let sparse = moe
                    .as_ref()
                    .filter(|_| w.contains("mtp.layers.0.mlp.gate.weight"));
                Some(MtpHead::load_gated(
                    c, w, layout, &embed, &lm_head, &rope, sparse,
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
        let m = Qwen3Next {
            ends: TrunkEnds {
                config: c.clone(),
                embed,
                norm,
                lm_head,
                mtp,
            },
            layers,
            kinds: hybrid.layers.clone(),
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
            v.extend(l.arrays());
        }
        v
    }
}

impl Model for Qwen3Next {
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
        self.kinds
            .iter()
            .map(|k| match k {
                LayerKind::Linear => Box::new(RecurrentCache::new()) as Box<dyn Cache>,
                LayerKind::Full => Box::new(KvCache::new()) as Box<dyn Cache>,
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
