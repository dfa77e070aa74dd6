//! [`FakeHead`]: a draft head over a next-token map that records its calls.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt;
use std::rc::Rc;

use kvcache::{Cache, KvCache};
use mlx_tensor::{Array, Dtype, ops};
use mtp_draft::{DraftHead, HeadOutput, Result};

/// Vocabulary of every fake.
pub(crate) const VOCAB: u32 = 32;
/// Width of the hiddens; column 0 carries the hidden's id.
pub(crate) const WIDTH: usize = 2;
/// The id of a hidden the head made itself (not a target hidden).
pub(crate) const OWN: i32 = -1;
/// Logit of the predicted token (all others are 0): near one-hot at temperature 1.
pub(crate) const SCALE: f32 = 30.0;

/// A next-token map: `t + 1 (mod VOCAB)` unless overridden.
#[derive(Debug, Clone, Default)]
pub(crate) struct Model {
    pub overrides: HashMap<u32, u32>,
}

impl Model {
    pub(crate) fn with(pairs: &[(u32, u32)]) -> Model {
        Model {
            overrides: pairs.iter().copied().collect(),
        }
    }

    pub(crate) fn next(&self, t: u32) -> u32 {
        self.overrides.get(&t).copied().unwrap_or((t + 1) % VOCAB)
    }
}

/// One head forward as the head saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call {
    pub position: usize,
    pub tokens: Vec<u32>,
    /// Column 0 of each hidden row: a target slot, or [`OWN`].
    pub hiddens: Vec<i32>,
}

/// Shorthand for an expected call.
pub(crate) fn call(position: usize, tokens: &[u32], hiddens: &[i32]) -> Call {
    Call {
        position,
        tokens: tokens.to_vec(),
        hiddens: hiddens.to_vec(),
    }
}

/// What the test reads back while the session holds the head.
#[derive(Debug, Default)]
pub(crate) struct Log {
    pub calls: Vec<Call>,
    /// The draft cache's live contents after the last write, read back from
    /// its keys (token) and values (hidden id): `(token, hidden)` per slot.
    pub stream: Vec<(u32, i32)>,
    pub unembeds: usize,
}

pub(crate) struct FakeHead {
    pub model: Model,
    caches: Vec<Box<dyn Cache>>,
    pub log: Rc<RefCell<Log>>,
    /// Asks for flushes padded to a power of two ([`DraftHead::flush_rows`]).
    pub pad_flushes: bool,
    /// The most pairs one flush forward takes ([`DraftHead::flush_span`]).
    pub flush_span: usize,
}

impl fmt::Debug for FakeHead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeHead").finish_non_exhaustive()
    }
}

impl FakeHead {
    /// A head with one draft KV cache.
    pub(crate) fn cached(model: Model) -> (FakeHead, Rc<RefCell<Log>>) {
        Self::build(model, vec![Box::new(KvCache::new())])
    }

    /// A cacheless ("single-position") head.
    pub(crate) fn cacheless(model: Model) -> (FakeHead, Rc<RefCell<Log>>) {
        Self::build(model, Vec::new())
    }

    fn build(model: Model, caches: Vec<Box<dyn Cache>>) -> (FakeHead, Rc<RefCell<Log>>) {
        let log = Rc::new(RefCell::new(Log::default()));
        let head = FakeHead {
            model,
            caches,
            log: log.clone(),
            pad_flushes: false,
            flush_span: usize::MAX,
        };
        (head, log)
    }
}

/// `[n, WIDTH]` hiddens whose column 0 holds `ids`.
pub(crate) fn hiddens(ids: &[i32]) -> Array {
    let data: Vec<f32> = ids
        .iter()
        .flat_map(|&id| std::iter::once(id as f32).chain(std::iter::repeat_n(0.5, WIDTH - 1)))
        .collect();
    Array::from_slice(&data, &[ids.len() as i32, WIDTH as i32]).expect("hiddens")
}

/// `[n]` u32 tokens.
pub(crate) fn tokens(ids: &[u32]) -> Array {
    Array::from_slice(ids, &[ids.len() as i32]).expect("tokens")
}

/// Target hiddens of slots `from..from + n`.
pub(crate) fn target_hiddens(from: usize, n: usize) -> Array {
    let ids: Vec<i32> = (from..from + n).map(|s| s as i32).collect();
    hiddens(&ids)
}

fn as_column(values: &[f32]) -> Array {
    Array::from_slice(values, &[1, 1, values.len() as i32, 1]).expect("column")
}

impl DraftHead for FakeHead {
    fn forward(&mut self, tokens: &Array, hiddens: &Array, position: usize) -> Result<HeadOutput> {
        let toks: Vec<u32> = tokens.to_vec()?;
        let rows: Vec<f32> = hiddens.to_vec()?;
        let ids: Vec<i32> = rows.chunks(WIDTH).map(|r| r[0] as i32).collect();
        assert_eq!(toks.len(), ids.len(), "tokens and hiddens of one call");
        if let Some(cache) = self.caches.first_mut() {
            assert_eq!(
                cache.offset(),
                position,
                "head called at a slot off its cache"
            );
            let keys: Vec<f32> = toks.iter().map(|&t| t as f32).collect();
            let values: Vec<f32> = ids.iter().map(|&i| i as f32).collect();
            let (k, v) = cache.update_and_fetch(&as_column(&keys), &as_column(&values))?;
            let (k, v) = (k.to_vec::<f32>()?, v.to_vec::<f32>()?);
            self.log.borrow_mut().stream = k
                .iter()
                .zip(&v)
                .map(|(&t, &h)| (t as u32, h as i32))
                .collect();
        }
        self.log.borrow_mut().calls.push(Call {
            position,
            tokens: toks.clone(),
            hiddens: ids,
        });
        let next: Vec<u32> = toks.iter().map(|&t| self.model.next(t)).collect();
        let next = Array::from_slice(&next, &[next.len() as i32, 1])?;
        let vocab = ops::arange(0.0, VOCAB as f64, 1.0, Dtype::Uint32)?;
        let out = next
            .equal(&vocab)?
            .as_type(Dtype::Float32)?
            .multiply(&Array::from_f32(SCALE)?)?;
        let hidden = ops::full(
            &[toks.len() as i32, WIDTH as i32],
            OWN as f32,
            Dtype::Float32,
        )?;
        Ok(HeadOutput { out, hidden })
    }

    fn unembed(&mut self, out: &Array) -> Result<Array> {
        self.log.borrow_mut().unembeds += 1;
        Ok(out.clone())
    }

    fn caches(&self) -> &[Box<dyn Cache>] {
        &self.caches
    }

    fn caches_mut(&mut self) -> &mut [Box<dyn Cache>] {
        &mut self.caches
    }

    fn flush_rows(&self, rows: usize) -> usize {
        if self.pad_flushes {
            rows.next_power_of_two()
        } else {
            rows
        }
    }

    fn flush_span(&self, _at: usize) -> usize {
        self.flush_span
    }
}
