//! Gated DeltaNet, the linear-attention layer of Qwen3.5: projections, the
//! causal depthwise convolution, the gated delta rule and the gated RMSNorm,
//! over a [`kvcache::RecurrentCache`].
//!
//! The recurrence runs position by position (mlx-lm's `gated_delta_ops`), so
//! the state after every position of a forward is a node of the same graph:
//! the offsets the cache has scheduled (a speculative verify schedules one
//! per draft) are captured from it without a second pass. On CUDA the whole
//! recurrence is one kernel (`delta_kernel.rs`) that writes those states too.

use kvcache::Cache;
use mlx_tensor::{Array, Dtype, fast, ops};

use crate::config::{HybridConfig, ModelConfig};
use crate::error::Result;
use crate::models::delta_kernel;
use crate::models::layers::{Linear, LinearLayout, linear};
use crate::quant::QuantizedTensor;
use crate::weights::Vars;

/// How a checkpoint stores the Gated DeltaNet's input projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InProj {
    /// `in_proj_qkv`, `in_proj_z`, `in_proj_b` and `in_proj_a` (Qwen3.5).
    Split,
    /// `in_proj_qkvz` and `in_proj_ba`, interleaved per key-head group
    /// (Qwen3-Next); split into the four above once at load.
    Fused,
}

/// One Gated DeltaNet mixer (the `linear_attn` module of a decoder layer).
#[derive(Debug, Clone)]
pub(crate) struct GatedDeltaNet {
    in_qkv: Linear,
    in_z: Linear,
    in_b: Linear,
    in_a: Linear,
    /// `[1, 1, C]` each: tap `j` of every channel's causal filter, split
    /// once at load so a forward reads them without slicing or broadcasting.
    taps: Vec<Array>,
    /// `[Dk]` filled with `Dk^-1` and `Dk^-1/2`: the RMSNorm weights that
    /// L2-normalise q (with the readout scale folded in) and k in one node.
    q_scale: Array,
    k_scale: Array,
    /// `-exp(A_log)`, float32 `[Hv]`.
    neg_a: Array,
    /// `[Hv]`.
    dt_bias: Array,
    /// Gated RMSNorm weight `[Dv]` (stored plain, not zero-centred).
    norm: Array,
    out: Linear,
    eps: f32,
    key_heads: i32,
    value_heads: i32,
    key_dim: i32,
    value_dim: i32,
    kernel: i32,
}

impl GatedDeltaNet {
    /// The mixer at `vb`: the input projections as `proj` says,
    /// `conv1d.weight` (`[C, 1, K]` as transformers stores it, or `[C, K, 1]`
    /// when `mlx_conv`: mlx-lm's layout), `A_log`, `dt_bias`, `norm.weight`
    /// and `out_proj`.
    pub(crate) fn load(
        c: &ModelConfig,
        h: &HybridConfig,
        mut vb: Vars<'_>,
        proj: InProj,
        mlx_conv: bool,
        layout: LinearLayout,
    ) -> Result<GatedDeltaNet> {
        let hidden = c.hidden_size;
        let key_total = h.key_heads * h.key_head_dim;
        let value_total = h.value_heads * h.value_head_dim;
        let conv_dim = h.conv_dim();
        let k = h.conv_kernel;
        let [in_qkv, in_z, in_b, in_a] = match proj {
            InProj::Split => {
                let mut lin =
                    |name: &str, i: usize, o: usize| linear(vb.pp(name), i, o, false, layout);
                [
                    lin("in_proj_qkv", hidden, conv_dim)?,
                    lin("in_proj_z", hidden, value_total)?,
                    lin("in_proj_b", hidden, h.value_heads)?,
                    lin("in_proj_a", hidden, h.value_heads)?,
                ]
            }
            InProj::Fused => split_fused(&mut vb, h, hidden, layout)?,
        };
        let out = linear(vb.pp("out_proj"), value_total, hidden, false, layout)?;
        let stored = if mlx_conv {
            [conv_dim, k, 1]
        } else {
            [conv_dim, 1, k]
        };
        let conv = vb.take("conv1d.weight", &stored)?;
        let conv = conv.reshape(&[conv_dim as i32, k as i32])?.t()?;
        let taps = (0..k as i32)
            .map(|j| {
                conv.slice_axis(0, j, j + 1)?
                    .reshape(&[1, 1, conv_dim as i32])?
                    .contiguous()
            })
            .collect::<mlx_tensor::Result<Vec<_>>>()?;
        let dk = h.key_head_dim;
        let inv = 1.0 / (dk as f32).sqrt();
        let filled = |v: f32| ops::full(&[dk as i32], v, conv.dtype());
        let (q_scale, k_scale) = (filled(inv * inv)?, filled(inv)?);
        let vh = [h.value_heads];
        let a_log = vb.take("A_log", &vh)?;
        let neg_a = a_log.as_type(Dtype::Float32)?.exp()?.negative()?;
        let dt_bias = vb.take("dt_bias", &vh)?;
        let norm = vb.take("norm.weight", &[h.value_head_dim])?;
        debug_assert_eq!(conv_dim, 2 * key_total + value_total);
        Ok(GatedDeltaNet {
            in_qkv,
            in_z,
            in_b,
            in_a,
            taps,
            q_scale,
            k_scale,
            neg_a,
            dt_bias,
            norm,
            out,
            eps: c.rms_norm_eps,
            key_heads: h.key_heads as i32,
            value_heads: h.value_heads as i32,
            key_dim: h.key_head_dim as i32,
            value_dim: h.value_head_dim as i32,
            kernel: k as i32,
        })
    }

