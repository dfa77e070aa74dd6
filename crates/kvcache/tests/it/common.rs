//! Shared test helpers: deterministic position data, a fake recurrent layer,
//! forwards that check what the cache returns, and fresh reference caches.
#![allow(dead_code)]

use kvcache::{Cache, KvCache, RecurrentCache, RotatingKvCache};
use mlx_tensor::Array;

/// Heads and head dim of the test keys/values: `[1, H, L, D]`.
pub(crate) const H: usize = 2;
/// Head dim.
pub(crate) const D: usize = 3;
/// Conv tail length of the fake recurrent layer.
pub(crate) const TAIL: usize = 3;
/// Channels of the fake recurrent layer.
pub(crate) const C: usize = 2;

/// Element `j` of position `p` written in generation `version`: distinct
/// integers below 2^24, so f32 holds them exactly.
pub(crate) fn elem(version: u32, p: usize, j: usize) -> f32 {
    ((version as usize * 4096 + p) * 8 + j) as f32
}

/// Keys and values `[1, H, L, D]` for positions `from..from+L` whose versions
/// are `versions[from..]`.
pub(crate) fn kv_for(versions: &[u32], from: usize) -> (Array, Array) {
    let l = versions.len() - from;
    let mut k = Vec::with_capacity(H * l * D);
    for h in 0..H {
        for (i, &v) in versions[from..].iter().enumerate() {
            for d in 0..D {
                k.push(elem(v, from + i, h * D + d));
            }
        }
    }
    let vals: Vec<f32> = k.iter().map(|x| -x - 0.5).collect();
    let shape = [1, H as i32, l as i32, D as i32];
    (
        Array::from_slice(&k, &shape).unwrap(),
        Array::from_slice(&vals, &shape).unwrap(),
    )
}

/// The keys `[H, positions, D]` flattened that a cache should return for
/// these absolute positions.
pub(crate) fn expected_keys(versions: &[u32], positions: &[usize]) -> Vec<f32> {
    let mut out = Vec::new();
    for h in 0..H {
        for &p in positions {
            for d in 0..D {
                out.push(elem(versions[p], p, h * D + d));
            }
        }
    }
    out
}

/// The fake recurrent layer's state after the positions of `versions`:
/// conv = the last TAIL inputs (zero padded), h = 0.5 h + x.
pub(crate) fn recurrent_state(versions: &[u32]) -> (Vec<f32>, Vec<f32>) {
    let x = |p: usize| -> Vec<f32> { (0..C).map(|j| elem(versions[p], p, j) / 64.0).collect() };
    let mut h = vec![0.0f32; C];
    for p in 0..versions.len() {
        for (hj, xj) in h.iter_mut().zip(x(p)) {
            *hj = 0.5 * *hj + xj;
        }
    }
    let mut conv = Vec::with_capacity(TAIL * C);
    for t in 0..TAIL {
        let p = versions.len() as isize - TAIL as isize + t as isize;
        if p < 0 {
            conv.extend(std::iter::repeat_n(0.0, C));
        } else {
            conv.extend(x(p as usize));
        }
    }
    (conv, h)
}

fn state_arrays(versions: &[u32]) -> (Array, Array) {
    let (conv, h) = recurrent_state(versions);
    (
        Array::from_slice(&conv, &[1, TAIL as i32, C as i32]).unwrap(),
        Array::from_slice(&h, &[1, C as i32]).unwrap(),
    )
}

/// Which cache a test drives.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Kv,
    Rotating { max_size: usize, keep: usize },
    Recurrent,
}

impl Kind {
    pub(crate) fn make(self) -> Box<dyn Cache> {
        match self {
            Kind::Kv => Box::new(KvCache::new()),
            Kind::Rotating { max_size, keep } => {
                Box::new(RotatingKvCache::new(max_size, keep).unwrap())
            }
            Kind::Recurrent => Box::new(RecurrentCache::new()),
        }
    }
}

/// Forwards positions `cache.offset()..history.len()` through the cache the
/// way a model layer would, and checks what an attention cache returns
/// against `history`.
pub(crate) fn forward(kind: Kind, cache: &mut dyn Cache, history: &[u32]) {
    let o = cache.offset();
    let l = history.len() - o;
    assert!(l > 0, "forward of no positions");
    if let Some(rec) = cache.as_recurrent_mut() {
        // Emit exactly the interior states the cache asks for, like a
        // "captureAll" kernel would.
        for s in rec.splits(l) {
            let (conv, h) = state_arrays(&history[..o + s]);
            assert!(rec.capture(o + s, &conv, &h), "split {s} not captured");
        }
        let (conv, h) = state_arrays(history);
        rec.update(conv, h, l).unwrap();
        return;
    }
    let positions: Vec<usize> = match kind {
        Kind::Rotating { max_size, keep } => rotating_positions(max_size, keep, o, l),
        _ => (0..o + l).collect(),
    };
    let (k, v) = kv_for(history, o);
    let (rk, rv) = cache.update_and_fetch(&k, &v).unwrap();
    let want = expected_keys(history, &positions);
    assert_eq!(
        rk.to_vec::<f32>().unwrap(),
        want,
        "keys returned at offset {o}, L {l}"
    );
    let want_v: Vec<f32> = want.iter().map(|x| -x - 0.5).collect();
    assert_eq!(
        rv.to_vec::<f32>().unwrap(),
        want_v,
        "values returned at offset {o}, L {l}"
    );
}

/// The key positions that an update of `l` positions at offset `o` returns,
/// as the `RotatingKvCache` docs describe them.
pub(crate) fn rotating_positions(max: usize, keep: usize, o: usize, l: usize) -> Vec<usize> {
    let e = o + l;
    let w = max - keep;
    if e <= max {
        (0..e).collect()
    } else if l == 1 {
        // The ring in slot order: slot s holds the newest position that maps to it.
        let slot = |p: usize| if p < keep { p } else { keep + (p - keep) % w };
        (0..max)
            .map(|s| {
                (0..e)
                    .rev()
                    .find(|&p| slot(p) == s)
                    .expect("every slot written")
            })
            .collect()
    } else {
        // Sinks, the old positions the first query sees, the new ones.
        let first_seen = (o + 1).saturating_sub(w).max(keep).min(o);
        (0..o.min(keep)).chain(first_seen..o).chain(o..e).collect()
    }
}

/// A cache of `kind` built fresh from `history` in one forward.
pub(crate) fn fresh(kind: Kind, history: &[u32]) -> Box<dyn Cache> {
    let mut c = kind.make();
    if !history.is_empty() {
        forward(kind, c.as_mut(), history);
    }
    c
}

/// The live contents as host vectors; empty when every array is empty.
pub(crate) fn contents(cache: &dyn Cache) -> Vec<Vec<f32>> {
    let all: Vec<Vec<f32>> = cache
        .live()
        .unwrap()
        .iter()
        .map(|a| a.to_vec::<f32>().unwrap())
        .collect();
    if all.iter().all(Vec::is_empty) {
        Vec::new()
    } else {
        all
    }
}

/// Asserts that `cache` holds exactly what a fresh cache of `history` holds.
pub(crate) fn assert_matches_fresh(kind: Kind, cache: &dyn Cache, history: &[u32], what: &str) {
    assert_eq!(cache.offset(), history.len(), "{what}: offset");
    let reference = fresh(kind, history);
    assert_eq!(
        contents(cache),
        contents(reference.as_ref()),
        "{what}: live contents differ from a fresh cache of {} positions",
        history.len()
    );
}
