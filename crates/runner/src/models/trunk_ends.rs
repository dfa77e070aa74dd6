//! [`TrunkEnds`]: what every family keeps around its layer stack (config,
//! token embedding, final norm, unembedding, MTP head), and the load steps
//! the families share.

use kvcache::Cache;
use mlx_tensor::{Array, Dtype};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::models::dispatch;
use crate::models::layers::{Embedding, Linear, LinearLayout, RmsNorm, linear};
use crate::models::mtp::{MtpHead, MtpLayout};
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
    /// The trunk's forward: `tokens` `[L]` embedded as `[1, L, H]`, through
    /// `layers` in order (`step` runs one layer over its own cache; the
    /// dispatch hook may hand the graph so far to the device after it),
    /// and out through the final norm as hidden rows `[L, H]`. The one loop
    /// every family's `Model::forward` is: a family says only how a layer steps.
    pub(crate) fn forward<L>(
        &self,
        tokens: &Array,
        caches: &mut [Box<dyn Cache>],
        layers: &[L],
        step: impl Fn(&L, &Array, &mut dyn Cache) -> Result<Array>,
    ) -> Result<Array> {
        let n = layers.len();
        assert_eq!(
            caches.len(),
            n,
            "caches ({}) must match layers ({n})",
            caches.len()
        );
        let l = tokens.dim(0);
        let h = self.config.hidden_size as i32;
        let mut x = self.embed.forward(tokens)?.reshape(&[1, l, h])?;
        for (i, (layer, cache)) in layers.iter().zip(caches.iter_mut()).enumerate() {
            x = step(layer, &x, cache.as_mut())?;
            dispatch::after_layer(&x, i + 1, n, &self.config)?;
        }
        Ok(self.norm.forward(&x)?.reshape(&[l, h])?)
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

    /// Replaces the MTP head by its copy set up as `s` asks: over a
    /// vocabulary subset ([`MtpHead::with_draft_vocab`], gathered from the
    /// full-precision rows), then quantized ([`MtpHead::quantized`]); false
    /// when there is no head.
    pub(crate) fn adapt_mtp(&mut self, s: &crate::DraftHeadSetup) -> Result<bool> {
        let Some(head) = &self.mtp else {
            return Ok(false);
        };
        let mut head = match &s.vocab {
            Some(ids) => head.with_draft_vocab(ids)?,
            None => head.fresh(),
        };
        if let Some(p) = s.quant {
            head = head.quantized(p)?;
        }
        self.mtp = Some(head);
        Ok(true)
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
/// else the checkpoint's `lm_head` (under the layout's prefix).
pub(crate) fn load_lm_head(
    c: &ModelConfig,
    w: &mut Weights,
    embed: &Embedding,
    layout: LinearLayout,
) -> Result<Linear> {
    let prefix = w.layout().lm_head;
    let mut vb = w.vars(prefix);
    if c.tie_word_embeddings {
        // A checkpoint may carry a redundant copy; the embedding is
        // authoritative (as in transformers and mlx-lm). A copy that differs
        // says the config's tie may be wrong: said, not silently dropped.
        if let Some(head) = vb.take_optional("weight", &[c.vocab_size, c.hidden_size])?
            && !tied_copy_agrees(embed, &head, c.vocab_size)?
        {
            tracing::warn!(
                "config.json ties the unembedding to the embedding (tie_word_embeddings: true), \
                 but the checkpoint's {prefix}.weight differs from it; it is not used, as \
                 transformers and mlx-lm do not. If this model has its own head, set \
                 tie_word_embeddings to false"
            );
        }
        embed.as_linear(layout)
    } else {
        linear(vb, c.hidden_size, c.vocab_size, false, layout)
    }
}

/// Whether a tied checkpoint's own `lm_head` copy equals the embedding, on
/// a few rows (first, middle, last: a different head differs everywhere);
/// a quantized embedding is not compared.
fn tied_copy_agrees(embed: &Embedding, head: &Array, vocab: usize) -> Result<bool> {
    if embed.is_quantized() {
        return Ok(true);
    }
    let ids: Vec<i32> = [0, vocab / 2, vocab.saturating_sub(1)]
        .iter()
        .map(|&i| i32::try_from(i).unwrap_or(0))
        .collect();
    let ids = Array::from_slice(&ids, &[3])?;
    let a = embed.forward(&ids)?.as_type(Dtype::Float32)?;
    let b = head.take(&ids, 0)?.as_type(Dtype::Float32)?;
    Ok(a.equal(&b)?.all(&[0, 1], false)?.item::<bool>()?)
}

/// The error for a checkpoint whose MTP head has the `found` layout where
/// the family of `c` reads the head as `expected` (its config key `key`
/// counts the head's layers).
pub(crate) fn wrong_mtp_layout(
    c: &ModelConfig,
    key: &'static str,
    found: MtpLayout,
    expected: &str,
) -> Error {
    c.unsupported_key(
        key,
        format!(
            "the checkpoint's MTP head has the {} layout, which {} does not use (expected \
             {expected})",
            found.name(),
            c.model_type
        ),
    )
}

/// Says once, at load, why a config that announces MTP layers has no head:
/// mlx-lm's converter drops `mtp.*` (and `model.mtp_layers.*`).
pub(crate) fn note_missing_mtp(c: &ModelConfig, w: &Weights) {
    if c.mtp_layers == 0 {
        return;
    }
    if w.layout().mlx_converted || w.quantization().is_some() {
        tracing::warn!(declared = c.mtp_layers, "{MLX_DROPPED_MTP}");
    } else {
        tracing::warn!(
            declared = c.mtp_layers,
            "config announces MTP layers but no MTP tensors were found; running without speculation"
        );
    }
}

/// What to tell a user whose mlx-lm conversion lost its MTP head.
pub(crate) const MLX_DROPPED_MTP: &str = "config.json declares MTP layers but the checkpoint has no MTP \
    tensors: mlx-lm's converter (mlx_lm.convert / mlx-community uploads) removes them, so this \
    folder runs without MTP speculation. `mtp-runner quantize --model HF_FOLDER` from the \
    Hugging Face folder keeps the head.";

/// The tensors no layer took, ignoring RoPE's stored `inv_freq` buffers
/// (recomputed from the config).
pub(crate) fn unused(w: &Weights) -> Vec<String> {
    w.remaining()
        .into_iter()
        .filter(|n| !n.contains("rotary_emb.inv_freq"))
        .collect()
}
