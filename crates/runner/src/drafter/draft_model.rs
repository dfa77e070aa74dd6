//! A separate, smaller model as the drafter: its own KV caches, kept level
//! with the target's committed tokens and rewound on rejection.
//!
//! Between calls the draft caches hold a prefix of the target's committed
//! tokens and `pending` holds the rest, so plain rounds cost the draft model
//! nothing; a proposal forwards `pending` and the current token in one go
//! and then one token per draft step, all lazily (no host sync unless the
//! options use penalties). The entries a proposal writes past the committed
//! tokens are its speculative tail: the report of the verified round keeps
//! the accepted part and rewinds the rest.
//!
//! A draft model with recurrent layers (Gated DeltaNet, as Qwen3.5 and
//! Qwen3-Next) folds every token into its state and cannot rewind by moving
//! an offset: a proposal schedules a snapshot at every offset the tail may
//! rewind to (the committed prefix, then one per draft but the last), as the
//! target does for its verify, and the round's report restores from them.

use std::path::Path;

use kvcache::{Cache, Snapshot, restore_all, schedule_all};
use mlx_tensor::{Array, Dtype, ops};
use mtp_draft::{DraftChain, DraftSampling, Proposal};

use crate::config::{GenerationConfig, ModelConfig};
use crate::error::{Error, Result};
use crate::load::{LoadOptions, LoadedModel, load};
use crate::models::Model;
use crate::tokenizer::Tokenizer;

/// Tokens per catch-up forward when `pending` is long (a prompt).
const CATCH_UP_CHUNK: usize = 512;

/// A draft model's per-session state.
pub(crate) struct ModelDrafter<'m> {
    model: &'m dyn Model,
    /// The target's vocabulary size, which proposal rows must have.
    target_vocab: usize,
    caches: Vec<Box<dyn Cache>>,
    /// Committed tokens whose keys and values are in `caches`.
    cached: Vec<u32>,
    /// Committed tokens not forwarded yet. Invariant between rounds:
    /// `cached.len() + pending.len()` is the target's committed length.
    pending: Vec<u32>,
    /// Entries past `cached.len()` written by the last proposal (its current
    /// token and all drafts but the last); 0 when none is outstanding.
    tail: usize,
    /// The last proposal's captures, one list per cache, at every offset
    /// its tail can rewind to; empty when every cache rewinds by offset or
    /// no proposal is outstanding.
    snaps: Vec<Vec<(usize, Snapshot)>>,
}

impl std::fmt::Debug for ModelDrafter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelDrafter")
            .field("model", &self.model)
            .field("cached", &self.cached.len())
            .field("pending", &self.pending.len())
            .field("tail", &self.tail)
            .finish()
    }
}

