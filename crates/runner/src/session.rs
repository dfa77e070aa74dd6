//! [`Session`]: one sequence's target stack (caches, committed tokens,
//! restore points) and its drafter, and every way to move them back.
//!
//! The target stack is a [`Target`], the only code that writes or restores
//! the target caches (see `session/target.rs`). A session adds the drafter
//! of a speculative mode and keeps the two in step: between calls every
//! target cache's offset equals the committed tokens, and an MTP drafter's
//! draft caches stand one slot behind (the pair at the last committed slot
//! needs the token after it). Rewinding the target to `n` therefore rewinds
//! the draft caches to `n - 1`: that drops the pair at slot `n - 1`, whose
//! look-ahead token `n` came from the old sequence (the stale boundary
//! pair), while every pair kept names only tokens below `n`.
//!
//! Generation itself is [`Session::generate`] (in `generate.rs`); the prefix
//! cache stores and restores a session through [`AtRest`].

mod points;
mod target;

use std::sync::atomic::{AtomicBool, Ordering};

use kvcache::{Cache, Snapshot};
use mlx_tensor::Array;

use crate::drafter::{
    DraftMethod, DraftRun, Drafter, ModelDrafter, MtpDrafter, NgramDrafter, NgramOptions,
};
use crate::error::{Error, Result};
use crate::models::Model;
pub(crate) use target::Target;

/// Prompt tokens per prefill forward.
pub(crate) const PREFILL_CHUNK: usize = 2048;
// The MTP head pads flushes up to one default chunk (`models/sdpa.rs`).
const _: () = assert!(PREFILL_CHUNK == crate::models::sdpa::FLUSH_BUCKET_CAP);

/// How a session drafts: the one choice the CLI's `generate` and `chat` and
/// a library user make the same way, with [`Session::open`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Speculation {
    /// Plain decoding.
    Off,
    /// The model's own MTP head ([`Error::NoMtpHead`] without one).
    Mtp,
    /// A separate draft model with the same tokenizer (load it with
    /// [`crate::load_draft`]).
    DraftModel,
    /// N-gram prompt lookup (no model).
    Ngram,
    /// MTP when the model has a head, else the draft model when one is
    /// given, else n-gram lookup (whose auto depth falls back to plain steps
    /// when drafts do not pay).
    #[default]
    Auto,
}

impl Speculation {
    /// Whether opening a session of `target` in this mode uses a draft
    /// model (so it is worth loading one).
    pub fn uses_draft_model(self, target: &dyn Model) -> bool {
        match self {
            Speculation::DraftModel => true,
            Speculation::Auto => target.mtp_head().is_none(),
            Speculation::Off | Speculation::Mtp | Speculation::Ngram => false,
        }
    }
}

/// Length of the common prefix of two token sequences.
pub(crate) fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// One sequence's caches and the tokens they hold, plus the drafter of a
/// speculative session.
pub struct Session<'m> {
    pub(crate) target: Target<'m>,
    /// The drafter of a speculative session. Between calls an MTP drafter's
    /// draft caches hold the pairs of every committed slot but the last
    /// (whose pair needs the token after it); a draft model holds a prefix of
    /// the committed tokens (re-synced when a request opens).
    pub(crate) drafter: Option<Drafter<'m>>,
    /// What the auto depth controller learned in the last request (round
    /// costs, acceptance), so the next request starts informed.
    pub(crate) depth_memory: Option<crate::depth::Learned>,
}

impl std::fmt::Debug for Session<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("target", &self.target)
            .field("drafter", &self.drafter_method())
            .finish()
    }
}

