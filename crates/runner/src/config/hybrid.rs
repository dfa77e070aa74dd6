//! The hybrid (Qwen3.5 / Qwen3-Next) part of `config.json`: which layers are
//! linear attention, the Gated DeltaNet shapes, the nested `text_config`.

use std::path::Path;

use serde_json::Value;

use super::RawConfig;
use crate::error::{Error, Result};

/// The kind of one decoder layer of a hybrid model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerKind {
    /// Gated DeltaNet linear attention (conv + recurrent state).
    Linear,
    /// Gated full attention (KV cache).
    Full,
}

/// Layer plan and linear-attention shapes of a hybrid model.
#[derive(Debug, Clone, PartialEq)]
pub struct HybridConfig {
    /// One kind per decoder layer (from `layer_types`, else `full_attention_interval`).
    pub layers: Vec<LayerKind>,
    /// Key (and query) heads of the linear layers.
    pub key_heads: usize,
    /// Value heads of the linear layers; a multiple of `key_heads`.
    pub value_heads: usize,
    /// Per-head key width.
    pub key_head_dim: usize,
    /// Per-head value width.
    pub value_head_dim: usize,
    /// Width of the causal depthwise convolution.
    pub conv_kernel: usize,
    /// Full attention gates its output with `sigmoid(gate)` from a doubled `q_proj`.
    pub attn_output_gate: bool,
}

impl HybridConfig {
    /// Channels of the convolution: q, k and v side by side.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim
    }
}

/// Moves a nested `text_config` to the top level (top-level keys fill what
/// it lacks, `architectures` and `model_type` stay the outer ones), and lifts
/// the RoPE dict (`rope_scaling`, else transformers 5's `rope_parameters`)
/// into `rope_theta`, `partial_rotary_factor` and `rope_scaling` (see
/// [`super::rope_keys`]).
pub(super) fn normalise(value: Value) -> Value {
    let Value::Object(mut top) = value else {
        return value;
    };
    if let Some(Value::Object(text)) = top.remove("text_config") {
        let mut merged = text;
        for key in ["architectures", "model_type"] {
            if let Some(v) = top.remove(key) {
                merged.insert(key.into(), v);
            }
        }
        for (k, v) in top {
            merged.entry(k).or_insert(v);
        }
        top = merged;
    }
    super::rope_keys::lift(&mut top);
    Value::Object(top)
}

/// The hybrid config when `raw` declares linear-attention layers, else `None`.
// Long: one check per hybrid key, each naming the key in its error.
pub(super) fn parse(raw: &RawConfig, path: &Path) -> Result<Option<HybridConfig>> {
    let bad = |key: &'static str, message: String| Error::InvalidConfig {
        path: path.to_owned(),
        key,
        message,
    };
    let declared = raw.linear_num_key_heads.is_some()
        || raw.layer_types.iter().any(|t| t == "linear_attention");
    if !declared {
        return Ok(None);
    }
    let n = raw.num_hidden_layers;
    let from_interval = |every: usize| -> Vec<LayerKind> {
        (0..n)
            .map(|i| {
                if (i + 1) % every == 0 {
                    LayerKind::Full
                } else {
                    LayerKind::Linear
                }
            })
            .collect()
    };
    if raw.full_attention_interval == Some(0) {
        return Err(bad("full_attention_interval", "must be positive".into()));
    }
    let layers = if raw.layer_types.is_empty() {
        from_interval(raw.full_attention_interval.unwrap_or(4))
    } else {
        if raw.layer_types.len() != n {
            return Err(bad(
                "layer_types",
                format!(
                    "has {} entries but num_hidden_layers is {n}: give one per layer",
                    raw.layer_types.len()
                ),
            ));
        }
        let kinds = raw
            .layer_types
            .iter()
            .map(|t| match t.as_str() {
                "linear_attention" => Ok(LayerKind::Linear),
                "full_attention" => Ok(LayerKind::Full),
                other => Err(bad(
                    "layer_types",
                    format!("`{other}` is not a layer type (linear_attention, full_attention)"),
                )),
            })
            .collect::<Result<Vec<_>>>()?;
        if let Some(every) = raw.full_attention_interval
            && from_interval(every) != kinds
        {
            return Err(bad(
                "full_attention_interval",
                format!(
                    "{every} disagrees with layer_types (mlx-lm reads the interval, we read \
                     layer_types): make them agree"
                ),
            ));
        }
        kinds
    };
    let need = |key: &'static str, v: Option<usize>| -> Result<usize> {
        match v {
            Some(0) => Err(bad(key, "must be positive".into())),
            Some(v) if v > i32::MAX as usize => Err(bad(key, format!("{v} is too large"))),
            Some(v) => Ok(v),
            None => Err(bad(
                key,
                "missing: a model with linear-attention layers needs it".into(),
            )),
        }
    };
    let key_heads = need("linear_num_key_heads", raw.linear_num_key_heads)?;
    let value_heads = need("linear_num_value_heads", raw.linear_num_value_heads)?;
    if !value_heads.is_multiple_of(key_heads) {
        return Err(bad(
            "linear_num_value_heads",
            format!("{value_heads} must be a multiple of linear_num_key_heads ({key_heads})"),
        ));
    }
    Ok(Some(HybridConfig {
        layers,
        key_heads,
        value_heads,
        key_head_dim: need("linear_key_head_dim", raw.linear_key_head_dim)?,
        value_head_dim: need("linear_value_head_dim", raw.linear_value_head_dim)?,
        conv_kernel: need(
            "linear_conv_kernel_dim",
            raw.linear_conv_kernel_dim.or(Some(4)),
        )?,
        attn_output_gate: raw.attn_output_gate.unwrap_or(true),
    }))
}

/// `partial_rotary_factor` (1 when absent): the fraction of each head RoPE rotates.
pub(super) fn rotary_factor(factor: Option<f32>, head_dim: usize, path: &Path) -> Result<f32> {
    let f = factor.unwrap_or(1.0);
    let dims = (head_dim as f32 * f) as usize;
    if !(f > 0.0 && f <= 1.0) || dims == 0 || !dims.is_multiple_of(2) {
        return Err(Error::InvalidConfig {
            path: path.to_owned(),
            key: "partial_rotary_factor",
            message: format!(
                "{f} must be in (0, 1] and leave an even number of rotated dims \
                 (head_dim {head_dim} × {f} = {dims})"
            ),
        });
    }
    Ok(f)
}
