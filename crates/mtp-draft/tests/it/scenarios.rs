//! Decode scenarios on fakes (after ollama's mtp_test.go): exact head-call
//! sequences and draft-cache contents for accept-all, mismatch, EOS, warm
//! and unprimed drafters, the flush cap, restored prefixes and parking.

use crate::common;

use common::fake::{call, target_hiddens, tokens};
use common::{FakeHead, Model, OWN, Sim};
use mtp_draft::{DraftHead, Drafter, PENDING_FLUSH_PAIRS};

#[test]
fn greedy_accept_all_drafts_and_bonus() {
    let (head, log) = FakeHead::cached(Model::default());
    let mut drafter = Drafter::new(head);
    let mut s = drafter.open();
    let mut sim = Sim::new(Model::default());
    sim.prefill(&mut s, &[1, 2, 3, 4]);
    assert!(log.borrow().calls.is_empty(), "prefill only buffers pairs");
    assert_eq!((s.frontier(), s.pending(), s.committed_offset()), (3, 2, 0));

    let round = sim.round(&mut s, 3).expect("a primed drafter proposes");
    assert_eq!(round.drafts, [5, 6, 7]);
    assert_eq!((round.accepted, round.kept), (3, 3));
    assert_eq!(round.emitted, [5, 6, 7, 8], "all drafts plus the bonus");
    assert_eq!(sim.pos, 7);
    assert_eq!(
        log.borrow().calls,
        [
            // settle(4) completes slot 2 and flushes the prefill pairs.
            call(0, &[2, 3, 4], &[0, 1, 2]),
            // d1 came from the held flush row; d2, d3 are speculative steps.
            call(3, &[5], &[OWN]),
            call(4, &[6], &[OWN]),
        ]
    );
    assert_eq!(log.borrow().unembeds, 3, "one unembed per draft step");
    assert_eq!(s.pending(), 3, "the round's pairs (5,g3) (6,g4) (7,g5)");

    sim.finish(s);
    let log = log.borrow();
    assert_eq!(log.calls[3], call(3, &[5, 6, 7, 8], &[3, 4, 5, 6]));
    assert_eq!(
        drafter.head().cache_offset(),
        Some(sim.pos),
        "level with the target"
    );
    sim.assert_paired(&log.stream, sim.pos);
}

/// A head asking for padded flushes (`DraftHead::flush_rows`) sees the
/// flush's pairs followed by copies of the last one, drafts from the last
/// real row, and its cache is rewound past the padding: the same drafts and
/// the same cache contents as unpadded.
#[test]
fn a_padded_flush_drafts_from_its_last_real_row_and_drops_the_padding() {
    let (mut head, log) = FakeHead::cached(Model::default());
    head.pad_flushes = true;
    let mut drafter = Drafter::new(head);
    let mut s = drafter.open();
    let mut sim = Sim::new(Model::default());
    sim.prefill(&mut s, &[1, 2, 3, 4]);
    let round = sim.round(&mut s, 3).expect("a primed drafter proposes");
    assert_eq!(round.drafts, [5, 6, 7]);
    assert_eq!(round.emitted, [5, 6, 7, 8]);
    assert_eq!(
        log.borrow().calls,
        [
            // Three pairs padded to four with a copy of the last.
            call(0, &[2, 3, 4, 4], &[0, 1, 2, 2]),
            // The padding was dropped: the next step writes slot 3.
            call(3, &[5], &[OWN]),
            call(4, &[6], &[OWN]),
        ]
    );
    sim.finish(s);
    assert_eq!(drafter.head().cache_offset(), Some(sim.pos));
    sim.assert_paired(&log.borrow().stream, sim.pos);
}

