//! Mixture-of-experts feed-forward layers for every family: the config
//! ([`MoeConfig`], from config.json), the router (softmax top-k, or
//! DeepSeek/GLM grouped sigmoid), the routed experts (`moe/experts.rs`, MLX
//! `gather_mm` / `gather_qmm` over stacked weights), and the shared experts.
//!
//! A family adds MoE with two calls:
//!
//! ```ignore
//! // Once, from config.json (None: the model has no experts).
//! let moe = MoeConfig::parse(c, MoeDefaults { scoring: Scoring::Softmax, norm_topk_prob: true })?;
//! // Per decoder layer `i`, on the view of `{trunk}.layers.{i}.mlp`: a MoE
//! // block where `moe.sparse` says layer `i` is sparse, else the dense SwiGLU
//! // MLP of `c.intermediate_size`.
//! let sparse = moe.as_ref().filter(|m| m.sparse.is_sparse(i));
//! let mlp = FeedForward::load(sparse, p.pp("mlp"), h, c.intermediate_size, layout)?;
//! // In the forward: `mlp.forward(&x)` for `x` `[..., H]`; at load, `mlp.arrays()`.
//! ```
//!
//! The block's tensors under the `mlp` view: `gate.weight` `[E, H]` (the
//! router; quantized when the checkpoint quantized it, as mlx-lm does at 8
//! bits), `gate.e_score_correction_bias` `[E]` (grouped sigmoid only), the
//! experts in any layout of `moe/experts.rs`, and `shared_expert.*` +
//! `shared_expert_gate.weight` `[1, H]` (Qwen) or `shared_experts.*` (DeepSeek/GLM).
//! `MoeBlock::forward` takes `[..., H]` rows and returns the same shape.

mod config;
mod experts;

use mlx_tensor::{Array, Dtype};

pub(crate) use config::{MoeConfig, MoeDefaults, Scoring, SharedExperts};
pub(crate) use experts::Experts;

use crate::error::Result;
use crate::models::layers::{Linear, LinearLayout, Mlp, linear};
use crate::weights::Vars;

/// A decoder layer's feed-forward: the dense SwiGLU MLP or a MoE block.
#[derive(Debug, Clone)]
pub(crate) enum FeedForward {
    /// A SwiGLU MLP.
    Dense(Mlp),
    /// A mixture-of-experts block.
    Sparse(Box<MoeBlock>),
}

impl FeedForward {
    /// The feed-forward under `mlp`: a [`MoeBlock`] of `moe` when given,
    /// else a dense [`Mlp`] of inner width `dense_intermediate`.
    pub(crate) fn load(
        moe: Option<&MoeConfig>,
        mlp: Vars<'_>,
        hidden: usize,
        dense_intermediate: usize,
        layout: LinearLayout,
    ) -> Result<FeedForward> {
        Ok(match moe {
            Some(m) => FeedForward::Sparse(Box::new(MoeBlock::load(m, mlp, hidden, layout)?)),
            None => FeedForward::Dense(Mlp::new(mlp, hidden, dense_intermediate, false, layout)?),
        })
    }

    /// Applies the layer to `x` `[..., H]`.
    pub(crate) fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            FeedForward::Dense(m) => m.forward(x),
            FeedForward::Sparse(m) => m.forward(x),
        }
    }

    /// A copy whose dense MLP is quantized to `p` (a MoE block is kept as it
    /// is: a row reads only its experts, so its bytes are not what a draft
    /// step waits on).
    pub(crate) fn quantized_copy(&self, p: crate::quant::QuantParams) -> Result<FeedForward> {
        Ok(match self {
            FeedForward::Dense(m) => FeedForward::Dense(m.quantized_copy(p)?),
            FeedForward::Sparse(_) => self.clone(),
        })
    }

    /// The arrays to evaluate at load.
    pub(crate) fn arrays(&self) -> Vec<Array> {
        match self {
            FeedForward::Dense(m) => m.arrays(),
            FeedForward::Sparse(m) => m.arrays(),
        }
    }
}

/// The router: `gate` logits → `top_k` experts per row and their weights.
#[derive(Debug, Clone)]
struct Router {
    gate: Linear,
    /// `e_score_correction_bias` `[E]` in f32 (grouped sigmoid only).
    bias: Option<Array>,
    scoring: Scoring,
    top_k: i32,
    norm_topk_prob: bool,
}

impl Router {
    /// `x` `[R, H]` → (experts `[R, k]` uint32, weights `[R, k]` f32).
    fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let logits = self.gate.forward(x)?.as_type(Dtype::Float32)?;
        let k = self.top_k;
        let (chosen, scores) = match self.scoring {
            Scoring::Softmax => {
                let probs = logits.softmax(&[-1], true)?;
                (top(&probs, k)?, probs)
            }
            Scoring::GroupedSigmoid {
                n_group,
                topk_group,
                ..
            } => {
                let scores = logits.sigmoid()?;
                let mut choice = match &self.bias {
                    Some(b) => scores.add(b)?,
                    None => scores.clone(),
                };
                if n_group > 1 {
                    choice = keep_best_groups(&choice, n_group as i32, topk_group as i32)?;
                }
                (top(&choice, k)?, scores)
            }
        };
        let mut weights = scores.take_along_axis(&chosen, -1)?;
        if self.norm_topk_prob {
            let mut sum = weights.sum(&[-1], true)?;
            if let Scoring::GroupedSigmoid { .. } = self.scoring {
                // transformers' DeepSeek-V3 / GLM-4.5 guard against a zero sum.
                sum = sum.add(&Array::scalar(1e-20, Dtype::Float32)?)?;
            }
            weights = weights.divide(&sum)?;
        }
        if let Scoring::GroupedSigmoid {
            routed_scaling_factor,
            ..
        } = self.scoring
        {
            weights = weights.multiply(&Array::scalar(routed_scaling_factor, Dtype::Float32)?)?;
        }
        Ok((chosen, weights))
    }

    fn arrays(&self) -> Vec<Array> {
        let mut v = self.gate.arrays();
        v.extend(self.bias.clone());
        v
    }
}

