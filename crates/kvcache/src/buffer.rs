//! Buffer helpers shared by the attention caches: shape checks, growth, writes.

use std::sync::OnceLock;

use mlx_tensor::{Array, Device, ops};

use crate::{Error, Result};

/// Growth step of the preallocated buffers, in positions.
pub const STEP: usize = 256;

/// `n` rounded up to a whole number of [`STEP`]s.
pub(crate) fn round_up(n: usize) -> usize {
    n.div_ceil(STEP) * STEP
}

/// Checks that keys and values are `[B, H, L, D]` with the same `B, H, L`;
/// returns `L`.
pub(crate) fn check_input(keys: &Array, values: &Array) -> Result<usize> {
    let (k, v) = (keys.shape(), values.shape());
    if k.len() != 4 {
        return Err(Error::ShapeMismatch {
            name: "keys",
            expected: "[B, H_kv, L, D]".into(),
            found: k.to_vec(),
        });
    }
    if v.len() != 4 || v[..3] != k[..3] {
        return Err(Error::ShapeMismatch {
            name: "values",
            expected: format!("[{}, {}, {}, D_v] like the keys", k[0], k[1], k[2]),
            found: v.to_vec(),
        });
    }
    Ok(k[2] as usize)
}

/// Checks that `input` fits `buffer` (same `B, H, D` and dtype).
pub(crate) fn check_fits(name: &'static str, buffer: &Array, input: &Array) -> Result<()> {
    let (b, i) = (buffer.shape(), input.shape());
    if b[0] != i[0] || b[1] != i[1] || b[3] != i[3] {
        return Err(Error::ShapeMismatch {
            name,
            expected: format!("[{}, {}, L, {}] as cached so far", b[0], b[1], b[3]),
            found: i.to_vec(),
        });
    }
    if buffer.dtype() != input.dtype() {
        return Err(Error::DtypeMismatch {
            name,
            expected: buffer.dtype(),
            found: input.dtype(),
        });
    }
    Ok(())
}

/// A buffer of `capacity` positions shaped like `template`, holding the
/// first `keep` positions of `old` (if any) and zeros after them.
pub(crate) fn grow(
    old: Option<&Array>,
    template: &Array,
    keep: usize,
    capacity: usize,
) -> Result<Array> {
    let s = template.shape();
    let fresh = |n: usize| ops::zeros(&[s[0], s[1], n as i32, s[3]], template.dtype());
    match old {
        Some(old) if keep > 0 => {
            let kept = old.slice_axis(2, 0, keep as i32)?;
            Ok(ops::concatenate(&[kept, fresh(capacity - keep)?], 2)?)
        }
        _ => Ok(fresh(capacity)?),
    }
}

/// Whether cache writes on the CPU go through `ops::kv_write_cpu` (default
/// on; `MTP_CPU_KV_WRITE=0` sends them to MLX's `slice_update`, to compare).
fn cpu_kv_write() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| match std::env::var("MTP_CPU_KV_WRITE").as_deref() {
        Err(_) | Ok("1") => true,
        Ok("0") => false,
        Ok(other) => {
            tracing::warn!(
                variable = "MTP_CPU_KV_WRITE",
                value = other,
                "not 0 or 1; keeping the default (on)"
            );
            true
        }
    }) && mlx_tensor::default_device() == Device::Cpu
}

/// Writes `src[:, :, from..from+len]` into `buffer[:, :, slot..slot+len]`.
///
/// On the CPU through `ops::kv_write_cpu`, which writes in place also while
/// queued attention reads of the rows below are pending (a draft chain would
/// otherwise copy the buffer at every step); elsewhere through MLX's
/// `slice_update`, which writes in place when nothing shares the buffer.
pub(crate) fn write(
    buffer: &Array,
    src: &Array,
    from: usize,
    slot: usize,
    len: usize,
) -> Result<Array> {
    let s = src.shape();
    let part = if from == 0 && len == s[2] as usize {
        src.clone()
    } else {
        src.slice_axis(2, from as i32, (from + len) as i32)?
    };
    let (lo, hi) = (slot as i32, (slot + len) as i32);
    if cpu_kv_write() {
        return Ok(ops::kv_write_cpu(buffer, &part, lo)?);
    }
    Ok(buffer.slice_update(&part, &[0, 0, lo, 0], &[s[0], s[1], hi, s[3]])?)
}

/// `buffer[:, :, ..len]` (the buffer itself when it is exactly that long).
pub(crate) fn prefix(buffer: &Array, len: usize) -> Result<Array> {
    if buffer.dim(2) as usize == len {
        Ok(buffer.clone())
    } else {
        Ok(buffer.slice_axis(2, 0, len as i32)?)
    }
}
