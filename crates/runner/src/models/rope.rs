//! Rotary position embeddings: plain, linear-scaled, Llama 3 scaled and YaRN.

use mlx_tensor::{Array, fast};

use crate::config::RopeScaling;
use crate::error::Result;

/// RoPE over the first `dims` features of a head, in the half-split layout
/// (transformers' `rotate_half`) unless made [`Rope::interleaved`].
#[derive(Debug, Clone)]
pub(crate) struct Rope {
    dims: i32,
    /// Rotates adjacent pairs `(x0, x1), (x2, x3), ...` (MLX's "traditional",
    /// DeepSeek's `rope_interleave`) instead of `(x_i, x_{i + dims/2})`. Only
    /// [`Rope::forward`] implements it: the fused heads kernels refuse such a rope.
    interleaved: bool,
    base: f32,
    scale: f32,
    /// Per-pair periods (`base^(2i/d)`, scaled) for Llama 3 and YaRN; MLX divides by them.
    freqs: Option<Array>,
    /// YaRN's attention scale, applied to the rotated features of q and k
    /// (transformers multiplies cos and sin by it); 1 otherwise.
    mscale: f32,
}

impl Rope {
    /// RoPE for `head_dim` features with the config's base and scaling.
    pub(crate) fn new(head_dim: usize, base: f32, scaling: &RopeScaling) -> Result<Rope> {
        let dims = head_dim as i32;
        Ok(match *scaling {
            RopeScaling::None => Rope {
                dims,
                interleaved: false,
                base,
                scale: 1.0,
                freqs: None,
                mscale: 1.0,
            },
            RopeScaling::Linear { factor } => Rope {
                dims,
                interleaved: false,
                base,
                scale: 1.0 / factor,
                freqs: None,
                mscale: 1.0,
            },
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
                truncate,
            } => {
                let periods = yarn_periods(
                    head_dim,
                    base,
                    factor,
                    original_max_position_embeddings as f32,
                    beta_fast,
                    beta_slow,
                    truncate,
                );
                Rope {
                    dims,
                    interleaved: false,
                    base,
                    scale: 1.0,
                    freqs: Some(Array::from_slice(&periods, &[periods.len() as i32])?),
                    mscale: attention_factor,
                }
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let periods = llama3_periods(
                    head_dim,
                    base,
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings as f32,
                );
                Rope {
                    dims,
                    interleaved: false,
                    base,
                    scale: 1.0,
                    freqs: Some(Array::from_slice(&periods, &[periods.len() as i32])?),
                    mscale: 1.0,
                }
            }
        })
    }

    /// The same rotation over interleaved pairs (DeepSeek's `rope_interleave`).
    pub(crate) fn interleaved(self) -> Rope {
        Rope {
            interleaved: true,
            ..self
        }
    }

    /// Whether pairs are adjacent features (see the field).
    pub(crate) fn is_interleaved(&self) -> bool {
        self.interleaved
    }

    /// Rotates `x` `[B, H, L, D]` for positions `offset..offset + L`.
    pub(crate) fn forward(&self, x: &Array, offset: usize) -> Result<Array> {
        let off = offset as i32;
        let t = self.interleaved;
        let y = match &self.freqs {
            None => fast::rope(x, self.dims, t, self.base, self.scale, off)?,
            Some(f) => fast::rope_with_freqs(x, self.dims, t, self.scale, off, f)?,
        };
        if self.mscale == 1.0 {
            return Ok(y);
        }
        let m = Array::scalar(self.mscale, y.dtype())?;
        let d = y.dim(-1);
        if d == self.dims {
            return Ok(y.multiply(&m)?);
        }
        // Partial rotary: only the rotated features are scaled.
        let axis = y.ndim() as i32 - 1;
        let rotated = y.slice_axis(axis, 0, self.dims)?.multiply(&m)?;
        let pass = y.slice_axis(axis, self.dims, d)?;
        Ok(mlx_tensor::ops::concatenate(&[rotated, pass], axis)?)
    }

    /// Whether this RoPE rotates all `head_dim` features, half-split, with no
    /// YaRN attention scale: what `models/heads_kernel.rs` computes.
    pub(crate) fn whole_head(&self, head_dim: i32) -> bool {
        self.dims == head_dim && self.mscale == 1.0 && !self.interleaved
    }

    /// What a kernel needs to rotate as [`Rope::forward`] does: the period
    /// table (when scaled), `log2(base)` (MLX's angle takes the base so) and
    /// the position scale.
    pub(crate) fn kernel_terms(&self) -> (Option<&Array>, f32, f32) {
        (self.freqs.as_ref(), self.base.log2(), self.scale)
    }

    /// The rotation as `mlx_tensor::ops::heads_cpu` takes it (offset 0).
    pub(crate) fn cpu_terms(&self) -> mlx_tensor::ops::HeadsRope<'_> {
        mlx_tensor::ops::HeadsRope {
            dims: self.dims,
            offset: 0,
            log2_base: self.base.log2(),
            scale: self.scale,
            periods: self.freqs.as_ref(),
            mscale: self.mscale,
        }
    }

    /// Arrays to evaluate at load.
    pub(crate) fn arrays(&self) -> Vec<Array> {
        self.freqs.iter().cloned().collect()
    }
}

