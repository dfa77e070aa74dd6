//! Multi-head latent attention (MLA) of DeepSeek-V3 and GLM-4.7-Flash: the
//! query through an optional low-rank pair (`q_a_proj` → RMSNorm →
//! `q_b_proj`), keys and values from one latent (`kv_a_proj_with_mqa` →
//! RMSNorm → `kv_b_proj`) plus a rotary key part shared by every head, RoPE
//! over the rotary parts only (interleaved pairs by default), and a softmax
//! scale that YaRN's `mscale_all_dim` raises.
//!
//! Design: the cache holds mlx-lm's compressed form, not per-head keys and
//! values: a one-head [`kvcache::KvCache`] whose keys are the normalised
//! latent (`kv_lora_rank` wide) and whose values are the rotated key part
//! (`qk_rope_head_dim`), so per position and layer `kv_lora + qk_rope`
//! values (DeepSeek-V3, GLM-4.7-Flash: 576) against `2 · heads · max(qk, v)`
//! (DeepSeek-V3: 49,152). Rewinds, snapshots and the prefix cache see an
//! ordinary cache. `kv_b_proj` is split at load into each head's key rows
//! W_uk and value rows W_uv; attention is computed here ([`MlaAttention`]'s
//! `attend`), explicitly, since `AttentionCore`'s kernels take keys and
//! values of one width per head: absorbed for a few rows (W_uk folded into
//! the query, W_uv applied after the weighted sum of latents), expanded per
//! head from the cached latent for a long prefill chunk, whichever takes
//! fewer multiply-adds (`MlaAttention::absorbs`). Either way a long chunk
//! attends in blocks of query rows, so that its scores (`heads × L × S`)
//! stay within `SCORE_BLOCK_BYTES` however long the context.

use kvcache::{AttentionMask, Cache};
use mlx_tensor::{Array, ops};
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::models::layers::{Linear, LinearLayout, RmsNorm, linear, rms_norm};
use crate::models::rope::Rope;
use crate::models::sdpa;
use crate::schedule;
use crate::weights::Vars;

/// The epsilon of `q_a_layernorm` and `kv_a_layernorm`: transformers builds
/// both with its RMSNorm's default, not `rms_norm_eps` (and mlx-lm agrees).
const LATENT_NORM_EPS: f32 = 1e-6;

/// Bytes of f32 scores (`heads × rows × S × 4`) that one block of query
/// rows may build in `MlaAttention::attend`. Whole, a prefill chunk's
/// scores grow with the context: DeepSeek-V3 (128 heads) at 16k keys holds
/// 17 GB for a 2048-row chunk. In blocks, a few score-sized arrays are
/// alive at once (a block's rotary product, summed and biased scores and
/// softmax, while the next block starts): `mla/tests.rs` measures 5 to 8
/// budgets' worth on the CPU, so 1.25 to 2 GiB here, small beside the
/// weights of any MLA model. A block still gives each product thousands of
/// rows (DeepSeek-V3 at 16k keys: 32 rows × 128 heads), not a sliver that
/// would leave a GPU idle between launches.
const SCORE_BLOCK_BYTES: usize = 256 << 20;

/// The fewest query rows of a block, whatever the budget: a decode step and
/// a verify (up to [`mlx_tensor::ops::ROWS_MATMUL_MAX_ROWS`] rows, as
/// [`rowwise`] counts them) stay one block at any context, so their graph
/// and rounding are the unblocked ones. Past `budget / (rows · heads · 4)`
/// keys (DeepSeek-V3: 16k) such a block exceeds [`SCORE_BLOCK_BYTES`], as
/// its scores did before blocking.
const MIN_BLOCK_ROWS: i32 = mlx_tensor::ops::ROWS_MATMUL_MAX_ROWS;

