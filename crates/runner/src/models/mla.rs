//! Multi-head latent attention (MLA) of DeepSeek-V3 and GLM-4.7-Flash: the
//! query through an optional low-rank pair (`q_a_proj` → RMSNorm →
//! `q_b_proj`), keys and values from one latent (`kv_a_proj_with_mqa` →
//! RMSNorm → `kv_b_proj`) plus a rotary key part shared by every head, RoPE
//! over the rotary parts only (interleaved pairs by default), and a softmax
//! scale that YaRN's `mscale_all_dim` raises.
//!
//! Design: the cache holds per-head keys (`qk_nope + qk_rope` wide) and
//! values, as transformers' attention sees them, not mlx-lm's absorbed form
//! (the normalised latent plus the rotary key, with `kv_b_proj` folded into
//! the query and the output). Every attention path of `attention.rs` (the CPU
//! rows kernel, MLX's fused kernel, the explicit form, the short CUDA
//! kernels), the KV cache's rewinds and its snapshots then apply unchanged,
//! and they all assume keys and values of one width: where `v_head_dim`
//! differs from the query/key width, the narrower side is padded with zeros
//! (zero query/key features add nothing to a score, zero value features give
//! zero outputs, sliced off). The cost is cache memory: per token and layer
//! `2 · heads · max(qk, v)` values against mlx-lm's `kv_lora + qk_rope`
//! (DeepSeek-V3: 49,152 against 576); the absorbed form is a later step.

use kvcache::Cache;
use mlx_tensor::{Array, ops};
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::models::attention::AttentionCore;
use crate::models::layers::{Linear, LinearLayout, RmsNorm, linear, rms_norm};
use crate::models::rope::Rope;
use crate::weights::Vars;

/// The epsilon of `q_a_layernorm` and `kv_a_layernorm`: transformers builds
/// both with its RMSNorm's default, not `rms_norm_eps` (and mlx-lm agrees).
const LATENT_NORM_EPS: f32 = 1e-6;

/// The MLA sizes of a config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MlaConfig {
    /// Rank of the query's low-rank pair; `None`: one `q_proj`.
    pub q_lora_rank: Option<usize>,
    /// Width of the key/value latent.
    pub kv_lora_rank: usize,
    /// Per-head key/query features without position.
    pub qk_nope: usize,
    /// Per-head key/query features under RoPE (the key's shared by all heads).
    pub qk_rope: usize,
    /// Per-head value width.
    pub v_head: usize,
    /// `rope_interleave`: RoPE over adjacent pairs.
    pub interleave: bool,
    /// Softmax scale: `1/√(qk_nope + qk_rope)`, times `mscale(factor,
    /// mscale_all_dim)²` under a scaled RoPE that gives `mscale_all_dim`.
    pub scale: f32,
}

impl MlaConfig {
    /// Reads the MLA keys of `c`, refusing absent or inconsistent ones by name.
    pub(crate) fn parse(c: &ModelConfig) -> Result<MlaConfig> {
        let raw = &c.raw;
        let size = |key: &'static str| -> Result<usize> {
            match raw.get(key) {
                Some(v) => v
                    .as_u64()
                    .filter(|&n| n > 0 && n <= i32::MAX as u64)
                    .map(|n| n as usize)
                    .ok_or_else(|| {
                        c.unsupported_key(key, format!("must be a positive integer, found {v}"))
                    }),
                None => Err(c.unsupported_key(
                    key,
                    "missing: multi-head latent attention needs it (the checkpoint's \
                     config.json states it; copy it from there)"
                        .into(),
                )),
            }
        };
        let q_lora_rank = match raw.get("q_lora_rank") {
            Some(Value::Null) => None,
            None => {
                return Err(c.unsupported_key(
                    "q_lora_rank",
                    "missing: give the query's low rank, or null for a single `q_proj`".into(),
                ));
            }
            Some(_) => Some(size("q_lora_rank")?),
        };
        let (kv_lora_rank, qk_nope, qk_rope, v_head) = (
            size("kv_lora_rank")?,
            size("qk_nope_head_dim")?,
            size("qk_rope_head_dim")?,
            size("v_head_dim")?,
        );
        if qk_rope % 2 != 0 {
            return Err(c.unsupported_key(
                "qk_rope_head_dim",
                format!("{qk_rope} must be even for RoPE"),
            ));
        }
        // transformers rotates all `qk_rope_head_dim` features; a partial factor
        // would make its rotary tables narrower than the features they rotate.
        if c.partial_rotary_factor != 1.0 {
            return Err(c.unsupported_key(
                "partial_rotary_factor",
                format!(
                    "{} is not implemented for multi-head latent attention, which rotates \
                     all qk_rope_head_dim features; remove the key",
                    c.partial_rotary_factor
                ),
            ));
        }
        let interleave = match raw.get("rope_interleave") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(c.unsupported_key(
                    "rope_interleave",
                    format!("must be true or false, found {v}"),
                ));
            }
        };
        let mut scale = 1.0 / ((qk_nope + qk_rope) as f32).sqrt();
        scale *= mscale_all_dim(c)?.powi(2);
        Ok(MlaConfig {
            q_lora_rank,
            kv_lora_rank,
            qk_nope,
            qk_rope,
            v_head,
            interleave,
            scale,
        })
    }

    /// The RoPE of the rotary parts: `qk_rope_head_dim` features with the
    /// config's base and scaling, interleaved unless `rope_interleave` is false.
    pub(crate) fn rope(&self, c: &ModelConfig) -> Result<Rope> {
        let r = Rope::new(self.qk_rope, c.rope_theta, &c.rope_scaling)?;
        Ok(if self.interleave { r.interleaved() } else { r })
    }

    fn qk(&self) -> usize {
        self.qk_nope + self.qk_rope
    }

    /// The width keys and values are cached at (see the module docs).
    fn width(&self) -> usize {
        self.qk().max(self.v_head)
    }
}

