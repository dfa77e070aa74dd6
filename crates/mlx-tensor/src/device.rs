//! Device and stream choice, and MLX's memory figures.
//!
//! The CPU build (`mlx-cpu`) has only the CPU device; the same binary started
//! with the CUDA build's `libmlx.so` (or on macOS with Metal) has a GPU too.

use std::marker::PhantomData;

use crate::Result;
use crate::error::check;
use crate::ffi::sys;

/// Where MLX runs new operations by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The CPU backend.
    Cpu,
    /// Metal on macOS, CUDA on NVIDIA hosts.
    Gpu,
}

/// Sets the default device for this thread's new operations.
#[track_caller]
pub fn set_default_device(device: Device) -> Result<()> {
    check(sys::set_default_device(device == Device::Gpu))
}

/// The current default device.
pub fn default_device() -> Device {
    if sys::default_device_is_gpu() {
        Device::Gpu
    } else {
        Device::Cpu
    }
}

/// True when the loaded MLX library has a usable GPU backend.
pub fn gpu_available() -> bool {
    sys::gpu_available()
}

/// A human-readable name of the default device (for example `NVIDIA H200`).
#[track_caller]
pub fn device_name() -> Result<String> {
    check(sys::device_name())
}

/// The GPU's CUDA compute capability as `major * 10 + minor` (90 for an
/// H100 or H200), or `None` where there is no GPU or its backend reports
/// none (Metal, the CPU build).
#[track_caller]
pub fn gpu_compute_capability() -> Result<Option<u32>> {
    Ok(Some(check(sys::gpu_compute_capability())?).filter(|&c| c > 0))
}

/// Waits for all scheduled work on the default stream.
#[track_caller]
pub fn synchronize() -> Result<()> {
    check(sys::synchronize())
}

/// An MLX stream: an ordered queue of work on one device. New operations go
/// to the calling thread's default stream for the default device.
///
/// Only [`Stream::new`] and [`Stream::default_for`] make one, so the index is
/// always one MLX handed out. Like every type here it is not `Send`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stream {
    index: i32,
    device: Device,
    _not_send: PhantomData<*const ()>,
}

impl Stream {
    fn from_index(index: i32, device: Device) -> Stream {
        Stream {
            index,
            device,
            _not_send: PhantomData,
        }
    }

    /// A new stream on `device` (an error when the device is not available).
    #[track_caller]
    pub fn new(device: Device) -> Result<Stream> {
        check(sys::new_stream(device == Device::Gpu)).map(|i| Stream::from_index(i, device))
    }

    /// This thread's default stream for `device`.
    #[track_caller]
    pub fn default_for(device: Device) -> Result<Stream> {
        check(sys::default_stream_index(device == Device::Gpu))
            .map(|i| Stream::from_index(i, device))
    }

    /// Makes this the default stream (and its device the default device) for this thread.
    #[track_caller]
    pub fn set_default(&self) -> Result<()> {
        check(sys::set_default_stream(
            self.index,
            self.device == Device::Gpu,
        ))
    }

    /// Waits for all work scheduled on this stream.
    #[track_caller]
    pub fn synchronize(&self) -> Result<()> {
        check(sys::synchronize_stream(
            self.index,
            self.device == Device::Gpu,
        ))
    }

    /// The device the stream runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// MLX's index of the stream.
    pub fn index(&self) -> i32 {
        self.index
    }
}

/// The MLX library version string.
pub fn mlx_version() -> String {
    sys::mlx_version()
}

/// Ends the process now with `code`, after the default stream's work is done
/// and C stdio is flushed, without running static destructors.
///
/// OpenBLAS 0.3.21's pthread build (the one mlx-tensor links on Debian) can
/// hang in its exit-time thread shutdown after MLX's worker thread used it;
/// binaries call this as their last step instead of returning from `main`.
/// Flush Rust's own buffered writers (stdout locks, files) before calling it.
pub fn exit_now(code: i32) -> ! {
    sys::exit_now(code);
    // `std::_Exit` does not return; cxx cannot declare `-> !` across the bridge.
    std::process::abort()
}

/// Which BLAS serves MLX's f32 matmul on the CPU (OpenBLAS when linked).
pub fn blas_info() -> String {
    sys::blas_info()
}

/// MLX allocator figures, in bytes.
pub mod memory {
    use super::sys;

    /// Bytes held by live arrays.
    pub fn active() -> usize {
        sys::active_memory()
    }
    /// Highest `active()` since start or the last [`reset_peak`].
    pub fn peak() -> usize {
        sys::peak_memory()
    }
    /// Resets the peak to zero (MLX's behaviour, even while arrays are live);
    /// the next allocation raises it again.
    pub fn reset_peak() {
        sys::reset_peak_memory()
    }
    /// Bytes kept in MLX's buffer cache for reuse.
    pub fn cache() -> usize {
        sys::cache_memory()
    }
    /// Caps the buffer cache; returns the previous limit.
    pub fn set_cache_limit(bytes: usize) -> usize {
        sys::set_cache_limit(bytes)
    }
    /// Caps total memory; returns the previous limit.
    pub fn set_memory_limit(bytes: usize) -> usize {
        sys::set_memory_limit(bytes)
    }
    /// Frees the buffer cache.
    pub fn clear_cache() {
        sys::clear_cache()
    }
}
