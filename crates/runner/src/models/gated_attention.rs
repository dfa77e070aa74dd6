//! Gated full attention (Qwen3.5 / Qwen3-Next): `q_proj` emits a query and a
//! sigmoid output gate per head, q/k RMSNorm, partial RoPE; and the
//! full-attention decoder layer built on it, shared with the MTP head.

use kvcache::Cache;
use mlx_tensor::Array;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::models::attention::AttentionCore;
use crate::models::layers::{
    Linear, LinearLayout, RmsNorm, linear, pre_norm_block, quantized_or_same, rms_norm,
};
use crate::models::moe::{FeedForward, MoeConfig};
use crate::models::rope::Rope;
use crate::quant::QuantParams;
use crate::weights::Vars;

/// Attention whose output is multiplied by `sigmoid(gate)` before `o_proj`.
#[derive(Debug, Clone)]
pub(crate) struct GatedAttention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    core: AttentionCore,
}

impl GatedAttention {
    /// The attention at `vb` (`self_attn`): query+gate `q_proj`, `k_proj`,
    /// `v_proj`, `o_proj`, `q_norm` and `k_norm` (shifted when `shift`).
    pub(crate) fn load(
        c: &ModelConfig,
        mut a: Vars<'_>,
        shift: bool,
        layout: LinearLayout,
    ) -> Result<GatedAttention> {
        let h = c.hidden_size;
        let d = c.head_dim;
        let (nq, nkv) = (c.num_attention_heads, c.num_key_value_heads);
        let eps = c.rms_norm_eps;
        let bias = c.attention_bias.unwrap_or(false);
        Ok(GatedAttention {
            q: linear(a.pp("q_proj"), h, 2 * nq * d, bias, layout)?,
            k: linear(a.pp("k_proj"), h, nkv * d, bias, layout)?,
            v: linear(a.pp("v_proj"), h, nkv * d, bias, layout)?,
            o: linear(a.pp("o_proj"), nq * d, h, bias, layout)?,
            core: AttentionCore::new(
                c,
                Some(load_norm(a.pp("q_norm"), d, eps, shift)?),
                Some(load_norm(a.pp("k_norm"), d, eps, shift)?),
            ),
        })
    }

    /// The attention over `x` `[1, L, H]`, appending its keys and values to `cache`.
    pub(crate) fn forward(&self, x: &Array, cache: &mut dyn Cache, rope: &Rope) -> Result<Array> {
        let c = &self.core;
        let l = x.dim(1);
        let d = c.head_dim;
        // Per head: [query D | gate D].
        let qg = self.q.forward(x)?.reshape(&[1, l, c.heads, 2 * d])?;
        let q = qg.slice_axis(3, 0, d)?;
        let gate = qg.slice_axis(3, d, 2 * d)?.reshape(&[1, l, c.heads * d])?;
        let k = c.split(&self.k.forward(x)?, c.kv_heads)?;
        let v = c.split(&self.v.forward(x)?, c.kv_heads)?;
        let o = c.attend(&q, &k, &v, cache, rope)?;
        self.o.forward(&o.multiply(&gate.sigmoid()?)?)
    }

    /// The arrays to evaluate at load.
    pub(crate) fn arrays(&self) -> Vec<Array> {
        [&self.q, &self.k, &self.v, &self.o]
            .iter()
            .flat_map(|l| l.arrays())
            .collect()
    }
}

/// A full-attention decoder block: pre-norm gated attention and a pre-norm
/// feed-forward (SwiGLU or mixture-of-experts), each with a residual. Its RMSNorms are loaded already shifted
/// when the checkpoint stores them zero-centred.
#[derive(Debug, Clone)]
pub(crate) struct GatedLayer {
    input_norm: RmsNorm,
    attn: GatedAttention,
    post_norm: RmsNorm,
    mlp: FeedForward,
}

/// The RMSNorm at `vb` (`weight` `[dim]`), adding 1 when `shift`
/// (zero-centred storage).
pub(crate) fn load_norm(vb: Vars<'_>, dim: usize, eps: f32, shift: bool) -> Result<RmsNorm> {
    let n = rms_norm(vb, dim, eps)?;
    if shift { n.shifted_by_one() } else { Ok(n) }
}

impl GatedLayer {
    /// The full-attention layer at `vb`: `input_layernorm`, `self_attn.*`
    /// (query+gate `q_proj`, `q_norm`, `k_norm`), `post_attention_layernorm`,
    /// `mlp.*` (a MoE block when `moe` is given, else a dense MLP).
    pub(crate) fn load(
        c: &ModelConfig,
        mut vb: Vars<'_>,
        shift: bool,
        layout: LinearLayout,
        moe: Option<&MoeConfig>,
    ) -> Result<GatedLayer> {
        let h = c.hidden_size;
        let eps = c.rms_norm_eps;
        let attn = GatedAttention::load(c, vb.pp("self_attn"), shift, layout)?;
        Ok(GatedLayer {
            input_norm: load_norm(vb.pp("input_layernorm"), h, eps, shift)?,
            attn,
            post_norm: load_norm(vb.pp("post_attention_layernorm"), h, eps, shift)?,
            mlp: FeedForward::load(moe, vb.pp("mlp"), h, c.intermediate_size, layout)?,
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

    /// The arrays to evaluate at load.
    pub(crate) fn arrays(&self) -> Vec<Array> {
        let mut v = self.attn.arrays();
        v.extend(self.mlp.arrays());
        v
    }

    /// The same layer with its projections affine-quantized to `p` where
    /// they can be (a MoE feed-forward is kept): the MTP head's cheaper copy.
    pub(crate) fn quantized_copy(&self, p: QuantParams) -> Result<GatedLayer> {
        let a = &self.attn;
        Ok(GatedLayer {
            input_norm: self.input_norm.clone(),
            attn: GatedAttention {
                q: quantized_or_same(&a.q, p)?,
                k: quantized_or_same(&a.k, p)?,
                v: quantized_or_same(&a.v, p)?,
                o: quantized_or_same(&a.o, p)?,
                core: a.core.clone(),
            },
            post_norm: self.post_norm.clone(),
            mlp: self.mlp.quantized_copy(p)?,
        })
    }
}