impl<'m> Session<'m> {
    /// A session with fresh caches that decodes plainly.
    pub fn new(model: &'m dyn Model) -> Session<'m> {
        Session {
            target: Target::new(model),
            drafter: None,
            depth_memory: None,
        }
    }

    /// A session of `target` decoding as `mode` asks; `draft` is the draft
    /// model for [`Speculation::DraftModel`] (and [`Speculation::Auto`] on a
    /// model without an MTP head).
    ///
    /// # Errors
    /// [`Error::NoMtpHead`] for [`Speculation::Mtp`] on a model without a
    /// head; [`Error::InvalidOption`] for [`Speculation::DraftModel`]
    /// without a draft model, or a draft model with a mode that never uses
    /// one.
    pub fn open(
        target: &'m dyn Model,
        mode: Speculation,
        draft: Option<&'m dyn Model>,
    ) -> Result<Session<'m>> {
        let ngram = || Session::with_ngram(target, NgramOptions::default());
        let unused = |name: &str| Error::InvalidOption {
            option: "draft model",
            message: format!(
                "speculation `{name}` does not use a draft model: open the session with \
                 `draft-model` (or `auto`), or pass no draft model"
            ),
        };
        Ok(match (mode, draft) {
            (Speculation::Off, None) => Session::new(target),
            (Speculation::Mtp, None) => Session::with_mtp(target)?,
            (Speculation::Ngram, None) => ngram(),
            (Speculation::Off, Some(_)) => return Err(unused("off")),
            (Speculation::Mtp, Some(_)) => return Err(unused("mtp")),
            (Speculation::Ngram, Some(_)) => return Err(unused("ngram")),
            (Speculation::DraftModel, Some(d)) => Session::with_draft_model(target, d),
            (Speculation::DraftModel, None) => {
                return Err(Error::InvalidOption {
                    option: "draft model",
                    message: "speculation `draft-model` needs a draft model (a smaller model \
                              with the same tokenizer, loaded with `load_draft`)"
                        .into(),
                });
            }
            (Speculation::Auto, d) => match (Session::with_mtp(target), d) {
                (Ok(s), _) => s,
                (Err(_), Some(d)) => Session::with_draft_model(target, d),
                (Err(_), None) => ngram(),
            },
        })
    }

    /// A session that decodes speculatively with the model's MTP head.
    pub fn with_mtp(model: &'m dyn Model) -> Result<Session<'m>> {
        let head = model.mtp_head().ok_or(Error::NoMtpHead)?;
        Ok(Session::with_drafter(
            model,
            Drafter::Mtp(MtpDrafter::new(head)),
        ))
    }

    /// A session that decodes speculatively with a separate draft model
    /// (load it with [`crate::load_draft`], which checks that the
    /// tokenizers agree).
    pub fn with_draft_model(model: &'m dyn Model, draft: &'m dyn Model) -> Session<'m> {
        let drafter = ModelDrafter::new(draft, model.vocab_size());
        Session::with_drafter(model, Drafter::Model(drafter))
    }

    /// A session that decodes speculatively with n-gram prompt lookup.
    pub fn with_ngram(model: &'m dyn Model, options: NgramOptions) -> Session<'m> {
        let drafter = NgramDrafter::new(model.vocab_size(), options);
        Session::with_drafter(model, Drafter::Ngram(drafter))
    }

    fn with_drafter(model: &'m dyn Model, drafter: Drafter<'m>) -> Session<'m> {
        Session {
            target: Target::new(model),
            drafter: Some(drafter),
            depth_memory: None,
        }
    }

    /// True when the session drafts (with any drafter).
    pub fn is_speculative(&self) -> bool {
        self.drafter.is_some()
    }

    /// The drafter's method, or `None` for a plain session.
    pub fn drafter_method(&self) -> Option<DraftMethod> {
        self.drafter.as_ref().map(Drafter::method)
    }

