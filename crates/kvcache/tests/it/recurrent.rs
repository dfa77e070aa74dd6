//! `RecurrentCache`: restores from per-position snapshots captured during
//! the forward, splits, byte accounting and pin release.

use crate::common;

use common::{Kind, assert_matches_fresh, forward};
use kvcache::{Cache, RecurrentCache, rollback};
use mlx_tensor::{Dtype, ops};

const KIND: Kind = Kind::Recurrent;

/// A recurrent cache after a forward of `history`.
fn after(history: &[u32]) -> RecurrentCache {
    let mut c = RecurrentCache::new();
    if !history.is_empty() {
        forward(KIND, &mut c, history);
    }
    c
}

#[test]
fn restores_every_interior_state_of_a_verify() {
    for prompt in [0, 1, 5] {
        for drafts in [1, 2, 4] {
            for accepted in 0..=drafts {
                let mut history = vec![1; prompt];
                let mut stack: Vec<Box<dyn Cache>> = vec![Box::new(after(&history))];
                let offsets: Vec<usize> = (prompt + 1..=prompt + drafts).collect();
                stack[0].schedule_snapshots(&offsets);
                history.extend(std::iter::repeat_n(2, drafts + 1));
                forward(KIND, stack[0].as_mut(), &history);
                rollback(&mut stack, prompt + 1 + accepted).unwrap();
                history.truncate(prompt + 1 + accepted);
                let what = format!("prompt {prompt}, drafts {drafts}, accepted {accepted}");
                assert_matches_fresh(KIND, stack[0].as_ref(), &history, &what);
            }
        }
    }
}

#[test]
fn splits_name_the_interior_offsets_of_the_next_forward() {
    let mut c = after(&[1; 3]);
    c.schedule_snapshots(&[3, 4, 5, 7]);
    let check = |c: &RecurrentCache, positions: usize, want: &[usize]| {
        assert_eq!(c.splits(positions).as_slice(), want, "splits({positions})");
    };
    check(&c, 1, &[]);
    check(&c, 2, &[1]);
    check(&c, 4, &[1, 2]); // offset 7 is the end of this forward, not a split
    check(&c, 5, &[1, 2, 4]);
    // Offset 3 (the current one) was captured at scheduling time.
    let taken = c.take_scheduled();
    assert_eq!(taken.iter().map(|(o, _)| *o).collect::<Vec<_>>(), vec![3]);
}

#[test]
fn capture_keeps_only_scheduled_offsets() {
    let mut c = after(&[1; 2]);
    c.schedule_snapshots(&[4]);
    let z = |s: &[i32]| ops::zeros(s, Dtype::Float32).unwrap();
    let (conv, h) = (z(&[1, 3, 2]), z(&[1, 2]));
    assert!(!c.capture(3, &conv, &h), "offset 3 was not scheduled");
    assert!(c.capture(4, &conv, &h));
    assert!(!c.capture(4, &conv, &h), "captured once");
    c.update(conv.clone(), h.clone(), 3).unwrap();
    let taken = c.take_scheduled();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].1.offset(), 4);
}

#[test]
fn state_and_nbytes_include_untaken_captures_and_pins_are_released() {
    let pins = mlx_tensor::live_pins();
    let mut c = after(&[1; 4]);
    let bytes = (3 * 2 + 2) * 4; // conv [1, 3, 2] + recurrent [1, 2], f32
    assert_eq!(c.nbytes(), bytes);
    assert_eq!(c.state().len(), 2);
    c.schedule_snapshots(&[5, 6]);
    forward(KIND, &mut c, &[1; 7]);
    assert_eq!(c.state().len(), 2 + 2 * 2, "two captures of two arrays");
    assert_eq!(c.nbytes(), 3 * bytes);
    assert!(mlx_tensor::live_pins() > pins);
    drop(c.take_scheduled());
    assert_eq!(c.nbytes(), bytes);
    assert_eq!(mlx_tensor::live_pins(), pins, "every capture unpinned");
}

#[test]
fn zero_state_before_the_first_update() {
    let c = RecurrentCache::new();
    assert!(c.conv().is_none() && c.recurrent().is_none());
    let conv = c.conv_or_zeros(&[1, 3, 2], Dtype::Float32).unwrap();
    assert_eq!(conv.to_vec::<f32>().unwrap(), vec![0.0; 6]);
    let h = c.recurrent_or_zeros(&[1, 2], Dtype::Float32).unwrap();
    assert_eq!(h.shape().as_slice(), &[1, 2]);
}
