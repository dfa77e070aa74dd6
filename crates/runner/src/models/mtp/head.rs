//! [`MtpHead`]: one MTP layer, implementing `mtp_draft::DraftHead`.

use std::rc::Rc;

use kvcache::{Cache, KvCache};
use mlx_tensor::{Array, Dtype, ops};
use mtp_draft::{DraftHead, HeadOutput};

use super::layout::{MtpLayout, zero_centred_norms};
use crate::config::ModelConfig;
use crate::error::Result;
use crate::models::gated_attention::GatedLayer;
use crate::models::layers::{Embedding, Linear, LinearLayout, RmsNorm, quantized_or_same};
use crate::models::llama::{Layer, Variant};
use crate::models::moe::MoeConfig;
use crate::models::rope::Rope;
use crate::models::trunk_ends::logits_f32;
use crate::quant::QuantParams;
use crate::weights::{Vars, Weights};

/// A multi-token-prediction layer over a trunk's shared embedding and LM head.
///
/// Row `i` of a forward fuses the embedding of the look-ahead token `t[i]`
/// with the trunk's post-final-norm hidden `h[i]`, projects `2H → H`, runs one
/// decoder block at draft-cache slot `position + i`, and normalises; the
/// result predicts the token after `t[i]`.
#[derive(Debug)]
pub(crate) struct MtpHead {
    layout: MtpLayout,
    embed: Embedding,
    embed_norm: RmsNorm,
    hidden_norm: RmsNorm,
    proj: Linear,
    /// Shared by every [`MtpHead::fresh`] copy: weights only, no state.
    block: Rc<dyn HeadBlock>,
    final_norm: RmsNorm,
    lm_head: Linear,
    /// With a drafting vocabulary ([`MtpHead::with_draft_vocab`]): for each
    /// id of the full vocabulary (`[V]` int32), its row in `lm_head`, or
    /// `lm_head`'s width for ids outside the subset (their logit is −∞).
    vocab_map: Option<Array>,
    rope: Rope,
    /// One KV cache: the block's attention over earlier draft slots.
    caches: Vec<Box<dyn Cache>>,
    hidden_size: i32,
    /// One decoder layer's weight bytes per the config
    /// (`dispatch::layer_bytes`): whether a draft step is dispatched alone.
    layer_bytes: u64,
    /// What bounds a flush forward's rows ([`DraftHead::flush_span`]).
    flush: FlushBudget,
}

/// A flush forward's scratch memory, estimated per row, and its budget.
///
/// A row of a forward at `k` keys holds its attention scores and
/// probabilities (`2 · heads · k` floats) and its feed-forward and
/// projection activations (`3 · intermediate + 6 · hidden` floats), counted
/// at 4 bytes whatever the dtype. The budget is [`FLUSH_SCRATCH_SHARE`] of
/// the head's own weight bytes (its projection, block and unembedding):
/// never more than that share of the model, whose trunk is larger than its
/// head, so a session that stays at depth 0 (256 pairs a flush) peaks within
/// a few percent of plain decoding at any context; and at least
/// [`FLUSH_SCRATCH_FLOOR`], so a small head's spans are not a few rows each.
#[derive(Debug, Clone, Copy)]
struct FlushBudget {
    bytes: usize,
    per_key: usize,
    per_row: usize,
}

/// The share of the head's weight bytes one flush forward's scratch may
/// take: on tiny-mtp in f32 at 1,900 keys about 6 rows (0.8 % of plain
/// decoding's peak; 256 rows took 24.6 %).
const FLUSH_SCRATCH_SHARE: f64 = 1.0 / 32.0;

/// The least scratch one flush forward may take. A plain stretch writes its
/// pairs one span at a time between the target's steps (`keep_up` in
/// `generate/plain.rs`), each span a head forward the host builds and
/// dispatches: tiny-mtp's share alone (about 1 MB in f32) allows 6 rows at
/// 1,900 keys, a forward every 6 tokens; 8 MiB allows about 55. On the CPU
/// the attention kernel does not hold the scores this counts, and a depth-0
/// session's peak did not move with 32- or 64-row spans (docs/gpu.md, open
/// check 14).
const FLUSH_SCRATCH_FLOOR: usize = 4 << 20;

impl FlushBudget {
    fn new(c: &ModelConfig, weight_bytes: usize) -> FlushBudget {
        FlushBudget {
            bytes: FlushBudget::bytes_for(weight_bytes),
            per_key: 4 * 2 * c.num_attention_heads,
            per_row: 4 * (3 * c.intermediate_size + 6 * c.hidden_size),
        }
    }

