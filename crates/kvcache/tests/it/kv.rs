//! `KvCache`: growth in 256-slot steps, byte accounting, rewinds by offset.

use crate::common;

use common::{D, H, Kind, assert_matches_fresh, forward, kv_for};
use kvcache::{Cache, KvCache, STEP};

const F32: usize = 4;

/// Appends `chunks` one after another, then checks capacity and allocations.
fn check_growth(chunks: &[usize], capacity: usize, allocations: usize) {
    let mut c = KvCache::new();
    let mut history = Vec::new();
    for (i, &n) in chunks.iter().enumerate() {
        history.extend(std::iter::repeat_n(i as u32, n));
        let (k, v) = kv_for(&history, c.offset());
        c.update_and_fetch(&k, &v).unwrap();
        if i % 64 == 63 {
            // Keep the lazy graph short.
            mlx_tensor::eval(&c.state()).unwrap();
        }
    }
    assert_eq!(
        (c.capacity(), c.allocations()),
        (capacity, allocations),
        "chunks {chunks:?}"
    );
    assert_eq!(c.offset(), chunks.iter().sum::<usize>());
    assert_eq!(
        c.nbytes(),
        2 * H * capacity * D * F32,
        "nbytes counts both buffers at capacity"
    );
    assert_matches_fresh(Kind::Kv, &c, &history, "after growth");
}

#[test]
fn grows_in_256_slot_steps_not_per_token() {
    assert_eq!(STEP, 256);
    check_growth(&[1], 256, 1);
    check_growth(&[256], 256, 1);
    check_growth(&[257], 512, 1);
    check_growth(&[300, 1], 512, 1);
    check_growth(&[255, 2, 300], 768, 3);
    // 600 single-token decode steps: 3 allocations, not 600.
    check_growth(&[1; 600], 768, 3);
}

#[test]
fn a_reserve_allocates_once_for_the_positions_asked_and_keeps_the_contents() {
    // Before the first write: the first write allocates room for all 600.
    let mut c = KvCache::new();
    c.reserve(600);
    let mut history = Vec::new();
    for i in 0..600u32 {
        history.push(i % 7);
        let (k, v) = kv_for(&history, c.offset());
        c.update_and_fetch(&k, &v).unwrap();
        if i % 64 == 63 {
            mlx_tensor::eval(&c.state()).unwrap();
        }
    }
    assert_eq!((c.capacity(), c.allocations()), (768, 1));
    assert_matches_fresh(Kind::Kv, &c, &history, "reserved before the first write");
    // After writes: the next write grows once to the reserve, keeping what is there.
    let mut c = KvCache::new();
    let mut history = vec![3; 100];
    forward(Kind::Kv, &mut c, &history);
    c.reserve(1000);
    history.push(4);
    forward(Kind::Kv, &mut c, &history);
    assert_eq!((c.capacity(), c.allocations()), (1024, 2));
    assert_matches_fresh(Kind::Kv, &c, &history, "grown to a later reserve");
    // A smaller reserve never shrinks the buffers.
    c.reserve(10);
    history.push(5);
    forward(Kind::Kv, &mut c, &history);
    assert_eq!((c.capacity(), c.allocations()), (1024, 2));
}

#[test]
fn rewind_keeps_capacity_and_later_writes_overwrite_dead_slots() {
    let mut c = KvCache::new();
    let mut history = vec![1; 300];
    forward(Kind::Kv, &mut c, &history);
    assert!(c.restore(None, 10).unwrap());
    history.truncate(10);
    assert_eq!(c.capacity(), 512, "a rewind frees nothing");
    history.extend([2; 5]);
    forward(Kind::Kv, &mut c, &history);
    assert_eq!(
        c.allocations(),
        1,
        "rewriting below capacity allocates nothing"
    );
    assert_matches_fresh(Kind::Kv, &c, &history, "after rewind and rewrite");
}

#[test]
fn snapshot_bytes() {
    let mut c = KvCache::new();
    forward(Kind::Kv, &mut c, &[1; 10]);
    let before = c.nbytes();
    c.schedule_snapshots(&[10, 11, 12]);
    forward(Kind::Kv, &mut c, &[1; 13]);
    let marks = c.take_scheduled();
    assert_eq!(marks.len(), 3);
    assert!(
        marks.iter().all(|(_, s)| s.nbytes() == 0),
        "zero-copy marks"
    );
    assert_eq!(c.nbytes(), before, "scheduling captured nothing");
    // An owned snapshot holds the live keys and values.
    let owned = c.snapshot().unwrap();
    assert_eq!(owned.nbytes(), 2 * H * 13 * D * F32);
}

#[test]
fn owned_snapshot_restores_into_another_cache() {
    let history = [1, 1, 2, 3, 3, 3];
    let mut a = KvCache::new();
    forward(Kind::Kv, &mut a, &history);
    let snap = a.snapshot().unwrap();
    // A cache with other contents, as a prefix cache would hand over.
    let mut b = KvCache::new();
    forward(Kind::Kv, &mut b, &[9; 20]);
    assert!(b.restore(Some(&snap), 4).unwrap());
    assert_matches_fresh(
        Kind::Kv,
        &b,
        &history[..4],
        "owned snapshot in another cache",
    );
    let mut empty = KvCache::new();
    assert!(empty.restore(Some(&snap), 6).unwrap());
    assert_matches_fresh(
        Kind::Kv,
        &empty,
        &history,
        "owned snapshot in an empty cache",
    );
}
