//! Speculative acceptance of draft chains (Leviathan / Chen rejection
//! sampling), every random draw made at once in one lazy graph.

use mlx_tensor::{Array, Dtype, ops, random};

use crate::distribution::{residual, sample_rows};
use crate::{Distribution, Error, Result};

/// Marks the slots of [`BatchOutcome::emitted`] after a chain's next token.
pub const NO_TOKEN: u32 = u32::MAX;

/// The lazy outcome of [`accept_batch`]: `B` independent chains of `k` drafts.
#[derive(Debug, Clone)]
pub struct BatchAcceptance {
    k: usize,
    batch: usize,
    /// `[B, k + 3]` u32: accepted count, next token, then `emitted`.
    packed: Array,
}

/// The host copy of a [`BatchAcceptance`], read with one sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Drafts per chain.
    pub k: usize,
    /// Accepted drafts per chain, each in `0..=k`.
    pub accepted: Vec<u32>,
    /// The token after the accepted drafts: the residual draw at the first
    /// rejection, or the bonus draw after a full accept.
    pub next: Vec<u32>,
    /// `[B, k + 1]` row-major: the accepted drafts, then `next`, then
    /// [`NO_TOKEN`] to the end of the row.
    pub emitted: Vec<u32>,
}

impl BatchOutcome {
    /// Chain `b`'s emitted tokens (accepted drafts plus next).
    pub fn chain(&self, b: usize) -> &[u32] {
        let row = &self.emitted[b * (self.k + 1)..(b + 1) * (self.k + 1)];
        &row[..self.accepted[b] as usize + 1]
    }
}

impl BatchAcceptance {
    /// Drafts per chain.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Number of chains.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Accepted drafts per chain, `[B]` u32 (lazy).
    pub fn accepted(&self) -> Result<Array> {
        self.column(0, 1)
    }

    /// The next token per chain, `[B]` u32 (lazy).
    pub fn next(&self) -> Result<Array> {
        self.column(1, 2)
    }

    /// `[B, k + 1]` u32 (lazy): accepted drafts, next, then [`NO_TOKEN`].
    pub fn emitted(&self) -> Result<Array> {
        Ok(self.packed.slice_axis(1, 2, self.k as i32 + 3)?)
    }

    /// Everything in one `[B, k + 3]` u32 array (accepted, next, emitted),
    /// for a caller that evaluates it together with other arrays.
    pub fn packed(&self) -> &Array {
        &self.packed
    }

    /// Evaluates everything in one graph run and copies it to the host.
    pub fn read(&self) -> Result<BatchOutcome> {
        Ok(self.outcome(&self.packed.to_vec::<u32>()?))
    }

    /// The outcome from `flat`, a host copy of [`BatchAcceptance::packed`]
    /// read together with other arrays: the one reader of the packed layout.
    pub fn outcome(&self, flat: &[u32]) -> BatchOutcome {
        let width = self.k + 3;
        assert_eq!(
            flat.len(),
            self.batch * width,
            "packed acceptance has {} elements for {} chains of width {width}",
            flat.len(),
            self.batch
        );
        let mut out = BatchOutcome {
            k: self.k,
            accepted: Vec::with_capacity(self.batch),
            next: Vec::with_capacity(self.batch),
            emitted: Vec::with_capacity(self.batch * (self.k + 1)),
        };
        for row in flat.chunks_exact(width) {
            out.accepted.push(row[0]);
            out.next.push(row[1]);
            out.emitted.extend_from_slice(&row[2..]);
        }
        out
    }

    fn column(&self, start: i32, end: i32) -> Result<Array> {
        Ok(self
            .packed
            .slice_axis(1, start, end)?
            .reshape(&[self.batch as i32])?)
    }
}

/// The lazy outcome of [`accept_chain`] for one chain.
#[derive(Debug, Clone)]
pub struct Acceptance {
    inner: BatchAcceptance,
}

impl Acceptance {
    /// Accepted drafts, a `[1]` u32 array (lazy).
    pub fn accepted(&self) -> Result<Array> {
        self.inner.accepted()
    }

    /// The next token, a `[1]` u32 array (lazy).
    pub fn next(&self) -> Result<Array> {
        self.inner.next()
    }

    /// `[k + 1]` u32 (lazy): accepted drafts, next, then [`NO_TOKEN`].
    pub fn emitted(&self) -> Result<Array> {
        Ok(self.inner.emitted()?.reshape(&[self.inner.k as i32 + 1])?)
    }

    /// Everything as one `[1, k + 3]` u32 array, to evaluate with the forward.
    pub fn packed(&self) -> &Array {
        self.inner.packed()
    }

    /// `(accepted, next)` with one sync.
    pub fn read(&self) -> Result<(usize, u32)> {
        let out = self.inner.read()?;
        Ok((out.accepted[0] as usize, out.next[0]))
    }

    /// The emitted tokens (accepted drafts, then next) with one sync.
    pub fn read_emitted(&self) -> Result<Vec<u32>> {
        Ok(self.inner.read()?.chain(0).to_vec())
    }

    /// The emitted tokens from `packed`, a host copy of
    /// [`Acceptance::packed`] read together with other arrays.
    pub fn emitted_from(&self, packed: &[u32]) -> Vec<u32> {
        self.inner.outcome(packed).chain(0).to_vec()
    }
}