    fn conv_dim(&self) -> i32 {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }

    /// The mixer over `x` `[1, L, H]`, folding the `L` positions into `cache`
    /// and capturing the states at the offsets it has scheduled.
    // Long: the Gated DeltaNet math in the reference's order, step by step.
    pub(crate) fn forward(&self, x: &Array, cache: &mut dyn Cache) -> Result<Array> {
        let kind = cache.kind();
        let cache = cache.as_recurrent_mut().unwrap_or_else(|| {
            panic!("a Gated DeltaNet layer was given a {kind}, not a RecurrentCache")
        });
        let l = x.dim(1);
        let (kh, vh, dk, dv) = (
            self.key_heads,
            self.value_heads,
            self.key_dim,
            self.value_dim,
        );
        let cd = self.conv_dim();
        let qkv = self.in_qkv.forward(x)?;
        let z = self.in_z.forward(x)?.reshape(&[1, l, vh, dv])?;
        let b = self.in_b.forward(x)?;
        let a = self.in_a.forward(x)?;

        // Causal depthwise conv over [tail; qkv]; the tail after position t is
        // rows t+1 .. t+K of that concatenation.
        let k1 = self.kernel - 1;
        let tail = cache.conv_or_zeros(&[1, k1, cd], x.dtype())?;
        let conv_in = ops::concatenate(&[tail, qkv], 1)?;
        let mut acc: Option<Array> = None;
        for (j, tap) in (0..self.kernel).zip(&self.taps) {
            let term = conv_in.slice_axis(1, j, j + l)?.multiply(tap)?;
            acc = Some(match acc {
                None => term,
                Some(s) => s.add(&term)?,
            });
        }
        let conv_out = acc.expect("kernel width is at least 1").silu()?;
        let kt = kh * dk;
        let q = conv_out.slice_axis(2, 0, kt)?.reshape(&[1, l, kh, dk])?;
        let k = conv_out
            .slice_axis(2, kt, 2 * kt)?
            .reshape(&[1, l, kh, dk])?;
        let v = conv_out
            .slice_axis(2, 2 * kt, cd)?
            .reshape(&[1, l, vh, dv])?;

        // L2-normalise q and k (mlx-lm's normalize_qk: through rms_norm, with
        // the readout scale Dk^-1/2 folded into q).
        let inv = 1.0 / (dk as f32).sqrt();
        let rms_eps = 1e-6 * inv * inv;
        let q = fast::rms_norm(&q, Some(&self.q_scale.as_type(q.dtype())?), rms_eps)?;
        let k = fast::rms_norm(&k, Some(&self.k_scale.as_type(k.dtype())?), rms_eps)?;
        let beta = b.sigmoid()?;
        let g = softplus(&a.add(&self.dt_bias)?)?
            .as_type(Dtype::Float32)?
            .multiply(&self.neg_a)?
            .exp()?;

        // The recurrence runs in f32: cast its inputs once here, not per
        // position (in bf16 each mixed-dtype product would add a cast node
        // per position and layer; the values are the same, as a cast to f32
        // is exact).
        let f32 = |a: &Array| a.as_type(Dtype::Float32);
        let (q, k, v, beta) = (f32(&q)?, f32(&k)?, f32(&v)?, f32(&beta)?);
        let mut state = cache.recurrent_or_zeros(&[1, vh, dv, dk], Dtype::Float32)?;
        let start = cache.offset();
        let splits = cache.splits(l as usize);
        if delta_kernel::applies(dk, dv) {
            // The positions after which the ops path below captures (1..L).
            let inside: Vec<usize> = splits
                .iter()
                .copied()
                .filter(|&d| (1..=l as usize).contains(&d))
                .collect();
            let all = !inside.is_empty();
            let (y, states) = delta_kernel::recurrence(&q, &k, &v, &g, &beta, &state, all)?;
            for &done in &inside {
                let tail = conv_in.slice_axis(1, done as i32, done as i32 + k1)?;
                let after = states.slice_axis(0, done as i32 - 1, done as i32)?;
                cache.capture(start + done, &tail, &after);
            }
            let last = if all {
                states.slice_axis(0, l - 1, l)?
            } else {
                states
            };
            let conv_tail = conv_in.slice_axis(1, l, l + k1)?.contiguous()?;
            cache.update(conv_tail, last, l as usize)?;
            return self.readout(&y.as_type(x.dtype())?, &z, x.dtype());
        }
        let (q, k) = (repeat_heads(&q, vh / kh)?, repeat_heads(&k, vh / kh)?);
        let mut ys = Vec::with_capacity(l as usize);
        for t in 0..l {
            // One position (a decode step) reads the arrays whole.
            let at = |x: &Array| {
                if l == 1 {
                    Ok(x.clone())
                } else {
                    x.slice_axis(1, t, t + 1)
                }
            };
            let qt = at(&q)?.reshape(&[1, vh, 1, dk])?;
            let kt = at(&k)?.reshape(&[1, vh, 1, dk])?;
            let vt = at(&v)?.reshape(&[1, vh, dv])?;
            let gt = at(&g)?.reshape(&[1, vh, 1, 1])?;
            let bt = at(&beta)?.reshape(&[1, vh, 1])?;
            state = state.multiply(&gt)?;
            let kv_mem = state.multiply(&kt)?.sum(&[-1], false)?;
            let delta = vt.subtract(&kv_mem)?.multiply(&bt)?;
            state = state.add(&kt.multiply(&delta.expand_dims(&[-1])?)?)?;
            let y = state.multiply(&qt)?.sum(&[-1], false)?;
            ys.push(y.as_type(x.dtype())?);
            let done = (t + 1) as usize;
            if splits.contains(&done) {
                let tail = conv_in.slice_axis(1, t + 1, t + 1 + k1)?;
                cache.capture(start + done, &tail, &state);
            }
        }
        let conv_tail = conv_in.slice_axis(1, l, l + k1)?.contiguous()?;
        cache.update(conv_tail, state, l as usize)?;

        let y = if l == 1 {
            ys[0].reshape(&[1, 1, vh, dv])?
        } else {
            ops::stack(&ys, 1)? // [1, L, Hv, Dv]
        };
        self.readout(&y, &z, x.dtype())
    }

