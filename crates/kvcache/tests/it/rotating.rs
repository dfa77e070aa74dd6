//! `RotatingKvCache`: the returned layouts and masks, attention parity with
//! a full cache, rewinds before the wrap, snapshots across it, capacity.

use crate::common;

use common::{Kind, assert_matches_fresh, contents, forward, rotating_positions};
use kvcache::{AttentionMask, Cache, KvCache, RotatingKvCache, rollback};
use mlx_tensor::{Array, fast};

/// A cache of `(max_size, keep)` after `o` single-token writes.
fn decoded(max_size: usize, keep: usize, o: usize) -> (RotatingKvCache, Vec<u32>) {
    let kind = Kind::Rotating { max_size, keep };
    let mut c = RotatingKvCache::new(max_size, keep).unwrap();
    let mut history = Vec::new();
    for p in 0..o {
        history.push(p as u32 % 3);
        forward(kind, &mut c, &history);
    }
    (c, history)
}

#[test]
fn fetch_positions_follow_the_documented_layouts() {
    let check = |max_size, keep, o, l| {
        let (c, _) = decoded(max_size, keep, o);
        assert_eq!(
            c.fetch_positions(l),
            rotating_positions(max_size, keep, o, l),
            "max_size {max_size}, keep {keep}, offset {o}, L {l}"
        );
    };
    check(4, 0, 0, 3); // fits: linear
    check(4, 0, 3, 1); // fills the window exactly
    check(4, 0, 4, 1); // first wrap, single token: the ring
    check(4, 0, 9, 1);
    check(5, 2, 11, 1); // ring with sinks
    check(4, 0, 2, 3); // crosses the wrap in one update: gathered
    check(4, 0, 9, 3);
    check(6, 2, 13, 4);
    check(3, 0, 0, 8); // a prefill longer than the window
}

/// Values that make attention weights differ from key to key.
fn smooth(h: usize, l: usize, d: usize, phase: f32) -> Array {
    let data: Vec<f32> = (0..h * l * d)
        .map(|i| ((i as f32) * 0.37 + phase).sin())
        .collect();
    Array::from_slice(&data, &[1, h as i32, l as i32, d as i32]).unwrap()
}

/// Attention of `l` new queries at offset `o` through a rotating cache
/// equals attention over the full history with the window rule written out.
#[test]
fn attention_through_the_window_matches_full_attention() {
    let (h, d) = (2usize, 4usize);
    let check = |max_size: usize, keep: usize, o: usize, l: usize| {
        let mut rot = RotatingKvCache::new(max_size, keep).unwrap();
        let mut full = KvCache::new();
        let keys = smooth(h, o + l, d, 0.1);
        let values = smooth(h, o + l, d, 1.7);
        // Decode the first o positions one by one so that the ring wraps.
        for p in 0..o {
            let (k, v) = (
                keys.slice_axis(2, p as i32, p as i32 + 1).unwrap(),
                values.slice_axis(2, p as i32, p as i32 + 1).unwrap(),
            );
            rot.update_and_fetch(&k, &v).unwrap();
        }
        let e = (o + l) as i32;
        let (k, v) = (
            keys.slice_axis(2, o as i32, e).unwrap(),
            values.slice_axis(2, o as i32, e).unwrap(),
        );
        let q = smooth(h, l, d, 2.9);
        let mask = rot.make_mask(l).unwrap();
        let (rk, rv) = rot.update_and_fetch(&k, &v).unwrap();
        let got = fast::scaled_dot_product_attention(&q, &rk, &rv, 0.5, mask.as_fast()).unwrap();
        let (fk, fv) = full.update_and_fetch(&keys, &values).unwrap();
        let w = max_size - keep;
        let rule: Vec<bool> = (o..o + l)
            .flat_map(|q| (0..o + l).map(move |k| k <= q && (k < keep || q - k < w)))
            .collect();
        let rule = Array::from_slice(&rule, &[l as i32, e]).unwrap();
        let want = fast::scaled_dot_product_attention(&q, &fk, &fv, 0.5, fast::Mask::Array(&rule))
            .unwrap();
        let (got, want) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
        // Tolerance: the same sums in another key order, f32.
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 1e-5,
                "max_size {max_size}, keep {keep}, offset {o}, L {l}: element {i}: {a} vs {b}"
            );
        }
        assert_eq!(got.len(), want.len());
        mask
    };
    assert!(matches!(check(8, 0, 0, 5), AttentionMask::Causal));
    assert!(matches!(check(8, 0, 5, 1), AttentionMask::None));
    assert!(matches!(check(4, 0, 9, 1), AttentionMask::None));
    assert!(matches!(check(6, 2, 13, 1), AttentionMask::None));
    assert!(matches!(check(4, 0, 2, 4), AttentionMask::Array(_)));
    assert!(matches!(check(4, 0, 9, 3), AttentionMask::Array(_)));
    assert!(matches!(check(6, 2, 13, 5), AttentionMask::Array(_)));
    assert!(matches!(check(5, 1, 0, 12), AttentionMask::Array(_)));
}