    /// The budget for a head of `weight_bytes`.
    fn bytes_for(weight_bytes: usize) -> usize {
        ((weight_bytes as f64 * FLUSH_SCRATCH_SHARE) as usize).max(FLUSH_SCRATCH_FLOOR)
    }

    /// The most rows whose scratch fits the budget when the cache holds
    /// `at` keys (row `r` attends `at + r + 1`); at least 1.
    fn rows(&self, at: usize) -> usize {
        // Rows r: per_row·r + per_key·(at·r + r²) ≤ bytes, taking r² for
        // the keys the rows add themselves (an over-estimate by half).
        let (a, b, c) = (
            self.per_key as f64,
            (self.per_row + self.per_key * at) as f64,
            self.bytes as f64,
        );
        let r = if a > 0.0 {
            (-b + (b * b + 4.0 * a * c).sqrt()) / (2.0 * a)
        } else {
            c / b.max(1.0)
        };
        (r.floor() as usize).max(1)
    }
}

impl MtpHead {
    /// Loads the head of `layout` from `w`, sharing `embed` (`[V, H]`) and,
    /// unless the layout carries its own, the trunk's `lm_head`; its block's
    /// `mlp` is a MoE block of `moe` when given.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn load(
        layout: MtpLayout,
        c: &ModelConfig,
        w: &mut Weights,
        variant: Variant,
        linear: LinearLayout,
        embed: &Embedding,
        lm_head: &Linear,
        rope: &Rope,
        moe: Option<&MoeConfig>,
    ) -> Result<MtpHead> {
        let block = |w: &mut Weights, prefix: &str, shift: bool| -> Result<Rc<dyn HeadBlock>> {
            let b = Layer::load(c, Vars::new(w, prefix), variant, linear, moe)?;
            let b = if shift { b.with_shifted_norms()? } else { b };
            Ok(Rc::new(b) as Rc<dyn HeadBlock>)
        };
        Self::load_with(layout, c, w, linear, embed, lm_head, rope, block)
    }

    /// Loads a Qwen3.5 `mtp.*` head whose block is a gated full-attention
    /// layer (see [`crate::models::gated_attention`]), with a MoE block of
    /// `moe` as its `mlp` when given (Qwen3.5-MoE, Qwen3-Next).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn load_gated(
        c: &ModelConfig,
        w: &mut Weights,
        linear: LinearLayout,
        embed: &Embedding,
        lm_head: &Linear,
        rope: &Rope,
        moe: Option<&MoeConfig>,
    ) -> Result<MtpHead> {
        let block = |w: &mut Weights, prefix: &str, shift: bool| -> Result<Rc<dyn HeadBlock>> {
            let b = GatedLayer::load(c, Vars::new(w, prefix), shift, linear, moe)?;
            Ok(Rc::new(b))
        };
        Self::load_with(MtpLayout::Qwen, c, w, linear, embed, lm_head, rope, block)
    }

    /// Loads a head of `layout` whose decoder block a family builds itself
    /// (`load_block(weights, prefix, zero_centred_norms)`), e.g. a MoE layer.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn load_family_block(
        layout: MtpLayout,
        c: &ModelConfig,
        w: &mut Weights,
        linear: LinearLayout,
        embed: &Embedding,
        lm_head: &Linear,
        rope: &Rope,
        load_block: impl FnOnce(&mut Weights, &str, bool) -> Result<Rc<dyn HeadBlock>>,
    ) -> Result<MtpHead> {
        Self::load_with(layout, c, w, linear, embed, lm_head, rope, load_block)
    }

    #[allow(clippy::too_many_arguments)]
    fn load_with(
        layout: MtpLayout,
        c: &ModelConfig,
        w: &mut Weights,
        linear: LinearLayout,
        embed: &Embedding,
        lm_head: &Linear,
        rope: &Rope,
        load_block: impl FnOnce(&mut Weights, &str, bool) -> Result<Rc<dyn HeadBlock>>,
    ) -> Result<MtpHead> {
        layers_beyond_the_first(layout, c, w);
        let names = layout.names(c);
        let h = c.hidden_size;
        let shift = zero_centred_norms(c);
        let norm = |w: &mut Weights, name: &str| -> Result<RmsNorm> {
            let n = RmsNorm::load(w, name, h, c.rms_norm_eps)?;
            Ok(if shift { n.shifted_by_one()? } else { n })
        };
        let embed_norm = norm(w, &names.embed_norm)?;
        let hidden_norm = norm(w, &names.hidden_norm)?;
        let proj = Linear::load(w, &names.proj, 2 * h, h, false, linear)?;
        let block = load_block(w, &names.block, shift)?;
        let final_norm = norm(w, &names.final_norm)?;
        if let Some(dup) = &names.duplicate_embed {
            let _ = w.take_optional(dup, &[c.vocab_size as i32, h as i32])?;
        }
        let own_head = match &names.head {
            Some(p) => w.take_optional(&format!("{p}.weight"), &[c.vocab_size as i32, h as i32])?,
            None => None,
        };
        let lm_head = match own_head {
            Some(weight) => Linear::from_weight(&weight, None, linear)?,
            None => lm_head.clone(),
        };
        let mut head = MtpHead {
            layout,
            embed: embed.clone(),
            embed_norm,
            hidden_norm,
            proj,
            block,
            final_norm,
            lm_head,
            vocab_map: None,
            rope: rope.clone(),
            caches: vec![Box::new(KvCache::new())],
            hidden_size: h as i32,
            layer_bytes: crate::models::dispatch::layer_bytes(c, w.dtype()),
            flush: FlushBudget {
                bytes: 0,
                per_key: 0,
                per_row: 0,
            },
        };
        head.flush = FlushBudget::new(c, head.weight_bytes());
        if !w.is_dry() {
            mlx_tensor::eval(&head.arrays())?;
        }
        Ok(head)
    }

    /// A copy sharing every weight, with empty draft caches: one per request.
    pub(crate) fn fresh(&self) -> MtpHead {
        MtpHead {
            layout: self.layout,
            embed: self.embed.clone(),
            embed_norm: self.embed_norm.clone(),
            hidden_norm: self.hidden_norm.clone(),
            proj: self.proj.clone(),
            block: Rc::clone(&self.block),
            final_norm: self.final_norm.clone(),
            lm_head: self.lm_head.clone(),
            vocab_map: self.vocab_map.clone(),
            rope: self.rope.clone(),
            caches: vec![Box::new(KvCache::new())],
            hidden_size: self.hidden_size,
            layer_bytes: self.layer_bytes,
            flush: self.flush,
        }
    }

    /// The bytes of the weights a draft step reads: the projection, the
    /// block and the unembedding.
    fn weight_bytes(&self) -> usize {
        self.arrays().iter().map(Array::nbytes).sum()
    }

    /// The flush budget's bytes for the weights the head holds now.
    fn rebudget(&mut self) {
        self.flush.bytes = FlushBudget::bytes_for(self.weight_bytes());
    }

    /// A copy whose drafting weights are affine-quantized to `p`: its
    /// unembedding (a separate quantized copy when it is the trunk's, which
    /// the verify keeps reading in full precision), its `2H → H` projection
    /// and, where the family provides it, its decoder block. Layers already
    /// quantized, or whose input width is not a multiple of the group size,
    /// are kept.
    ///
    /// Why: a draft step reads one decoder layer plus the whole unembedding
    /// (at a 151,936-token vocabulary and hidden 4,096 that is 1.24 GB in
    /// bf16, three quarters of the step), and every drafted token pays it.
    /// The draft's logits only decide which tokens are proposed and, when
    /// sampling, the draft distribution `q` the acceptance test divides by;
    /// the test uses the same `q` the tokens were drawn from, so the output
    /// keeps the target's distribution (and greedy output equals plain)
    /// whatever the head's precision. A coarser head can only lower acceptance.
    pub(crate) fn quantized(&self, p: QuantParams) -> Result<MtpHead> {
        let mut head = self.fresh();
        head.proj = quantized_or_same(&self.proj, p)?;
        head.lm_head = quantized_or_same(&self.lm_head, p)?;
        if let Some(block) = self.block.quantized(p)? {
            head.block = block;
        }
        head.rebudget();
        mlx_tensor::eval(&head.arrays())?;
        Ok(head)
    }

    /// A copy that drafts over the vocabulary subset `ids` only (distinct,
    /// within the unembedding's width): its unembedding is a gathered copy
    /// of those rows, and its logits are −∞ for every other id.
    ///
    /// Why: a draft step reads the whole unembedding (at a 151,936-token
    /// vocabulary and hidden 4,096, 1.24 GB in bf16, three quarters of the
    /// step) and, unlike the quantized head, a smaller dense GEMV is fast on
    /// every backend. Ids outside the subset get draft probability 0: the
    /// head never proposes them, and the acceptance test divides by the
    /// same `q` the drafts were drawn from, so the output keeps the target's
    /// distribution (and greedy output equals plain). Only acceptance can
    /// drop, when the target's choice lies outside the subset.
    pub(crate) fn with_draft_vocab(&self, ids: &[u32]) -> Result<MtpHead> {
        let width = self.lm_head.output_width();
        let n = ids.len() as i32;
        let mut map = vec![n; width as usize];
        for (row, &id) in ids.iter().enumerate() {
            match map.get_mut(id as usize) {
                Some(slot) if *slot == n => *slot = row as i32,
                _ => {
                    return Err(crate::Error::InvalidOption {
                        option: "draft-vocab",
                        message: format!(
                            "token id {id} is repeated or outside the vocabulary of {width}"
                        ),
                    });
                }
            }
        }
        let ids = Array::from_slice(ids, &[n])?;
        let mut head = self.fresh();
        head.lm_head = self.lm_head.output_rows(&ids)?;
        head.vocab_map = Some(Array::from_slice(&map, &[width])?);
        head.rebudget();
        mlx_tensor::eval(&head.arrays())?;
        Ok(head)
    }

    fn arrays(&self) -> Vec<Array> {
        let mut v = self.proj.arrays();
        v.extend(self.block.arrays());
        v.extend(self.lm_head.arrays());
        v.extend(self.vocab_map.clone());
        v
    }

    fn forward_rows(
        &mut self,
        tokens: &Array,
        hiddens: &Array,
        position: usize,
    ) -> Result<HeadOutput> {
        let l = tokens.dim(0);
        let offset = self.caches[0].offset();
        assert_eq!(
            offset, position,
            "MTP head asked to write slot {position} but its draft cache is at {offset}"
        );
        let e = self.embed_norm.forward(&self.embed.forward(tokens)?)?;
        let g = self.hidden_norm.forward(&hiddens.as_type(e.dtype())?)?;
        let fused = if self.layout.hidden_first() {
            ops::concatenate(&[g, e], -1)?
        } else {
            ops::concatenate(&[e, g], -1)?
        };
        let u = self
            .proj
            .forward(&fused)?
            .reshape(&[1, l, self.hidden_size])?;
        let o = self
            .block
            .forward(&u, self.caches[0].as_mut(), &self.rope)?;
        let o = o.reshape(&[l, self.hidden_size])?;
        Ok(if self.layout.norm_in_head() {
            HeadOutput {
                out: o.clone(),
                hidden: o,
            }
        } else {
            let n = self.final_norm.forward(&o)?;
            HeadOutput {
                out: n.clone(),
                hidden: n,
            }
        })
    }
}