/// Whether an absorbed attention of `rows` query rows runs row by row: on
/// the CPU, where the rest of a verify (our rows kernels, up to
/// [`mlx_tensor::ops::ROWS_MATMUL_MAX_ROWS`] rows) equals single steps bit
/// for bit and greedy speculation promises plain decoding's tokens exactly,
/// for the few rows of a verify under a causal (or no) mask. A GPU keeps
/// the batched products: its verifies equal steps within rounding, as the
/// other attention paths there do, and a row per launch would cost a verify
/// its speed.
fn rowwise(rows: i32, masked: bool) -> bool {
    rows > 1
        && rows <= mlx_tensor::ops::ROWS_MATMUL_MAX_ROWS
        && !masked
        && mlx_tensor::default_device() == mlx_tensor::Device::Cpu
}

/// The MLA sizes of a config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct MlaConfig {
    /// Rank of the query's low-rank pair; `None`: one `q_proj`.
    pub q_lora_rank: Option<usize>,
    /// Width of the key/value latent.
    pub kv_lora_rank: usize,
    /// Per-head key/query features without position.
    pub qk_nope: usize,
    /// Per-head key/query features under RoPE (the key's shared by all heads).
    pub qk_rope: usize,
    /// Per-head value width.
    pub v_head: usize,
    /// `rope_interleave`: RoPE over adjacent pairs.
    pub interleave: bool,
    /// Softmax scale: `1/√(qk_nope + qk_rope)`, times `mscale(factor,
    /// mscale_all_dim)²` under a scaled RoPE that gives `mscale_all_dim`.
    pub scale: f32,
}

impl MlaConfig {
    /// Reads the MLA keys of `c`, refusing absent or inconsistent ones by name.
    pub(crate) fn parse(c: &ModelConfig) -> Result<MlaConfig> {
        let raw = &c.raw;
        let size = |key: &'static str| -> Result<usize> {
            match raw.get(key) {
                Some(v) => v
                    .as_u64()
                    .filter(|&n| n > 0 && n <= i32::MAX as u64)
                    .map(|n| n as usize)
                    .ok_or_else(|| {
                        c.unsupported_key(key, format!("must be a positive integer, found {v}"))
                    }),
                None => Err(c.unsupported_key(
                    key,
                    "missing: multi-head latent attention needs it (the checkpoint's \
                     config.json states it; copy it from there)"
                        .into(),
                )),
            }
        };
        let q_lora_rank = match raw.get("q_lora_rank") {
            Some(Value::Null) => None,
            None => {
                return Err(c.unsupported_key(
                    "q_lora_rank",
                    "missing: give the query's low rank, or null for a single `q_proj`".into(),
                ));
            }
            Some(_) => Some(size("q_lora_rank")?),
        };
        let (kv_lora_rank, qk_nope, qk_rope, v_head) = (
            size("kv_lora_rank")?,
            size("qk_nope_head_dim")?,
            size("qk_rope_head_dim")?,
            size("v_head_dim")?,
        );
        if qk_rope % 2 != 0 {
            return Err(c.unsupported_key(
                "qk_rope_head_dim",
                format!("{qk_rope} must be even for RoPE"),
            ));
        }
        // transformers rotates all `qk_rope_head_dim` features; a partial factor
        // would make its rotary tables narrower than the features they rotate.
        if c.partial_rotary_factor != 1.0 {
            return Err(c.unsupported_key(
                "partial_rotary_factor",
                format!(
                    "{} is not implemented for multi-head latent attention, which rotates \
                     all qk_rope_head_dim features; remove the key",
                    c.partial_rotary_factor
                ),
            ));
        }
        let interleave = match raw.get("rope_interleave") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return Err(c.unsupported_key(
                    "rope_interleave",
                    format!("must be true or false, found {v}"),
                ));
            }
        };
        let mut scale = 1.0 / ((qk_nope + qk_rope) as f32).sqrt();
        scale *= mscale_all_dim(c)?.powi(2);
        Ok(MlaConfig {
            q_lora_rank,
            kv_lora_rank,
            qk_nope,
            qk_rope,
            v_head,
            interleave,
            scale,
        })
    }

    /// The RoPE of the rotary parts: `qk_rope_head_dim` features with the
    /// config's base and scaling, interleaved unless `rope_interleave` is false.
    pub(crate) fn rope(&self, c: &ModelConfig) -> Result<Rope> {
        let r = Rope::new(self.qk_rope, c.rope_theta, &c.rope_scaling)?;
        Ok(if self.interleave { r.interleaved() } else { r })
    }

    fn qk(&self) -> usize {
        self.qk_nope + self.qk_rope
    }
}

