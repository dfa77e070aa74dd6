//! [`History`]: the recent tokens of one sequence, for repetition penalties.

/// Tokens a new history reserves room for; longer windows grow on demand.
const PREALLOCATED: usize = 4096;

/// The last `window` committed tokens of one sequence.
///
/// Speculative rows never mutate it: [`crate::Distribution::from_logits`]
/// reads it together with the draft chain. Only accepted tokens go in, through
/// [`History::commit`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    window: usize,
    /// Oldest first; never longer than `window`.
    tokens: Vec<u32>,
}

impl History {
    /// An empty history that keeps the last `window` tokens (use the options'
    /// `repeat_last_n`).
    pub fn new(window: usize) -> Self {
        History {
            window,
            // Grown as tokens arrive: a huge `repeat_last_n` must not allocate up front.
            tokens: Vec::with_capacity(window.min(PREALLOCATED)),
        }
    }

    /// Appends accepted tokens (a prompt, or a round's accepted drafts plus
    /// its next token), dropping the oldest beyond the window.
    pub fn commit(&mut self, tokens: &[u32]) {
        self.tokens.extend_from_slice(tokens);
        let excess = self.tokens.len().saturating_sub(self.window);
        self.tokens.drain(..excess);
    }

    /// The kept tokens, oldest first.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// How many tokens it keeps at most.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Number of tokens kept now.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when nothing has been committed (or the window is 0).
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Forgets every token (a new request on the same slot).
    pub fn clear(&mut self) {
        self.tokens.clear();
    }

    /// The last `n` tokens of `history ++ chain`, oldest first.
    pub(crate) fn window_with(&self, chain: &[u32], n: usize) -> Vec<u32> {
        let from_chain = chain.len().min(n);
        let from_history = (n - from_chain).min(self.tokens.len());
        let mut out = Vec::with_capacity(from_history + from_chain);
        out.extend_from_slice(&self.tokens[self.tokens.len() - from_history..]);
        out.extend_from_slice(&chain[chain.len() - from_chain..]);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_keeps_the_last_window_tokens() {
        let mut h = History::new(3);
        h.commit(&[1, 2]);
        assert_eq!(h.tokens(), &[1, 2]);
        h.commit(&[3, 4, 5]);
        assert_eq!(h.tokens(), &[3, 4, 5]);
        h.commit(&[6]);
        assert_eq!(h.tokens(), &[4, 5, 6]);
        assert_eq!(h.len(), 3);
    }

    #[test]
    fn window_with_takes_the_tail_of_history_then_chain() {
        let mut h = History::new(8);
        h.commit(&[1, 2, 3, 4]);
        let check = |chain: &[u32], n: usize, expected: &[u32]| {
            assert_eq!(h.window_with(chain, n), expected, "chain {chain:?}, n {n}");
        };
        check(&[], 2, &[3, 4]);
        check(&[9], 2, &[4, 9]);
        check(&[7, 8, 9], 2, &[8, 9]);
        check(&[7], 10, &[1, 2, 3, 4, 7]);
        check(&[7], 0, &[]);
    }

    #[test]
    fn a_zero_window_keeps_nothing() {
        let mut h = History::new(0);
        h.commit(&[1, 2, 3]);
        assert!(h.is_empty());
    }
}
