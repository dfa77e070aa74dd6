//! MLX allocator figures: no leaks across 100,000 arrays, peak, cache limit and clear, pins and the lazy graph.
//!
//! The figures are process-wide, so the tests of this binary take one lock.

use crate::common;
use std::sync::Mutex;

use mlx_tensor::{Array, Dtype, live_pins, memory, ops};

static SERIAL: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const MIB: usize = 1 << 20;

/// A 4 MiB f32 array made by MLX (so its buffer comes from MLX's allocator).
fn big() -> Array {
    let a = ops::full(&[MIB as i32], 1.0, Dtype::Float32).unwrap();
    a.eval().unwrap();
    a
}

#[test]
fn hundred_thousand_arrays_leave_no_trace() {
    // MLX's memory figures are per process.
    common::own_process(
        "memory::hundred_thousand_arrays_leave_no_trace",
        hundred_thousand_arrays_leave_no_trace_alone,
    );
}

fn hundred_thousand_arrays_leave_no_trace_alone() {
    let _g = lock();
    let one = ops::ones(&[4], Dtype::Float32).unwrap();
    one.eval().unwrap();
    let start = memory::active();
    let mut made = 0;
    for batch in 0..100 {
        let mut arrays = Vec::with_capacity(1000);
        for i in 0..1000 {
            let x = Array::from_slice(&[(batch * 1000 + i) as f32; 4], &[4]).unwrap();
            arrays.push(x.add(&one).unwrap());
        }
        mlx_tensor::eval(&arrays).unwrap();
        assert_eq!(
            arrays[999].to_vec::<f32>().unwrap()[0],
            (batch * 1000 + 1000) as f32
        );
        made += arrays.len();
    }
    assert_eq!(made, 100_000);
    assert_eq!(
        memory::active(),
        start,
        "active memory after dropping {made} arrays"
    );
}

#[test]
fn peak_cache_and_limits() {
    // MLX's memory figures are per process.
    common::own_process("memory::peak_cache_and_limits", peak_cache_and_limits_alone);
}

fn peak_cache_and_limits_alone() {
    let _g = lock();
    let before = memory::active();
    memory::reset_peak();
    assert_eq!(memory::peak(), 0, "reset_peak zeroes the peak");
    let a = big();
    assert!(
        memory::active() >= before + 4 * MIB,
        "active {} before {before}",
        memory::active()
    );
    drop(a);
    assert_eq!(memory::active(), before);
    assert!(
        memory::peak() >= before + 4 * MIB,
        "peak {} remembers the 4 MiB array",
        memory::peak()
    );

    // A freed buffer goes to the cache; clear_cache empties it.
    let old_limit = memory::set_cache_limit(64 * MIB);
    drop(big());
    assert!(memory::cache() >= 4 * MIB, "cache {}", memory::cache());
    memory::clear_cache();
    assert_eq!(memory::cache(), 0);
    // A zero limit keeps nothing cached.
    memory::set_cache_limit(0);
    drop(big());
    assert_eq!(memory::cache(), 0);
    assert_eq!(
        memory::set_cache_limit(old_limit),
        0,
        "set_cache_limit returns the previous limit"
    );
}

/// An unevaluated node keeps its inputs alive even when every handle on them
/// is gone; evaluating it releases them. This is why a pin is just a handle.
#[test]
fn lazy_graph_keeps_inputs_until_evaluated() {
    // MLX's memory figures are per process.
    common::own_process(
        "memory::lazy_graph_keeps_inputs_until_evaluated",
        lazy_graph_keeps_inputs_until_evaluated_alone,
    );
}

fn lazy_graph_keeps_inputs_until_evaluated_alone() {
    let _g = lock();
    memory::clear_cache();
    let before = memory::active();
    let a = big();
    let b = a.multiply(&a).unwrap().sum(&[0], false).unwrap();
    drop(a);
    assert!(
        memory::active() >= before + 4 * MIB,
        "the pending sum holds its input"
    );
    b.eval().unwrap();
    assert_eq!(b.item::<f32>().unwrap(), MIB as f32);
    assert!(
        memory::active() < before + MIB,
        "evaluation released the input: {}",
        memory::active()
    );
    drop(b);
    assert_eq!(memory::active(), before);
}

#[test]
fn pins_hold_arrays_and_release_on_drop() {
    // MLX's memory figures are per process.
    common::own_process(
        "memory::pins_hold_arrays_and_release_on_drop",
        pins_hold_arrays_and_release_on_drop_alone,
    );
}

fn pins_hold_arrays_and_release_on_drop_alone() {
    let _g = lock();
    let before = memory::active();
    assert_eq!(live_pins(), 0);
    let pin = big().pin();
    assert_eq!(live_pins(), 1);
    assert!(
        memory::active() >= before + 4 * MIB,
        "the pin keeps the buffer"
    );
    let mut set = mlx_tensor::PinSet::new();
    for _ in 0..3 {
        set.push(pin.array());
    }
    assert_eq!((set.len(), live_pins()), (3, 4));
    assert_eq!(set.arrays().count(), 3);
    set.clear();
    assert!(set.is_empty());
    assert_eq!(live_pins(), 1);
    set.push(pin.array());
    drop(pin);
    assert_eq!(live_pins(), 1, "the set still holds one");
    assert!(
        memory::active() >= before + 4 * MIB,
        "the set keeps the buffer"
    );
    drop(set);
    assert_eq!(live_pins(), 0);
    assert_eq!(memory::active(), before);
}
