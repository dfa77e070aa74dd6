//! [`MoeConfig`]: the mixture-of-experts keys of config.json, for every family.
//!
//! | key | meaning | families |
//! | --- | --- | --- |
//! | `num_experts` / `num_local_experts` / `n_routed_experts` | routed experts `E` | all (transformers 5 writes Qwen2/3-MoE's as `num_local_experts`) |
//! | `num_experts_per_tok` | experts per token `k` | all |
//! | `moe_intermediate_size` | one expert's inner width | all |
//! | `norm_topk_prob` | renormalise the `k` chosen weights | all (default per family) |
//! | `n_group`, `topk_group` | grouped choice: keep the best `topk_group` of `n_group` groups | DeepSeek-V3, GLM-4.5 |
//! | `routed_scaling_factor` | scale of the routed sum | DeepSeek-V3, GLM-4.5 |
//! | `shared_expert_intermediate_size` | one sigmoid-gated shared expert | Qwen2-MoE, Qwen3-Next, Qwen3.5-MoE |
//! | `n_shared_experts` | ungated shared experts of `n · moe_intermediate_size` | DeepSeek-V3, GLM-4.5 |
//! | `mlp_only_layers`, `decoder_sparse_step` | dense layers by list / every `step` layers sparse | Qwen |
//! | `first_k_dense_replace`, `moe_layer_freq` | the first `k` layers dense / every `freq` sparse | DeepSeek-V3, GLM-4.5 |

use std::path::PathBuf;

use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{Error, Result};

/// How the router turns its logits into expert weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Scoring {
    /// Qwen / Mixtral: softmax over all experts, top-`k`, optionally renormalised.
    Softmax,
    /// DeepSeek-V3 / GLM-4.5 (`noaux_tc`): sigmoid scores, choice by score +
    /// `e_score_correction_bias` within the best `topk_group` of `n_group`
    /// groups (a group scores the sum of its two best), weights from the
    /// unbiased scores, optionally renormalised, times `routed_scaling_factor`.
    GroupedSigmoid {
        /// Expert groups (1: no grouping).
        n_group: usize,
        /// Groups kept per token.
        topk_group: usize,
        /// Multiplies the routed weights.
        routed_scaling_factor: f32,
    },
}

/// The shared experts that every token passes through beside the routed ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SharedExperts {
    /// None (Qwen3-MoE, Mixtral).
    None,
    /// Qwen's `shared_expert` (a SwiGLU MLP of this inner width) scaled by
    /// `sigmoid(shared_expert_gate(x))`.
    Gated {
        /// Inner width (`shared_expert_intermediate_size`).
        intermediate: usize,
    },
    /// DeepSeek/GLM's ungated `shared_experts`, one MLP of this inner width
    /// (`n_shared_experts · moe_intermediate_size`).
    Plain {
        /// Inner width.
        intermediate: usize,
    },
}

/// Which decoder layers are sparse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SparseLayers {
    /// Layers kept dense whatever the other rules say (`mlp_only_layers`).
    pub dense: Vec<usize>,
    /// The first this many layers are dense (`first_k_dense_replace`).
    pub first_dense: usize,
    /// Layer `i` is sparse when `(i + 1) % step == 0` (`decoder_sparse_step`).
    pub step: usize,
    /// Layer `i` is sparse when `i % freq == 0` (`moe_layer_freq`).
    pub freq: usize,
}

impl SparseLayers {
    /// True when layer `i` is a MoE layer.
    pub(crate) fn is_sparse(&self, i: usize) -> bool {
        !self.dense.contains(&i)
            && i >= self.first_dense
            && (i + 1).is_multiple_of(self.step)
            && i.is_multiple_of(self.freq)
    }
}

/// A family's defaults for keys its config.json may leave out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MoeDefaults {
    /// The router of the family (grouped-sigmoid keys are read from the config).
    pub scoring: Scoring,
    /// `norm_topk_prob` when absent (transformers: Qwen3.5-MoE and Qwen3-Next
    /// always renormalise, Qwen2/3-MoE default to false).
    pub norm_topk_prob: bool,
}

/// The mixture-of-experts part of a config.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MoeConfig {
    /// Routed experts.
    pub num_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// One routed expert's inner width.
    pub intermediate: usize,
    /// Renormalise the chosen weights to sum to one.
    pub norm_topk_prob: bool,
    /// The router.
    pub scoring: Scoring,
    /// The shared experts.
    pub shared: SharedExperts,
    /// Which layers are sparse.
    pub sparse: SparseLayers,
}