/// transformers' `yarn_apply_mscale` factor: `0.1 · mscale_all_dim · ln(factor)
/// + 1` when the RoPE dict is not the default one, gives a non-zero
/// `mscale_all_dim` and a factor above 1; else 1.
fn mscale_all_dim(c: &ModelConfig) -> Result<f32> {
    let dict = &c.raw["rope_scaling"];
    let kind = dict["rope_type"]
        .as_str()
        .or(dict["type"].as_str())
        .unwrap_or("default");
    let all = dict["mscale_all_dim"].as_f64().unwrap_or(0.0);
    if kind == "default" || all == 0.0 {
        return Ok(1.0);
    }
    let factor = dict["factor"].as_f64().ok_or_else(|| {
        c.unsupported_key(
            "rope_scaling",
            "gives mscale_all_dim without a factor; transformers needs both".into(),
        )
    })?;
    Ok(if factor <= 1.0 {
        1.0
    } else {
        (0.1 * all * factor.ln() + 1.0) as f32
    })
}

/// How the query is projected.
#[derive(Debug, Clone)]
enum Query {
    Direct(Linear),
    LowRank { a: Linear, norm: RmsNorm, b: Linear },
}

/// One MLA layer's projections.
#[derive(Debug, Clone)]
pub(crate) struct MlaAttention {
    q: Query,
    kv_a: Linear,
    kv_a_norm: RmsNorm,
    /// `[heads · (qk_nope + v), kv_lora]`, dense even from mlx-lm's split form.
    kv_b: Linear,
    o: Linear,
    dims: MlaConfig,
    core: AttentionCore,
}

impl MlaAttention {
    /// Takes `self_attn.*` of one layer: the hub's `kv_b_proj`, or mlx-lm's
    /// `embed_q` / `unembed_out` (dense or quantized) joined back into it.
    pub(crate) fn load(
        c: &ModelConfig,
        m: &MlaConfig,
        mut a: Vars<'_>,
        layout: LinearLayout,
    ) -> Result<MlaAttention> {
        let (h, heads) = (c.hidden_size, c.num_attention_heads);
        if c.num_key_value_heads != heads {
            return Err(c.unsupported_key(
                "num_key_value_heads",
                format!(
                    "{} differs from num_attention_heads ({heads}): multi-head latent \
                     attention expands its latent to every head",
                    c.num_key_value_heads
                ),
            ));
        }
        let bias = c.attention_bias.unwrap_or(false);
        let q = match m.q_lora_rank {
            None => Query::Direct(linear(a.pp("q_proj"), h, heads * m.qk(), false, layout)?),
            Some(r) => Query::LowRank {
                a: linear(a.pp("q_a_proj"), h, r, bias, layout)?,
                norm: rms_norm(a.pp("q_a_layernorm"), r, LATENT_NORM_EPS)?,
                b: linear(a.pp("q_b_proj"), r, heads * m.qk(), false, layout)?,
            },
        };
        let kv_a = linear(
            a.pp("kv_a_proj_with_mqa"),
            h,
            m.kv_lora_rank + m.qk_rope,
            bias,
            layout,
        )?;
        let kv_a_norm = rms_norm(a.pp("kv_a_layernorm"), m.kv_lora_rank, LATENT_NORM_EPS)?;
        let kv_b = if a.contains("embed_q.weight") {
            joined_kv_b(m, heads, &mut a, layout)?
        } else {
            let out = heads * (m.qk_nope + m.v_head);
            linear(a.pp("kv_b_proj"), m.kv_lora_rank, out, false, layout)?
        };
        let o = linear(a.pp("o_proj"), heads * m.v_head, h, bias, layout)?;
        Ok(MlaAttention {
            q,
            kv_a,
            kv_a_norm,
            kv_b,
            o,
            dims: *m,
            core: AttentionCore::with_scale(heads as i32, m.width() as i32, m.scale),
        })
    }

