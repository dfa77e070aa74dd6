//! Property: whatever the accept/reject sequence, the committed draft stream
//! has no gap (slot S holds token S+1 with the target hidden at S) and every
//! flush leaves the draft caches exactly at the committed offset.

use crate::common;

use common::{FakeHead, Model, Sim};
use mtp_draft::{DraftHead, Drafter};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// A parked plain step.
    Plain,
    /// A round of depth `k` with `accepted` drafts passing, then `next`.
    Round {
        k: usize,
        accepted: usize,
        next: u32,
    },
    /// An explicit flush.
    Flush,
    /// A plain step that then writes the buffered pairs once they fill a
    /// flush span (`DraftSession::flush_ready`).
    PlainKeptUp,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => Just(Op::Plain),
        3 => (0usize..5, 0usize..5, 0u32..32)
            .prop_map(|(k, accepted, next)| Op::Round { k, accepted, next }),
        1 => Just(Op::Flush),
        2 => Just(Op::PlainKeptUp),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn pairing_never_leaves_a_gap(
        prompt in prop::collection::vec(0u32..32, 1..300),
        ops in prop::collection::vec(op(), 0..40),
        end_on_eos in any::<bool>(),
        draft_shift in 0u32..3,
        span in 1usize..6,
    ) {
        // The draft model agrees with the target only where draft_shift is 0.
        let overrides: Vec<(u32, u32)> = (0..32).map(|t| (t, (t + 1 + draft_shift) % 32)).collect();
        let (mut head, log) = FakeHead::cached(Model::with(&overrides));
        head.flush_span = span;
        let mut drafter = Drafter::new(head);
        let mut sim = Sim::new(Model::default());
        let mut s = drafter.open();
        sim.prefill(&mut s, &prompt);
        for op in &ops {
            match *op {
                Op::Plain => sim.plain(&mut s),
                Op::Round { k, accepted, next } => {
                    if sim.forced_round(&mut s, k, accepted, false, next).is_none() {
                        sim.plain(&mut s);
                    }
                }
                Op::PlainKeptUp => {
                    sim.plain(&mut s);
                    s.flush_ready().expect("flush_ready");
                    prop_assert!(s.pending() < span, "{} pairs left buffered", s.pending());
                }
                Op::Flush => {
                    s.flush().expect("flush");
                    prop_assert_eq!(s.pending(), 0);
                    prop_assert_eq!(s.cache_offset(), Some(s.committed_offset()));
                }
            }
            let written = s.committed_offset() + s.pending();
            if s.is_primed() {
                prop_assert!(
                    written + 1 == s.frontier() || written == s.frontier(),
                    "written {} vs frontier {}", written, s.frontier()
                );
            }
            prop_assert_eq!(s.frontier(), sim.pos);
            prop_assert!(s.cache_offset().unwrap_or(0) >= s.committed_offset());
            sim.assert_paired(&log.borrow().stream, s.committed_offset());
        }
        if end_on_eos {
            sim.forced_round(&mut s, 3, 2, true, 0);
        }
        sim.finish(s);
        prop_assert_eq!(drafter.head().cache_offset(), Some(sim.pos));
        sim.assert_paired(&log.borrow().stream, sim.pos);
        prop_assert_eq!(mlx_tensor::live_pins(), 0);
    }
}