/// A head bounding its flushes (`DraftHead::flush_span`) gets a long
/// committed run as consecutive forwards of at most that many pairs, each
/// at the offset where the last ended (padded when it asks), and drafts as
/// after one forward: the same drafts and the same cache contents.
#[test]
fn a_flush_longer_than_the_heads_span_runs_as_consecutive_forwards() {
    let prompt: Vec<u32> = (1..=12).collect();
    let run = |span: usize, pad: bool| {
        let (mut head, log) = FakeHead::cached(Model::default());
        head.flush_span = span;
        head.pad_flushes = pad;
        let mut drafter = Drafter::new(head);
        let mut s = drafter.open();
        let mut sim = Sim::new(Model::default());
        sim.prefill(&mut s, &prompt);
        let round = sim.round(&mut s, 3).expect("a primed drafter proposes");
        sim.finish(s);
        assert_eq!(drafter.head().cache_offset(), Some(sim.pos));
        sim.assert_paired(&log.borrow().stream, sim.pos);
        let calls = log.borrow().calls.clone();
        (round.drafts, calls)
    };
    let (whole, calls) = run(usize::MAX, false);
    assert_eq!(
        calls[0],
        call(0, &prompt[1..], &(0..11).collect::<Vec<_>>())
    );
    for (span, pad) in [(4, false), (4, true), (5, true), (1, false), (0, false)] {
        let (drafts, calls) = run(span, pad);
        assert_eq!(drafts, whole, "span {span}, padded {pad}");
        let width = span.max(1);
        // 11 prefill pairs in spans of `width`, then the draft steps.
        let mut at = 0;
        for c in calls.iter().take(11usize.div_ceil(width)) {
            let n = width.min(11 - at);
            // Padding repeats the last pair.
            let rows = if pad { n.next_power_of_two() } else { n };
            let ids: Vec<u32> = (0..rows).map(|i| (at + 2 + i.min(n - 1)) as u32).collect();
            let slots: Vec<i32> = (0..rows).map(|i| (at + i.min(n - 1)) as i32).collect();
            assert_eq!(*c, call(at, &ids, &slots), "span {span}, padded {pad}");
            at += n;
        }
        assert_eq!(at, 11);
    }
}

/// A plain stretch that calls `flush_ready` after each token writes its
/// pairs one span at a time as they fill, never more at once, and leaves at
/// most one span short for the catch-up when drafting resumes: the drafts
/// and the cache contents are those of a stretch flushed at the end.
#[test]
fn a_plain_stretch_kept_up_flushes_one_span_at_a_time() {
    let run = |keep_up: bool| {
        let (mut head, log) = FakeHead::cached(Model::default());
        head.flush_span = 4;
        let mut drafter = Drafter::new(head);
        let mut s = drafter.open();
        let mut sim = Sim::new(Model::default());
        sim.prefill(&mut s, &[1, 2, 3]);
        let mut calls_during = Vec::new();
        for _ in 0..10 {
            sim.plain(&mut s);
            if keep_up {
                s.flush_ready().expect("flush_ready");
                assert!(s.pending() < 4, "{} pairs buffered", s.pending());
            }
            calls_during.push(log.borrow().calls.len());
        }
        let round = sim.round(&mut s, 3).expect("a primed drafter proposes");
        sim.finish(s);
        assert_eq!(drafter.head().cache_offset(), Some(sim.pos));
        sim.assert_paired(&log.borrow().stream, sim.pos);
        let calls = log.borrow().calls.clone();
        (round.drafts, calls, calls_during)
    };
    let (late, _, during) = run(false);
    assert!(
        during.iter().all(|&n| n == 0),
        "nothing written: {during:?}"
    );
    let (drafts, calls, during) = run(true);
    assert_eq!(drafts, late);
    // The prefill forwards tokens 1 and 2 (3 is the seed) and completes slot
    // 0; each plain step completes one more, so the 10 steps complete slots
    // 1..11: two spans of 4 written the step each filled, two pairs left.
    assert_eq!(during, [0, 0, 1, 1, 1, 1, 2, 2, 2, 2]);
    for (i, c) in calls.iter().take(2).enumerate() {
        let at = 4 * i;
        let ids: Vec<u32> = (at + 2..at + 6).map(|t| t as u32).collect();
        let slots: Vec<i32> = (at as i32..at as i32 + 4).collect();
        assert_eq!(*c, call(at, &ids, &slots));
    }
}

