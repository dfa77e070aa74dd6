//! Detecting an MTP head's tensor layout and naming its tensors.

use crate::config::ModelConfig;

/// The tensor layout of a checkpoint's MTP head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MtpLayout {
    /// `mtp.*` (Qwen3.5, Qwen3-Next, and our bundled tiny model).
    Qwen,
    /// `model.layers.{num_hidden_layers}.*` with `enorm`, `hnorm`, `eh_proj`, `shared_head`.
    DeepSeek,
    /// `model.mtp_layers.0.*` with `token_layernorm`, `hidden_layernorm`, `input_proj`.
    Mimo,
}

/// Names of one layout's tensors (without the `.weight` suffix for linears).
#[derive(Debug, Clone)]
pub struct Names {
    /// Norm applied to the embedding of the look-ahead token.
    pub embed_norm: String,
    /// Norm applied to the conditioning hidden.
    pub hidden_norm: String,
    /// The 2H→H projection (linear prefix).
    pub proj: String,
    /// Prefix of the decoder block (`input_layernorm`, `self_attn.*`, ...).
    pub block: String,
    /// The head's final norm.
    pub final_norm: String,
    /// A dedicated LM head (linear prefix), when the layout may carry one.
    pub head: Option<String>,
    /// A duplicate embedding some exports carry; loaded and discarded.
    pub duplicate_embed: Option<String>,
}

impl MtpLayout {
    /// Every layout, in detection order.
    pub const ALL: [MtpLayout; 3] = [MtpLayout::Qwen, MtpLayout::DeepSeek, MtpLayout::Mimo];

    /// The layout whose tensors are present, checked with `has(name)`.
    pub fn detect(config: &ModelConfig, has: impl Fn(&str) -> bool) -> Option<MtpLayout> {
        Self::ALL
            .into_iter()
            .find(|l| has(&format!("{}.weight", l.names(config).proj)))
    }

    /// The prefix (with its trailing dot) under which this layout keeps every
    /// tensor of the head, for a trunk of `num_hidden_layers` layers.
    pub fn prefix(self, num_hidden_layers: usize) -> String {
        match self {
            MtpLayout::Qwen => "mtp.".to_owned(),
            MtpLayout::DeepSeek => format!("model.layers.{num_hidden_layers}."),
            MtpLayout::Mimo => "model.mtp_layers.".to_owned(),
        }
    }

    /// How many MTP layers of this layout `names` hold: layers `0..n` each
    /// with at least one tensor (`mtp.layers.{i}.*`, `model.layers.{N + i}.*`,
    /// `model.mtp_layers.{i}.*`). The head drafts with layer 0 alone.
    pub fn layers_present<'a>(
        self,
        config: &ModelConfig,
        names: impl Iterator<Item = &'a str>,
    ) -> usize {
        let names: Vec<&str> = names.collect();
        (0..)
            .take_while(|&i| {
                let p = self.layer_prefix(config, i);
                names.iter().any(|n| n.starts_with(&p))
            })
            .count()
    }

    /// Layer 0's prefix without its trailing dot: the layer the head drafts with.
    fn layer_zero(self, config: &ModelConfig) -> String {
        let mut p = self.layer_prefix(config, 0);
        p.pop();
        p
    }

    /// The prefix (with its trailing dot) of MTP layer `i`'s own tensors.
    pub fn layer_prefix(self, config: &ModelConfig, i: usize) -> String {
        match self {
            MtpLayout::Qwen => format!("mtp.layers.{i}."),
            MtpLayout::DeepSeek => format!("model.layers.{}.", config.num_hidden_layers + i),
            MtpLayout::Mimo => format!("model.mtp_layers.{i}."),
        }
    }

    /// True when tensor or module `name` belongs to an MTP head of any layout.
    pub fn owns(name: &str, num_hidden_layers: usize) -> bool {
        Self::ALL
            .iter()
            .any(|l| name.starts_with(&l.prefix(num_hidden_layers)))
    }

    /// Tensor names of this layout for `config`.
    pub fn names(self, config: &ModelConfig) -> Names {
        match self {
            MtpLayout::Qwen => Names {
                embed_norm: "mtp.pre_fc_norm_embedding.weight".into(),
                hidden_norm: "mtp.pre_fc_norm_hidden.weight".into(),
                proj: "mtp.fc".into(),
                block: self.layer_zero(config),
                final_norm: "mtp.norm.weight".into(),
                head: None,
                duplicate_embed: None,
            },
            MtpLayout::DeepSeek => {
                let p = self.layer_zero(config);
                Names {
                    embed_norm: format!("{p}.enorm.weight"),
                    hidden_norm: format!("{p}.hnorm.weight"),
                    proj: format!("{p}.eh_proj"),
                    final_norm: format!("{p}.shared_head.norm.weight"),
                    head: Some(format!("{p}.shared_head.head")),
                    duplicate_embed: Some(format!("{p}.embed_tokens.weight")),
                    block: p,
                }
            }
            MtpLayout::Mimo => {
                let p = self.layer_zero(config);
                Names {
                    embed_norm: format!("{p}.token_layernorm.weight"),
                    hidden_norm: format!("{p}.hidden_layernorm.weight"),
                    proj: format!("{p}.input_proj"),
                    final_norm: format!("{p}.final_layernorm.weight"),
                    head: None,
                    duplicate_embed: None,
                    block: p,
                }
            }
        }
    }

    /// True when the hidden comes first in the concatenation (MiMo).
    pub fn hidden_first(self) -> bool {
        self == MtpLayout::Mimo
    }

    /// True when the final norm belongs to the unembedding rather than the
    /// output rows (DeepSeek's `shared_head`): the chained hidden is then the
    /// block output before that norm.
    pub fn norm_in_head(self) -> bool {
        self == MtpLayout::DeepSeek
    }

    /// A short name for `info` and statistics.
    pub fn name(self) -> &'static str {
        match self {
            MtpLayout::Qwen => "qwen3.5",
            MtpLayout::DeepSeek => "deepseek-v3",
            MtpLayout::Mimo => "mimo",
        }
    }
}

/// Whether the head's RMSNorm weights are stored zero-centred (the norm
/// computes `x · (1 + w)`, so the loader adds 1 once).
///
/// The rule: an explicit `mtp_norm_zero_centered` in config.json wins;
/// otherwise the Qwen3.5 / Qwen3-Next model types store them zero-centred
/// (as their trunk norms) and every other model type stores plain weights.
/// The bundled tiny model is `qwen3` with `mtp_norm_zero_centered: false`.
pub fn zero_centred_norms(config: &ModelConfig) -> bool {
    let by_type = matches!(
        config.model_type.as_str(),
        "qwen3_next" | "qwen3_5" | "qwen3_5_moe" | "qwen3_5_text" | "qwen3_5_moe_text"
    );
    config.mtp_norm_zero_centered.unwrap_or(by_type)
}
