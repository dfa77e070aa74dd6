//! Cache offsets, RoPE positions and masks: incremental forwards equal one full forward.

use crate::common;

use std::sync::atomic::AtomicBool;

use mlx_tensor::Array;
use runner::testing::{Arch, Fixture};
use runner::{Model, Session};

/// f32 logits of a 2-layer model with logits of order 10: the paths differ only in
/// summation order inside matmul and attention, so they agree to ~1e-5; 1e-3 leaves room.
const TOL: f32 = 1e-3;

fn tokens(n: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 37 + 11) % 250) as u32).collect()
}

fn logits(m: &dyn Model, ids: &[u32], caches: &mut [Box<dyn kvcache::Cache>]) -> Vec<f32> {
    let a = Array::from_slice(ids, &[ids.len() as i32]).unwrap();
    let h = m.forward(&a, caches).unwrap();
    m.unembed(&h).unwrap().to_vec::<f32>().unwrap()
}

/// Full forward over `n` tokens vs prefill of `split` tokens then one token at a time.
fn check_decode(arch: Arch, n: usize, split: usize) {
    let dir = common::write(&Fixture::new(arch), 5);
    let m = common::load(dir.path());
    let model = m.model.as_ref();
    let ids = tokens(n);
    let full = logits(model, &ids, &mut model.new_caches());
    let v = model.vocab_size();
    let mut caches = model.new_caches();
    let mut inc = logits(model, &ids[..split], &mut caches);
    for &t in &ids[split..] {
        inc.extend(logits(model, &[t], &mut caches));
    }
    assert_eq!(inc.len(), n * v);
    let d = common::max_abs_diff(&full, &inc);
    assert!(
        d < TOL,
        "{arch:?} n={n} split={split}: max |diff| {d} >= {TOL}"
    );
    assert_eq!(caches[0].offset(), n);
}

#[test]
fn prefill_then_decode_equals_full_forward() {
    for arch in Arch::ALL {
        check_decode(arch, 12, 5);
        check_decode(arch, 9, 1);
    }
    // Crossing the cache's 256-slot growth step.
    check_decode(Arch::Qwen3, 262, 250);
}

/// One-shot prefill vs chunks of `chunk` (each chunk at offset > 0 needs the end-aligned mask).
fn check_chunks(arch: Arch, n: usize, chunk: usize) {
    let dir = common::write(&Fixture::new(arch), 9);
    let m = common::load(dir.path());
    let model = m.model.as_ref();
    let ids = tokens(n);
    let full = logits(model, &ids, &mut model.new_caches());
    let mut caches = model.new_caches();
    let mut parts = Vec::new();
    for c in ids.chunks(chunk) {
        parts.extend(logits(model, c, &mut caches));
    }
    let d = common::max_abs_diff(&full, &parts);
    assert!(d < TOL, "{arch:?} n={n} chunk={chunk}: max |diff| {d}");
}

#[test]
fn chunked_prefill_equals_one_shot() {
    check_chunks(Arch::Llama, 40, 7);
    check_chunks(Arch::Qwen3, 40, 16);
    check_chunks(Arch::Llama3, 33, 32);
}

#[test]
fn session_prefill_chunks_fill_the_cache_like_one_forward() {
    let (_dir, m) = common::fixture(Arch::Qwen2);
    let ids = tokens(30);
    let stop = AtomicBool::new(false);
    let mut a = Session::new(m.model.as_ref());
    let mut b = Session::new(m.model.as_ref());
    let ha = a.prefill(&ids, 2048, &stop).unwrap().unwrap();
    let hb = b.prefill(&ids, 4, &stop).unwrap().unwrap();
    assert_eq!(a.offset(), 30);
    assert_eq!(b.offset(), 30);
    // The last chunk's last row equals the one-shot last row.
    let last = |h: &Array| {
        let n = h.dim(0);
        h.slice_axis(0, n - 1, n).unwrap().to_vec::<f32>().unwrap()
    };
    let d = common::max_abs_diff(&last(&ha), &last(&hb));
    assert!(d < TOL, "hidden max |diff| {d}");
    for (ca, cb) in a.caches().iter().zip(b.caches()) {
        for (x, y) in ca.live().unwrap().iter().zip(cb.live().unwrap()) {
            let d = common::max_abs_diff(&x.to_vec::<f32>().unwrap(), &y.to_vec::<f32>().unwrap());
            assert!(d < TOL, "cache max |diff| {d}");
        }
    }
}

#[test]
fn llama3_periods_with_factor_one_equal_plain_rope() {
    // With factor 1 every branch of the Llama 3 formula leaves the period unchanged, so
    // rope_with_freqs must equal plain rope: this pins down that MLX wants periods.
    let periods = runner::testing::llama3_periods(16, 10000.0, 1.0, 1.0, 4.0, 64.0);
    let f = Array::from_slice(&periods, &[8]).unwrap();
    let key = mlx_tensor::random::key(1).unwrap();
    let x = mlx_tensor::random::normal(&[1, 2, 5, 16], mlx_tensor::Dtype::Float32, &key).unwrap();
    let a = mlx_tensor::fast::rope(&x, 16, false, 10000.0, 1.0, 3).unwrap();
    let b = mlx_tensor::fast::rope_with_freqs(&x, 16, false, 1.0, 3, &f).unwrap();
    let d = common::max_abs_diff(&a.to_vec::<f32>().unwrap(), &b.to_vec::<f32>().unwrap());
    assert!(d < 1e-4, "max |diff| {d}");
    // Control: a real factor changes the low frequencies.
    let scaled = runner::testing::llama3_periods(16, 10000.0, 8.0, 1.0, 4.0, 64.0);
    assert_ne!(scaled, periods);
}
