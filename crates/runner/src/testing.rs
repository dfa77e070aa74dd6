//! The test door: internals that runner's integration tests, examples and
//! benches reach, re-exported in one place. Not part of the API (hidden from
//! the docs); everything a library user needs is at the crate root.
//!
//! Integration tests see only `pub` items, so the units they test directly
//! (stop matching, streaming detokenizing, template rendering, safetensors
//! headers, quantized layers, the family registry) are named here rather
//! than made public one module at a time.

#[cfg(feature = "testing")]
mod fixture;

#[cfg(feature = "testing")]
pub use crate::seeded::with_perturbed_timings;
#[cfg(feature = "testing")]
pub use fixture::{
    Arch, CHAT_TEMPLATE, EOT, Fixture, IM_END, IM_START, TOKENIZER_VOCAB, tokenizer_json,
    write_checkpoint,
};

pub use crate::chat::{MAX_MEMORY, MAX_OUTPUT, render_template};
pub use crate::detok::StreamDetokenizer;
pub use crate::models::kernel_check::rel_err;
pub use crate::models::layers::{Embedding, Linear};
pub use crate::models::mtp::{MtpLayout, zero_centred_norms};
pub use crate::models::registry::lookup;
pub use crate::models::rope::llama3_periods;
pub use crate::models::sdpa::explicit as explicit_attention;
pub use crate::models::short_sdpa::attend as short_attention;
pub use crate::models::skinny::matmul_t_variant as rows_matmul_t;
pub use crate::quant::{QuantConfig, QuantParams, QuantizedTensor};
pub use crate::stop::{StopMatcher, StopStep};
pub use crate::weights::{Weights, validate_header, weight_files};
