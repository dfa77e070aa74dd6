//! [`Snapshot`]: a cache's state at one offset, owned until dropped.

use mlx_tensor::{Array, PinSet};

/// The state of one cache at one offset, for a later
/// [`Cache::restore`](crate::Cache::restore).
///
/// A snapshot pins the arrays it needs (see [`mlx_tensor::PinSet`]), so they
/// outlive the cache's own updates; dropping it releases them. Arrays are
/// immutable graph nodes, so holding one costs no copy now; it only stops MLX
/// from updating that buffer in place, so the cache's next write copies it
/// once.
#[derive(Debug)]
pub struct Snapshot {
    /// The cache offset this snapshot restores.
    pub(crate) offset: usize,
    pub(crate) payload: Payload,
    /// Pins every array of `payload`; released on drop.
    _pins: PinSet,
}

/// What each kind of cache needs to come back to `offset`.
#[derive(Debug)]
pub(crate) enum Payload {
    /// A zero-copy mark on a [`crate::KvCache`]: valid while that cache has
    /// not been rewound or refilled since (`origin` and `epoch` match).
    Marker { origin: u64, epoch: u64 },
    /// Owned keys and values `[B, H, offset, D]` of a [`crate::KvCache`]
    /// (`None` when the cache had never been written).
    Kv { kv: Option<(Array, Array)> },
    /// A [`crate::RotatingKvCache`]'s ring at `base_offset`, plus the keys and
    /// values of positions `base_offset..offset` to write on top of it.
    Window {
        max_size: usize,
        keep: usize,
        base: Option<(Array, Array)>,
        base_offset: usize,
        tail: Option<(Array, Array)>,
    },
    /// A [`crate::RecurrentCache`]'s conv and recurrent state.
    Recurrent {
        conv: Option<Array>,
        recurrent: Option<Array>,
    },
}

impl Payload {
    fn arrays(&self) -> Vec<&Array> {
        fn pair(p: &Option<(Array, Array)>) -> Vec<&Array> {
            p.as_ref().map(|(k, v)| vec![k, v]).unwrap_or_default()
        }
        match self {
            Payload::Marker { .. } => Vec::new(),
            Payload::Kv { kv } => pair(kv),
            Payload::Window { base, tail, .. } => {
                let mut all = pair(base);
                all.extend(pair(tail));
                all
            }
            Payload::Recurrent { conv, recurrent } => conv.iter().chain(recurrent).collect(),
        }
    }

    /// A short name for error messages.
    pub(crate) fn name(&self) -> String {
        match self {
            Payload::Marker { .. } => "KvCache (zero-copy)".into(),
            Payload::Kv { .. } => "KvCache".into(),
            Payload::Window { max_size, keep, .. } => {
                format!("RotatingKvCache(max_size {max_size}, keep {keep})")
            }
            Payload::Recurrent { .. } => "RecurrentCache".into(),
        }
    }
}

impl Snapshot {
    pub(crate) fn new(offset: usize, payload: Payload) -> Snapshot {
        let mut pins = PinSet::new();
        for a in payload.arrays() {
            pins.push(a);
        }
        Snapshot {
            offset,
            payload,
            _pins: pins,
        }
    }

    /// The cache offset this snapshot restores.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Bytes of the arrays it holds (0 for a zero-copy KV mark). Arrays that
    /// share a buffer with a live cache are counted here too.
    pub fn nbytes(&self) -> usize {
        self.payload.arrays().iter().map(|a| a.nbytes()).sum()
    }

    /// The arrays it holds, to evaluate together with a step.
    pub fn arrays(&self) -> Vec<Array> {
        self.payload.arrays().into_iter().cloned().collect()
    }
}