#[test]
fn rewinds_live_until_the_wrap() {
    let kind = Kind::Rotating {
        max_size: 4,
        keep: 1,
    };
    let (mut c, mut history) = decoded(4, 1, 4);
    assert!(!c.wrapped());
    assert!(
        c.restore(None, 1).unwrap(),
        "full but not wrapped: live rewind"
    );
    history.truncate(1);
    history.extend([7, 7, 7, 7, 7]);
    forward(kind, &mut c, &history);
    assert!(c.wrapped());
    assert_matches_fresh(kind, &c, &history, "rewound then wrapped");
    let before = contents(&c);
    assert!(!c.restore(None, 5).unwrap(), "wrapped: no live rewind");
    assert_eq!(contents(&c), before);
}

/// Verify rounds across the wrap: with a scheduled snapshot every accepted
/// count restores exactly; without one the rewind is refused.
#[test]
fn rolls_back_across_the_wrap_from_scheduled_snapshots() {
    let (max_size, keep) = (4, 0);
    let kind = Kind::Rotating { max_size, keep };
    for o in [2, 3, 4, 7] {
        for accepted in 0..=3 {
            let (c, mut history) = decoded(max_size, keep, o);
            let mut stack: Vec<Box<dyn Cache>> = vec![Box::new(c)];
            stack[0].schedule_snapshots(&[o + 1, o + 2, o + 3]);
            history.extend([9; 4]);
            forward(kind, stack[0].as_mut(), &history);
            rollback(&mut stack, o + 1 + accepted).unwrap();
            history.truncate(o + 1 + accepted);
            assert_matches_fresh(
                kind,
                stack[0].as_ref(),
                &history,
                &format!("offset {o}, accepted {accepted}"),
            );
        }
    }
}

#[test]
fn window_capacity_grows_in_steps_up_to_max_size() {
    let mut c = RotatingKvCache::new(300, 4).unwrap();
    let (k, v) = common::kv_for(&[1; 10], 0);
    c.update_and_fetch(&k, &v).unwrap();
    assert_eq!((c.capacity(), c.allocations()), (256, 1));
    let (k, v) = common::kv_for(&[1; 260], 10);
    c.update_and_fetch(&k, &v).unwrap();
    assert_eq!((c.capacity(), c.allocations()), (300, 2));
    let (k, v) = common::kv_for(&[1; 1000], 260);
    c.update_and_fetch(&k, &v).unwrap();
    assert_eq!(
        (c.capacity(), c.allocations()),
        (300, 2),
        "the ring never exceeds max_size"
    );
    assert_eq!(c.nbytes(), 2 * common::H * 300 * common::D * 4);
    assert_eq!(c.max_size(), Some(300));
}

#[test]
fn captured_window_snapshots_count_in_nbytes_until_taken() {
    let (mut c, _) = decoded(4, 0, 6);
    let ring = c.nbytes();
    c.schedule_snapshots(&[6]);
    assert_eq!(c.nbytes(), 2 * ring, "the capture holds the previous ring");
    let pins = mlx_tensor::live_pins();
    let taken = c.take_scheduled();
    assert_eq!(c.nbytes(), ring);
    drop(taken);
    assert_eq!(
        mlx_tensor::live_pins(),
        pins - 2,
        "dropping a snapshot unpins its arrays"
    );
}