    /// The target model.
    pub fn model(&self) -> &'m dyn Model {
        self.target.model()
    }

    /// Tokens in the caches.
    pub fn committed(&self) -> &[u32] {
        self.target.committed()
    }

    /// The caches' common offset.
    ///
    /// # Panics
    /// When the caches disagree with each other or with [`Session::committed`]
    /// (broken bookkeeping, a bug).
    pub fn offset(&self) -> usize {
        self.target.offset()
    }

    /// The target caches.
    pub fn caches(&self) -> &[Box<dyn Cache>] {
        self.target.caches()
    }

    /// The look-ahead of prefix-cache keys for this session: 1 when its
    /// drafter keeps draft caches (draft slot `i` holds token `i + 1`), else 0.
    pub fn lookahead(&self) -> usize {
        self.drafter.as_ref().map_or(0, Drafter::lookahead)
    }

    /// The MTP head's draft caches (empty for other sessions and for a
    /// cacheless head).
    pub fn draft_caches(&self) -> &[Box<dyn Cache>] {
        self.drafter.as_ref().map_or(&[], Drafter::paired_caches)
    }

    /// Forwards known tokens in chunks; returns the hidden rows `[n, H]` of the last
    /// chunk (lazy), or `None` for no tokens or on cancellation between chunks.
    /// A speculative session reports the chunks to its drafter.
    ///
    /// # Errors
    /// MLX errors; the session is then emptied (see `Session::empty_after`).
    pub fn prefill(
        &mut self,
        tokens: &[u32],
        chunk: usize,
        cancel: &AtomicBool,
    ) -> Result<Option<Array>> {
        let r = self.prefill_inner(tokens, chunk, cancel);
        self.empty_after(r)
    }

    fn prefill_inner(
        &mut self,
        tokens: &[u32],
        chunk: usize,
        cancel: &AtomicBool,
    ) -> Result<Option<Array>> {
        let mut draft = match self.drafter.as_mut() {
            Some(d) => Some(d.open(self.target.committed())?),
            None => None,
        };
        let last = prefill_chunks(&mut self.target, tokens, chunk, cancel, draft.as_mut())?;
        if let Some(d) = draft {
            d.close()?;
        }
        Ok(last)
    }

    /// Rewinds the session to its first `n` committed tokens: the target
    /// caches to `n`, the draft caches to `n - 1` (dropping the boundary pair
    /// whose look-ahead token was the old token `n`).
    ///
    /// Caches that rewind by offset (full attention) just move back. A
    /// recurrent layer goes back only to a state captured earlier (a restore
    /// point); when there is none at `n`, the session restarts from the
    /// nearest point below (a capture, else fresh caches) and forwards the
    /// tokens in between again, so the result is the same state, only
    /// slower. An MTP session also needs the point at `n - 1` (its next
    /// request re-runs token `n - 1`), or it replays from below that.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] when `n` is past the committed tokens (the
    /// session is left as it was); MLX errors of the replay (the session is
    /// then emptied, see `Session::empty_after`).
    pub fn rewind_to(&mut self, n: usize) -> Result<()> {
        self.rewind_replaying(n).map(|_| ())
    }

    /// Passes `r` through; on an error first empties the session (fresh
    /// caches and draft state, as a new session of the same kind has; what
    /// the auto depth controller learned is kept). An error in the middle of
    /// a forward, a round or a rewind can leave the caches part-written and
    /// out of step with [`Session::committed`]; the next request would then
    /// build on state no plain decode produces. Empty, it starts over from
    /// its prompt, and a prefix cache restores what it holds.
    pub(crate) fn empty_after<T>(&mut self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            tracing::debug!(error = %e, held = self.committed().len(), "emptying the session after an error");
            self.target.reset();
            if let Some(d) = self.drafter.as_mut() {
                d.empty(self.target.model());
            }
        }
        r
    }

    /// Keeps the longest prefix of `prompt` the session already holds, but
    /// never all of it (at least one prompt token is evaluated again, to
    /// produce the first sample): rewinds to that length and returns it.
    /// Generate from `prompt[n..]` afterwards.
    pub fn reuse_prefix(&mut self, prompt: &[u32]) -> Result<usize> {
        let n = common_prefix(self.committed(), prompt).min(prompt.len().saturating_sub(1));
        self.rewind_to(n)?;
        Ok(n)
    }

    /// The offset [`Session::rewind_to`] would replay from to reach `n`
    /// (`n` itself when it forwards nothing).
    pub(crate) fn replay_from(&self, n: usize) -> usize {
        let t = &self.target;
        let n = n.min(t.committed().len());
        let paired = self.lookahead() > 0;
        let back_ok = !paired || n == 0 || t.reaches(n - 1);
        if back_ok && t.reaches(n) {
            return n;
        }
        let below = if paired { n.saturating_sub(1) } else { n };
        t.deepest(below).unwrap_or(0)
    }

    /// [`Session::rewind_to`], returning how many tokens it forwarded again.
    pub(crate) fn rewind_replaying(&mut self, n: usize) -> Result<usize> {
        let have = self.committed().len();
        if n > have {
            return Err(Error::InvalidOption {
                option: "rewind_to",
                message: format!(
                    "cannot rewind to {n} tokens: the session holds {have}; \
                     pass at most {have}"
                ),
            });
        }
        if n == have {
            return Ok(0);
        }
        let r = self.rewind_from(n, have);
        self.empty_after(r)
    }

    /// [`Session::rewind_replaying`] from `have` committed tokens to `n < have`.
    fn rewind_from(&mut self, n: usize, have: usize) -> Result<usize> {
        let from = self.replay_from(n);
        let mut replay = self.target.rewind_reachable(from)?;
        replay.truncate(n - from);
        let level = if replay.is_empty() {
            draft_level(n)
        } else {
            // The replay reports its run from `from` to the drafter, which
            // pairs it from the draft caches' offset: they stand level.
            from
        };
        if let Some(d) = self.drafter.as_mut() {
            d.rewind(level)?;
        }
        if !replay.is_empty() {
            let never = AtomicBool::new(false);
            self.prefill_inner(&replay, PREFILL_CHUNK, &never)?;
        }
        self.offset();
        tracing::debug!(
            from = have,
            to = n,
            replayed = replay.len(),
            "session rewound"
        );
        Ok(replay.len())
    }

    /// Snapshots of every cache at rest, for a prefix-cache entry.
    pub(crate) fn at_rest(&self) -> Result<AtRest> {
        let tokens = self.offset();
        let level = draft_level(tokens);
        for (i, c) in self.draft_caches().iter().enumerate() {
            assert_eq!(
                c.offset(),
                level,
                "draft cache {i} at {} with {tokens} committed tokens",
                c.offset()
            );
        }
        let sliceable = self
            .caches()
            .iter()
            .chain(self.draft_caches())
            .all(|c| c.rewinds_by_offset());
        let back = if sliceable {
            None
        } else {
            self.target.back_point(tokens.saturating_sub(1))?
        };
        let draft = self
            .draft_caches()
            .iter()
            .map(|c| c.snapshot())
            .collect::<Result<_, _>>()?;
        Ok(AtRest {
            tokens,
            target: self.target.snapshots()?,
            draft,
            sliceable,
            back,
        })
    }

    /// Restores every cache from `rest` to hold `tokens` (a prefix of the
    /// tokens it was taken under; check with [`AtRest::restores_to`]).
    /// On an error the session is emptied (see `Session::empty_after`).
    pub(crate) fn restore(&mut self, rest: &AtRest, tokens: &[u32]) -> Result<()> {
        let r = self.restore_inner(rest, tokens);
        self.empty_after(r)
    }

    fn restore_inner(&mut self, rest: &AtRest, tokens: &[u32]) -> Result<()> {
        let n = tokens.len();
        self.target
            .restore_from(&rest.target, tokens, rest.back.as_deref())?;
        if let Some(d) = self.drafter.as_mut() {
            let caches = d.paired_caches_mut();
            for (layer, (c, s)) in caches.iter_mut().zip(&rest.draft).enumerate() {
                if !c.restore(Some(s), draft_level(n))? {
                    return Err(kvcache::Error::SnapshotMissing {
                        offset: draft_level(n),
                        layer,
                        cache_offset: c.offset(),
                    }
                    .into());
                }
            }
        }
        Ok(())
    }
}