impl<'m> ModelDrafter<'m> {
    /// The draft model.
    pub(crate) fn model(&self) -> &'m dyn Model {
        self.model
    }

    /// A drafter with empty caches proposing for a target of `target_vocab` tokens.
    pub(crate) fn new(model: &'m dyn Model, target_vocab: usize) -> ModelDrafter<'m> {
        ModelDrafter {
            model,
            target_vocab,
            caches: model.new_caches(),
            cached: Vec::new(),
            pending: Vec::new(),
            tail: 0,
            snaps: Vec::new(),
        }
    }

    /// The draft model's caches.
    pub(crate) fn caches_mut(&mut self) -> &mut [Box<dyn Cache>] {
        &mut self.caches
    }

    /// The draft caches' offset (committed prefix plus any speculative tail).
    pub(crate) fn cache_offset(&self) -> usize {
        self.caches.first().map_or(0, |c| c.offset())
    }

    /// Committed tokens the drafter knows (forwarded or pending).
    pub(crate) fn level(&self) -> usize {
        self.cached.len() + self.pending.len()
    }

    /// Makes the drafter hold exactly `committed` (the target's tokens): keeps
    /// the longest common prefix of what it holds, rewinds the rest, and
    /// queues the new tokens. The target may have been rewound in between.
    pub(crate) fn sync(&mut self, committed: &[u32]) -> Result<()> {
        let common = self
            .cached
            .iter()
            .chain(&self.pending)
            .zip(committed)
            .take_while(|(a, b)| a == b)
            .count();
        let keep = common.min(self.cached.len());
        self.drain_schedule();
        let snaps = std::mem::take(&mut self.snaps);
        let rewound =
            self.cache_offset() == keep || restore_all(&mut self.caches, keep, &snaps).is_ok();
        if rewound {
            self.cached.truncate(keep);
        } else {
            // A cache that cannot rewind without snapshots starts over.
            self.caches = self.model.new_caches();
            self.cached.clear();
        }
        self.tail = 0;
        self.pending.clear();
        self.pending
            .extend_from_slice(&committed[self.cached.len()..]);
        Ok(())
    }

    /// Takes the target's report that `ids` were committed at `pos`.
    pub(crate) fn committed(&mut self, ids: &[u32], pos: usize) -> Result<()> {
        assert_eq!(
            pos,
            self.level(),
            "draft model level {} but the target committed at {pos}",
            self.level()
        );
        // The tail holds the current token then the drafts; the accepted
        // drafts are exactly those, so its first entries are already right.
        let keep = self.tail.min(ids.len());
        let snaps = std::mem::take(&mut self.snaps);
        if self.tail > keep {
            restore_all(&mut self.caches, self.cached.len() + keep, &snaps)?;
        }
        self.tail = 0;
        self.cached.extend_from_slice(&ids[..keep]);
        self.pending.extend_from_slice(&ids[keep..]);
        assert_eq!(
            self.cache_offset(),
            self.cached.len(),
            "draft caches at {} but {} tokens forwarded",
            self.cache_offset(),
            self.cached.len()
        );
        Ok(())
    }

    /// Drafts `max_tokens` tokens after `current` (not yet committed),
    /// sampling like the target. `None` for `max_tokens == 0`.
    pub(crate) fn propose(
        &mut self,
        current: u32,
        max_tokens: usize,
        sampling: DraftSampling<'_>,
    ) -> Result<Option<Proposal>> {
        if max_tokens == 0 {
            return Ok(None);
        }
        assert_eq!(self.tail, 0, "a proposal is still outstanding");
        self.drain_schedule();
        let mut input = std::mem::take(&mut self.pending);
        input.push(current);
        let (catch_up, last) = input.split_at(input.len().saturating_sub(CATCH_UP_CHUNK));
        for part in catch_up.chunks(CATCH_UP_CHUNK) {
            let ids = Array::from_slice(part, &[part.len() as i32])?;
            self.model.forward(&ids, &mut self.caches)?;
            let state: Vec<Array> = self.caches.iter().flat_map(|c| c.state()).collect();
            mlx_tensor::eval(&state)?;
        }
        // The tail rewinds to the committed prefix `c` plus the accepted
        // drafts: offsets `c ..= c + max_tokens - 1`.
        let c = self.cache_offset() + last.len() - 1;
        let scheduled = !self.caches.iter().all(|c| c.rewinds_by_offset());
        if scheduled {
            let offsets: Vec<usize> = (c..c + max_tokens).collect();
            schedule_all(&mut self.caches, &offsets);
        }
        let ids = Array::from_slice(last, &[last.len() as i32])?;
        let hidden = self.model.forward(&ids, &mut self.caches)?;
        self.cached.extend_from_slice(&input[..input.len() - 1]);
        self.tail = 1;

        let mut row = hidden.slice_axis(0, last.len() as i32 - 1, last.len() as i32)?;
        let mut chain = DraftChain::new(sampling, max_tokens);
        for i in 0..max_tokens {
            let logits = self.fit_vocab(&self.model.unembed(&row)?)?;
            let next = chain.step(&logits)?;
            if i + 1 < max_tokens {
                row = self.model.forward(&next, &mut self.caches)?;
                self.tail += 1;
            }
        }
        if scheduled {
            self.snaps = self.caches.iter_mut().map(|c| c.take_scheduled()).collect();
        }
        Ok(Some(chain.finish()?))
    }

    /// Drops the captures a failed proposal left scheduled, so the next
    /// schedule starts clean (the caches are then rewound or replaced).
    fn drain_schedule(&mut self) {
        for c in &mut self.caches {
            drop(c.take_scheduled());
        }
    }

    /// Logits `[1, V_draft]` as `[1, V_target]`: extra rows dropped, missing
    /// ones at −∞ (padding rows beyond the shared tokenizer's ids).
    fn fit_vocab(&self, logits: &Array) -> Result<Array> {
        let (have, want) = (logits.dim(-1) as usize, self.target_vocab);
        Ok(match have.cmp(&want) {
            std::cmp::Ordering::Equal => logits.clone(),
            std::cmp::Ordering::Greater => logits.slice_axis(1, 0, want as i32)?,
            std::cmp::Ordering::Less => {
                let pad = ops::full(
                    &[1, (want - have) as i32],
                    f32::NEG_INFINITY,
                    Dtype::Float32,
                )?;
                ops::concatenate(&[logits.as_type(Dtype::Float32)?, pad], 1)?
            }
        })
    }
}

/// Checks that two tokenizers map text to the same ids: the same vocabulary
/// size and the same id for every token (added tokens included).
pub(crate) fn check_same_tokenizer(
    target: &Tokenizer,
    target_dir: &Path,
    draft: &Tokenizer,
    draft_dir: &Path,
) -> Result<()> {
    let mismatch = |detail: String| Error::DraftTokenizerMismatch {
        target: target_dir.to_owned(),
        draft: draft_dir.to_owned(),
        detail,
    };
    let (t, d) = (target.vocab_size(), draft.vocab_size());
    if t != d {
        return Err(mismatch(format!("{t} tokens vs {d} tokens")));
    }
    let tv = target.inner().get_vocab(true);
    let dv = draft.inner().get_vocab(true);
    let mut differing: Vec<(&String, &u32)> = tv
        .iter()
        .filter(|(tok, id)| dv.get(*tok) != Some(id))
        .collect();
    differing.sort_by_key(|&(_, id)| *id);
    if let Some((tok, id)) = differing.first() {
        let other = dv
            .get(*tok)
            .map_or("is missing".to_owned(), |d| format!("has id {d}"));
        return Err(mismatch(format!(
            "token {tok:?} has id {id} in the target but {other} in the draft ({} tokens differ)",
            differing.len()
        )));
    }
    Ok(())
}

/// Loads the draft model at `draft_dir` for the target at `target_dir`,
/// checking the tokenizers agree before reading any weights.
pub fn load_draft(
    draft_dir: &Path,
    target_dir: &Path,
    target_tokenizer: &Tokenizer,
    opts: LoadOptions,
) -> Result<LoadedModel> {
    let config = ModelConfig::load(draft_dir)?;
    let gen_cfg = GenerationConfig::load(draft_dir)?;
    let tok = Tokenizer::load(draft_dir, &config, &gen_cfg)?;
    check_same_tokenizer(target_tokenizer, target_dir, &tok, draft_dir)?;
    load(draft_dir, opts, |_, _| {})
}