/// Indices of the `k` largest entries of each row of `s` `[R, E]` (in no order).
fn top(s: &Array, k: i32) -> Result<Array> {
    Ok(s.negative()?
        .argpartition(k - 1, -1)?
        .slice_axis(-1, 0, k)?)
}

/// Zeroes every expert outside the `keep` best of `groups` groups per row
/// (a group scores the sum of its two best experts), as DeepSeek-V3 does.
fn keep_best_groups(choice: &Array, groups: i32, keep: i32) -> Result<Array> {
    let (rows, e) = (choice.dim(0), choice.dim(1));
    let grouped = choice.reshape(&[rows, groups, e / groups])?;
    let best_two = grouped
        .negative()?
        .sort(-1)?
        .slice_axis(-1, 0, 2)?
        .negative()?
        .sum(&[-1], true)?;
    // The `groups - keep` worst groups, by ascending group score.
    let dropped = best_two
        .argpartition(groups - keep - 1, -2)?
        .slice_axis(-2, 0, groups - keep)?;
    let zero = Array::scalar(0.0, Dtype::Float32)?;
    let masked = grouped.put_along_axis(&dropped, &zero, -2)?;
    Ok(masked.reshape(&[rows, e])?)
}

/// The shared experts of a block.
#[derive(Debug, Clone)]
enum Shared {
    None,
    Gated { mlp: Mlp, gate: Linear },
    Plain(Mlp),
}

/// One mixture-of-experts feed-forward layer.
#[derive(Debug, Clone)]
pub(crate) struct MoeBlock {
    router: Router,
    experts: Experts,
    shared: Shared,
}

impl MoeBlock {
    /// Loads the block under `mlp` (see the module docs for its tensors).
    pub(crate) fn load(
        c: &MoeConfig,
        mut mlp: Vars<'_>,
        hidden: usize,
        layout: LinearLayout,
    ) -> Result<MoeBlock> {
        let e = c.num_experts;
        let gate = linear(mlp.pp("gate"), hidden, e, false, layout)?;
        let bias = match c.scoring {
            Scoring::GroupedSigmoid { .. } => mlp
                .take_optional("gate.e_score_correction_bias", &[e])?
                .map(|b| b.as_type(Dtype::Float32))
                .transpose()?,
            Scoring::Softmax => None,
        };
        let experts = Experts::load(&mut mlp, e, hidden, c.intermediate)?;
        let shared = match c.shared {
            SharedExperts::None => Shared::None,
            SharedExperts::Gated { intermediate } => Shared::Gated {
                mlp: Mlp::new(mlp.pp("shared_expert"), hidden, intermediate, false, layout)?,
                gate: linear(mlp.pp("shared_expert_gate"), hidden, 1, false, layout)?,
            },
            SharedExperts::Plain { intermediate } => Shared::Plain(Mlp::new(
                mlp.pp("shared_experts"),
                hidden,
                intermediate,
                false,
                layout,
            )?),
        };
        Ok(MoeBlock {
            router: Router {
                gate,
                bias,
                scoring: c.scoring,
                top_k: c.top_k as i32,
                norm_topk_prob: c.norm_topk_prob,
            },
            experts,
            shared,
        })
    }

    /// Applies the block to `x` `[..., H]` (any number of rows).
    pub(crate) fn forward(&self, x: &Array) -> Result<Array> {
        let shape = x.shape().to_vec();
        let h = x.dim(-1);
        let rows = x.reshape(&[-1, h])?;
        let (chosen, weights) = self.router.route(&rows)?;
        let routed = self.experts.forward(&rows, &chosen)?;
        let weights = weights.as_type(routed.dtype())?.expand_dims(&[-1])?;
        let mut y = routed.multiply(&weights)?.sum(&[1], false)?;
        match &self.shared {
            Shared::None => {}
            Shared::Gated { mlp, gate } => {
                let g = gate.forward(&rows)?.sigmoid()?;
                y = y.add(&mlp.forward(&rows)?.multiply(&g)?)?;
            }
            Shared::Plain(mlp) => y = y.add(&mlp.forward(&rows)?)?,
        }
        Ok(y.reshape(&shape)?)
    }

    /// True when the routed experts are quantized.
    #[cfg(test)]
    pub(crate) fn is_quantized(&self) -> bool {
        self.experts.is_quantized()
    }

    /// The arrays to evaluate at load.
    pub(crate) fn arrays(&self) -> Vec<Array> {
        let mut v = self.router.arrays();
        v.extend(self.experts.arrays());
        match &self.shared {
            Shared::None => {}
            Shared::Gated { mlp, gate } => {
                v.extend(mlp.arrays());
                v.extend(gate.arrays());
            }
            Shared::Plain(mlp) => v.extend(mlp.arrays()),
        }
        v
    }
}

#[cfg(test)]
mod tests;
