//! Prompt lookup: draft the continuation of the longest recent n-gram match.
//!
//! The proposal after `… x y z` is what followed the most recent earlier
//! occurrence of `x y z` in the prompt plus output (trying `n` = 3, 2, 1
//! tokens). There is no model: proposals are one-hot rows, and the
//! acceptance rule with a one-hot draft `q` accepts token `x` with
//! probability `p(x)`, so the emitted tokens still follow the target exactly.

use mlx_tensor::{Array, Dtype, ops};
use mtp_draft::Proposal;
use sampler::Distribution;

use crate::error::Result;

/// How prompt lookup searches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NgramOptions {
    /// Longest suffix tried.
    pub max_n: usize,
    /// Shortest suffix tried (at least 1).
    pub min_n: usize,
    /// Tokens at the end of the context searched (the recent text).
    pub window: usize,
}

impl Default for NgramOptions {
    fn default() -> Self {
        NgramOptions {
            max_n: 3,
            min_n: 1,
            window: 1024,
        }
    }
}

/// The prompt-lookup drafter: stateless but for its options and the target's vocabulary.
#[derive(Debug, Clone)]
pub(crate) struct NgramDrafter {
    options: NgramOptions,
    vocab: usize,
}

impl NgramDrafter {
    /// A drafter proposing ids below `vocab` (the target's vocabulary size).
    pub(crate) fn new(vocab: usize, options: NgramOptions) -> NgramDrafter {
        NgramDrafter { options, vocab }
    }

    /// Up to `max_tokens` drafts after `context` (committed tokens) then
    /// `current`, with one-hot distributions; `None` when nothing matches.
    pub(crate) fn propose(
        &self,
        context: &[u32],
        current: u32,
        max_tokens: usize,
    ) -> Result<Option<Proposal>> {
        let start = context.len().saturating_sub(self.options.window);
        let mut recent = context[start..].to_vec();
        recent.push(current);
        let drafts = lookup(&recent, self.options, max_tokens);
        // Ids the model cannot embed would index past the one-hot rows.
        if drafts.is_empty() || drafts.iter().any(|&t| t as usize >= self.vocab) {
            return Ok(None);
        }
        let k = drafts.len() as i32;
        let tokens = Array::from_slice(&drafts, &[k])?;
        let ids = ops::arange(0.0, self.vocab as f64, 1.0, Dtype::Uint32)?.reshape(&[1, -1])?;
        let one_hot = ids
            .equal(&tokens.reshape(&[k, 1])?)?
            .as_type(Dtype::Float32)?;
        Ok(Some(Proposal {
            tokens,
            len: drafts.len(),
            dist: Distribution::from_probs(&one_hot)?,
        }))
    }
}

/// The continuation (at most `max_tokens`) of the most recent earlier
/// occurrence of the longest suffix of `tokens` that occurs earlier, trying
/// suffix lengths `max_n` down to `min_n`; empty when none occurs.
pub(crate) fn lookup(tokens: &[u32], options: NgramOptions, max_tokens: usize) -> Vec<u32> {
    let len = tokens.len();
    if max_tokens == 0 {
        return Vec::new();
    }
    for n in (options.min_n.max(1)..=options.max_n).rev() {
        if len < n + 1 {
            continue;
        }
        let suffix = &tokens[len - n..];
        // Earlier occurrences end before the suffix starts repeating itself at
        // the very end, so each has at least one token after it.
        if let Some(i) = (0..len - n).rev().find(|&i| &tokens[i..i + n] == suffix) {
            let from = i + n;
            return tokens[from..(from + max_tokens).min(len)].to_vec();
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(tokens: &[u32], max_tokens: usize, expected: &[u32]) {
        let got = lookup(tokens, NgramOptions::default(), max_tokens);
        assert_eq!(got, expected, "lookup({tokens:?}, {max_tokens})");
    }

    #[test]
    fn lookup_cases() {
        // Trigram match: `1 2 3` occurred before, followed by `4 5`.
        check(&[1, 2, 3, 4, 5, 9, 1, 2, 3], 2, &[4, 5]);
        // The continuation stops at the end of the context.
        check(&[1, 2, 3, 4, 1, 2, 3], 8, &[4, 1, 2, 3]);
        // The longest suffix wins over a more recent shorter one: `7 3`
        // (bigram, followed by 8) beats the recent unigram `3 → 6`.
        check(&[7, 3, 8, 0, 3, 6, 7, 3], 1, &[8]);
        // Of two trigram matches, the most recent one.
        check(&[1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3], 1, &[5]);
        // Falls back to a unigram.
        check(&[4, 9, 8, 4], 3, &[9, 8, 4]);
        // No earlier occurrence of even the last token: no proposal.
        check(&[1, 2, 3, 4], 3, &[]);
        // Too short to have an earlier occurrence.
        check(&[5], 3, &[]);
        check(&[], 3, &[]);
        // Zero budget.
        check(&[1, 1, 1], 0, &[]);
        // A run of one token proposes more of it.
        check(&[2, 2, 2, 2], 4, &[2]);
    }

    #[test]
    fn min_n_above_the_match_finds_nothing() {
        let o = NgramOptions {
            min_n: 2,
            ..NgramOptions::default()
        };
        assert_eq!(lookup(&[4, 9, 8, 4], o, 3), Vec::<u32>::new());
    }

    #[test]
    fn window_limits_the_search() -> Result<()> {
        let d = NgramDrafter::new(
            16,
            NgramOptions {
                window: 3,
                ..NgramOptions::default()
            },
        );
        // `1 2` occurred only outside the last three tokens.
        assert!(d.propose(&[1, 2, 5, 6, 7, 1], 2, 2)?.is_none());
        let wide = NgramDrafter::new(16, NgramOptions::default());
        let p = wide.propose(&[1, 2, 5, 6, 7, 1], 2, 2)?.expect("a match");
        assert_eq!((p.len, p.tokens.to_vec::<u32>()?), (2, vec![5, 6]));
        Ok(())
    }

    #[test]
    fn proposals_are_one_hot_rows() -> Result<()> {
        let d = NgramDrafter::new(8, NgramOptions::default());
        let p = d.propose(&[3, 5, 6], 3, 2)?.expect("a match");
        assert_eq!(p.dist.rows(), 2);
        let probs = p.dist.probs().to_vec::<f32>()?;
        let mut expected = vec![0.0f32; 16];
        expected[5] = 1.0;
        expected[8 + 6] = 1.0;
        assert_eq!(probs, expected);
        Ok(())
    }

    #[test]
    fn ids_outside_the_vocabulary_are_not_proposed() -> Result<()> {
        let d = NgramDrafter::new(8, NgramOptions::default());
        assert!(d.propose(&[3, 9], 3, 2)?.is_none());
        Ok(())
    }
}
