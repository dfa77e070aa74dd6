//! Rolling back a mixed stack after speculative verifies, as the runner does.

use crate::common;

use common::{Kind, assert_matches_fresh, forward};
use kvcache::{Cache, restore_all, rollback, schedule_all};

const STACK: [Kind; 4] = [
    Kind::Kv,
    Kind::Rotating {
        max_size: 4,
        keep: 0,
    },
    Kind::Rotating {
        max_size: 6,
        keep: 2,
    },
    Kind::Recurrent,
];

/// Every layer of the stack after a forward of `history`.
fn stack(history: &[u32]) -> Vec<Box<dyn Cache>> {
    STACK
        .iter()
        .map(|&kind| {
            let mut c = kind.make();
            forward(kind, c.as_mut(), history);
            c
        })
        .collect()
}

/// Runs `rounds` verify rounds of `drafts` drafts accepting `accepted(round)`
/// each, checking every layer against a fresh cache after each rollback.
fn check_rounds(prompt: usize, drafts: usize, rounds: usize, accepted: impl Fn(usize) -> usize) {
    let pins = mlx_tensor::live_pins();
    let mut history = vec![0; prompt];
    let mut caches = stack(&history);
    for round in 0..rounds {
        let o = history.len();
        schedule_all(&mut caches, &(o + 1..=o + drafts).collect::<Vec<_>>());
        history.extend(std::iter::repeat_n(round as u32 + 1, drafts + 1));
        for (kind, c) in STACK.iter().zip(caches.iter_mut()) {
            forward(*kind, c.as_mut(), &history);
        }
        let keep = o + 1 + accepted(round);
        rollback(&mut caches, keep).unwrap();
        history.truncate(keep);
        for (kind, c) in STACK.iter().zip(&caches) {
            let what = format!("{kind:?}, prompt {prompt}, drafts {drafts}, round {round}");
            assert_matches_fresh(*kind, c.as_ref(), &history, &what);
        }
    }
    drop(caches);
    assert_eq!(mlx_tensor::live_pins(), pins, "snapshots left pins behind");
}

#[test]
fn mixed_stack_rolls_back_for_every_accepted_count() {
    for drafts in [1, 2, 4] {
        for accepted in 0..=drafts {
            check_rounds(3, drafts, 4, |_| accepted);
        }
        // Varying acceptance over many rounds, through several wraps.
        check_rounds(1, drafts, 12, |r| (r * 7 + 3) % (drafts + 1));
    }
}

#[test]
fn full_acceptance_needs_no_snapshot() {
    let mut caches = stack(&[1; 7]);
    restore_all(&mut caches, 7, &[]).unwrap();
    assert!(caches.iter().all(|c| c.offset() == 7));
}
