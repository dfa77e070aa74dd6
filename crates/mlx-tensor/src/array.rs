//! [`Array`]: an RAII handle on one node of MLX's lazy graph.

use std::fmt;
use std::panic::Location;

use cxx::UniquePtr;
use smallvec::SmallVec;

use crate::error::check;
use crate::ffi::sys;
use crate::{Dtype, Element, Error, Result};

/// A shape: small enough to live on the stack for every tensor a runner uses.
pub type Shape = SmallVec<[i32; 4]>;

/// An MLX array. Dropping it releases this handle; the node's buffer is freed
/// when the last handle (and the last graph node that reads it) is gone.
///
/// Cloning is cheap: the clone shares the same graph node, as `mx::array`'s
/// copy constructor does. `Array` is neither `Send` nor `Sync`: MLX's default
/// streams are per thread, so all MLX work stays on the thread that made it.
pub struct Array {
    pub(crate) inner: UniquePtr<sys::Arr>,
}

impl Array {
    pub(crate) fn wrap(inner: UniquePtr<sys::Arr>) -> Array {
        debug_assert!(!inner.is_null());
        Array { inner }
    }

    pub(crate) fn raw(&self) -> &sys::Arr {
        // The pointer is never null: every constructor goes through `wrap`.
        self.inner.as_ref().expect("Array holds a live MLX handle")
    }

    /// Copies host data into a new array of the given shape.
    #[track_caller]
    pub fn from_slice<T: Element>(data: &[T], shape: &[i32]) -> Result<Array> {
        let expected: usize = shape.iter().map(|&d| d.max(0) as usize).product();
        if shape.iter().any(|&d| d < 0) || expected != data.len() {
            return Err(Error::ShapeData {
                shape: shape.to_vec(),
                expected,
                len: data.len(),
                location: Location::caller(),
            });
        }
        let mut bytes = Vec::with_capacity(data.len() * T::DTYPE.size());
        for &x in data {
            x.write_bytes(&mut bytes);
        }
        Self::from_raw_bytes(&bytes, shape, T::DTYPE)
    }

    /// Copies raw native-endian bytes (for example a safetensors payload) into an array.
    #[track_caller]
    pub fn from_raw_bytes(bytes: &[u8], shape: &[i32], dtype: Dtype) -> Result<Array> {
        check(sys::from_bytes(bytes, shape, dtype.code())).map(Array::wrap)
    }

    /// A scalar float of the given dtype.
    #[track_caller]
    pub fn scalar(value: f32, dtype: Dtype) -> Result<Array> {
        check(sys::scalar_f32(value, dtype.code())).map(Array::wrap)
    }

    /// A scalar `f32`.
    #[track_caller]
    pub fn from_f32(value: f32) -> Result<Array> {
        Self::scalar(value, Dtype::Float32)
    }

    /// A scalar integer of the given (integer) dtype.
    #[track_caller]
    pub fn from_int(value: i64, dtype: Dtype) -> Result<Array> {
        check(sys::scalar_i64(value, dtype.code())).map(Array::wrap)
    }

    /// The element type.
    pub fn dtype(&self) -> Dtype {
        let code = sys::dtype_of(self.raw());
        // Every array this crate can create has a modelled dtype; complex
        // arrays cannot be made through this API.
        Dtype::from_code(code)
            .unwrap_or_else(|| panic!("MLX array with unmodelled dtype code {}", code.repr))
    }

    /// The shape.
    pub fn shape(&self) -> Shape {
        sys::shape_of(self.raw()).into_iter().collect()
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape().len()
    }

    /// Size of one axis; negative axes count from the end.
    ///
    /// # Panics
    /// When the axis is out of range (a programming error, not bad input).
    pub fn dim(&self, axis: i32) -> i32 {
        let shape = self.shape();
        let n = shape.len() as i32;
        let a = if axis < 0 { axis + n } else { axis };
        assert!(
            (0..n).contains(&a),
            "axis {axis} out of range for shape {shape:?}"
        );
        shape[a as usize]
    }

    /// Number of elements.
    pub fn size(&self) -> usize {
        sys::size_of(self.raw())
    }

    /// Bytes of the logical array (elements × element size).
    pub fn nbytes(&self) -> usize {
        sys::nbytes_of(self.raw())
    }

