//! TEMPORARY minimal mixture-of-experts block for Qwen3-Next and GLM-4.5,
//! written while moe-core's `models/moe.rs` (gather_mm / gather_qmm, every
//! expert layout) was not merged yet; replaced by it on merge. It computes
//! every expert densely and weighs the outputs, which is exact but slow, and
//! reads only per-expert and dense stacked (`switch_mlp`) experts.

use mlx_tensor::{Array, Dtype, ops};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::models::layers::{Linear, LinearLayout, Mlp, linear};
use crate::quant::{QuantParams, QuantizedTensor};
use crate::weights::Vars;

/// How the router turns its logits into expert weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Router {
    /// Softmax over all experts, top-k (Qwen).
    Softmax,
    /// Sigmoid scores; experts chosen on `score + e_score_correction_bias`
    /// within the best `topk_group` of `n_group` groups; weights scaled by
    /// `routed_scaling_factor` (DeepSeek-V3, GLM-4.5).
    GroupedSigmoid {
        n_group: usize,
        topk_group: usize,
        scaling: f32,
    },
}

/// The shared expert next to the routed ones.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Shared {
    /// `shared_expert.*` gated by `sigmoid(shared_expert_gate(x))` (Qwen).
    Gated { inter: usize },
    /// `shared_experts.*`, ungated (DeepSeek, GLM).
    Plain { inter: usize },
}

/// A parsed MoE block config.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MoeConfig {
    pub(crate) experts: usize,
    pub(crate) top_k: usize,
    pub(crate) inter: usize,
    pub(crate) norm_topk_prob: bool,
    pub(crate) router: Router,
    pub(crate) shared: Option<Shared>,
}

/// A positive integer key of config.json.
pub(crate) fn need(c: &ModelConfig, key: &'static str) -> Result<usize> {
    match c.raw[key].as_u64() {
        Some(0) | None => Err(c.unsupported_key(
            key,
            format!(
                "missing or not a positive integer ({}): a mixture-of-experts `{}` needs it",
                c.raw[key], c.model_type
            ),
        )),
        Some(v) if v > i32::MAX as u64 => Err(c.unsupported_key(key, format!("{v} is too large"))),
        Some(v) => Ok(v as usize),
    }
}

impl MoeConfig {
    pub(crate) fn check(self, c: &ModelConfig) -> Result<MoeConfig> {
        if self.top_k > self.experts {
            return Err(c.unsupported_key(
                "num_experts_per_tok",
                format!("{} exceeds the {} experts", self.top_k, self.experts),
            ));
        }
        if let Router::GroupedSigmoid {
            n_group,
            topk_group,
            ..
        } = self.router
            && (!self.experts.is_multiple_of(n_group) || topk_group > n_group)
        {
            return Err(c.unsupported_key(
                "n_group",
                format!(
                    "{n_group} groups must divide the {} experts and hold topk_group {topk_group}",
                    self.experts
                ),
            ));
        }
        Ok(self)
    }
}

/// One MoE MLP: router, experts and the shared expert.
#[derive(Debug, Clone)]
pub(crate) struct MoeBlock {
    cfg: MoeConfig,
    gate: Linear,
    /// `e_score_correction_bias` `[E]` in f32 (grouped sigmoid routing).
    correction: Option<Array>,
    experts: Vec<Mlp>,
    shared: Option<Mlp>,
    shared_gate: Option<Linear>,
}