/// transformers' `yarn_apply_mscale` factor: `0.1 · mscale_all_dim · ln(factor)
/// + 1` when the RoPE dict is not the default one, gives a non-zero
/// `mscale_all_dim` and a factor above 1; else 1.
fn mscale_all_dim(c: &ModelConfig) -> Result<f32> {
    let dict = &c.raw["rope_scaling"];
    let kind = dict["rope_type"]
        .as_str()
        .or(dict["type"].as_str())
        .unwrap_or("default");
    let all = dict["mscale_all_dim"].as_f64().unwrap_or(0.0);
    if kind == "default" || all == 0.0 {
        return Ok(1.0);
    }
    let factor = dict["factor"].as_f64().ok_or_else(|| {
        c.unsupported_key(
            "rope_scaling",
            "gives mscale_all_dim without a factor; transformers needs both".into(),
        )
    })?;
    Ok(if factor <= 1.0 {
        1.0
    } else {
        (0.1 * all * factor.ln() + 1.0) as f32
    })
}

/// How the query is projected.
#[derive(Debug, Clone)]
enum Query {
    Direct(Linear),
    LowRank { a: Linear, norm: RmsNorm, b: Linear },
}

/// One MLA layer's projections.
#[derive(Debug, Clone)]
pub(crate) struct MlaAttention {
    q: Query,
    kv_a: Linear,
    kv_a_norm: RmsNorm,
    /// Each head's key rows of `kv_b_proj`, `[heads, qk_nope, kv_lora]`
    /// (W_uk): a query's `q_nope · W_uk` scores against the latent itself.
    w_uk: Array,
    /// Each head's value rows of `kv_b_proj`, `[heads, v, kv_lora]` (W_uv).
    w_uv: Array,
    o: Linear,
    dims: MlaConfig,
    heads: i32,
}

impl MlaAttention {
    /// Takes `self_attn.*` of one layer: the hub's `kv_b_proj`, split into
    /// its per-head key and value rows, or mlx-lm's `embed_q` / `unembed_out`
    /// (dense or quantized; quantized ones are dequantized).
    pub(crate) fn load(
        c: &ModelConfig,
        m: &MlaConfig,
        mut a: Vars<'_>,
        layout: LinearLayout,
    ) -> Result<MlaAttention> {
        let (h, heads) = (c.hidden_size, c.num_attention_heads);
        if c.num_key_value_heads != heads {
            return Err(c.unsupported_key(
                "num_key_value_heads",
                format!(
                    "{} differs from num_attention_heads ({heads}): multi-head latent \
                     attention expands its latent to every head",
                    c.num_key_value_heads
                ),
            ));
        }
        let bias = c.attention_bias.unwrap_or(false);
        let q = match m.q_lora_rank {
            None => Query::Direct(linear(a.pp("q_proj"), h, heads * m.qk(), false, layout)?),
            Some(r) => Query::LowRank {
                a: linear(a.pp("q_a_proj"), h, r, bias, layout)?,
                norm: rms_norm(a.pp("q_a_layernorm"), r, LATENT_NORM_EPS)?,
                b: linear(a.pp("q_b_proj"), r, heads * m.qk(), false, layout)?,
            },
        };
        let kv_a = linear(
            a.pp("kv_a_proj_with_mqa"),
            h,
            m.kv_lora_rank + m.qk_rope,
            bias,
            layout,
        )?;
        let kv_a_norm = rms_norm(a.pp("kv_a_layernorm"), m.kv_lora_rank, LATENT_NORM_EPS)?;
        let (w_uk, w_uv) = if a.contains("embed_q.weight") {
            split_kv_b(m, heads, &mut a)?
        } else {
            hub_kv_b(m, heads, a.pp("kv_b_proj"))?
        };
        let o = linear(a.pp("o_proj"), heads * m.v_head, h, bias, layout)?;
        Ok(MlaAttention {
            q,
            kv_a,
            kv_a_norm,
            w_uk,
            w_uv,
            o,
            dims: *m,
            heads: heads as i32,
        })
    }

