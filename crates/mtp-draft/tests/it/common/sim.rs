//! [`Sim`]: a stand-in for the speculative decoder, driving a session with a
//! target that predicts through a [`Model`] and reports hiddens by slot.

use mtp_draft::{DraftHead, DraftSampling, DraftSession};
use sampler::{History, KeyStream, Options};

use super::fake::{Model, target_hiddens, tokens};

/// The runner's side: the token stream by slot and the unforwarded current.
#[derive(Debug)]
pub(crate) struct Sim {
    pub target: Model,
    pub eos: Option<u32>,
    /// Every token by slot; `seq[pos]` is the current token, emitted but not
    /// forwarded, so the target caches rest at `pos`.
    pub seq: Vec<u32>,
    pub pos: usize,
    pub options: Options,
    pub history: History,
    pub keys: KeyStream,
    /// An EOS was emitted: generation is over.
    pub done: bool,
}

/// What one speculative round did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Round {
    pub drafts: Vec<u32>,
    /// Drafts accepted by the target (an accepted EOS included).
    pub accepted: usize,
    /// Drafts committed to the caches (an accepted EOS excluded).
    pub kept: usize,
    /// Tokens emitted this round.
    pub emitted: Vec<u32>,
}

impl Sim {
    pub(crate) fn new(target: Model) -> Sim {
        Sim {
            target,
            eos: None,
            seq: Vec::new(),
            pos: 0,
            options: Options::greedy(),
            history: History::new(64),
            keys: KeyStream::new(7),
            done: false,
        }
    }

    pub(crate) fn current(&self) -> u32 {
        self.seq[self.pos]
    }

    fn current_array(&self) -> mlx_tensor::Array {
        tokens(&[self.current()])
    }

    /// Prefills `prompt`: every token but the last (the seed) is forwarded
    /// and reported at slot 0.
    pub(crate) fn prefill<H: DraftHead>(&mut self, s: &mut DraftSession<'_, H>, prompt: &[u32]) {
        self.prefill_at(s, prompt, 0);
    }

    /// Prefills `prompt` placed at slot `at` of an existing stream (a
    /// restored prefix covers the slots below).
    pub(crate) fn prefill_at<H: DraftHead>(
        &mut self,
        s: &mut DraftSession<'_, H>,
        prompt: &[u32],
        at: usize,
    ) {
        self.seq.truncate(at);
        self.seq.extend_from_slice(prompt);
        let n = prompt.len() - 1;
        if n > 0 {
            s.committed(&tokens(&prompt[..n]), &target_hiddens(at, n), at)
                .expect("prefill report");
        }
        self.pos = at + n;
    }

    /// One plain decode step: forwards the current token and emits the
    /// target's next.
    pub(crate) fn plain<H: DraftHead>(&mut self, s: &mut DraftSession<'_, H>) {
        let current = self.current();
        s.committed(&tokens(&[current]), &target_hiddens(self.pos, 1), self.pos)
            .expect("plain report");
        self.seq.push(self.target.next(current));
        self.pos += 1;
    }

    /// Drafts up to `k`, verifies greedily against the target, commits.
    /// `None` when the session proposed nothing (decode plainly then).
    pub(crate) fn round<H: DraftHead>(
        &mut self,
        s: &mut DraftSession<'_, H>,
        k: usize,
    ) -> Option<Round> {
        let drafts = self.propose(s, k)?;
        let mut prev = self.current();
        let mut accepted = 0;
        for &d in &drafts {
            if d != self.target.next(prev) {
                break;
            }
            accepted += 1;
            prev = d;
        }
        let eos_at = self
            .eos
            .and_then(|e| drafts[..accepted].iter().position(|&d| d == e));
        let round = match eos_at {
            Some(i) => self.commit(s, drafts, i + 1, true, 0),
            None => {
                let next = self.target.next(prev);
                self.commit(s, drafts, accepted, false, next)
            }
        };
        Some(round)
    }

    /// Drafts up to `k` and commits with a forced outcome: `accepted` drafts
    /// pass, then `next` is emitted (or, with `eos`, the last accepted draft
    /// ends generation uncommitted).
    pub(crate) fn forced_round<H: DraftHead>(
        &mut self,
        s: &mut DraftSession<'_, H>,
        k: usize,
        accepted: usize,
        eos: bool,
        next: u32,
    ) -> Option<Round> {
        let drafts = self.propose(s, k)?;
        let accepted = accepted.min(drafts.len());
        Some(self.commit(s, drafts, accepted, eos && accepted > 0, next))
    }

    fn propose<H: DraftHead>(&mut self, s: &mut DraftSession<'_, H>, k: usize) -> Option<Vec<u32>> {
        let current = self.current_array();
        let sampling = DraftSampling {
            options: &self.options,
            history: &self.history,
            keys: &mut self.keys,
        };
        let proposal = s.propose(&current, k, sampling).expect("propose")?;
        assert_eq!(
            proposal.dist.rows(),
            proposal.len,
            "one distribution row per draft"
        );
        let drafts: Vec<u32> = proposal.tokens.to_vec().expect("drafts");
        assert_eq!(drafts.len(), proposal.len);
        Some(drafts)
    }

    fn commit<H: DraftHead>(
        &mut self,
        s: &mut DraftSession<'_, H>,
        drafts: Vec<u32>,
        accepted: usize,
        eos: bool,
        next: u32,
    ) -> Round {
        // An accepted EOS is emitted but its state is not committed.
        let kept = if eos { accepted - 1 } else { accepted };
        let before = self.pos;
        let mut run = vec![self.current()];
        run.extend_from_slice(&drafts[..kept]);
        s.committed(&tokens(&run), &target_hiddens(before, kept + 1), before)
            .expect("round report");
        let mut emitted = drafts[..accepted].to_vec();
        if !eos {
            emitted.push(next);
        }
        self.seq.truncate(before + 1);
        self.seq.extend_from_slice(&emitted);
        self.pos = before + 1 + kept;
        self.done = eos;
        Round {
            drafts,
            accepted,
            kept,
            emitted,
        }
    }

    /// Ends the request: the current token was emitted but never forwarded;
    /// settling with it levels the draft caches with the target.
    pub(crate) fn finish<H: DraftHead>(&mut self, mut s: DraftSession<'_, H>) {
        s.settle(&self.current_array()).expect("settle");
        s.close().expect("close");
    }

    /// Checks the pairing invariant on the draft cache's first `upto` slots:
    /// slot `S` holds token `S + 1` with the target hidden at `S`.
    pub(crate) fn assert_paired(&self, stream: &[(u32, i32)], upto: usize) {
        assert!(
            stream.len() >= upto,
            "stream {} slots, need {upto}",
            stream.len()
        );
        for (slot, &(token, hidden)) in stream[..upto].iter().enumerate() {
            assert_eq!(
                (token, hidden),
                (self.seq[slot + 1], slot as i32),
                "draft slot {slot} of {upto}; stream {stream:?}, seq {:?}",
                self.seq
            );
        }
    }
}
