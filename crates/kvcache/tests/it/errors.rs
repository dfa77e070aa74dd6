//! Impossible restores and bad inputs: each gives its typed error (and
//! `restore` its `Ok(false)` for refusals), leaving the cache unchanged.

use crate::common;

use common::{Kind, contents, forward, kv_for};
use kvcache::{Cache, Error, KvCache, RecurrentCache, RotatingKvCache, restore_all};
use mlx_tensor::{Array, Dtype};

/// A cache of `kind` after a forward of `n` positions (version 1).
fn filled(kind: Kind, n: usize) -> Box<dyn Cache> {
    let mut c = kind.make();
    forward(kind, c.as_mut(), &vec![1; n]);
    c
}

/// Runs a restore that must fail; checks the error, that `restore` agrees
/// (`Ok(false)` for refusals, the same `Err` otherwise) and that the cache
/// did not change.
fn check_restore(
    cache: &mut dyn Cache,
    snapshot: Option<&kvcache::Snapshot>,
    target: usize,
    expect: impl Fn(&Error) -> bool,
) {
    let (offset, before) = (cache.offset(), contents(cache));
    let err = cache.try_restore(snapshot, target).unwrap_err();
    assert!(expect(&err), "unexpected error {err:?}");
    match cache.restore(snapshot, target) {
        Ok(false) => assert!(err.is_refusal(), "{err:?} reported as a refusal"),
        Err(_) => assert!(!err.is_refusal(), "refusal {err:?} reported as an Err"),
        Ok(true) => panic!("restore to {target} succeeded after try_restore failed"),
    }
    assert_eq!(cache.offset(), offset, "offset changed by a failed restore");
    assert_eq!(
        contents(cache),
        before,
        "contents changed by a failed restore"
    );
}

#[test]
fn restore_beyond_offset_is_an_error_for_every_kind() {
    for kind in [
        Kind::Kv,
        Kind::Rotating {
            max_size: 4,
            keep: 1,
        },
        Kind::Recurrent,
    ] {
        let mut c = filled(kind, 5);
        check_restore(c.as_mut(), None, 6, |e| {
            matches!(
                e,
                Error::RestoreBeyondOffset {
                    target: 6,
                    offset: 5
                }
            )
        });
    }
}

#[test]
fn wrapped_rotating_cache_needs_a_snapshot() {
    let kind = Kind::Rotating {
        max_size: 4,
        keep: 0,
    };
    let mut c = filled(kind, 6);
    check_restore(c.as_mut(), None, 5, |e| {
        matches!(
            e,
            Error::WrappedWithoutSnapshot {
                target: 5,
                offset: 6,
                max_size: 4
            }
        )
    });
    // Staying put needs nothing, wrapped or not.
    assert!(c.restore(None, 6).unwrap());
}

#[test]
fn wrapped_window_snapshot_restores_only_its_own_offset() {
    let kind = Kind::Rotating {
        max_size: 4,
        keep: 0,
    };
    let mut c = filled(kind, 6);
    let snap = c.snapshot().unwrap();
    check_restore(c.as_mut(), Some(&snap), 5, |e| {
        matches!(
            e,
            Error::SnapshotMismatch {
                target: 5,
                snapshot_offset: 6
            }
        )
    });
    check_restore(c.as_mut(), Some(&snap), 7, |e| {
        matches!(
            e,
            Error::SnapshotMismatch {
                target: 7,
                snapshot_offset: 6
            }
        )
    });
}

#[test]
fn recurrent_cache_cannot_rewind_by_offset() {
    let mut c = filled(Kind::Recurrent, 5);
    check_restore(c.as_mut(), None, 4, |e| {
        matches!(
            e,
            Error::CannotRewind {
                target: 4,
                offset: 5
            }
        )
    });
    let snap = c.snapshot().unwrap();
    check_restore(c.as_mut(), Some(&snap), 4, |e| {
        matches!(
            e,
            Error::SnapshotMismatch {
                target: 4,
                snapshot_offset: 5
            }
        )
    });
}

#[test]
fn zero_copy_kv_marks_go_stale_after_a_rewind() {
    let mut c = filled(Kind::Kv, 5);
    c.schedule_snapshots(&[5]);
    let (_, mark) = c.take_scheduled().pop().unwrap();
    assert_eq!(mark.nbytes(), 0, "a scheduled KV capture copies nothing");
    assert!(c.restore(None, 3).unwrap());
    // Positions 3..5 may now be rewritten: the mark must not restore them.
    forward(Kind::Kv, c.as_mut(), &[1, 1, 1, 2, 2]);
    check_restore(c.as_mut(), Some(&mark), 5, |e| {
        matches!(e, Error::SnapshotStale { snapshot_offset: 5 })
    });
    // Nor may a mark of another cache.
    let mut other = filled(Kind::Kv, 5);
    check_restore(other.as_mut(), Some(&mark), 4, |e| {
        matches!(e, Error::SnapshotStale { snapshot_offset: 5 })
    });
}