    /// Attention of `x` `[1, L, H]` at the cache's offset, appending its
    /// latent and rotary key to `cache`; `[1, L, H]` out.
    pub(crate) fn forward(&self, x: &Array, cache: &mut dyn Cache, rope: &Rope) -> Result<Array> {
        let m = &self.dims;
        let (l, heads) = (x.dim(1), self.heads);
        let (nope, rot, vd, lora) = (
            m.qk_nope as i32,
            m.qk_rope as i32,
            m.v_head as i32,
            m.kv_lora_rank as i32,
        );
        let q = match &self.q {
            Query::Direct(p) => p.forward(x)?,
            Query::LowRank { a, norm, b } => b.forward(&norm.forward(&a.forward(x)?)?)?,
        };
        // Heads-first `[1, heads, L, qk]`, scaled once here for both score parts.
        let q = q
            .reshape(&[1, l, heads, nope + rot])?
            .transpose(&[0, 2, 1, 3])?;
        let q = q.multiply(&Array::scalar(m.scale, q.dtype())?)?;
        let offset = cache.offset();
        let q_pe = rope.forward(&q.slice_axis(3, nope, nope + rot)?, offset)?;
        let q_nope = q.slice_axis(3, 0, nope)?;
        let ckv = self.kv_a.forward(x)?;
        // One "head" of each: the latent `[1, 1, L, lora]` and the rotary key
        // `[1, 1, L, rot]`, cached as the keys and values of a 1-head cache.
        let latent = self
            .kv_a_norm
            .forward(&ckv.slice_axis(2, 0, lora)?)?
            .reshape(&[1, 1, l, lora])?;
        let k_pe = ckv
            .slice_axis(2, lora, lora + rot)?
            .reshape(&[1, 1, l, rot])?;
        let k_pe = rope.forward(&k_pe, offset)?;
        let mask = cache.make_mask(l as usize)?;
        let masked = matches!(mask, AttentionMask::Array(_));
        let (latent, k_pe) = cache.update_and_fetch(&latent, &k_pe)?;
        let bias = match mask {
            AttentionMask::None => None,
            AttentionMask::Causal => {
                let s = latent.dim(2);
                Some(sdpa::causal_bias(l, s, s, latent.dtype())?)
            }
            AttentionMask::Array(a) => {
                let zero = Array::scalar(0.0, latent.dtype())?;
                let neg = Array::scalar(f32::NEG_INFINITY, latent.dtype())?;
                Some(ops::r#where(&a, &zero, &neg)?)
            }
        };
        let absorbed = self.absorbs(l as usize);
        let o = if absorbed && rowwise(l, masked) {
            // Each row as the one-row step at its position computes it: over
            // its own causal keys, unmasked. Batched, BLAS sums a product of
            // more rows (and the softmax a longer masked row) in another
            // order, and a verify would part from plain decoding at a
            // near-tie (`moe_families::verify_rows_equal_single_steps_bit_for_bit`).
            let s = latent.dim(2);
            let rows = (0..l)
                .map(|i| {
                    let keys = s - l + i + 1;
                    self.attend(
                        (
                            &q_nope.slice_axis(2, i, i + 1)?,
                            &q_pe.slice_axis(2, i, i + 1)?,
                        ),
                        (
                            &latent.slice_axis(2, 0, keys)?,
                            &k_pe.slice_axis(2, 0, keys)?,
                        ),
                        None,
                        true,
                    )
                })
                .collect::<Result<Vec<_>>>()?;
            ops::concatenate(&rows, 2)?
        } else {
            self.attend((&q_nope, &q_pe), (&latent, &k_pe), bias.as_ref(), absorbed)?
        };
        let o = o.transpose(&[0, 2, 1, 3])?.reshape(&[1, l, heads * vd])?;
        self.o.forward(&o)
    }

    /// `softmax(q_nope·k_nope + q_pe·k_pe + bias) · v` per head for the
    /// scaled queries `[1, heads, L, nope | rope]` over the cached latent
    /// `[1, 1, S, kv_lora]` and rotary keys `[1, 1, S, rope]`, returned
    /// `[1, heads, L, v]`: absorbed (W_uk folded into the query, W_uv applied
    /// to the attended latent) or over keys and values expanded per head.
    /// The two are equal up to rounding; the softmax runs in f32. Query rows
    /// go in blocks of at most [`SCORE_BLOCK_BYTES`] of scores.
    fn attend(
        &self,
        q: (&Array, &Array),
        kv: (&Array, &Array),
        bias: Option<&Array>,
        absorbed: bool,
    ) -> Result<Array> {
        attend_in_blocks(
            (&self.w_uk, &self.w_uv),
            q,
            kv,
            bias,
            absorbed,
            SCORE_BLOCK_BYTES,
        )
    }

    /// Whether `rows` query rows attend in the absorbed form (the latent as
    /// one shared key and value head) rather than over per-head keys and
    /// values expanded from the latent. Multiply-adds per head and cached
    /// position: absorbed, `rows · (2·kv_lora + rope)`; expanded, `rows ·
    /// (nope + rope + v)` plus `kv_lora · (nope + v)` to expand that
    /// position. A decode step and a verify absorb; a long prefill chunk
    /// expands (GLM-4.7-Flash from 399 rows, DeepSeek-V3 from 171).
    fn absorbs(&self, rows: usize) -> bool {
        let m = &self.dims;
        let absorbed = 2 * m.kv_lora_rank + m.qk_rope;
        let expanded = m.qk_nope + m.qk_rope + m.v_head;
        let expansion = m.kv_lora_rank * (m.qk_nope + m.v_head);
        rows * absorbed <= rows * expanded + expansion
    }

    /// The layer's arrays (to evaluate at load).
    pub(crate) fn arrays(&self) -> Vec<Array> {
        let mut v = match &self.q {
            Query::Direct(p) => p.arrays(),
            Query::LowRank { a, norm, b } => {
                let mut v = a.arrays();
                v.push(norm.weight().clone());
                v.extend(b.arrays());
                v
            }
        };
        for l in [&self.kv_a, &self.o] {
            v.extend(l.arrays());
        }
        v.extend([
            self.kv_a_norm.weight().clone(),
            self.w_uk.clone(),
            self.w_uv.clone(),
        ]);
        v
    }
}

/// `MlaAttention::attend` with the weights W_uk `[heads, nope, kv_lora]`
/// and W_uv `[heads, v, kv_lora]` given, the query rows taken
/// [`block_rows`] at a time for `score_bytes` and the blocks' outputs
/// joined along the rows. What does not depend on the rows (the expanded
/// keys and values, the transposes) is built once for all blocks, and each
/// block is scheduled after the one before ([`schedule::after`]), so about one
/// block's scores are alive at a time. A chunk that fits one block builds
/// the unblocked graph, node for node.
fn attend_in_blocks(
    w: (&Array, &Array),
    (q_nope, q_pe): (&Array, &Array),
    (latent, k_pe): (&Array, &Array),
    bias: Option<&Array>,
    absorbed: bool,
    score_bytes: usize,
) -> Result<Array> {
    let (l, s) = (q_nope.dim(2), latent.dim(2));
    let keys = Keys::new(w, (latent, k_pe), absorbed)?;
    let rows = block_rows(q_nope.dim(1), s, score_bytes);
    if l <= rows {
        return keys.attend(q_nope, q_pe, bias);
    }
    let mut blocks: Vec<Array> = Vec::with_capacity((l as usize).div_ceil(rows as usize));
    for start in (0..l).step_by(rows as usize) {
        let stop = (start + rows).min(l);
        let q_pe = q_pe.slice_axis(2, start, stop)?;
        // Every score-sized array of a block derives from its rotary
        // product, so ordering `q_pe` after the previous block orders the
        // whole block after it.
        let q_pe = match blocks.last() {
            Some(prev) => schedule::after(&q_pe, prev, 2)?,
            None => q_pe,
        };
        let bias = bias.map(|b| bias_rows(b, l, start, stop)).transpose()?;
        blocks.push(keys.attend(&q_nope.slice_axis(2, start, stop)?, &q_pe, bias.as_ref())?);
    }
    Ok(ops::concatenate(&blocks, 2)?)
}

/// Query rows per block: as many as keep `heads × rows × keys` f32 scores
/// within `score_bytes`, and at least [`MIN_BLOCK_ROWS`].
fn block_rows(heads: i32, keys: i32, score_bytes: usize) -> i32 {
    let row = (heads.max(1) as usize) * (keys.max(1) as usize) * size_of::<f32>();
    let rows = (score_bytes / row).min(i32::MAX as usize) as i32;
    rows.max(MIN_BLOCK_ROWS)
}

/// Rows `start..stop` of a bias over `l` query rows: one `[.., L, S]` is
/// cut along its row axis; one that broadcasts along the rows (a single
/// row, or fewer than two axes) serves every block whole.
fn bias_rows(bias: &Array, l: i32, start: i32, stop: i32) -> Result<Array> {
    let n = bias.ndim() as i32;
    if n >= 2 && bias.dim(n - 2) == l {
        Ok(bias.slice_axis(n - 2, start, stop)?)
    } else {
        Ok(bias.clone())
    }
}

/// The keys and values of one attention, in the form its scores take,
/// built once for all of its query blocks.
struct Keys<'a> {
    /// The rotary keys, transposed: `[1, 1, rope, S]`.
    k_pe_t: Array,
    form: Form<'a>,
}

