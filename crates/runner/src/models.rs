//! Model families: the [`Model`] seam and its registry, the shared layers,
//! and the multi-token-prediction heads built from them.

pub(crate) mod attention;
pub(crate) mod gated_attention;
pub(crate) mod gated_delta;
pub(crate) mod glm4_moe;
pub(crate) mod layers;
pub(crate) mod llama;
pub(crate) mod moe;
pub(crate) mod mtp;
pub(crate) mod qwen3_5;
pub(crate) mod qwen3_next;
pub(crate) mod registry;
pub(crate) mod rope;
pub(crate) mod sdpa;
pub(crate) mod skinny;
pub(crate) mod swiglu;
pub(crate) mod trunk_ends;

pub use registry::Model;
