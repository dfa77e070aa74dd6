//! Pins as RAII guards.
//!
//! ollama's Go wrapper frees every array that is not pinned at each sweep, so
//! code that must keep a tensor across a later sync pins it and unpins it by
//! hand. Here an [`Array`] handle already keeps its node alive, and MLX's lazy
//! graph keeps the inputs of an unevaluated node alive until that node is
//! evaluated (after evaluation the node drops its inputs and holds only its
//! own buffer). A pin is therefore an owned handle with a name and a count:
//! [`Pinned`] holds one array, [`PinSet`] many; dropping the guard is the
//! unpin. [`live_pins`] counts the pins of this thread, so tests can prove
//! that long-lived holders (draft sessions, snapshots) release what they pin.

use std::cell::Cell;

use crate::Array;

thread_local! {
    static LIVE: Cell<usize> = const { Cell::new(0) };
}

fn adjust(delta: isize) {
    LIVE.with(|c| {
        let now = c.get() as isize + delta;
        assert!(
            now >= 0,
            "pin count went negative ({now}): a guard was released twice"
        );
        c.set(now as usize);
    });
}

/// Pins alive on this thread (one per array held by a guard).
pub fn live_pins() -> usize {
    LIVE.with(Cell::get)
}

/// One pinned array; unpinned when dropped.
#[must_use = "the pin is released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct Pinned {
    array: Array,
}

impl Pinned {
    pub(crate) fn new(array: &Array) -> Pinned {
        adjust(1);
        Pinned {
            array: array.clone(),
        }
    }

    /// The pinned array.
    pub fn array(&self) -> &Array {
        &self.array
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        adjust(-1);
    }
}

/// A growable set of pins released together (for example the hiddens a draft
/// session buffers until its next flush).
#[must_use = "the pins are released as soon as the set is dropped"]
#[derive(Debug, Default)]
pub struct PinSet {
    pins: Vec<Pinned>,
}

impl PinSet {
    /// An empty set.
    pub fn new() -> PinSet {
        PinSet::default()
    }

    /// Pins one more array.
    pub fn push(&mut self, array: &Array) {
        self.pins.push(array.pin());
    }

    /// The pinned arrays, in insertion order.
    pub fn arrays(&self) -> impl Iterator<Item = &Array> {
        self.pins.iter().map(Pinned::array)
    }

    /// Number of pinned arrays.
    pub fn len(&self) -> usize {
        self.pins.len()
    }

    /// True when nothing is pinned.
    pub fn is_empty(&self) -> bool {
        self.pins.is_empty()
    }

    /// Releases every pin now.
    pub fn clear(&mut self) {
        self.pins.clear();
    }
}
