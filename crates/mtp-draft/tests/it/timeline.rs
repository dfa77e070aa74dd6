//! The worked timeline of the pairing (ollama-mlxrunner.md §5.5), asserted
//! step by step: prompt t0..t4 = 10..14, target hidden at slot j is g_j.

use crate::common;

use common::fake::{call, target_hiddens, tokens};
use common::{FakeHead, Model, OWN};
use mtp_draft::{DraftHead, DraftSampling, DraftSession, Drafter};
use sampler::{History, KeyStream, Options};

fn propose(s: &mut DraftSession<'_, FakeHead>, current: u32, k: usize) -> Vec<u32> {
    let (options, history) = (Options::greedy(), History::new(0));
    let mut keys = KeyStream::new(0);
    let sampling = DraftSampling {
        options: &options,
        history: &history,
        keys: &mut keys,
    };
    let p = s
        .propose(&tokens(&[current]), k, sampling)
        .expect("propose")
        .expect("primed");
    p.tokens.to_vec().expect("drafts")
}

#[test]
fn worked_timeline_step_by_step() {
    let (head, log) = FakeHead::cached(Model::default());
    let mut drafter = Drafter::new(head);
    let mut s = drafter.open();
    let calls = |n: usize| log.borrow().calls[n..].to_vec();

    // 1. Prefill forwards t0..t3: pairs S0=(t1,g0) S1=(t2,g1) S2=(t3,g2) wait for t4.
    s.committed(&tokens(&[10, 11, 12, 13]), &target_hiddens(0, 4), 0)
        .expect("prefill");
    assert_eq!((s.frontier(), s.pending(), s.committed_offset()), (4, 3, 0));
    assert!(calls(0).is_empty());

    // 2. settle(t4) completes S3=(t4,g3) and flushes four pairs at 0.
    s.settle(&tokens(&[14])).expect("settle");
    assert_eq!(calls(0), [call(0, &[11, 12, 13, 14], &[0, 1, 2, 3])]);
    assert_eq!((s.pending(), s.committed_offset()), (0, 4));
    assert_eq!(log.borrow().stream, [(11, 0), (12, 1), (13, 2), (14, 3)]);

    // 3. Round 1, current t4 at 4: the settle inside propose has nothing to
    // pair; d1 comes from the held row, d2 and d3 write slots 4 and 5.
    let drafts = propose(&mut s, 14, 3);
    assert_eq!(drafts, [15, 16, 17]);
    assert_eq!(calls(1), [call(4, &[15], &[OWN]), call(5, &[16], &[OWN])]);
    assert_eq!(s.cache_offset(), Some(6), "two speculative slots");

    // 4. The target accepts d1 and rejects d2 (r = 25); it rewinds to 6 and
    // reports [t4, d1] with [g4, g5]: S4=(d1,g4) waits, frontier 6.
    s.committed(&tokens(&[14, 15]), &target_hiddens(4, 2), 4)
        .expect("round 1 report");
    assert_eq!((s.frontier(), s.pending(), s.committed_offset()), (6, 1, 4));
    assert_eq!(calls(3).len(), 0, "reports only buffer");

    // 5. Round 2, current r at 6: settle pairs S5=(r,g5); the flush rewinds
    // the speculative slots 4, 5 and writes S4, S5 in one forward.
    let drafts = propose(&mut s, 25, 2);
    assert_eq!(drafts, [26, 27], "the held row predicts slot 7");
    assert_eq!(
        calls(3),
        [call(4, &[15, 25], &[4, 5]), call(6, &[26], &[OWN])]
    );
    assert_eq!(
        log.borrow().stream,
        [
            (11, 0),
            (12, 1),
            (13, 2),
            (14, 3),
            (15, 4),
            (25, 5),
            (26, OWN)
        ]
    );
    s.close().expect("close");
    assert_eq!(
        drafter.head().cache_offset(),
        Some(6),
        "level with the target at 6"
    );
}