/// Where the draft caches must stand for `committed` tokens between calls.
fn draft_level(committed: usize) -> usize {
    committed.saturating_sub(1)
}

/// Forwards `tokens` in chunks of `chunk` after what `target` holds,
/// reporting each chunk to `draft`; returns the last chunk's hidden rows, or
/// `None` for no tokens or on cancellation between chunks.
pub(crate) fn prefill_chunks(
    target: &mut Target<'_>,
    tokens: &[u32],
    chunk: usize,
    cancel: &AtomicBool,
    mut draft: Option<&mut DraftRun<'_, '_>>,
) -> Result<Option<Array>> {
    let mut last = None;
    for part in tokens.chunks(chunk.max(1)) {
        if cancel.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let pos = target.committed().len();
        let (ids, hidden) = target.prefill_chunk(part, chunk.max(1))?;
        if let Some(d) = draft.as_deref_mut() {
            d.committed(part, &ids, &hidden, pos)?;
        }
        last = Some(hidden);
    }
    if !tokens.is_empty() {
        // The end of a prompt: the next chat turn's prompt extends it.
        target.mark_anchor();
    }
    target.offset();
    Ok(last)
}

/// A session's caches at rest, as a prefix-cache entry keeps them: the
/// target snapshots at `tokens` committed tokens, the draft snapshots at
/// `tokens - 1`.
#[derive(Debug)]
pub(crate) struct AtRest {
    /// Committed tokens `C`.
    pub(crate) tokens: usize,
    target: Vec<Snapshot>,
    draft: Vec<Snapshot>,
    /// Every snapshot restores to any lower offset (all full attention).
    pub(crate) sliceable: bool,
    /// The target captures at `tokens - 1` (recurrent caches only), for the
    /// MTP boundary re-run after a restore; `None` when not taken.
    back: Option<Vec<Option<Snapshot>>>,
}