    /// The gated RMSNorm of the recurrence's output `y` `[1, L, Hv, Dv]` by
    /// `z`, and the output projection.
    fn readout(&self, y: &Array, z: &Array, dtype: Dtype) -> Result<Array> {
        let l = y.dim(1);
        let normed = fast::rms_norm(y, Some(&self.norm), self.eps)?.as_type(Dtype::Float32)?;
        let gated = z
            .as_type(Dtype::Float32)?
            .silu()?
            .multiply(&normed)?
            .as_type(dtype)?;
        self.out
            .forward(&gated.reshape(&[1, l, self.value_heads * self.value_dim])?)
    }

    /// The arrays to evaluate at load.
    pub(crate) fn arrays(&self) -> Vec<Array> {
        let mut v: Vec<Array> = [&self.in_qkv, &self.in_z, &self.in_b, &self.in_a, &self.out]
            .iter()
            .flat_map(|l| l.arrays())
            .collect();
        v.extend(self.taps.iter().cloned());
        v.extend([
            self.q_scale.clone(),
            self.k_scale.clone(),
            self.neg_a.clone(),
            self.dt_bias.clone(),
            self.norm.clone(),
        ]);
        v
    }
}

/// Qwen3-Next's `in_proj_qkvz` and `in_proj_ba` as Qwen3.5's `[qkv, z, b, a]`.
///
/// `in_proj_qkvz` `[2·Kh·Dk + 2·Vh·Dv, H]` holds, for each of the `Kh`
/// key-head groups in turn, that group's query rows (`Dk`), key rows (`Dk`),
/// value rows (`r·Dv`) and gate rows (`r·Dv`), with `r = Vh / Kh`;
/// `in_proj_ba` `[2·Vh, H]` holds per group its `r` beta rows, then its `r`
/// alpha rows (transformers' and mlx-lm's `fix_query_key_value_ordering`).
/// Regrouping the rows once here gives the projections the convolution and
/// the recurrence read; quantized weights keep their codes (a row of codes,
/// scales and biases belongs to one output).
fn split_fused(
    vb: &mut Vars<'_>,
    h: &HybridConfig,
    hidden: usize,
    layout: LinearLayout,
) -> Result<[Linear; 4]> {
    let r = h.value_heads / h.key_heads;
    let (dk, dv) = (h.key_head_dim, h.value_head_dim);
    let qkvz_rows = 2 * h.key_heads * dk + 2 * h.value_heads * dv;
    let qkvz = Rows::take(vb.pp("in_proj_qkvz"), hidden, qkvz_rows)?;
    let [q, k, v, z] = qkvz.ungroup(h.key_heads, [dk, dk, r * dv, r * dv])?;
    let ba = Rows::take(vb.pp("in_proj_ba"), hidden, 2 * h.value_heads)?;
    let [b, a] = ba.ungroup(h.key_heads, [r, r])?;
    let qkv = Rows::concat(&[q, k, v])?;
    Ok([
        qkv.into_linear(layout)?,
        z.into_linear(layout)?,
        b.into_linear(layout)?,
        a.into_linear(layout)?,
    ])
}

