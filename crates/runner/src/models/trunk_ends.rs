//! [`TrunkEnds`]: what every family keeps around its layer stack (config,
//! token embedding, final norm, unembedding, MTP head), and the load steps
//! the families share.

use mlx_tensor::{Array, Dtype};

use crate::config::ModelConfig;
use crate::error::Result;
use crate::models::layers::{Embedding, Linear, LinearLayout, RmsNorm};
use crate::mtp::MtpHead;
use crate::weights::Weights;

/// A trunk's two ends: tokens in through `embed`, hidden states out through
/// `norm`, logits through `lm_head`; and the checkpoint's MTP head.
#[derive(Debug)]
pub(crate) struct TrunkEnds {
    pub(crate) config: ModelConfig,
    pub(crate) embed: Embedding,
    pub(crate) norm: RmsNorm,
    /// `[H, V]`: the transposed view of `lm_head.weight`, or of the embedding when tied.
    pub(crate) lm_head: Linear,
    /// The checkpoint's MTP head, loaded once; each request gets a copy with
    /// fresh draft caches (the arrays are shared handles).
    pub(crate) mtp: Option<MtpHead>,
}

impl TrunkEnds {
    /// `tokens` `[L]` embedded as `[1, L, H]`, after checking that the
    /// caller passed one cache per layer.
    pub(crate) fn embed(&self, tokens: &Array, caches: usize, layers: usize) -> Result<Array> {
        assert_eq!(
            caches, layers,
            "caches ({caches}) must match layers ({layers})"
        );
        let l = tokens.dim(0);
        Ok(self
            .embed
            .forward(tokens)?
            .reshape(&[1, l, self.config.hidden_size as i32])?)
    }

    /// The stack's output `[1, L, H]` through the final norm, as `[L, H]`.
    pub(crate) fn finish(&self, x: &Array) -> Result<Array> {
        let l = x.dim(1);
        Ok(self
            .norm
            .forward(x)?
            .reshape(&[l, self.config.hidden_size as i32])?)
    }

    /// Logits `[R, V]` in f32 for hidden rows `[R, H]`.
    pub(crate) fn unembed(&self, hidden: &Array) -> Result<Array> {
        logits_f32(&self.lm_head, hidden)
    }

    /// A fresh copy of the MTP head (empty draft caches) for one request.
    pub(crate) fn mtp_head(&self) -> Option<Box<dyn mtp_draft::DraftHead>> {
        self.mtp
            .as_ref()
            .map(|h| Box::new(h.fresh()) as Box<dyn mtp_draft::DraftHead>)
    }

    /// The embedding's and unembedding's arrays, to evaluate at load.
    pub(crate) fn arrays(&self) -> Vec<Array> {
        let mut v = self.embed.arrays();
        v.extend(self.lm_head.arrays());
        v
    }
}

/// `lm_head` applied to `x`, cast to f32 when the weights are not.
pub(crate) fn logits_f32(lm_head: &Linear, x: &Array) -> Result<Array> {
    let logits = lm_head.forward(x)?;
    Ok(if logits.dtype() == Dtype::Float32 {
        logits
    } else {
        logits.as_type(Dtype::Float32)?
    })
}

/// The unembedding: the embedding's transposed view when `c` ties them,
/// else `lm_head.*`.
pub(crate) fn load_lm_head(
    c: &ModelConfig,
    w: &mut Weights,
    embed: &Embedding,
    layout: LinearLayout,
) -> Result<Linear> {
    if c.tie_word_embeddings {
        // A checkpoint may carry a redundant copy; the embedding is authoritative.
        let _ = w.take_optional(
            "lm_head.weight",
            &[c.vocab_size as i32, c.hidden_size as i32],
        )?;
        embed.as_linear(layout)
    } else {
        Linear::load(w, "lm_head", c.hidden_size, c.vocab_size, false, layout)
    }
}

/// Warns about tensors no layer took (RoPE's stored `inv_freq` buffers are
/// recomputed, so they do not count).
pub(crate) fn warn_unused(w: &Weights) {
    let left = w.remaining();
    let unknown: Vec<&String> = left
        .iter()
        .filter(|n| !n.contains("rotary_emb.inv_freq"))
        .collect();
    if !unknown.is_empty() {
        tracing::warn!(count = unknown.len(), first = %unknown[0], "unused tensors in checkpoint");
    }
}
