//! How proposals sample: penalties see the committed history plus the
//! earlier drafts of the chain, and a sampled drafter on near-point-mass
//! logits drafts what the greedy one does.

use crate::common;

use common::fake::tokens;
use common::{FakeHead, Model, Sim};
use mtp_draft::{DraftSampling, Drafter};
use sampler::{History, KeyStream, Options};

/// Drafts `k` tokens after a four-token prefill with a head that always
/// predicts 5, under `options` and a history holding `committed`.
fn drafts_with(options: &Options, committed: &[u32], k: usize) -> Vec<u32> {
    let always_five: Vec<(u32, u32)> = (0..32).map(|t| (t, 5)).collect();
    let (head, _log) = FakeHead::cacheless(Model::with(&always_five));
    let mut drafter = Drafter::new(head);
    let mut s = drafter.open();
    let mut sim = Sim::new(Model::default());
    sim.prefill(&mut s, &[1, 2, 3, 4]);
    let mut history = History::new(64);
    history.commit(committed);
    let mut keys = KeyStream::new(11);
    let sampling = DraftSampling {
        options,
        history: &history,
        keys: &mut keys,
    };
    let p = s
        .propose(&tokens(&[4]), k, sampling)
        .expect("propose")
        .expect("primed");
    assert_eq!(history.tokens(), committed, "a proposal never commits");
    p.tokens.to_vec().expect("drafts")
}

#[test]
fn earlier_drafts_are_penalty_history_for_later_steps() {
    let presence = Options {
        presence_penalty: 100.0,
        ..Options::greedy()
    };
    // Logits are 30 at token 5 and 0 elsewhere; a seen token drops by 100,
    // so each step takes the lowest id not yet seen once 5 is used.
    let check = |options: &Options, committed: &[u32], expected: &[u32]| {
        assert_eq!(
            drafts_with(options, committed, 3),
            expected,
            "history {committed:?}, presence penalty {}",
            options.presence_penalty
        );
    };
    check(&presence, &[], &[5, 0, 1]);
    check(&presence, &[1], &[5, 0, 2]);
    check(&presence, &[5], &[0, 1, 2]);
    // Control: without penalties the chain changes nothing.
    check(&Options::greedy(), &[5], &[5, 5, 5]);
}

#[test]
fn sampled_drafts_on_near_point_masses_match_greedy() {
    let run = |options: Options| {
        let (head, _log) = FakeHead::cached(Model::with(&[(9, 3)]));
        let mut drafter = Drafter::new(head);
        let mut s = drafter.open();
        let mut sim = Sim::new(Model::with(&[(7, 2)]));
        sim.options = options;
        sim.prefill(&mut s, &[1, 2, 3, 4]);
        let mut rounds = Vec::new();
        while sim.seq.len() < 40 {
            rounds.push(sim.round(&mut s, 3).expect("proposal"));
        }
        sim.finish(s);
        (sim.seq, rounds)
    };
    let greedy = run(Options::greedy());
    // Temperature 1: the predicted token has probability 1 - 31·e^-30.
    let sampled = run(Options {
        seed: Some(5),
        ..Options::default()
    });
    assert_eq!(sampled, greedy);
    assert!(
        greedy.1.iter().any(|r| r.accepted < 3),
        "the maps disagree somewhere, so some round rejects"
    );
}
