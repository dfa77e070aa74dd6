//! Per-layer caches with offsets, snapshots and exact rewinds for speculative decoding.
//!
//! Every cache implements [`Cache`]: [`KvCache`] for full attention (grows in
//! 256-position steps, rewinds by moving its offset), [`RotatingKvCache`] for
//! sliding-window attention with a kept prefix (rewinds live until it wraps,
//! then from a snapshot), and [`RecurrentCache`] for linear-attention and SSM
//! layers (restores only from snapshots captured during the forward).
//!
//! A speculative verify schedules a rollback point per draft on every cache
//! ([`schedule_all`]), runs one forward, and after acceptance rewinds the stack
//! to `offset + 1 + accepted` with [`rollback`]. After any successful restore
//! to `n`, a cache's [`Cache::live`] contents equal those of a cache built
//! fresh from the first `n` positions, bit for bit.
//!
//! # Example
//! ```
//! use kvcache::{Cache, KvCache, RotatingKvCache, rollback, schedule_all};
//! use mlx_tensor::Array;
//!
//! fn main() -> kvcache::Result<()> {
//!     // [B, H_kv, L, D] = [1, 1, L, 2]; position p holds the value p.
//!     let kv = |from: usize, len: usize| -> kvcache::Result<Array> {
//!         let data: Vec<f32> = (from..from + len).flat_map(|p| [p as f32; 2]).collect();
//!         Ok(Array::from_slice(&data, &[1, 1, len as i32, 2])?)
//!     };
//!     let mut caches: Vec<Box<dyn Cache>> =
//!         vec![Box::new(KvCache::new()), Box::new(RotatingKvCache::new(4, 0)?)];
//!     for c in caches.iter_mut() {
//!         c.update_and_fetch(&kv(0, 3)?, &kv(0, 3)?)?; // the prompt
//!     }
//!     // Verify the current token plus 2 drafts, with rollback points after each.
//!     schedule_all(&mut caches, &[4, 5]);
//!     for c in caches.iter_mut() {
//!         let _mask = c.make_mask(3)?; // build before the update
//!         let (keys, _values) = c.update_and_fetch(&kv(3, 3)?, &kv(3, 3)?)?;
//!         assert_eq!(keys.dim(2), 6); // the window still sees positions 0..3
//!     }
//!     // One draft accepted: keep current + 1 draft.
//!     rollback(&mut caches, 5)?;
//!     for c in &caches {
//!         assert_eq!(c.offset(), 5);
//!     }
//!     // The window holds positions 1..5 in slots (4, 1, 2, 3).
//!     let window = caches[1].live()?[0].to_vec::<f32>()?;
//!     assert_eq!(window, vec![4.0, 4.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]);
//!     Ok(())
//! }
//! ```
#![warn(missing_docs)]

mod buffer;
mod cache;
mod error;
mod kv;
mod recurrent;
mod rollback;
mod rotating;
mod schedule;
mod snapshot;

pub use buffer::STEP;
pub use cache::{AttentionMask, Cache};
pub use error::{Error, Result};
pub use kv::KvCache;
pub use recurrent::RecurrentCache;
pub use rollback::{restore_all, rollback, schedule_all};
pub use rotating::RotatingKvCache;
pub use snapshot::Snapshot;