#[test]
fn mismatch_rebuilds_the_rejected_slots_from_target_hiddens() {
    let (head, log) = FakeHead::cached(Model::default());
    let mut drafter = Drafter::new(head);
    let mut s = drafter.open();
    let mut sim = Sim::new(Model::with(&[(5, 20)]));
    sim.prefill(&mut s, &[1, 2, 3, 4]);

    let round = sim.round(&mut s, 3).expect("proposal");
    assert_eq!(round.drafts, [5, 6, 7]);
    assert_eq!(
        round.emitted,
        [5, 20],
        "the target's own token at the rejection"
    );
    assert_eq!((round.accepted, sim.pos), (1, 5));
    // Speculative slots 3 and 4 hold the head's own hiddens until the next flush.
    assert_eq!(log.borrow().stream[3..], [(5, OWN), (6, OWN)]);

    let round = sim.round(&mut s, 2).expect("proposal");
    assert_eq!(round.drafts, [21, 22]);
    {
        let log = log.borrow();
        assert_eq!(
            log.calls[3..],
            [call(3, &[5, 20], &[3, 4]), call(5, &[21], &[OWN])],
            "the flush rewinds slots 3.. and rewrites them from target hiddens"
        );
        sim.assert_paired(&log.stream, 5);
    }
    sim.finish(s);
    sim.assert_paired(&log.borrow().stream, sim.pos);
}

#[test]
fn eos_inside_the_draft_is_emitted_but_not_committed() {
    let (head, log) = FakeHead::cached(Model::default());
    let mut drafter = Drafter::new(head);
    let mut s = drafter.open();
    let mut sim = Sim::new(Model::default());
    sim.eos = Some(6);
    sim.prefill(&mut s, &[1, 2, 3, 4]);

    let round = sim.round(&mut s, 3).expect("proposal");
    assert_eq!(round.drafts, [5, 6, 7]);
    assert_eq!((round.accepted, round.kept), (2, 1));
    assert_eq!(round.emitted, [5, 6], "no bonus after an EOS");
    assert!(sim.done);
    assert_eq!(
        sim.pos, 5,
        "the EOS sits at 5, one past the committed state"
    );
    assert_eq!(s.frontier(), 5);

    sim.finish(s);
    let log = log.borrow();
    assert_eq!(log.calls.last(), Some(&call(3, &[5, 6], &[3, 4])));
    assert_eq!(drafter.head().cache_offset(), Some(5));
    assert_eq!(
        log.stream[4],
        (6, 4),
        "the boundary pair holds the EOS look-ahead"
    );
    sim.assert_paired(&log.stream, 5);
}

#[test]
fn warm_drafter_drafts_in_the_first_round() {
    let (head, log) = FakeHead::cached(Model::default());
    let mut drafter = Drafter::new(head);
    let mut s = drafter.open();
    let mut sim = Sim::new(Model::default());
    sim.prefill(&mut s, &[1, 2]);
    assert!(s.is_primed());
    let round = sim.round(&mut s, 4).expect("prefill primed the drafter");
    assert_eq!(round.emitted, [3, 4, 5, 6, 7]);
    assert_eq!(log.borrow().calls[0], call(0, &[2], &[0]));
    sim.finish(s);
    sim.assert_paired(&log.borrow().stream, sim.pos);
}

#[test]
fn unprimed_drafter_proposes_nothing_until_a_plain_step() {
    let (head, log) = FakeHead::cached(Model::default());
    let mut drafter = Drafter::new(head);
    let mut s = drafter.open();
    let mut sim = Sim::new(Model::default());
    // A one-token prompt: the seed alone, nothing forwarded yet.
    sim.prefill(&mut s, &[9]);
    assert!(!s.is_primed());
    assert_eq!(sim.round(&mut s, 3), None, "unprimed: decode plainly");
    assert!(log.borrow().calls.is_empty());

    sim.plain(&mut s);
    let round = sim.round(&mut s, 2).expect("primed by the plain step");
    assert_eq!(round.emitted, [11, 12, 13]);
    assert_eq!(
        log.borrow().calls[..2],
        [call(0, &[10], &[0]), call(1, &[11], &[OWN])]
    );
    sim.finish(s);
    sim.assert_paired(&log.borrow().stream, sim.pos);

    // No budget: nothing to propose even when primed.
    let mut s = drafter.open();
    assert_eq!(sim.round(&mut s, 0), None);
    s.close().expect("close");
}

