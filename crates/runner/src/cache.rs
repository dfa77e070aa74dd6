//! The per-layer KV cache seam. TEMPORARY: a minimal stand-in with the
//! `kvcache::Cache` surface, replaced by `pub use kvcache::...` when that crate lands.

use mlx_tensor::{Array, ops};

use crate::error::Result;

/// A per-layer cache of keys and values `[B, Hkv, S, D]`.
pub trait Cache: std::fmt::Debug {
    /// Positions stored.
    fn offset(&self) -> usize;
    /// Appends `keys`/`values` `[B, Hkv, L, D]` at the offset; returns the live prefix.
    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)>;
    /// Rewinds to `offset` positions.
    fn restore(&mut self, snapshot: Option<()>, offset: usize) -> Result<bool>;
    /// The arrays holding the state (to evaluate them).
    fn state(&self) -> Vec<Array>;
}

/// Growing KV cache (256-slot steps).
#[derive(Debug, Default)]
pub struct KvCache {
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
}

const STEP: i32 = 256;

impl KvCache {
    /// An empty cache.
    pub fn new() -> KvCache {
        KvCache::default()
    }
}

impl Cache for KvCache {
    fn offset(&self) -> usize {
        self.offset
    }

    fn update_and_fetch(&mut self, keys: &Array, values: &Array) -> Result<(Array, Array)> {
        let ks = keys.shape();
        let (b, h, l, d) = (ks[0], ks[1], ks[2], ks[3]);
        let vd = values.dim(3);
        let prev = self.offset as i32;
        let cap = self.keys.as_ref().map_or(0, |k| k.dim(2));
        if prev + l > cap {
            let n = ((prev + l - cap + STEP - 1) / STEP) * STEP;
            let nk = ops::zeros(&[b, h, n, d], keys.dtype())?;
            let nv = ops::zeros(&[b, h, n, vd], values.dtype())?;
            let (k, v) = match (&self.keys, &self.values) {
                (Some(k), Some(v)) => (
                    ops::concatenate(&[k.slice_axis(2, 0, prev)?, nk], 2)?,
                    ops::concatenate(&[v.slice_axis(2, 0, prev)?, nv], 2)?,
                ),
                _ => (nk, nv),
            };
            self.keys = Some(k);
            self.values = Some(v);
        }
        let end = prev + l;
        let k = self.keys.as_ref().expect("allocated above");
        let v = self.values.as_ref().expect("allocated above");
        let k = k.slice_update(keys, &[0, 0, prev, 0], &[b, h, end, d])?;
        let v = v.slice_update(values, &[0, 0, prev, 0], &[b, h, end, vd])?;
        self.offset = end as usize;
        let out = (k.slice_axis(2, 0, end)?, v.slice_axis(2, 0, end)?);
        self.keys = Some(k);
        self.values = Some(v);
        Ok(out)
    }

    fn restore(&mut self, _snapshot: Option<()>, offset: usize) -> Result<bool> {
        if offset > self.offset {
            return Ok(false);
        }
        self.offset = offset;
        Ok(true)
    }

    fn state(&self) -> Vec<Array> {
        self.keys
            .iter()
            .chain(self.values.iter())
            .cloned()
            .collect()
    }
}
