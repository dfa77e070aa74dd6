//! Rotary position embeddings: plain, linear-scaled and Llama 3 scaled.

use mlx_tensor::{Array, fast};

use crate::config::RopeScaling;
use crate::error::Result;

/// RoPE over the whole head (`dims = head_dim`), non-traditional (half-split) layout.
#[derive(Debug, Clone)]
pub struct Rope {
    dims: i32,
    base: f32,
    scale: f32,
    /// Per-pair periods (`base^(2i/d)`, scaled) for Llama 3; MLX divides by them.
    freqs: Option<Array>,
}

impl Rope {
    /// RoPE for `head_dim` features with the config's base and scaling.
    pub fn new(head_dim: usize, base: f32, scaling: &RopeScaling) -> Result<Rope> {
        let dims = head_dim as i32;
        Ok(match *scaling {
            RopeScaling::None => Rope {
                dims,
                base,
                scale: 1.0,
                freqs: None,
            },
            RopeScaling::Linear { factor } => Rope {
                dims,
                base,
                scale: 1.0 / factor,
                freqs: None,
            },
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
                    base,
                    scale: 1.0,
                    freqs: Some(Array::from_slice(&periods, &[periods.len() as i32])?),
                }
            }
        })
    }

    /// Rotates `x` `[B, H, L, D]` for positions `offset..offset + L`.
    pub fn forward(&self, x: &Array, offset: usize) -> Result<Array> {
        let off = offset as i32;
        Ok(match &self.freqs {
            None => fast::rope(x, self.dims, false, self.base, self.scale, off)?,
            Some(f) => fast::rope_with_freqs(x, self.dims, false, self.scale, off, f)?,
        })
    }

    /// Arrays to evaluate at load.
    pub fn arrays(&self) -> Vec<Array> {
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