#[test]
fn committed_run_past_the_flush_cap_flushes_inside_committed() {
    let (head, log) = FakeHead::cached(Model::default());
    let mut drafter = Drafter::new(head);
    let mut s = drafter.open();
    let mut sim = Sim::new(Model::default());
    let prompt: Vec<u32> = (0..601).map(|i| i % 32).collect();
    sim.prefill(&mut s, &prompt);
    {
        let log = log.borrow();
        assert_eq!(log.calls.len(), 1, "one batched head forward");
        assert_eq!((log.calls[0].position, log.calls[0].tokens.len()), (0, 599));
    }
    assert_eq!((s.pending(), s.committed_offset()), (0, 599));
    assert!(
        mlx_tensor::live_pins() <= 3,
        "frontier hidden and held row only"
    );

    // Single-token runs buffer until the cap, then flush as one forward.
    for _ in 0..300 {
        sim.plain(&mut s);
    }
    {
        let log = log.borrow();
        assert_eq!(log.calls.len(), 2);
        assert_eq!(
            (log.calls[1].position, log.calls[1].tokens.len()),
            (599, PENDING_FLUSH_PAIRS)
        );
    }
    assert_eq!(s.pending(), 300 - PENDING_FLUSH_PAIRS);
    sim.finish(s);
    assert_eq!(drafter.head().cache_offset(), Some(900));
    sim.assert_paired(&log.borrow().stream, 900);
}

#[test]
fn restored_prefix_rewrites_the_stale_boundary_pair() {
    let (head, log) = FakeHead::cached(Model::default());
    let mut drafter = Drafter::new(head);
    let mut sim = Sim::new(Model::default());
    sim.eos = Some(6);
    let mut s = drafter.open();
    sim.prefill(&mut s, &[1, 2, 3, 4]);
    sim.round(&mut s, 3).expect("proposal");
    sim.finish(s);
    assert_eq!(
        log.borrow().stream[4],
        (6, 4),
        "turn 1 ends on the EOS pair"
    );

    // Turn 2 continues after token 5 with 9, not the EOS: the prefix cache
    // restores target and draft one below the match, to 4.
    let restored = drafter.head_mut().caches_mut()[0].restore(None, 4);
    assert!(restored.expect("rewind"));
    let mut s = drafter.open();
    assert_eq!((s.frontier(), s.committed_offset()), (4, 4));
    assert!(!s.is_primed());
    sim.prefill_at(&mut s, &[5, 9, 10, 11], 4);
    assert_eq!(
        s.pending(),
        2,
        "slot 3 is already written; slots 4 and 5 are new"
    );
    let round = sim.round(&mut s, 2).expect("proposal");
    assert_eq!(round.drafts, [12, 13]);
    {
        let log = log.borrow();
        let n = log.calls.len();
        assert_eq!(log.calls[n - 2], call(4, &[9, 10, 11], &[4, 5, 6]));
    }
    sim.finish(s);
    let log = log.borrow();
    assert_eq!(
        log.stream[4],
        (9, 4),
        "the boundary pair now holds the new token"
    );
    sim.assert_paired(&log.stream, sim.pos);
}

#[test]
fn parked_decoding_resumes_with_contiguous_pairs() {
    let (head, log) = FakeHead::cached(Model::default());
    let mut drafter = Drafter::new(head);
    let mut s = drafter.open();
    let mut sim = Sim::new(Model::with(&[(6, 30)]));
    sim.prefill(&mut s, &[1, 2, 3, 4]);
    let round = sim.round(&mut s, 3).expect("proposal");
    assert_eq!(round.emitted, [5, 6, 30]);
    let calls_before = log.borrow().calls.len();

    // Parked: plain steps report one token each and never call the head.
    for _ in 0..3 {
        sim.plain(&mut s);
    }
    assert_eq!(log.borrow().calls.len(), calls_before);
    assert_eq!(s.pending(), 5, "the round's two pairs and the parked three");

    // Resume: one flush writes every buffered pair and the frontier pair.
    let round = sim.round(&mut s, 2).expect("proposal");
    assert_eq!(round.drafts, [2, 3], "after 31 the map wraps to 0, 1");
    {
        let log = log.borrow();
        assert_eq!(
            log.calls[calls_before],
            call(3, &[5, 6, 30, 31, 0, 1], &[3, 4, 5, 6, 7, 8])
        );
        sim.assert_paired(&log.stream, 9);
    }
    sim.finish(s);
    sim.assert_paired(&log.borrow().stream, sim.pos);
}