/// An `[out, in]` weight as stored, dense or quantized: every array in it
/// has one row per output, so regrouping outputs is the same row operation
/// on each.
enum Rows {
    Dense(Array),
    Quantized(QuantizedTensor),
}

impl Rows {
    fn take(mut vb: Vars<'_>, input: usize, out: usize) -> Result<Rows> {
        Ok(match vb.take_quantized(out, input)? {
            Some(q) => Rows::Quantized(q),
            None => Rows::Dense(vb.take("weight", &[out, input])?),
        })
    }

    fn map(&self, f: impl Fn(&Array) -> Result<Array>) -> Result<Rows> {
        Ok(match self {
            Rows::Dense(w) => Rows::Dense(f(w)?),
            Rows::Quantized(q) => Rows::Quantized(q.map(f)?),
        })
    }

    /// The rows as `groups` blocks of parts of `widths` rows each; returns
    /// each part's rows from every block, in block order.
    fn ungroup<const N: usize>(&self, groups: usize, widths: [usize; N]) -> Result<[Rows; N]> {
        let per: usize = widths.iter().sum();
        let mut start = 0;
        let parts = widths.map(|w| {
            let (lo, hi) = (start as i32, (start + w) as i32);
            start += w;
            self.map(|a| {
                let cols = a.dim(1);
                Ok(a.reshape(&[groups as i32, per as i32, cols])?
                    .slice_axis(1, lo, hi)?
                    .reshape(&[(groups * w) as i32, cols])?)
            })
        });
        let mut out = Vec::with_capacity(N);
        for p in parts {
            out.push(p?);
        }
        Ok(out
            .try_into()
            .unwrap_or_else(|_| unreachable!("one part per width")))
    }

    /// The parts' rows one after another (all dense or all quantized alike).
    fn concat(parts: &[Rows]) -> Result<Rows> {
        let pick = |f: &dyn Fn(&Rows) -> Array| -> Result<Array> {
            let v: Vec<Array> = parts.iter().map(f).collect();
            Ok(ops::concatenate(&v, 0)?)
        };
        Ok(match &parts[0] {
            Rows::Dense(_) => Rows::Dense(pick(&|p| match p {
                Rows::Dense(w) => w.clone(),
                Rows::Quantized(_) => unreachable!("parts of one weight"),
            })?),
            Rows::Quantized(_) => {
                let q: Vec<QuantizedTensor> = parts
                    .iter()
                    .map(|p| match p {
                        Rows::Quantized(q) => q.clone(),
                        Rows::Dense(_) => unreachable!("parts of one weight"),
                    })
                    .collect();
                Rows::Quantized(QuantizedTensor::join(&q, |v| ops::concatenate(v, 0))?)
            }
        })
    }

    fn into_linear(self, layout: LinearLayout) -> Result<Linear> {
        Ok(match self {
            // A regrouped copy, so the weight is contiguous for either layout.
            Rows::Dense(w) => Linear::from_weight(&w.contiguous()?, None, layout)?,
            Rows::Quantized(q) => Linear::from_quantized(q, None),
        })
    }
}

fn scalar(v: f32, dtype: Dtype) -> mlx_tensor::Result<Array> {
    Array::scalar(v, dtype)
}

/// `log(1 + exp(x))` as `logaddexp(x, 0)` (one node; it neither overflows
/// nor loses large inputs).
fn softplus(x: &Array) -> Result<Array> {
    Ok(x.logaddexp(&scalar(0.0, x.dtype())?)?)
}

/// `[1, L, Hk, D]` → `[1, L, Hk·r, D]`, each head repeated `r` times in place
/// (`mx.repeat(x, r, axis=-2)`).
fn repeat_heads(x: &Array, r: i32) -> Result<Array> {
    if r == 1 {
        return Ok(x.clone());
    }
    let s = x.shape().to_vec();
    Ok(x.expand_dims(&[3])?
        .broadcast_to(&[s[0], s[1], s[2], r, s[3]])?
        .reshape(&[s[0], s[1], s[2] * r, s[3]])?)
}
