//! [`AttentionCore`]: the part of multi-head attention every family shares
//! between its projections: per-head q/k RMSNorm, RoPE at the cache's offset,
//! the cache update and mask, and scaled dot-product attention.

use kvcache::{AttentionMask, Cache};
use mlx_tensor::{Array, fast};

use crate::config::ModelConfig;
use crate::error::Result;
use crate::models::heads_kernel;
use crate::models::layers::RmsNorm;
use crate::models::rope::Rope;
use crate::models::sdpa::{self, Kernel};
use crate::models::short_sdpa;

/// Head counts, scale and optional per-head q/k norms of one attention layer.
#[derive(Debug, Clone)]
pub(crate) struct AttentionCore {
    pub(crate) q_norm: Option<RmsNorm>,
    pub(crate) k_norm: Option<RmsNorm>,
    pub(crate) heads: i32,
    pub(crate) kv_heads: i32,
    pub(crate) head_dim: i32,
    scale: f32,
}

impl AttentionCore {
    /// The heads of `c` (`1/√head_dim` scale) with the given q/k norms.
    pub(crate) fn new(
        c: &ModelConfig,
        q_norm: Option<RmsNorm>,
        k_norm: Option<RmsNorm>,
    ) -> AttentionCore {
        AttentionCore {
            q_norm,
            k_norm,
            heads: c.num_attention_heads as i32,
            kv_heads: c.num_key_value_heads as i32,
            head_dim: c.head_dim as i32,
            scale: 1.0 / (c.head_dim as f32).sqrt(),
        }
    }

    /// A projection `[1, L, n·D]` viewed as `n` heads: `[1, L, n, D]`.
    pub(crate) fn split(&self, y: &Array, n: i32) -> Result<Array> {
        Ok(y.reshape(&[1, y.dim(1), n, self.head_dim])?)
    }

    /// Attention of `q` `[1, L, heads, D]` over the cache extended by `k`, `v`
    /// `[1, L, kv_heads, D]`, returned as `[1, L, heads·D]`.
    pub(crate) fn attend(
        &self,
        q: &Array,
        k: &Array,
        v: &Array,
        cache: &mut dyn Cache,
        rope: &Rope,
    ) -> Result<Array> {
        let norms = (self.q_norm.as_ref(), self.k_norm.as_ref());
        let heads = heads_kernel::heads(q, k, v, norms, rope, cache.offset())?;
        self.attend_heads(heads, cache)
    }

    /// [`AttentionCore::attend`] of one fused projection `y` `[1, L,
    /// (heads + 2·kv_heads)·D]` (q's heads, then k's, then v's) where the
    /// fused heads kernel reads the three parts straight from it; `None`
    /// where it does not (the caller splits `y`).
    pub(crate) fn attend_joint(
        &self,
        y: &Array,
        cache: &mut dyn Cache,
        rope: &Rope,
    ) -> Result<Option<Array>> {
        let norms = (self.q_norm.as_ref(), self.k_norm.as_ref());
        let shape = (self.heads, self.kv_heads, self.head_dim);
        match heads_kernel::heads_joint(y, shape, norms, rope, cache.offset())? {
            Some(heads) => Ok(Some(self.attend_heads(heads, cache)?)),
            None => Ok(None),
        }
    }

    /// Attention of heads-first q, k, v `[1, H, L, D]` (normed and rotated)
    /// over the cache extended by k, v, returned as `[1, L, heads·D]`.
    pub(crate) fn attend_heads(
        &self,
        (q, k, v): (Array, Array, Array),
        cache: &mut dyn Cache,
    ) -> Result<Array> {
        let l = q.dim(2);
        // Every kernel below reads q, k and v at one head width (multi-head
        // latent attention, whose widths differ, has its own form in `mla.rs`).
        assert!(
            [q.dim(3), k.dim(3), v.dim(3)] == [self.head_dim; 3],
            "attention of head width {} got q {}, k {}, v {} wide",
            self.head_dim,
            q.dim(3),
            k.dim(3),
            v.dim(3)
        );
        // The cache picks the mask (before the update): causal aligned at the end for
        // L > 1, so a chunk at offset > 0 sees the whole prefix; none for one query.
        let mask = cache.make_mask(l as usize)?;
        let (keys, values) = cache.update_and_fetch(&k, &v)?;
        // The mask is causal for several rows of a full-attention cache (`None`
        // for one row); a windowed cache hands out its own array mask, which
        // only the fused kernel takes.
        let causal = matches!(mask, AttentionMask::Causal);
        let shape = sdpa::Shape {
            rows: l,
            keys: keys.dim(2),
            heads: self.heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
        };
        let o = match sdpa::choose(shape, q.dtype()) {
            // Already `[1, L, heads·D]`.
            Kernel::CpuRows if causal || (l == 1 && matches!(mask, AttentionMask::None)) => {
                // Over the cache's own buffers where it has them: a slice node
                // would hold the buffer until this attention has run, and the
                // next step's cache write would copy it (`ops::kv_write_cpu`).
                return Ok(match cache.kv_buffers() {
                    Some((kb, vb)) => mlx_tensor::ops::attention_rows_cpu_cached(
                        &q,
                        &kb,
                        &vb,
                        keys.dim(2),
                        self.scale,
                    )?,
                    None => {
                        mlx_tensor::ops::attention_rows_cpu_merged(&q, &keys, &values, self.scale)?
                    }
                });
            }
            // Already `[1, L, heads·D]`.
            Kernel::Short if causal => {
                return short_sdpa::attend(&q, &keys, &values, self.scale);
            }
            Kernel::Explicit | Kernel::Short if causal => {
                sdpa::explicit(&q, &keys, &values, self.scale)?
            }
            Kernel::Padded if causal => match cache.kv_buffers() {
                Some((kb, vb)) => sdpa::padded(&q, &kb, &vb, keys.dim(2), self.scale)?,
                None => fast::scaled_dot_product_attention(
                    &q,
                    &keys,
                    &values,
                    self.scale,
                    mask.as_fast(),
                )?,
            },
            _ => {
                fast::scaled_dot_product_attention(&q, &keys, &values, self.scale, mask.as_fast())?
            }
        };
        Ok(o.transpose(&[0, 2, 1, 3])?
            .reshape(&[1, l, self.heads * self.head_dim])?)
    }
}
