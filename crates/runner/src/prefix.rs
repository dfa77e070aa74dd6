//! [`PrefixCache`]: cached prompt prefixes across sessions and requests, with
//! the draft caches restored together with the target's.
//!
//! Each entry holds a snapshot of every cache of a session at rest (target
//! caches at `C` committed tokens, draft caches at `C - 1`, see
//! [`Session`]) and sits in a compressed [`Trie`] under the keys of its
//! tokens. With draft caches, draft slot `i` fuses token `i + 1`, so key `i`
//! is the token pair `(token i, token i + 1)` ([`keys`]): matching `k` keys
//! verifies `k + 1` tokens, and every match length is a valid restore point
//! for the draft caches too. Without them key `i` is token `i`.
//!
//! A restore keeps at most `prompt.len() - 1` tokens, so at least one prompt
//! token is evaluated again (it produces the first sample). Full-attention
//! snapshots hold every position up to the entry's end, so any entry at or
//! below the match point restores the whole match (sliced); snapshots of
//! caches that cannot rewind (recurrent, rotating) restore only at their own
//! offset, so for those only the entries on the matched path count. Such
//! an entry also keeps the recurrent states one token back: an MTP session
//! re-runs its last committed token on its next request, and a restored
//! session has no capture of its own there.
//!
//! When the live session cannot rewind to the common prefix without
//! replaying tokens (recurrent layers, see [`Session::rewind_to`]), a stored
//! entry is preferred whenever it leaves fewer tokens to forward.
//!
//! Entries are evicted least recently used first whenever the snapshots hold
//! more than the byte budget. Dropping an entry (evicted, replaced, covered
//! by a deeper full-attention entry, or with the cache) releases its pins.

mod trie;

pub(crate) use trie::Trie;

use crate::error::{Error, Result};
use crate::session::{AtRest, Session, common_prefix};

/// The trie keys of `tokens`: the tokens themselves for look-ahead 0, the
/// `len - 1` pairs `token[i] << 32 | token[i + 1]` for look-ahead 1.
///
/// # Panics
/// For a look-ahead above 1 (no drafter has one).
pub(crate) fn keys(tokens: &[u32], lookahead: usize) -> Vec<u64> {
    match lookahead {
        0 => tokens.iter().map(|&t| u64::from(t)).collect(),
        1 => tokens
            .windows(2)
            .map(|w| (u64::from(w[0]) << 32) | u64::from(w[1]))
            .collect(),
        n => panic!("prefix keys for a look-ahead of {n}: only 0 and 1 exist"),
    }
}

/// Tokens verified by `k` matched keys.
fn verified(k: usize, lookahead: usize) -> usize {
    if k == 0 { 0 } else { k + lookahead }
}

/// Where a prompt's reused prefix came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReuseSource {
    /// Nothing was reused.
    None,
    /// The live session was rewound to the common prefix.
    Live,
    /// The caches were restored from a stored entry.
    Stored,
}

/// What [`PrefixCache::prepare`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reuse {
    /// Prompt tokens the session now holds: generate from `prompt[tokens..]`.
    pub tokens: usize,
    /// Of those, the tokens forwarded again to get there (a rewind of
    /// recurrent layers that had no restore point at the common prefix).
    pub replayed: usize,
    /// Where they came from.
    pub source: ReuseSource,
}

/// The shape of the sessions a cache serves; entries of one do not fit another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    lookahead: usize,
    target: usize,
    draft: usize,
}

impl Layout {
    fn of(s: &Session<'_>) -> Layout {
        Layout {
            lookahead: s.lookahead(),
            target: s.caches().len(),
            draft: s.draft_caches().len(),
        }
    }
}

/// Prompt prefixes cached across requests (see the module docs).
#[derive(Debug)]
pub struct PrefixCache {
    trie: Trie<AtRest>,
    budget: usize,
    layout: Option<Layout>,
}

impl PrefixCache {
    /// A default byte budget: 256 MiB.
    pub const DEFAULT_BUDGET: usize = 256 << 20;

    /// An empty cache holding at most `budget` bytes of snapshots.
    pub fn new(budget: usize) -> PrefixCache {
        PrefixCache {
            trie: Trie::new(),
            budget,
            layout: None,
        }
    }