#[test]
fn cacheless_head_anchors_every_step_at_the_last_committed_slot() {
    let (head, log) = FakeHead::cacheless(Model::default());
    let mut drafter = Drafter::new(head);
    assert_eq!(drafter.lookahead(), 0);
    let mut s = drafter.open();
    let mut sim = Sim::new(Model::with(&[(6, 9)]));
    sim.prefill(&mut s, &[1, 2, 3, 4]);
    let round = sim.round(&mut s, 3).expect("proposal");
    assert_eq!(round.drafts, [5, 6, 7]);
    assert_eq!(round.emitted, [5, 6, 9]);
    let round = sim.round(&mut s, 2).expect("proposal");
    assert_eq!(round.drafts, [10, 11]);
    assert_eq!(
        log.borrow().calls,
        [
            call(2, &[4], &[2]),
            call(2, &[5], &[OWN]),
            call(2, &[6], &[OWN]),
            call(5, &[9], &[5]),
            call(5, &[10], &[OWN]),
        ]
    );
    sim.finish(s);
    assert!(log.borrow().stream.is_empty());
}

#[test]
fn a_second_proposal_without_a_report_drops_the_first_ones_entries() {
    let (head, log) = FakeHead::cached(Model::default());
    let mut drafter = Drafter::new(head);
    let mut s = drafter.open();
    let mut sim = Sim::new(Model::default());
    sim.prefill(&mut s, &[1, 2, 3, 4]);
    let current = tokens(&[4]);
    for _ in 0..2 {
        let sampling = mtp_draft::DraftSampling {
            options: &sim.options,
            history: &sim.history,
            keys: &mut sim.keys,
        };
        let p = s
            .propose(&current, 3, sampling)
            .expect("propose")
            .expect("primed");
        assert_eq!(p.tokens.to_vec::<u32>().expect("read"), [5, 6, 7]);
    }
    let calls = log.borrow().calls.clone();
    assert_eq!(calls[3..], [call(3, &[5], &[OWN]), call(4, &[6], &[OWN])]);
    s.close().expect("close");
    assert_eq!(
        drafter.head().cache_offset(),
        Some(3),
        "speculative entries dropped"
    );
}

#[test]
fn pins_are_all_released_after_close_or_drop() {
    let before = mlx_tensor::live_pins();
    let (head, _log) = FakeHead::cached(Model::default());
    let mut drafter = Drafter::new(head);
    let mut sim = Sim::new(Model::with(&[(7, 1)]));
    let mut s = drafter.open();
    sim.prefill(&mut s, &[1, 2, 3, 4]);
    sim.round(&mut s, 4).expect("proposal");
    sim.plain(&mut s);
    assert!(
        mlx_tensor::live_pins() > before,
        "the session holds pins while open"
    );
    sim.finish(s);
    assert_eq!(mlx_tensor::live_pins(), before, "close releases every pin");

    let mut s = drafter.open();
    sim.plain(&mut s);
    sim.plain(&mut s);
    drop(s);
    assert_eq!(mlx_tensor::live_pins(), before, "drop releases every pin");
}

#[test]
fn bad_runs_are_errors_naming_the_counts() {
    let (head, _log) = FakeHead::cached(Model::default());
    let mut drafter = Drafter::new(head);
    let mut s = drafter.open();
    let err = s
        .committed(&tokens(&[1, 2, 3]), &target_hiddens(0, 2), 0)
        .expect_err("3 tokens, 2 hiddens");
    assert!(
        matches!(
            err,
            mtp_draft::Error::RunMismatch {
                position: 0,
                tokens: 3,
                hiddens: 2
            }
        ),
        "{err}"
    );
    let err = s
        .committed(&tokens(&[]), &target_hiddens(0, 0), 0)
        .expect_err("an empty run");
    assert!(err.to_string().contains("n >= 1"), "{err}");
    let err = s
        .settle(&tokens(&[1, 2]))
        .expect_err("two tokens to settle");
    assert!(err.to_string().contains("scalar or [1]"), "{err}");
    assert_eq!(
        (s.frontier(), s.pending()),
        (0, 0),
        "failed calls change nothing"
    );
}

#[test]
fn a_gap_in_the_committed_stream_panics_with_both_slots() {
    let (head, _log) = FakeHead::cached(Model::default());
    let mut drafter = Drafter::new(head);
    let mut sim = Sim::new(Model::default());
    let mut s = drafter.open();
    sim.prefill(&mut s, &[1, 2, 3, 4]);
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        s.committed(&tokens(&[5]), &target_hiddens(4, 1), 4)
    }));
    let message = run.expect_err("slot 3 was never reported");
    let message = message
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(
        message.contains("at 4") && message.contains("frontier 3"),
        "{message}"
    );
}