impl DraftHead for MtpHead {
    fn forward(
        &mut self,
        tokens: &Array,
        hiddens: &Array,
        position: usize,
    ) -> mtp_draft::Result<HeadOutput> {
        let mut run = || -> Result<HeadOutput> {
            let out = self.forward_rows(tokens, hiddens, position)?;
            crate::models::dispatch::after_draft_step(&out.out, &out.hidden, self.layer_bytes)?;
            Ok(out)
        };
        run().map_err(|e| mtp_draft::Error::Head(Box::new(e)))
    }

    fn unembed(&mut self, out: &Array) -> mtp_draft::Result<Array> {
        let run = || -> Result<Array> {
            let x = if self.layout.norm_in_head() {
                self.final_norm.forward(out)?
            } else {
                out.clone()
            };
            let logits = logits_f32(&self.lm_head, &x)?;
            let Some(map) = &self.vocab_map else {
                return Ok(logits);
            };
            // The subset's logits back at their ids, −∞ everywhere else.
            let rows = logits.dim(0);
            let outside = ops::full(&[rows, 1], f32::NEG_INFINITY, Dtype::Float32)?;
            Ok(ops::concatenate(&[logits, outside], 1)?.take(map, 1)?)
        };
        run().map_err(|e| mtp_draft::Error::Head(Box::new(e)))
    }

