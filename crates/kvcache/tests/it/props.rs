//! Property tests: after any sequence of appends, verifies with scheduled
//! snapshots, rewinds and snapshot restores, every cache's live contents
//! equal those of a cache built fresh from the positions it kept, bit for bit.

use crate::common;

use common::{Kind, assert_matches_fresh, forward};
use kvcache::{Snapshot, rollback};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// A plain forward of `n` positions.
    Append(usize),
    /// Schedule `offset+1..=offset+drafts` (and `offset` itself when
    /// `with_current`), forward `drafts + 1` positions, roll back keeping
    /// `keep` of them (0..=drafts+1).
    Verify {
        drafts: usize,
        keep: usize,
        with_current: bool,
    },
    /// `restore(None, offset - back)`.
    Rewind(usize),
    /// `snapshot()` now, kept with the history it stands for.
    Save,
    /// `restore(Some(saved), saved.offset - back)`.
    Load(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1..=6usize).prop_map(Op::Append),
        4 => (1..=4usize, 0..=5usize, any::<bool>()).prop_map(|(drafts, keep, with_current)| {
            Op::Verify { drafts, keep: keep.min(drafts + 1), with_current }
        }),
        2 => (0..=8usize).prop_map(Op::Rewind),
        1 => Just(Op::Save),
        1 => (0..=3usize).prop_map(Op::Load),
    ]
}

/// Whether a live rewind from `offset` to `target` must succeed.
fn live_rewind_ok(kind: Kind, offset: usize, target: usize) -> bool {
    match kind {
        Kind::Kv => true,
        Kind::Rotating { max_size, .. } => target == offset || offset <= max_size,
        Kind::Recurrent => target == offset,
    }
}

/// Whether restoring a `snapshot()` taken at `at` to `target ≤ at` must succeed.
fn snapshot_restore_ok(kind: Kind, at: usize, target: usize) -> bool {
    match kind {
        Kind::Kv => true,
        Kind::Rotating { max_size, .. } => target == at || at <= max_size,
        Kind::Recurrent => target == at,
    }
}

fn run(kind: Kind, ops: &[Op]) {
    let pins_before = mlx_tensor::live_pins();
    let mut cache = kind.make();
    let mut history: Vec<u32> = Vec::new();
    let mut version = 0u32;
    let mut saved: Option<(Snapshot, Vec<u32>)> = None;
    let mut extend = |history: &mut Vec<u32>, n: usize| {
        version += 1;
        history.extend(std::iter::repeat_n(version, n));
    };
    for (i, op) in ops.iter().enumerate() {
        let o = cache.offset();
        match *op {
            Op::Append(n) => {
                extend(&mut history, n);
                forward(kind, cache.as_mut(), &history);
            }
            Op::Verify {
                drafts,
                keep,
                with_current,
            } => {
                let start = if with_current { o } else { o + 1 };
                let offsets: Vec<usize> = (start..=o + drafts).collect();
                cache.schedule_snapshots(&offsets);
                extend(&mut history, drafts + 1);
                forward(kind, cache.as_mut(), &history);
                let target = o + keep;
                let mut stack = vec![cache];
                let result = rollback(&mut stack, target);
                cache = stack.pop().unwrap();
                // keep == 0 needs the snapshot at `o`, scheduled only with_current.
                let possible = keep > 0 || with_current || live_rewind_ok(kind, o + drafts + 1, o);
                assert_eq!(result.is_ok(), possible, "op {i}: {op:?} gave {result:?}");
                if result.is_ok() {
                    history.truncate(target);
                }
            }
            Op::Rewind(back) => {
                let target = o.saturating_sub(back);
                let ok = cache.restore(None, target).unwrap();
                assert_eq!(ok, live_rewind_ok(kind, o, target), "op {i}: {op:?} at {o}");
                if ok {
                    history.truncate(target);
                }
            }
            Op::Save => saved = Some((cache.snapshot().unwrap(), history.clone())),
            Op::Load(back) => {
                if let Some((snap, kept)) = &saved {
                    let target = snap.offset().saturating_sub(back);
                    let ok = cache.restore(Some(snap), target).unwrap();
                    let want = snapshot_restore_ok(kind, snap.offset(), target);
                    assert_eq!(
                        ok,
                        want,
                        "op {i}: {op:?} from snapshot at {}",
                        snap.offset()
                    );
                    if ok {
                        history = kept[..target].to_vec();
                    }
                }
            }
        }
        assert_matches_fresh(
            kind,
            cache.as_ref(),
            &history,
            &format!("after op {i} {op:?}"),
        );
    }
    drop(saved);
    drop(cache);
    assert_eq!(
        mlx_tensor::live_pins(),
        pins_before,
        "snapshots left pins behind"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn kv_cache_matches_fresh_prefix(ops in prop::collection::vec(op(), 1..16)) {
        run(Kind::Kv, &ops);
    }

    #[test]
    fn rotating_cache_matches_fresh_prefix(
        ops in prop::collection::vec(op(), 1..16),
        (max_size, keep) in prop_oneof![Just((3, 0)), Just((4, 0)), Just((5, 2)), Just((8, 1))],
    ) {
        run(Kind::Rotating { max_size, keep }, &ops);
    }

    #[test]
    fn recurrent_cache_matches_fresh_prefix(ops in prop::collection::vec(op(), 1..16)) {
        run(Kind::Recurrent, &ops);
    }
}