    /// Bytes of snapshots held (at most the budget).
    pub fn bytes(&self) -> usize {
        self.trie.bytes()
    }

    /// The byte budget.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Entries stored.
    pub fn len(&self) -> usize {
        self.trie.len()
    }

    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.trie.is_empty()
    }

    /// Drops every entry (and its pins).
    pub fn clear(&mut self) {
        drop(self.trie.clear());
    }

    fn check_layout(&mut self, s: &Session<'_>) -> Result<Layout> {
        let now = Layout::of(s);
        match self.layout {
            None => {
                self.layout = Some(now);
                Ok(now)
            }
            Some(l) if l == now => Ok(now),
            Some(l) => Err(Error::InvalidOption {
                option: "prefix cache",
                message: format!(
                    "built for sessions with {} target caches, {} draft caches and look-ahead {}, \
                     used with {} / {} / {}: keep one prefix cache per model and speculation mode",
                    l.target, l.draft, l.lookahead, now.target, now.draft, now.lookahead
                ),
            }),
        }
    }

    /// Stores the session's caches under its committed tokens. Returns false
    /// when there is nothing to key (fewer tokens than one key needs) or the
    /// snapshots alone exceed the budget; otherwise evicts older entries
    /// until the budget holds.
    pub fn store(&mut self, session: &Session<'_>) -> Result<bool> {
        let layout = self.check_layout(session)?;
        let tokens = session.offset();
        let keys = keys(session.committed(), layout.lookahead);
        if keys.is_empty() {
            return Ok(false);
        }
        let entry = session.at_rest()?;
        let sliceable = entry.sliceable;
        let arrays = entry.arrays();
        mlx_tensor::eval(&arrays)?;
        let bytes = arrays.iter().map(|a| a.nbytes()).sum::<usize>();
        if bytes > self.budget {
            tracing::debug!(bytes, budget = self.budget, "prefix entry over budget");
            return Ok(false);
        }
        let (node, replaced) = self.trie.insert(&keys, entry, bytes);
        drop(replaced);
        if sliceable {
            // A full-attention entry restores every prefix of itself.
            for a in self.trie.ancestors_with_entries(node) {
                if self.trie.get(a).is_some_and(|e| e.sliceable) {
                    drop(self.trie.remove(a));
                }
            }
        }
        let evicted = self.trie.evict_to(self.budget);
        tracing::debug!(
            tokens,
            bytes,
            evicted = evicted.len(),
            held = self.trie.bytes(),
            "prefix stored"
        );
        Ok(true)
    }

    /// Puts `session` at the longest prefix of `prompt` available, from the
    /// live session itself (a rewind, the cheapest) or from a stored entry,
    /// and never past `prompt.len() - 1` tokens. Generate from
    /// `prompt[reuse.tokens..]` afterwards.
    pub fn prepare(&mut self, session: &mut Session<'_>, prompt: &[u32]) -> Result<Reuse> {
        let layout = self.check_layout(session)?;
        let cap = prompt.len().saturating_sub(1);
        let live = common_prefix(session.committed(), prompt).min(cap);
        // What the live rewind costs: tokens from here on are forwarded.
        let live_from = session.replay_from(live);
        let found = self.trie.find(&keys(prompt, layout.lookahead));
        let at = |depth: usize| verified(depth.min(found.matched), layout.lookahead).min(cap);
        let best = found
            .below
            .into_iter()
            .chain(found.on_path.iter().copied())
            .map(|(node, depth)| (node, at(depth)))
            .find(|&(node, n)| {
                n > live_from
                    && self
                        .trie
                        .get(node)
                        .is_some_and(|e| e.restores_to(n, layout.lookahead))
            });
        let Some((node, n)) = best else {
            let replayed = session.rewind_replaying(live)?;
            let source = if live > 0 {
                ReuseSource::Live
            } else {
                ReuseSource::None
            };
            return Ok(Reuse {
                tokens: live,
                replayed,
                source,
            });
        };
        let entry = self.trie.get(node).expect("candidate has an entry");
        session.restore(entry, &prompt[..n])?;
        self.trie.touch(node);
        tracing::debug!(tokens = n, live, "prefix restored");
        Ok(Reuse {
            tokens: n,
            replayed: 0,
            source: ReuseSource::Stored,
        })
    }
}
