//! Multi-token-prediction heads: which layout a checkpoint uses, and the head itself.
//!
//! Three tensor layouts are recognised, by the tensors actually present (a
//! config that announces MTP layers whose tensors are missing gets no head):
//!
//! | layout | detected by | concat into the 2H→H projection | final norm |
//! | --- | --- | --- | --- |
//! | Qwen3.5 / Qwen3-Next | `mtp.fc.weight` | `[pre_fc_norm_embedding(e), pre_fc_norm_hidden(h)]` → `mtp.fc` | `mtp.norm`, output also chains |
//! | DeepSeek-V3 / GLM-4.5 | `model.layers.{N}.eh_proj.weight`, N = `num_hidden_layers` | `[enorm(e), hnorm(h)]` → `eh_proj` | `shared_head.norm` before `shared_head.head` (or the main head) |
//! | MiMo | `model.mtp_layers.0.input_proj.weight` | `[hidden_layernorm(h), token_layernorm(e)]` → `input_proj` | `final_layernorm` inside the layer |
//!
//! The head's block is the trunk family's decoder layer behind the small
//! `head::HeadBlock` trait (attention with its own KV cache, then a SwiGLU MLP
//! or a mixture-of-experts block: Qwen3.5-MoE, Qwen3-Next, GLM-4.5; DeepSeek-V3 and
//! GLM-4.7-Flash: multi-head latent attention, its cache the compressed latent).

mod head;
mod layout;

pub(crate) use head::HeadBlock;
pub(crate) use head::MtpHead;
pub use layout::{MtpLayout, zero_centred_norms};