    /// Graph nodes that evaluating this array would still run, each counted
    /// once (0 for an evaluated array or one made from host data): the op
    /// count of a lazily built step, for launch-overhead estimates.
    pub fn pending_nodes(&self) -> usize {
        sys::pending_nodes(self.raw())
    }

    /// The same graph nodes counted per primitive name, one `"Name count"`
    /// line each, sorted by name: what a step's op count is made of.
    pub fn pending_census(&self) -> String {
        sys::pending_census(self.raw())
    }

    /// Evaluates the graph that produces this array and waits for it.
    #[track_caller]
    pub fn eval(&self) -> Result<()> {
        count_sync();
        check(sys::eval_one(self.raw()))
    }

    /// Schedules evaluation without waiting; a later read or [`Array::wait`] syncs.
    #[track_caller]
    pub fn async_eval(&self) -> Result<()> {
        check(sys::async_eval_one(self.raw()))
    }

    /// Waits for a scheduled evaluation to finish.
    #[track_caller]
    pub fn wait(&self) -> Result<()> {
        count_sync();
        check(sys::wait_one(self.raw()))
    }

    /// Evaluates and copies the elements to the host, in row-major order,
    /// converting to `T` first when the dtype differs.
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        let src = if self.dtype() == T::DTYPE {
            self.clone()
        } else {
            self.as_type(T::DTYPE)?
        };
        let width = T::DTYPE.size();
        let mut bytes = vec![0u8; src.size() * width];
        count_sync();
        check(sys::read_into(src.raw(), &mut bytes))?;
        Ok(bytes.chunks_exact(width).map(T::read_bytes).collect())
    }

    /// Reads the single element of a one-element array.
    #[track_caller]
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.size() != 1 {
            return Err(Error::NotScalar {
                shape: self.shape().to_vec(),
                location: Location::caller(),
            });
        }
        Ok(self.to_vec::<T>()?[0])
    }

    /// Keeps this array alive until the returned guard drops (see [`crate::Pinned`]).
    #[must_use = "the pin is released as soon as the guard is dropped"]
    pub fn pin(&self) -> crate::Pinned {
        crate::Pinned::new(self)
    }
}

impl Clone for Array {
    fn clone(&self) -> Self {
        Array::wrap(sys::clone_arr(self.raw()))
    }
}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Array")
            .field("shape", &self.shape())
            .field("dtype", &self.dtype())
            .finish()
    }
}

/// An ordered batch of arrays handed to MLX in one call.
pub(crate) struct List {
    pub(crate) inner: UniquePtr<sys::ArrList>,
}

impl List {
    pub(crate) fn new<'a>(arrays: impl IntoIterator<Item = &'a Array>) -> List {
        let mut inner = sys::list_new();
        for a in arrays {
            sys::list_push(inner.pin_mut(), a.raw());
        }
        List { inner }
    }

    pub(crate) fn raw(&self) -> &sys::ArrList {
        self.inner.as_ref().expect("list handle is live")
    }

    #[track_caller]
    pub(crate) fn into_arrays(self) -> Result<Vec<Array>> {
        let n = sys::list_len(self.raw());
        (0..n)
            .map(|i| check(sys::list_get(self.raw(), i)).map(Array::wrap))
            .collect()
    }
}

/// Evaluates several arrays in one graph run and waits for all of them.
#[track_caller]
pub fn eval<'a>(arrays: impl IntoIterator<Item = &'a Array>) -> Result<()> {
    count_sync();
    check(sys::eval_list(List::new(arrays).raw()))
}

/// Schedules several arrays for evaluation without waiting.
#[track_caller]
pub fn async_eval<'a>(arrays: impl IntoIterator<Item = &'a Array>) -> Result<()> {
    check(sys::async_eval_list(List::new(arrays).raw()))
}

thread_local! {
    static SYNCS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn count_sync() {
    SYNCS.with(|c| c.set(c.get() + 1));
}

/// Blocking host syncs made on this thread so far: every `eval`, `wait`,
/// `to_vec` and `item` counts one (`async_eval` does not). Decode loops use
/// it to prove they sync with the device once per step or round.
pub fn host_syncs() -> u64 {
    SYNCS.with(std::cell::Cell::get)
}
