//! The [`Model`] seam and the registry that maps `config.json` to a family.

use mlx_tensor::Array;

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::models::layers::LinearLayout;
use crate::weights::Weights;
use kvcache::Cache;

/// A causal language model: hidden states over a run of tokens, and a separate unembedding.
pub trait Model: std::fmt::Debug {
    /// Runs `tokens` (`[L]` `u32`, maybe still lazy) at the caches' offset and appends
    /// them to `caches`. Returns the post-final-norm hidden states `[L, H]`: what
    /// [`Model::unembed`] turns into logits and what an MTP head conditions on.
    fn forward(&self, tokens: &Array, caches: &mut [Box<dyn Cache>]) -> Result<Array>;

    /// Logits `[R, V]` for hidden rows `[R, H]`, in f32.
    fn unembed(&self, hidden: &Array) -> Result<Array>;

    /// One fresh cache per layer.
    fn new_caches(&self) -> Vec<Box<dyn Cache>>;

    /// The config the model was built from.
    fn config(&self) -> &ModelConfig;

    /// Rows of the unembedding.
    fn vocab_size(&self) -> usize {
        self.config().vocab_size
    }

    /// End-of-sequence ids from config.json.
    fn eos_ids(&self) -> &[u32] {
        &self.config().eos_token_id
    }

    /// Longest sequence the model handles.
    fn context_length(&self) -> usize {
        self.config().max_position_embeddings
    }

    /// A fresh multi-token-prediction head (with empty draft caches) for one
    /// request, when the checkpoint has one and the family wires it up.
    ///
    /// The seam for speculative decoding: the head shares the model's arrays
    /// (clones are cheap handles). No family returns one yet.
    fn mtp_head(&self) -> Option<Box<dyn mtp_draft::DraftHead>> {
        None
    }
}

/// Builds a model of one family from its config and weights.
pub type Build = fn(&ModelConfig, &mut Weights, LinearLayout) -> Result<Box<dyn Model>>;

/// One registered family.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// Name for messages and `info`.
    pub name: &'static str,
    /// `architectures[0]` values handled.
    pub architectures: &'static [&'static str],
    /// `model_type` values handled (used when `architectures` is absent or unknown).
    pub model_types: &'static [&'static str],
    /// Constructor.
    pub build: Build,
}

/// Every registered family. Adding one is a line here, nothing in the generation loop.
pub const FAMILIES: &[Family] = &[
    Family {
        name: "llama",
        architectures: &["LlamaForCausalLM"],
        model_types: &["llama"],
        build: crate::models::llama::build_llama,
    },
    Family {
        name: "mistral",
        architectures: &["MistralForCausalLM"],
        model_types: &["mistral"],
        build: crate::models::llama::build_llama,
    },
    Family {
        name: "qwen2",
        architectures: &["Qwen2ForCausalLM"],
        model_types: &["qwen2"],
        build: crate::models::llama::build_qwen2,
    },
    Family {
        name: "qwen3",
        architectures: &["Qwen3ForCausalLM"],
        model_types: &["qwen3"],
        build: crate::models::llama::build_qwen3,
    },
    Family {
        name: "qwen3_5",
        architectures: &["Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"],
        model_types: &["qwen3_5", "qwen3_5_text"],
        build: crate::models::qwen3_5::build_qwen3_5,
    },
];

/// The family for `config`: by `architectures[0]`, else by `model_type`.
pub fn lookup(config: &ModelConfig) -> Result<&'static Family> {
    FAMILIES
        .iter()
        .find(|f| f.architectures.contains(&config.architecture.as_str()))
        .or_else(|| {
            FAMILIES
                .iter()
                .find(|f| f.model_types.contains(&config.model_type.as_str()))
        })
        .ok_or_else(|| Error::UnknownArchitecture {
            architecture: config.architecture.clone(),
            model_type: config.model_type.clone(),
            known: FAMILIES
                .iter()
                .flat_map(|f| f.architectures.iter().copied())
                .collect::<Vec<_>>()
                .join(", "),
        })
}
