//! Model families and their shared layers.

pub(crate) mod attention;
pub(crate) mod gated_attention;
pub(crate) mod gated_delta;
pub mod glm4_moe;
pub mod layers;
pub mod llama;
pub mod moe;
pub mod qwen3_5;
pub mod qwen3_next;
pub mod rope;
pub mod sdpa;
pub(crate) mod skinny;
pub(crate) mod trunk_ends;