/// Which form [`Keys`] attends in.
enum Form<'a> {
    /// The latent `[1, 1, S, kv_lora]` as one shared key and value head;
    /// W_uk folds into each query, W_uv (transposed) turns the attended
    /// latent into values.
    Absorbed {
        latent: &'a Array,
        latent_t: Array,
        w_uk: &'a Array,
        w_uv_t: Array,
    },
    /// Each head's keys (transposed, `[1, heads, nope, S]`) and values
    /// (`[1, heads, S, v]`) expanded from the latent, as transformers
    /// computes them.
    Expanded { k_nope_t: Array, v: Array },
}

impl<'a> Keys<'a> {
    fn new(
        (w_uk, w_uv): (&'a Array, &'a Array),
        (latent, k_pe): (&'a Array, &Array),
        absorbed: bool,
    ) -> Result<Keys<'a>> {
        let form = if absorbed {
            Form::Absorbed {
                latent,
                latent_t: latent.swapaxes(-1, -2)?,
                w_uk,
                w_uv_t: w_uv.swapaxes(-1, -2)?,
            }
        } else {
            let k_nope = latent.matmul(&w_uk.swapaxes(-1, -2)?)?;
            Form::Expanded {
                k_nope_t: k_nope.swapaxes(-1, -2)?,
                v: latent.matmul(&w_uv.swapaxes(-1, -2)?)?,
            }
        };
        Ok(Keys {
            k_pe_t: k_pe.swapaxes(-1, -2)?,
            form,
        })
    }

