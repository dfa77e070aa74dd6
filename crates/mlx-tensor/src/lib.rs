//! Safe Rust wrappers over MLX's C++ array API.
//!
//! `mlx-tensor` binds the official MLX build from PyPI (`mlx-cpu` on Linux,
//! `mlx-metal` on macOS; the `mlx-cuda-13` library is a drop-in at run time)
//! through `cxx`. Every MLX call that can fail returns [`Result`]; a C++
//! exception becomes [`Error::Mlx`] naming the Rust call site, never an abort.
//!
//! Names follow mlx-rs where they fit: [`Array`], [`ops`], [`fast`], [`random`].
//!
//! # Threads
//! [`Array`] is neither `Send` nor `Sync`. MLX keeps a default stream per
//! thread, and its graph nodes are reference counted without atomics on the
//! Rust side's behalf, so an inference runner owns one MLX thread and does all
//! array work there. No type of this crate is `Send`.
//!
//! # Example
//! ```
//! use mlx_tensor::{Array, Result};
//!
//! fn main() -> Result<()> {
//!     let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2])?;
//!     let b = Array::from_slice(&[5.0f32, 6.0, 7.0, 8.0], &[2, 2])?;
//!     let c = a.matmul(&b)?;
//!     assert_eq!(c.to_vec::<f32>()?, vec![19.0, 22.0, 43.0, 50.0]);
//!     // Mistakes are errors at the call site, not crashes.
//!     let bad = Array::from_slice(&[1.0f32; 3], &[3, 1])?;
//!     assert!(a.matmul(&bad).is_err());
//!     Ok(())
//! }
//! ```
#![warn(missing_docs)]

mod array;
mod device;
mod dtype;
mod error;
pub mod fast;
mod ffi;
pub mod io;
pub mod ops;
mod pin;
pub mod random;

pub use array::{Array, Shape, async_eval, eval};
pub use device::{
    Device, blas_info, default_device, device_name, gpu_available, memory, mlx_version,
    set_default_device, synchronize,
};
pub use dtype::{Dtype, Element};
pub use error::{Error, Result};
pub use pin::{PinSet, Pinned, live_pins};

pub use half::{bf16, f16};
