//! The crate's error type: every MLX failure arrives here with the Rust call site.

use std::panic::Location;

use crate::Dtype;

/// Errors from MLX calls and from argument checks done on the Rust side.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// MLX threw a C++ exception; `location` is the Rust call that led to it.
    #[error("MLX error at {location}: {message}")]
    Mlx {
        /// The exception's `what()` text.
        message: String,
        /// The caller of the mlx-tensor function (via `#[track_caller]`).
        location: &'static Location<'static>,
    },
    /// Data does not fit the shape it was given.
    #[error("at {location}: {len} elements cannot fill shape {shape:?} ({expected} elements)")]
    ShapeData {
        /// The shape requested.
        shape: Vec<i32>,
        /// Elements the shape needs.
        expected: usize,
        /// Elements supplied.
        len: usize,
        /// The caller.
        location: &'static Location<'static>,
    },
    /// MLX returned a dtype this crate does not model (for example complex64).
    #[error("unsupported MLX dtype code {0}")]
    UnsupportedDtype(u8),
    /// `item` on an array with more than one element.
    #[error("at {location}: item() needs a single element, the array has shape {shape:?}")]
    NotScalar {
        /// The array's shape.
        shape: Vec<i32>,
        /// The caller.
        location: &'static Location<'static>,
    },
    /// An axis argument outside `-ndim..ndim`.
    #[error("at {location}: axis {axis} is out of range for an array of {ndim} dimensions")]
    AxisOutOfRange {
        /// The axis given.
        axis: i32,
        /// The array's number of dimensions.
        ndim: usize,
        /// The caller.
        location: &'static Location<'static>,
    },
    /// A read back into a type that does not match the array.
    #[error("at {location}: cannot read a {found:?} array as {expected:?}")]
    DtypeMismatch {
        /// The dtype asked for.
        expected: Dtype,
        /// The array's dtype.
        found: Dtype,
        /// The caller.
        location: &'static Location<'static>,
    },
}

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The funnel: converts a cxx exception into [`Error::Mlx`] at the caller's location.
#[track_caller]
pub(crate) fn check<T>(r: std::result::Result<T, cxx::Exception>) -> Result<T> {
    let location = Location::caller();
    r.map_err(|e| Error::Mlx {
        message: e.what().to_owned(),
        location,
    })
}
