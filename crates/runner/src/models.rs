//! Model families and their shared layers.

pub mod layers;
pub mod llama;
pub mod rope;
