//! Safe Rust wrappers over MLX's C++ array API.
//!
//! `mlx-tensor` binds the official MLX build from PyPI (`mlx-cpu` on Linux,
//! `mlx-metal` on macOS; the `mlx-cuda-13` library is a drop-in at run time)
//! through `cxx`. Every MLX call that can fail returns [`Result`]; a C++
//! exception becomes [`Error::Mlx`] naming the Rust call site, never an abort.
//!
//! Names follow mlx-rs where they fit: [`Array`], [`ops`], [`fast`], [`random`].
//!
//! # Threads: nothing is `Send`
//! [`Array`], [`Pinned`], [`PinSet`], [`Stream`] and [`io::Safetensors`] are neither `Send`
//! nor `Sync`, and that is deliberate. MLX keeps a default stream per thread
//! (an array is scheduled on the stream of the thread that built it), and its
//! graph and evaluation code is not documented as safe for concurrent use of
//! one graph from several threads. The handles are cxx opaque types, which
//! are `!Send` and `!Sync` by default; this crate does not override that. An
//! inference runner therefore owns one MLX thread and does all array work
//! there; other threads talk to it with plain data (token ids, strings).
//! [`live_pins`] is per thread for the same reason.
//!
//! ```compile_fail
//! fn needs_send<T: Send>() {}
//! needs_send::<mlx_tensor::Array>(); // error: `Array` cannot be sent between threads
//! ```
//!
//! # Laziness, evaluation and pins
//! Every op only adds a node to MLX's graph; [`Array::eval`], [`eval`],
//! [`Array::to_vec`] and [`Array::item`] run the graph and wait (one round
//! trip to MLX's worker thread, about 100 µs on the CPU backend), while
//! [`async_eval`] schedules it and [`Array::wait`] waits later. Build a whole
//! step as one graph and sync once. Errors that MLX detects while building a
//! node (shapes, dtypes) are returned by the op at its call site.
//!
//! An [`Array`] owns one reference to its node. A node that is not evaluated
//! yet also owns references to its inputs, so inputs stay alive as long as any
//! pending consumer does, even after their own handles are dropped; evaluation
//! replaces the inputs by the node's own buffer and releases them. A pin
//! ([`Array::pin`], [`PinSet`]) is therefore nothing more than a counted owned
//! handle: it keeps an array (and, while unevaluated, its inputs) alive until
//! the guard drops, and [`live_pins`] lets tests prove that long-lived holders
//! release what they pinned. There is no sweep and no manual unpin.
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
pub mod budget;
mod device;
mod dtype;
mod error;
pub mod fast;
mod ffi;
pub mod io;
pub mod ops;
mod pin;
pub mod random;

pub use array::{Array, Shape, async_eval, eval, host_syncs};
pub use device::{
    Device, Stream, blas_info, default_device, device_name, exit_now, gpu_available,
    gpu_compute_capability, memory, mlx_version, set_default_device, synchronize,
};
pub use dtype::{Dtype, Element};
pub use error::{Error, Result};
pub use pin::{PinSet, Pinned, live_pins};

pub use half::{bf16, f16};