impl MoeBlock {
    /// The block at `vb` (a layer's `mlp`): `gate`, experts per expert
    /// (`experts.{e}.*`) or stacked (`switch_mlp.*`), and the shared expert.
    pub(crate) fn load(
        c: &ModelConfig,
        cfg: &MoeConfig,
        mut vb: Vars<'_>,
        layout: LinearLayout,
    ) -> Result<MoeBlock> {
        let h = c.hidden_size;
        let e = cfg.experts;
        let gate = linear(vb.pp("gate"), h, e, false, layout)?;
        let correction = match cfg.router {
            Router::GroupedSigmoid { .. } => Some(
                vb.take("gate.e_score_correction_bias", &[e])?
                    .as_type(Dtype::Float32)?,
            ),
            Router::Softmax => None,
        };
        let experts = load_experts(&mut vb, cfg, h, layout)?;
        let (shared, shared_gate) = match cfg.shared {
            None => (None, None),
            Some(Shared::Plain { inter }) => (
                Some(Mlp::new(vb.pp("shared_experts"), h, inter, false, layout)?),
                None,
            ),
            Some(Shared::Gated { inter }) => (
                Some(Mlp::new(vb.pp("shared_expert"), h, inter, false, layout)?),
                Some(linear(vb.pp("shared_expert_gate"), h, 1, false, layout)?),
            ),
        };
        Ok(MoeBlock {
            cfg: cfg.clone(),
            gate,
            correction,
            experts,
            shared,
            shared_gate,
        })
    }

    /// The arrays to evaluate at load.
    pub(crate) fn arrays(&self) -> Vec<Array> {
        let mut v = self.gate.arrays();
        v.extend(self.correction.clone());
        for m in self.experts.iter().chain(self.shared.iter()) {
            v.extend(m.arrays());
        }
        if let Some(g) = &self.shared_gate {
            v.extend(g.arrays());
        }
        v
    }

    /// Expert indices `[R, k]` and their weights `[R, k]` (f32) for rows `x` `[R, H]`.
    fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let logits = self.gate.forward(x)?.as_type(Dtype::Float32)?;
        let k = self.cfg.top_k as i32;
        let top = |choice: &Array| -> Result<Array> {
            Ok(choice
                .negative()?
                .argpartition(k - 1, -1)?
                .slice_axis(-1, 0, k)?)
        };
        let (inds, mut w) = match self.cfg.router {
            Router::Softmax => {
                let p = logits.softmax(&[-1], true)?;
                let inds = top(&p)?;
                let w = p.take_along_axis(&inds, -1)?;
                (inds, w)
            }
            Router::GroupedSigmoid {
                n_group,
                topk_group,
                ..
            } => {
                let scores = logits.sigmoid()?;
                let bias = self.correction.as_ref().expect("loaded with the router");
                let mut choice = scores.add(bias)?;
                let drop = (n_group - topk_group) as i32;
                if n_group > 1 && drop > 0 {
                    let r = choice.dim(0);
                    let (g, per) = (n_group as i32, (self.cfg.experts / n_group) as i32);
                    let grouped = choice.reshape(&[r, g, per])?;
                    let group_scores = grouped.topk(2.min(per), -1)?.sum(&[-1], true)?;
                    let worst = group_scores
                        .argpartition(drop - 1, 1)?
                        .slice_axis(1, 0, drop)?
                        .broadcast_to(&[r, drop, per])?;
                    let zeros = ops::zeros(&[r, drop, per], Dtype::Float32)?;
                    choice = grouped
                        .put_along_axis(&worst, &zeros, 1)?
                        .reshape(&[r, g * per])?;
                }
                let inds = top(&choice)?;
                (inds.clone(), scores.take_along_axis(&inds, -1)?)
            }
        };
        if self.cfg.norm_topk_prob && k > 1 {
            let mut sum = w.sum(&[-1], true)?;
            if matches!(self.cfg.router, Router::GroupedSigmoid { .. }) {
                sum = sum.add(&Array::scalar(1e-20, Dtype::Float32)?)?;
            }
            w = w.divide(&sum)?;
        }
        if let Router::GroupedSigmoid { scaling, .. } = self.cfg.router {
            w = w.multiply(&Array::scalar(scaling, Dtype::Float32)?)?;
        }
        Ok((inds, w))
    }

    /// The block over `x` `[..., H]`.
    pub(crate) fn forward(&self, x: &Array) -> Result<Array> {
        let shape = x.shape().to_vec();
        let h = *shape.last().expect("rank ≥ 1");
        let rows = x.reshape(&[-1, h])?;
        let (inds, w) = self.route(&rows)?;
        let r = rows.dim(0);
        let dense = ops::zeros(&[r, self.cfg.experts as i32], Dtype::Float32)?
            .put_along_axis(&inds, &w, -1)?
            .as_type(x.dtype())?;
        let mut y: Option<Array> = None;
        for (e, expert) in self.experts.iter().enumerate() {
            let e = e as i32;
            let term = expert
                .forward(&rows)?
                .multiply(&dense.slice_axis(1, e, e + 1)?)?;
            y = Some(match y {
                None => term,
                Some(s) => s.add(&term)?,
            });
        }
        let mut y = y.expect("at least one expert");
        if let Some(s) = &self.shared {
            let mut out = s.forward(&rows)?;
            if let Some(g) = &self.shared_gate {
                out = out.multiply(&g.forward(&rows)?.sigmoid()?)?;
            }
            y = y.add(&out)?;
        }
        Ok(y.reshape(&shape)?)
    }
}