/// Accepts a prefix of one draft chain.
///
/// `target` has `k + 1` rows (row `i` follows drafts `..i`; row `k` is the
/// bonus row), `draft` has the `k` rows the drafts were sampled from, and
/// `drafted` holds the `k` tokens (`[k]`). Draft `i` is accepted with
/// probability `min(1, p_i(x_i) / q_i(x_i))`; at the first rejection the next
/// token comes from `residual(p_i, q_i)`, after a full accept from row `k`.
/// The emitted tokens then follow the target distribution exactly.
///
/// Token ids must be below the vocabulary size (not checked: that would need
/// a sync). Nothing is evaluated here: read the result with
/// [`Acceptance::read`], or evaluate [`Acceptance::packed`] together with the
/// target forward's other outputs first.
pub fn accept_chain(
    target: &Distribution,
    draft: &Distribution,
    drafted: &Array,
    key: &Array,
) -> Result<Acceptance> {
    let k = drafted.size() as i32;
    if drafted.ndim() != 1 {
        return Err(Error::Shape {
            what: "drafted tokens for accept_chain",
            shape: drafted.shape().to_vec(),
            expected: "[k]".into(),
        });
    }
    let inner = accept_batch(target, draft, &drafted.reshape(&[1, k])?, key)?;
    Ok(Acceptance { inner })
}

/// [`accept_chain`] for `B` independent chains in one graph.
///
/// `drafted` is `[B, k]`; `target` has `B * (k + 1)` rows (chain `b`'s rows
/// are `b * (k + 1)..(b + 1) * (k + 1)`) and `draft` `B * k` rows.
pub fn accept_batch(
    target: &Distribution,
    draft: &Distribution,
    drafted: &Array,
    key: &Array,
) -> Result<BatchAcceptance> {
    let (batch, k) = match drafted.shape().as_slice() {
        [b, k] if *b > 0 && *k > 0 => (*b, *k),
        s => {
            return Err(Error::Shape {
                what: "drafted tokens for accept_batch",
                shape: s.to_vec(),
                expected: "[batch, k] with batch, k > 0 (with no drafts, sample the target row)"
                    .into(),
            });
        }
    };
    let (b, ku) = (batch as usize, k as usize);
    let checks = [
        (
            "target rows vs batch * (k + 1)",
            target.rows(),
            b * (ku + 1),
        ),
        ("draft rows vs batch * k", draft.rows(), b * ku),
        ("target vs draft vocabulary", target.vocab(), draft.vocab()),
    ];
    if let Some((what, left, right)) = checks.into_iter().find(|&(_, l, r)| l != r) {
        return Err(Error::Mismatch { what, left, right });
    }
    let (accept_key, sample_key) = random::split2(key)?;
    let v = target.vocab() as i32;
    let p = target.probs().reshape(&[batch, k + 1, v])?;
    let p_head = p.slice_axis(1, 0, k)?;
    let q = draft.probs().reshape(&[batch, k, v])?;
    let tokens = drafted.as_type(Dtype::Uint32)?;
    let idx = tokens.reshape(&[batch, k, 1])?;
    let p_x = p_head.take_along_axis(&idx, 2)?.reshape(&[batch, k])?;
    let q_x = q.take_along_axis(&idx, 2)?.reshape(&[batch, k])?;
    let accepted = leading_accepts(&p_x, &q_x, &accept_key)?;

    // One categorical draw covers the residual of every row and the bonus row;
    // the accepted count picks which of them is the next token. A one-hot
    // target's residual is the target itself, so its argmax is the draw.
    let candidates = if target.is_one_hot() {
        p.argmax(-1, false)?
    } else {
        let replacement =
            ops::concatenate(&[residual(&p_head, &q)?, p.slice_axis(1, k, k + 1)?], 1)?;
        sample_rows(&replacement, &sample_key)?
    };
    let acc_col = accepted.reshape(&[batch, 1])?;
    let next = candidates.take_along_axis(&acc_col, 1)?;

    let pos = ops::arange(0.0, f64::from(k + 1), 1.0, Dtype::Uint32)?;
    let drafted_pad = ops::concatenate(&[tokens, ops::zeros(&[batch, 1], Dtype::Uint32)?], 1)?;
    let none = Array::from_int(i64::from(NO_TOKEN), Dtype::Uint32)?;
    let tail = ops::r#where(&pos.equal(&acc_col)?, &next, &none)?;
    let emitted = ops::r#where(&pos.less(&acc_col)?, &drafted_pad, &tail)?;
    let packed = ops::concatenate(&[acc_col, next, emitted], 1)?;
    tracing::trace!(batch, k, "speculative acceptance graph built");
    Ok(BatchAcceptance {
        k: ku,
        batch: b,
        packed,
    })
}

/// Length of each row's leading run of accepted drafts, `[B]` u32.
fn leading_accepts(p_x: &Array, q_x: &Array, key: &Array) -> Result<Array> {
    let zero = Array::from_f32(0.0)?;
    let one = Array::from_f32(1.0)?;
    // p >= q accepts surely (this also covers q = 0 < p); p = 0 never accepts,
    // and below p < q implies q > 0, so the division is safe where it is taken.
    let sure = p_x.greater_equal(q_x)?.logical_and(&p_x.greater(&zero)?)?;
    let ratio = p_x.divide(&q_x.maximum(&Array::from_f32(f32::MIN_POSITIVE)?)?)?;
    let accept_p = ops::r#where(&sure, &one, &ratio)?;
    let u = random::uniform(&p_x.shape(), Dtype::Float32, key)?;
    let accepts = u.less(&accept_p)?.as_type(Dtype::Float32)?;
    let run = accepts.cumprod(1, false, true)?.sum(&[1], false)?;
    Ok(run.as_type(Dtype::Uint32)?)
}