impl MoeConfig {
    /// The MoE config of `c`, or `None` when it declares no experts.
    ///
    /// `defaults.scoring` picks the router style; for
    /// [`Scoring::GroupedSigmoid`] the `n_group`, `topk_group` and
    /// `routed_scaling_factor` keys replace the defaults' values when present.
    // Long: one check per key, each naming the key in its error.
    pub(crate) fn parse(c: &ModelConfig, defaults: MoeDefaults) -> Result<Option<MoeConfig>> {
        let raw = &c.raw;
        let bad = |key: &'static str, message: String| Error::InvalidConfig {
            path: PathBuf::from("config.json"),
            key,
            message,
        };
        let int = |key: &'static str| -> Result<Option<usize>> {
            match raw.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .filter(|&n| n <= i32::MAX as u64)
                    .map(|n| Some(n as usize))
                    .ok_or_else(|| bad(key, format!("must be a non-negative integer, found {v}"))),
            }
        };
        let Some((experts_key, experts)) = ["num_experts", "num_local_experts", "n_routed_experts"]
            .into_iter()
            .map(|k| Ok(int(k)?.map(|n| (k, n))))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .flatten()
            .next()
        else {
            return Ok(None);
        };
        if experts == 0 {
            return Ok(None);
        }
        let top_k = int("num_experts_per_tok")?.ok_or_else(|| {
            bad(
                "num_experts_per_tok",
                "missing: a MoE model needs it".into(),
            )
        })?;
        if top_k == 0 || top_k > experts {
            return Err(bad(
                "num_experts_per_tok",
                format!("{top_k} must be in 1..={experts} ({experts_key})"),
            ));
        }
        let intermediate = match int("moe_intermediate_size")? {
            Some(0) => return Err(bad("moe_intermediate_size", "must be positive".into())),
            Some(n) => n,
            None => {
                return Err(bad(
                    "moe_intermediate_size",
                    "missing: a MoE model needs it".into(),
                ));
            }
        };
        let norm_topk_prob = match raw.get("norm_topk_prob") {
            None | Some(Value::Null) => defaults.norm_topk_prob,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(bad(
                    "norm_topk_prob",
                    format!("must be true or false, found {v}"),
                ));
            }
        };
        let scoring = match defaults.scoring {
            Scoring::Softmax => Scoring::Softmax,
            Scoring::GroupedSigmoid {
                n_group,
                topk_group,
                routed_scaling_factor,
            } => {
                let n_group = int("n_group")?.unwrap_or(n_group).max(1);
                let topk_group = int("topk_group")?.unwrap_or(topk_group).max(1);
                if !experts.is_multiple_of(n_group) || topk_group > n_group {
                    return Err(bad(
                        "n_group",
                        format!(
                            "{n_group} groups must divide the {experts} experts and be at least \
                             topk_group ({topk_group})"
                        ),
                    ));
                }
                let per_group = experts / n_group;
                if n_group > 1 && (per_group < 2 || top_k > topk_group * per_group) {
                    return Err(bad(
                        "topk_group",
                        format!(
                            "{topk_group} groups of {per_group} experts cannot hold \
                             num_experts_per_tok ({top_k}) with two experts scoring each group"
                        ),
                    ));
                }
                let factor = match raw.get("routed_scaling_factor") {
                    None | Some(Value::Null) => routed_scaling_factor,
                    Some(v) => v
                        .as_f64()
                        .filter(|f| f.is_finite() && *f > 0.0)
                        .ok_or_else(|| {
                            bad(
                                "routed_scaling_factor",
                                format!("must be a positive number, found {v}"),
                            )
                        })? as f32,
                };
                Scoring::GroupedSigmoid {
                    n_group,
                    topk_group,
                    routed_scaling_factor: factor,
                }
            }
        };
        let shared = match (
            int("shared_expert_intermediate_size")?,
            int("n_shared_experts")?,
        ) {
            (Some(i), _) if i > 0 => SharedExperts::Gated { intermediate: i },
            (_, Some(n)) if n > 0 => SharedExperts::Plain {
                intermediate: n * intermediate,
            },
            _ => SharedExperts::None,
        };
        let dense = match raw.get("mlp_only_layers") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_u64().map(|n| n as usize).ok_or_else(|| {
                        bad(
                            "mlp_only_layers",
                            format!("must list layer indices, found {v}"),
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?,
            Some(v) => return Err(bad("mlp_only_layers", format!("must be a list, found {v}"))),
        };
        let positive = |key: &'static str| -> Result<usize> {
            match int(key)? {
                Some(0) => Err(bad(key, "must be positive".into())),
                v => Ok(v.unwrap_or(1)),
            }
        };
        let sparse = SparseLayers {
            dense,
            first_dense: int("first_k_dense_replace")?.unwrap_or(0),
            step: positive("decoder_sparse_step")?,
            freq: positive("moe_layer_freq")?,
        };
        Ok(Some(MoeConfig {
            num_experts: experts,
            top_k,
            intermediate,
            norm_topk_prob,
            scoring,
            shared,
            sparse,
        }))
    }
}