    fn caches(&self) -> &[Box<dyn Cache>] {
        &self.caches
    }

    fn caches_mut(&mut self) -> &mut [Box<dyn Cache>] {
        &mut self.caches
    }

    /// Bounded by the head's scratch budget (see [`FlushBudget`]).
    fn flush_span(&self, at: usize) -> usize {
        self.flush.rows(at)
    }

    /// Under shape buckets, a prefill-sized flush runs over the bucketed row
    /// count the target's prefill chunks use (see `Target::prefill_chunk`);
    /// flushes longer than a default chunk keep their length.
    fn flush_rows(&self, rows: usize) -> usize {
        if crate::models::sdpa::pads_over(&self.caches) {
            crate::models::sdpa::row_bucket(rows, rows.max(crate::models::sdpa::FLUSH_BUCKET_CAP))
        } else {
            rows
        }
    }
}

/// The head's decoder block: whatever decoder layer the trunk family uses
/// (its dense layer, Qwen3.5's gated full-attention layer, with a dense or
/// MoE feed-forward). A family with a new layer kind implements this.
pub(crate) trait HeadBlock: std::fmt::Debug {
    /// The block over `x` `[1, L, H]` at the draft cache's offset.
    fn forward(&self, x: &Array, cache: &mut dyn Cache, rope: &Rope) -> Result<Array>;
    /// The arrays to evaluate at load.
    fn arrays(&self) -> Vec<Array>;
    /// The block with its projections affine-quantized to `p` (see
    /// [`MtpHead::quantized`]); `None` where a family does not provide it,
    /// and the head keeps its block as it is.
    fn quantized(&self, p: QuantParams) -> Result<Option<Rc<dyn HeadBlock>>> {
        let _ = p;
        Ok(None)
    }
}