impl AtRest {
    /// Whether this can put a session at `n` committed tokens; a session
    /// with look-ahead also needs the point one token back.
    pub(crate) fn restores_to(&self, n: usize, lookahead: usize) -> bool {
        n <= self.tokens
            && (self.sliceable
                || (n == self.tokens && (lookahead == 0 || n <= 1 || self.back.is_some())))
    }

    /// Every array the snapshots hold.
    pub(crate) fn arrays(&self) -> Vec<Array> {
        self.target
            .iter()
            .chain(&self.draft)
            .chain(self.back.iter().flatten().flatten())
            .flat_map(Snapshot::arrays)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DepthPolicy, GenerateOptions};

    /// A session emptied by `rewind_to(0)` (what `serve --no-prefix-reuse`
    /// does between requests) generates what a fresh session does, on the
    /// hybrid model whose recurrent layers restart from fresh caches, and
    /// keeps what the auto depth controller learned, so the next request
    /// does not seed its depth again.
    #[test]
    fn an_emptied_session_equals_a_fresh_one_and_keeps_its_depth_memory() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-hybrid-mtp");
        let m = crate::load(&dir, crate::LoadOptions::default(), |_, _| {}).unwrap();
        let model = m.model.as_ref();
        let opts = GenerateOptions {
            max_tokens: 24,
            depth: DepthPolicy::default(),
            // Greedy: a sampled run's draws depend on the depths chosen.
            sampling: sampler::Options {
                temperature: 0.0,
                ..sampler::Options::default()
            },
            ..GenerateOptions::default()
        };
        let cancel = AtomicBool::new(false);
        let first = m.tokenizer.encode("Once upon a time", true).unwrap();
        let second = m.tokenizer.encode("The little dog", true).unwrap();
        let run = |s: &mut Session<'_>, p: &[u32]| {
            s.generate(&m.tokenizer, p, &opts, &cancel, |_| {})
                .unwrap()
                .token_ids
        };

        let mut reused = Session::with_mtp(model).unwrap();
        run(&mut reused, &first);
        assert!(
            reused.depth_memory.is_some(),
            "an auto request leaves what it learned"
        );
        reused.rewind_to(0).unwrap();
        assert!(reused.committed().is_empty());
        assert!(
            reused.depth_memory.is_some(),
            "emptying keeps the depth memory"
        );
        let got = run(&mut reused, &second);
        let want = run(&mut Session::with_mtp(model).unwrap(), &second);
        assert_eq!(got, want);
        assert!(!got.is_empty());
    }

    /// A request that fails while it runs (here: a temperature that scales
    /// the logits past f32's range, found after the prefill wrote the
    /// caches) leaves every kind of session empty and consistent, and its
    /// next request generates what a fresh session does. Before, the caches
    /// stayed written past the committed tokens and the next request
    /// panicked on the broken bookkeeping (a server's engine thread died).
    /// Opens a session of some kind over a target and a draft model.
    type Open = for<'a> fn(&'a dyn Model, &'a dyn Model) -> Session<'a>;

    #[test]
    fn a_request_that_fails_midway_leaves_an_empty_consistent_session() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models");
        let lo = crate::LoadOptions::default;
        let m = crate::load(&root.join("tiny-mtp"), lo(), |_, _| {}).unwrap();
        let draft = crate::load_draft(
            &root.join("tiny-draft"),
            &root.join("tiny-mtp"),
            &m.tokenizer,
            lo(),
        )
        .unwrap();
        let model = m.model.as_ref();
        let greedy = GenerateOptions {
            max_tokens: 16,
            depth: DepthPolicy::Fixed(3),
            sampling: sampler::Options {
                temperature: 0.0,
                ..sampler::Options::default()
            },
            ..GenerateOptions::default()
        };
        let broken = GenerateOptions {
            sampling: sampler::Options {
                temperature: 1e-40,
                seed: Some(7),
                ..sampler::Options::default()
            },
            ..greedy.clone()
        };
        let cancel = AtomicBool::new(false);
        let first = m.tokenizer.encode("Once upon a time", true).unwrap();
        let second = m.tokenizer.encode("Once upon a hill", true).unwrap();
        let sessions: [(&str, Open); 4] = [
            ("plain", |t, _| Session::new(t)),
            ("mtp", |t, _| Session::with_mtp(t).unwrap()),
            ("draft-model", |t, d| Session::with_draft_model(t, d)),
            ("ngram", |t, _| {
                Session::with_ngram(t, NgramOptions::default())
            }),
        ];
        for (name, open) in sessions {
            let open = || open(model, draft.model.as_ref());
            let mut s = open();
            s.generate(&m.tokenizer, &first, &greedy, &cancel, |_| {})
                .unwrap();
            let e = s
                .generate(&m.tokenizer, &second, &broken, &cancel, |_| {})
                .expect_err(name);
            assert!(e.to_string().contains("non-finite"), "{name}: {e}");
            assert!(s.committed().is_empty(), "{name}: emptied");
            assert_eq!(s.offset(), 0, "{name}: caches agree");
            assert!(s.draft_caches().iter().all(|c| c.offset() == 0), "{name}");
            let got = s
                .generate(&m.tokenizer, &second, &greedy, &cancel, |_| {})
                .unwrap()
                .token_ids;
            let want = open()
                .generate(&m.tokenizer, &second, &greedy, &cancel, |_| {})
                .unwrap()
                .token_ids;
            assert_eq!(got, want, "{name}");
            assert!(!got.is_empty(), "{name}");
        }
    }
}