    /// Attention of the query rows `[1, heads, B, nope | rope]` under
    /// `bias` (`[.., B, S]` or broadcastable to it): `[1, heads, B, v]`.
    fn attend(&self, q_nope: &Array, q_pe: &Array, bias: Option<&Array>) -> Result<Array> {
        let (heads, l, s) = (q_nope.dim(1), q_nope.dim(2), self.k_pe_t.dim(3));
        // The rotary part of the scores, for every head in one product.
        let pe = q_pe
            .reshape(&[1, 1, heads * l, q_pe.dim(3)])?
            .matmul(&self.k_pe_t)?;
        let softmax = |scores: Array| -> Result<Array> {
            let scores = match bias {
                Some(b) => scores.add(b)?,
                None => scores,
            };
            Ok(scores.softmax(&[-1], true)?)
        };
        match &self.form {
            Form::Absorbed {
                latent,
                latent_t,
                w_uk,
                w_uv_t,
            } => {
                // `q_nope · W_uk` scores against the latent itself; the
                // weights then sum the latent, which `W_uv` turns into each
                // head's value.
                let lora = latent.dim(3);
                let q_lat = q_nope.matmul(w_uk)?.reshape(&[1, 1, heads * l, lora])?;
                let scores = pe
                    .addmm(&q_lat, latent_t, 1.0, 1.0)?
                    .reshape(&[1, heads, l, s])?;
                let p = softmax(scores)?.reshape(&[1, 1, heads * l, s])?;
                Ok(p.matmul(latent)?
                    .reshape(&[1, heads, l, lora])?
                    .matmul(w_uv_t)?)
            }
            Form::Expanded { k_nope_t, v } => {
                let scores = pe
                    .reshape(&[1, heads, l, s])?
                    .addmm(q_nope, k_nope_t, 1.0, 1.0)?;
                Ok(softmax(scores)?.matmul(v)?)
            }
        }
    }
}

