//! Model families: the [`Model`] seam and its registry, the shared layers,
//! and the multi-token-prediction heads built from them.

pub(crate) mod attention;
pub(crate) mod gated_attention;
pub(crate) mod gated_delta;
pub mod layers;
pub mod llama;
pub mod mtp;
pub mod qwen3_5;
pub mod registry;
pub mod rope;
pub mod sdpa;
pub(crate) mod skinny;
pub(crate) mod trunk_ends;

pub use registry::Model;
