//! Gated full attention (Qwen3.5 / Qwen3-Next): `q_proj` emits a query and a
//! sigmoid output gate per head, q/k RMSNorm, partial RoPE; and the
//! full-attention decoder layer built on it, shared with the MTP head.

use kvcache::Cache;
use mlx_tensor::Array;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::models::attention::AttentionCore;
use crate::models::layers::{Linear, LinearLayout, Mlp, RmsNorm, pre_norm_block};
use crate::models::rope::Rope;
use crate::weights::Weights;

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
    fn forward(&self, x: &Array, cache: &mut dyn Cache, rope: &Rope) -> Result<Array> {
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
}

/// A full-attention decoder block: pre-norm gated attention and pre-norm
/// SwiGLU, each with a residual. Its RMSNorms are loaded already shifted
/// when the checkpoint stores them zero-centred.
#[derive(Debug, Clone)]
pub(crate) struct GatedLayer {
    input_norm: RmsNorm,
    attn: GatedAttention,
    post_norm: RmsNorm,
    mlp: Mlp,
}

/// Loads `{name}` `[dim]`, adding 1 when `shift` (zero-centred storage).
pub(crate) fn load_norm(
    w: &mut Weights,
    name: &str,
    dim: usize,
    eps: f32,
    shift: bool,
) -> Result<RmsNorm> {
    let n = RmsNorm::load(w, name, dim, eps)?;
    if shift { n.shifted_by_one() } else { Ok(n) }
}

impl GatedLayer {
    /// Takes `{prefix}.input_layernorm`, `{prefix}.self_attn.*`,
    /// `{prefix}.post_attention_layernorm` and `{prefix}.mlp.*`.
    pub(crate) fn load(
        c: &ModelConfig,
        w: &mut Weights,
        prefix: &str,
        shift: bool,
        layout: LinearLayout,
    ) -> Result<GatedLayer> {
        let h = c.hidden_size;
        let d = c.head_dim;
        let (nq, nkv) = (c.num_attention_heads, c.num_key_value_heads);
        let eps = c.rms_norm_eps;
        let bias = c.attention_bias.unwrap_or(false);
        let a = format!("{prefix}.self_attn");
        let attn = GatedAttention {
            q: Linear::load(w, &format!("{a}.q_proj"), h, 2 * nq * d, bias, layout)?,
            k: Linear::load(w, &format!("{a}.k_proj"), h, nkv * d, bias, layout)?,
            v: Linear::load(w, &format!("{a}.v_proj"), h, nkv * d, bias, layout)?,
            o: Linear::load(w, &format!("{a}.o_proj"), nq * d, h, bias, layout)?,
            core: AttentionCore::new(
                c,
                Some(load_norm(w, &format!("{a}.q_norm.weight"), d, eps, shift)?),
                Some(load_norm(w, &format!("{a}.k_norm.weight"), d, eps, shift)?),
            ),
        };
        Ok(GatedLayer {
            input_norm: load_norm(
                w,
                &format!("{prefix}.input_layernorm.weight"),
                h,
                eps,
                shift,
            )?,
            attn,
            post_norm: load_norm(
                w,
                &format!("{prefix}.post_attention_layernorm.weight"),
                h,
                eps,
                shift,
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

    /// The arrays to evaluate at load.
    pub(crate) fn arrays(&self) -> Vec<Array> {
        let mut v: Vec<Array> = [&self.attn.q, &self.attn.k, &self.attn.v, &self.attn.o]
            .iter()
            .flat_map(|l| l.arrays())
            .collect();
        v.extend(self.mlp.arrays());
        v
    }
}