/// The hub's `kv_b_proj` `[heads · (qk_nope + v), kv_lora]` (dense, or
/// quantized and then dequantized) split into W_uk `[heads, qk_nope,
/// kv_lora]` and W_uv `[heads, v, kv_lora]`: per head its key rows, then
/// its value rows.
fn hub_kv_b(m: &MlaConfig, heads: usize, mut vb: Vars<'_>) -> Result<(Array, Array)> {
    let (lora, nope, v) = (m.kv_lora_rank, m.qk_nope, m.v_head);
    let out = heads * (nope + v);
    let w = match vb.take_quantized(out, lora)? {
        Some(q) => q.dequantize()?,
        None => vb.take("weight", &[out, lora])?,
    };
    let w = w.reshape(&[heads as i32, (nope + v) as i32, lora as i32])?;
    let (nope, v) = (nope as i32, v as i32);
    Ok((
        w.slice_axis(1, 0, nope)?.contiguous()?,
        w.slice_axis(1, nope, nope + v)?.contiguous()?,
    ))
}

/// mlx-lm's split of `kv_b_proj` (its `sanitize`): `embed_q` `[heads,
/// kv_lora, qk_nope]` (each head's key rows, transposed) and `unembed_out`
/// `[heads, v, kv_lora]` (its value rows), dense or affine-quantized along
/// their last axis; returned as W_uk `[heads, qk_nope, kv_lora]` and W_uv.
/// Quantized halves are dequantized: the same weights mlx-lm multiplies by.
fn split_kv_b(m: &MlaConfig, heads: usize, a: &mut Vars<'_>) -> Result<(Array, Array)> {
    let (lora, nope, v) = (m.kv_lora_rank, m.qk_nope, m.v_head);
    let take = |mut vb: Vars<'_>, out: usize, input: usize| -> Result<Array> {
        match vb.take_quantized_stack(&[heads], out, input)? {
            Some(q) => q.dequantize(),
            None => vb.take("weight", &[heads, out, input]),
        }
    };
    let w_uk = take(a.pp("embed_q"), lora, nope)?.transpose(&[0, 2, 1])?;
    let w_uv = take(a.pp("unembed_out"), v, lora)?;
    Ok((w_uk.contiguous()?, w_uv.contiguous()?))
}

#[cfg(test)]
mod tests;
