//! Recurrent-state rewind on the Qwen3.5 hybrid fixture: a verify forward of
//! `current + k` drafts captures the state after every position in the same
//! pass, and restoring to `offset + 1 + a` (for every accepted count `a` in
//! `0..=k`) gives
//!
//! - bit for bit the caches (conv tails, recurrent states, KV) and next-token
//!   logits of a fresh verify of the same width whose drafts after the
//!   accepted prefix are different tokens: nothing of the rejected drafts
//!   survives the rewind;
//! - within 1e-5 the caches of a fresh run of the accepted prefix alone, and
//!   the same next 8 greedy tokens. (Not bit for bit: BLAS rounds a row of a
//!   6-row matmul differently from a 1-row one, so a run of another width is
//!   a different computation, for the KV layers as much as the recurrent ones.)

use crate::writer;

use kvcache::{Cache, rollback, schedule_all};
use mlx_tensor::Array;
use runner::Model;

fn forward(m: &dyn Model, caches: &mut [Box<dyn Cache>], ids: &[u32]) -> Array {
    let t = Array::from_slice(ids, &[ids.len() as i32]).unwrap();
    let h = m.forward(&t, caches).unwrap();
    let l = h.dim(0);
    m.unembed(&h.slice_axis(0, l - 1, l).unwrap()).unwrap()
}

fn contents(caches: &[Box<dyn Cache>]) -> Vec<Vec<f32>> {
    caches
        .iter()
        .flat_map(|c| c.live().unwrap())
        .map(|a| a.to_vec::<f32>().unwrap())
        .collect()
}

/// Largest accepted difference from a fresh run of another width.
const WIDTH_TOL: f32 = 1e-5;

/// Caches after `prompt` and a verify of `run` with captures at every
/// position, rewound to `keep` tokens of `run`.
fn verified(m: &dyn Model, prompt: &[u32], run: &[u32], keep: usize) -> Vec<Box<dyn Cache>> {
    let pos = prompt.len();
    let mut caches = m.new_caches();
    forward(m, &mut caches, prompt);
    let offsets: Vec<usize> = (pos + 1..pos + run.len()).collect();
    schedule_all(&mut caches, &offsets);
    forward(m, &mut caches, run);
    rollback(&mut caches, pos + keep).unwrap();
    caches
}

fn greedy(m: &dyn Model, caches: &mut [Box<dyn Cache>], first: u32, n: usize) -> Vec<u32> {
    let mut t = first;
    (0..n)
        .map(|_| {
            let v = forward(m, caches, &[t]).to_vec::<f32>().unwrap();
            t = (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b }) as u32;
            t
        })
        .collect()
}

/// Verify `[current, drafts]` after `prompt` and rewind to `accepted` drafts.
fn check(m: &dyn Model, prompt: &[u32], current: u32, drafts: &[u32], accepted: usize) {
    let k = drafts.len();
    let run: Vec<u32> = std::iter::once(current)
        .chain(drafts.iter().copied())
        .collect();
    let keep = accepted + 1;
    let mut rewound = verified(m, prompt, &run, keep);

    // The same width, other tokens after the accepted prefix.
    let mut other = run.clone();
    for t in &mut other[keep..] {
        *t = (*t + 1) % 8192;
    }
    let mut twin = verified(m, prompt, &other, keep);
    let (a, b) = (contents(&rewound), contents(&twin));
    assert_eq!(a.len(), b.len());
    for (j, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            x == y,
            "state {j} differs after rewinding to {accepted} of {k} drafts"
        );
    }

    let mut fresh = m.new_caches();
    forward(m, &mut fresh, prompt);
    forward(m, &mut fresh, &run[..keep]);
    for (i, (a, b)) in rewound.iter().zip(&fresh).enumerate() {
        assert_eq!(
            a.offset(),
            b.offset(),
            "layer {i} offset, accepted {accepted}"
        );
    }
    let worst = a
        .iter()
        .zip(contents(&fresh))
        .flat_map(|(x, y)| {
            x.iter()
                .zip(y)
                .map(|(p, q)| (p - q).abs())
                .collect::<Vec<_>>()
        })
        .fold(0.0f32, f32::max);
    assert!(
        worst <= WIDTH_TOL,
        "accepted {accepted} of {k}: {worst} from a fresh run"
    );

    // The next step gives the same logits bit for bit as the twin, and the
    // same greedy tokens as the fresh run.
    let next = 42;
    let la = forward(m, &mut rewound, &[next]).to_vec::<f32>().unwrap();
    let lb = forward(m, &mut twin, &[next]).to_vec::<f32>().unwrap();
    assert!(
        la == lb,
        "next-token logits differ after rewinding to {accepted} of {k} drafts"
    );
    let after = la
        .iter()
        .enumerate()
        .fold(0, |b, (i, x)| if *x > la[b] { i } else { b }) as u32;
    forward(m, &mut fresh, &[next]);
    assert_eq!(
        greedy(m, &mut rewound, after, 8),
        greedy(m, &mut fresh, after, 8),
        "greedy tokens after rewinding to {accepted} of {k} drafts"
    );
}

#[test]
fn rewind_to_every_accepted_count_equals_a_fresh_run() {
    let loaded = writer::load();
    let m = loaded.model.as_ref();
    let prompt = loaded
        .tokenizer
        .encode("Once upon a time there was", false)
        .unwrap();
    let drafts = [17, 2048, 5, 999, 8000];
    for k in [1, drafts.len()] {
        for accepted in 0..=k {
            check(m, &prompt, 311, &drafts[..k], accepted);
        }
    }
}

#[test]
fn a_recurrent_cache_refuses_a_rewind_it_has_no_capture_for() {
    let loaded = writer::load();
    let m = loaded.model.as_ref();
    let mut caches = m.new_caches();
    forward(m, &mut caches, &[5, 6, 7, 8]);
    // Layer 0 is Gated DeltaNet: without a scheduled capture it cannot go back.
    assert!(caches[0].as_recurrent().is_some());
    assert!(!caches[0].restore(None, 2).unwrap());
    assert_eq!(caches[0].offset(), 4);
    // The full-attention layer (3) rewinds by its offset.
    assert!(caches[3].restore(None, 2).unwrap());
}