    /// Attention of `x` `[1, L, H]` at the cache's offset, appending its keys
    /// and values to `cache`; `[1, L, H]` out.
    pub(crate) fn forward(&self, x: &Array, cache: &mut dyn Cache, rope: &Rope) -> Result<Array> {
        let m = &self.dims;
        let (l, heads) = (x.dim(1), self.core.heads);
        let (nope, rot, vd, lora) = (
            m.qk_nope as i32,
            m.qk_rope as i32,
            m.v_head as i32,
            m.kv_lora_rank as i32,
        );
        let q = match &self.q {
            Query::Direct(p) => p.forward(x)?,
            Query::LowRank { a, norm, b } => b.forward(&norm.forward(&a.forward(x)?)?)?,
        };
        // Heads-first `[1, heads, L, qk]`.
        let q = q
            .reshape(&[1, l, heads, nope + rot])?
            .transpose(&[0, 2, 1, 3])?;
        let offset = cache.offset();
        let q_rot = rope.forward(&q.slice_axis(3, nope, nope + rot)?, offset)?;
        let q = ops::concatenate(&[q.slice_axis(3, 0, nope)?, q_rot], 3)?;
        let ckv = self.kv_a.forward(x)?;
        let latent = self.kv_a_norm.forward(&ckv.slice_axis(2, 0, lora)?)?;
        // One rotary key head `[1, 1, L, rot]`, shared by every head.
        let k_rot = ckv
            .slice_axis(2, lora, lora + rot)?
            .reshape(&[1, l, 1, rot])?
            .transpose(&[0, 2, 1, 3])?;
        let k_rot = rope
            .forward(&k_rot, offset)?
            .broadcast_to(&[1, heads, l, rot])?;
        let kv = self
            .kv_b
            .forward(&latent)?
            .reshape(&[1, l, heads, nope + vd])?
            .transpose(&[0, 2, 1, 3])?;
        let k = ops::concatenate(&[kv.slice_axis(3, 0, nope)?, k_rot], 3)?;
        let v = kv.slice_axis(3, nope, nope + vd)?;
        let w = m.width() as i32;
        let (q, k, v) = (pad(&q, w)?, pad(&k, w)?, pad(&v, w)?);
        let o = self.core.attend_heads((q, k, v), cache)?;
        let o = if w == vd {
            o
        } else {
            o.reshape(&[1, l, heads, w])?
                .slice_axis(3, 0, vd)?
                .reshape(&[1, l, heads * vd])?
        };
        self.o.forward(&o)
    }

    /// The layer's arrays (to evaluate at load).
    pub(crate) fn arrays(&self) -> Vec<Array> {
        let mut v = match &self.q {
            Query::Direct(p) => p.arrays(),
            Query::LowRank { a, norm, b } => {
                let mut v = a.arrays();
                v.push(norm.weight().clone());
                v.extend(b.arrays());
                v
            }
        };
        for l in [&self.kv_a, &self.kv_b, &self.o] {
            v.extend(l.arrays());
        }
        v.push(self.kv_a_norm.weight().clone());
        v
    }
}

/// `x` `[1, H, L, d]` with zero features appended up to `width`.
fn pad(x: &Array, width: i32) -> Result<Array> {
    let d = x.dim(3);
    if d == width {
        return Ok(x.clone());
    }
    let zeros = ops::zeros(&[x.dim(0), x.dim(1), x.dim(2), width - d], x.dtype())?;
    Ok(ops::concatenate(&[x.clone(), zeros], 3)?)
}

/// mlx-lm's split of `kv_b_proj` (its `sanitize`): `embed_q` `[heads,
/// kv_lora, qk_nope]` (each head's key rows, transposed) and `unembed_out`
/// `[heads, v, kv_lora]` (its value rows), dense or affine-quantized along
/// their last axis; joined back into `[heads · (qk_nope + v), kv_lora]`.
/// Quantized halves are dequantized: the same weights mlx-lm multiplies by.
fn joined_kv_b(
    m: &MlaConfig,
    heads: usize,
    a: &mut Vars<'_>,
    layout: LinearLayout,
) -> Result<Linear> {
    let (lora, nope, v) = (m.kv_lora_rank, m.qk_nope, m.v_head);
    let take = |mut vb: Vars<'_>, out: usize, input: usize| -> Result<Array> {
        match vb.take_quantized_stack(&[heads], out, input)? {
            Some(q) => q.dequantize(),
            None => vb.take("weight", &[heads, out, input]),
        }
    };
    let k = take(a.pp("embed_q"), lora, nope)?.transpose(&[0, 2, 1])?;
    let v_rows = take(a.pp("unembed_out"), v, lora)?;
    let w =
        ops::concatenate(&[k, v_rows], 1)?.reshape(&[(heads * (nope + v)) as i32, lora as i32])?;
    Ok(Linear::from_weight(&w.contiguous()?, None, layout)?)
}