/// `switch_mlp.{gate,up,down}_proj` `[E, rows, cols]`, dense or packed.
enum Stacked {
    Dense(Array),
    Quantized(Array, Array, Array, QuantParams),
}

fn load_experts(
    vb: &mut Vars<'_>,
    cfg: &MoeConfig,
    h: usize,
    layout: LinearLayout,
) -> Result<Vec<Mlp>> {
    let (e, i) = (cfg.experts, cfg.inter);
    if vb.contains("experts.0.gate_proj.weight") {
        let mut ex = vb.pp("experts");
        return (0..e)
            .map(|n| Mlp::new(ex.pp(n), h, i, false, layout))
            .collect();
    }
    let quantized = vb.contains("switch_mlp.gate_proj.scales");
    let mut stacked = |name: &str, rows: usize, cols: usize| -> Result<Stacked> {
        let shape = |n: &str| vb.shape(&format!("switch_mlp.{name}.{n}"));
        if !quantized {
            let w = vb.take(&format!("switch_mlp.{name}.weight"), &[e, rows, cols])?;
            return Ok(Stacked::Dense(w));
        }
        let bad = || Error::InvalidConfig {
            path: "config.json".into(),
            key: "quantization",
            message: format!(
                "`{}`: stacked quantized experts of an unexpected shape",
                vb.path(&format!("switch_mlp.{name}"))
            ),
        };
        let (Some(ws), Some(ss)) = (shape("weight"), shape("scales")) else {
            return Err(bad());
        };
        let (packed, groups) = (ws[2], ss[2]);
        if packed == 0 || groups == 0 || !(cols * 32).is_multiple_of(packed) {
            return Err(bad());
        }
        let params = QuantParams {
            bits: (packed * 32 / cols) as u32,
            group_size: (cols / groups) as u32,
        };
        let mut t =
            |n: &str, last: usize| vb.take(&format!("switch_mlp.{name}.{n}"), &[e, rows, last]);
        Ok(Stacked::Quantized(
            t("weight", packed)?,
            t("scales", groups)?,
            t("biases", groups)?,
            params,
        ))
    };
    let gate = stacked("gate_proj", i, h)?;
    let up = stacked("up_proj", i, h)?;
    let down = stacked("down_proj", h, i)?;
    let one = |s: &Stacked, n: usize| -> Result<Linear> {
        let n = n as i32;
        let pick = |a: &Array| -> Result<Array> {
            Ok(a.slice_axis(0, n, n + 1)?.squeeze(&[0])?.contiguous()?)
        };
        Ok(match s {
            Stacked::Dense(w) => Linear::from_weight(&pick(w)?, None, layout)?,
            Stacked::Quantized(w, sc, b, params) => Linear::from_quantized(
                QuantizedTensor {
                    weight: pick(w)?,
                    scales: pick(sc)?,
                    biases: pick(b)?,
                    params: *params,
                },
                None,
            ),
        })
    };
    (0..e)
        .map(|n| {
            Ok(Mlp::from_parts(
                one(&gate, n)?,
                one(&up, n)?,
                one(&down, n)?,
            ))
        })
        .collect()
}