impl HeadBlock for Layer {
    fn forward(&self, x: &Array, cache: &mut dyn Cache, rope: &Rope) -> Result<Array> {
        Layer::forward(self, x, cache, rope)
    }

    fn arrays(&self) -> Vec<Array> {
        Layer::arrays(self)
    }

    fn quantized(&self, p: QuantParams) -> Result<Option<Rc<dyn HeadBlock>>> {
        Ok(Some(Rc::new(self.quantized_copy(p)?)))
    }
}

impl HeadBlock for GatedLayer {
    fn forward(&self, x: &Array, cache: &mut dyn Cache, rope: &Rope) -> Result<Array> {
        GatedLayer::forward(self, x, cache, rope)
    }

    fn arrays(&self) -> Vec<Array> {
        GatedLayer::arrays(self)
    }

    fn quantized(&self, p: QuantParams) -> Result<Option<Rc<dyn HeadBlock>>> {
        Ok(Some(Rc::new(self.quantized_copy(p)?)))
    }
}

/// Warns when the checkpoint's MTP layers are not the config's count, and
/// drops the layers after the first unread: the head chains its first layer
/// for every draft step (as it does with the one layer most checkpoints
/// ship); the others, which a serving engine would use for later steps,
/// are not used.
fn layers_beyond_the_first(layout: MtpLayout, c: &ModelConfig, w: &mut Weights) {
    let present = layout.layers_present(c, w.all_names());
    if c.mtp_layers > present {
        tracing::warn!(
            declared = c.mtp_layers,
            present,
            "config.json declares {} MTP layers but the checkpoint holds {present}; \
             drafting uses layer 0 (the config or the export may be wrong)",
            c.mtp_layers
        );
    }
    if present > 1 {
        for i in 1..present {
            w.discard_prefix(&layout.layer_prefix(c, i));
        }
        tracing::warn!(
            present,
            "the checkpoint holds {present} MTP layers; drafting chains layer 0 for \
             every step and leaves the others unused"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::FlushBudget;

    /// The scratch `rows` rows at offset `at` are estimated to take.
    fn scratch(b: &FlushBudget, at: usize, rows: usize) -> usize {
        rows * b.per_row + b.per_key * (at * rows + rows * rows)
    }

    #[test]
    fn flush_spans_fit_the_budget_shrink_with_the_context_and_never_stop() {
        // tiny-mtp in f32: 8 heads, intermediate 1536, hidden 512; ~1 MB.
        let b = FlushBudget {
            bytes: 1 << 20,
            per_key: 4 * 2 * 8,
            per_row: 4 * (3 * 1536 + 6 * 512),
        };
        let mut last = usize::MAX;
        for at in [0, 1, 100, 1_900, 32_768, 1 << 20] {
            let r = b.rows(at);
            assert!(r >= 1 && r <= last, "at {at}: {r} rows after {last}");
            if r > 1 {
                assert!(scratch(&b, at, r) <= b.bytes, "at {at}: {r} rows overflow");
            }
            assert!(
                scratch(&b, at, r + 1) > b.bytes,
                "at {at}: {r} rows, but one more fits"
            );
            last = r;
        }
        assert_eq!(
            b.rows(1 << 20),
            1,
            "a huge context still flushes a row at a time"
        );
        let none = FlushBudget { bytes: 0, ..b };
        assert_eq!(none.rows(0), 1);
    }
}