#[test]
fn snapshots_of_another_kind_are_rejected() {
    let kv = filled(Kind::Kv, 3).snapshot().unwrap();
    let rot = filled(
        Kind::Rotating {
            max_size: 4,
            keep: 0,
        },
        3,
    )
    .snapshot()
    .unwrap();
    let rec = filled(Kind::Recurrent, 3).snapshot().unwrap();
    let kind_err = |e: &Error| matches!(e, Error::SnapshotKind { .. });
    check_restore(filled(Kind::Kv, 3).as_mut(), Some(&rot), 3, kind_err);
    check_restore(filled(Kind::Recurrent, 3).as_mut(), Some(&kv), 3, kind_err);
    check_restore(
        filled(
            Kind::Rotating {
                max_size: 4,
                keep: 0,
            },
            3,
        )
        .as_mut(),
        Some(&rec),
        3,
        kind_err,
    );
    // Another window size is another kind too.
    check_restore(
        filled(
            Kind::Rotating {
                max_size: 5,
                keep: 0,
            },
            3,
        )
        .as_mut(),
        Some(&rot),
        3,
        kind_err,
    );
}

#[test]
fn mismatched_keys_and_values_are_rejected() {
    let (k, v) = kv_for(&[1, 1], 0);
    let f16 = k.as_type(Dtype::Float16).unwrap();
    let wide = mlx_tensor::ops::zeros(&[1, 2, 2, 4], Dtype::Float32).unwrap();
    let longer = mlx_tensor::ops::zeros(&[1, 2, 3, 3], Dtype::Float32).unwrap();
    let flat = mlx_tensor::ops::zeros(&[2, 3], Dtype::Float32).unwrap();
    let caches: Vec<Box<dyn Cache>> = vec![
        Box::new(KvCache::new()),
        Box::new(RotatingKvCache::new(4, 0).unwrap()),
    ];
    for mut c in caches {
        let check = |c: &mut Box<dyn Cache>, k: &Array, v: &Array, want: fn(&Error) -> bool| {
            let err = c.update_and_fetch(k, v).unwrap_err();
            assert!(want(&err), "{}: unexpected {err:?}", c.kind());
        };
        check(&mut c, &flat, &flat, |e| {
            matches!(e, Error::ShapeMismatch { name: "keys", .. })
        });
        check(&mut c, &k, &longer, |e| {
            matches!(e, Error::ShapeMismatch { name: "values", .. })
        });
        c.update_and_fetch(&k, &v).unwrap();
        check(&mut c, &wide, &v, |e| {
            matches!(e, Error::ShapeMismatch { name: "keys", .. })
        });
        check(&mut c, &f16, &v, |e| {
            matches!(
                e,
                Error::DtypeMismatch {
                    name: "keys",
                    expected: Dtype::Float32,
                    found: Dtype::Float16
                }
            )
        });
        assert_eq!(
            c.offset(),
            2,
            "{}: a rejected update moved the offset",
            c.kind()
        );
    }
}

#[test]
fn recurrent_cache_has_no_keys_or_mask_and_keeps_state_shapes() {
    let mut c = RecurrentCache::new();
    let (k, v) = kv_for(&[1], 0);
    let not = |e: Error, op: &str| matches!(e, Error::NotApplicable { op: o, .. } if o == op);
    assert!(not(
        c.update_and_fetch(&k, &v).unwrap_err(),
        "update_and_fetch"
    ));
    assert!(not(c.make_mask(1).unwrap_err(), "make_mask"));
    let z = |s: &[i32]| mlx_tensor::ops::zeros(s, Dtype::Float32).unwrap();
    c.update(z(&[1, 3, 2]), z(&[1, 2]), 1).unwrap();
    let err = c.update(z(&[1, 4, 2]), z(&[1, 2]), 1).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ShapeMismatch {
                name: "conv state",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(Cache::offset(&c), 1);
}

#[test]
fn bad_window_is_rejected() {
    for (max_size, keep) in [(4, 4), (4, 5), (0, 0)] {
        let err = RotatingKvCache::new(max_size, keep).unwrap_err();
        assert!(
            matches!(err, Error::BadWindow { max_size: m, keep: k } if m == max_size && k == keep),
            "{err:?}"
        );
    }
}

#[test]
fn restore_all_names_the_layer_without_a_snapshot() {
    let rot = Kind::Rotating {
        max_size: 4,
        keep: 0,
    };
    let mut stack = vec![
        filled(Kind::Kv, 6),
        filled(rot, 6),
        filled(Kind::Recurrent, 6),
    ];
    let err = restore_all(&mut stack, 5, &[]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::SnapshotMissing {
                offset: 5,
                layer: 1,
                cache_offset: 6
            }
        ),
        "{err:?}"
    );
    let err = restore_all(&mut stack, 6, &[Vec::new()]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::LayerCount {
                caches: 3,
                snapshots: 1
            }
        ),
        "{err:?}"
    );
}