/// Llama 3.1 frequency scaling, as mlx-lm's `Llama3RoPE` computes it (periods, not
/// inverse frequencies: MLX's `rope(freqs=...)` divides positions by them).
pub fn llama3_periods(
    head_dim: usize,
    base: f32,
    factor: f32,
    low_freq_factor: f32,
    high_freq_factor: f32,
    old_context: f32,
) -> Vec<f32> {
    let low_freq_wavelen = old_context / low_freq_factor;
    let high_freq_wavelen = old_context / high_freq_factor;
    (0..head_dim / 2)
        .map(|i| {
            let f = base.powf((2 * i) as f32 / head_dim as f32);
            let wavelen = 2.0 * std::f32::consts::PI * f;
            let f = if wavelen > low_freq_wavelen {
                f * factor
            } else {
                f
            };
            let medium = wavelen > high_freq_wavelen && wavelen < low_freq_wavelen;
            if medium {
                let smooth = (old_context / wavelen - low_freq_factor)
                    / (high_freq_factor - low_freq_factor);
                f / ((1.0 - smooth) / factor + smooth)
            } else {
                f
            }
        })
        .collect()
}

/// YaRN's per-pair periods (the inverse of transformers'
/// `_compute_yarn_parameters` inverse frequencies): pairs below the
/// correction range keep their frequency (extrapolation), pairs above it are
/// divided by `factor` (interpolation), with a linear ramp between.
pub(crate) fn yarn_periods(
    dims: usize,
    base: f32,
    factor: f32,
    old_context: f32,
    beta_fast: f32,
    beta_slow: f32,
    truncate: bool,
) -> Vec<f32> {
    let d = dims as f64;
    let base = base as f64;
    let correction = |rotations: f64| {
        d * (old_context as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
    };
    let (mut low, mut high) = (correction(beta_fast as f64), correction(beta_slow as f64));
    if truncate {
        low = low.floor();
        high = high.ceil();
    }
    let low = low.max(0.0);
    let mut high = high.min(d - 1.0);
    if low == high {
        high += 0.001;
    }
    (0..dims / 2)
        .map(|i| {
            let pos = base.powf((2 * i) as f64 / d);
            let extrapolation = 1.0 / pos;
            let interpolation = 1.0 / (factor as f64 * pos);
            let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
            let keep = 1.0 - ramp;
            let inv = interpolation * (1.0 - keep) + extrapolation * keep;
            (1.0 / inv) as f32
        })
        .collect()
}
