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
    /// (clones are cheap handles). `None` by default; the MTP families
    /// return theirs.
    fn mtp_head(&self) -> Option<Box<dyn mtp_draft::DraftHead>> {
        None
    }

    /// Sets up how the MTP head drafts: over a vocabulary subset (its own
    /// gathered unembedding) and with drafting weights affine-quantized (its
    /// unembedding, projection and, where the family provides it, its
    /// block); the trunk keeps its own weights. False when there is no head.
    /// See `MtpHead::with_draft_vocab` and `MtpHead::quantized` for why the
    /// output is unchanged.
    fn adapt_draft_head(&mut self, s: &crate::DraftHeadSetup) -> Result<bool> {
        let _ = s;
        Ok(false)
    }
}

/// Builds a model of one family from its config and weights.
pub(crate) type Build = fn(&ModelConfig, &mut Weights, LinearLayout) -> Result<Box<dyn Model>>;

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

/// Every registered family. Adding one is a file under `models/` and a row
/// here, nothing in the generation loop.
pub(crate) const FAMILIES: &[Family] = &[
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
        build: crate::models::llama::build_mistral,
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
        name: "mimo",
        architectures: &["MiMoForCausalLM"],
        model_types: &["mimo"],
        build: crate::models::llama::build_qwen2,
    },
    Family {
        name: "qwen2_moe",
        architectures: &["Qwen2MoeForCausalLM"],
        model_types: &["qwen2_moe"],
        build: crate::models::llama::build_qwen2_moe,
    },
    Family {
        name: "qwen3_moe",
        architectures: &["Qwen3MoeForCausalLM"],
        model_types: &["qwen3_moe"],
        build: crate::models::llama::build_qwen3_moe,
    },
    Family {
        name: "qwen3_5",
        architectures: &["Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"],
        model_types: &["qwen3_5", "qwen3_5_text"],
        build: crate::models::qwen3_5::build_qwen3_5,
    },
    Family {
        name: "qwen3_next",
        architectures: &["Qwen3NextForCausalLM"],
        model_types: &["qwen3_next"],
        build: crate::models::qwen3_next::build_qwen3_next,
    },
    Family {
        name: "glm4_moe",
        architectures: &["Glm4MoeForCausalLM"],
        model_types: &["glm4_moe"],
        build: crate::models::glm4_moe::build_glm4_moe,
    },
    Family {
        name: "deepseek_v3",
        architectures: &["DeepseekV3ForCausalLM"],
        model_types: &["deepseek_v3"],
        build: crate::models::glm4_moe::build_deepseek_v3,
    },
    Family {
        name: "glm4_moe_lite",
        architectures: &["Glm4MoeLiteForCausalLM"],
        model_types: &["glm4_moe_lite"],
        build: crate::models::glm4_moe::build_glm4_moe_lite,
    },
    Family {
        name: "qwen3_5_moe",
        architectures: &[
            "Qwen3_5MoeForCausalLM",
            "Qwen3_5MoeForConditionalGeneration",
        ],
        model_types: &["qwen3_5_moe", "qwen3_5_moe_text"],
        build: crate::models::qwen3_5::build_qwen3_5_moe,
    },
];

/// Architectures recognised but not implemented, with what they need
/// (`architectures[0]`, `model_type`, what is missing).
pub(crate) const UNSUPPORTED: &[(&str, &str, &str)] = &[(
    "MixtralForCausalLM",
    "mixtral",
    "mixture-of-experts MLP layers",
)];

fn known() -> String {
    FAMILIES
        .iter()
        .flat_map(|f| f.architectures.iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The family for an architecture and model type: by `architectures[0]`,
/// else by `model_type`; a recognised but unimplemented one is
/// [`Error::UnsupportedArchitecture`].
pub(crate) fn lookup_names(architecture: &str, model_type: &str) -> Result<&'static Family> {
    if let Some(f) = FAMILIES
        .iter()
        .find(|f| f.architectures.contains(&architecture))
    {
        return Ok(f);
    }
    if let Some(&(_, _, needs)) = UNSUPPORTED
        .iter()
        .find(|(a, m, _)| *a == architecture || *m == model_type)
    {
        return Err(Error::UnsupportedArchitecture {
            architecture: architecture.to_owned(),
            model_type: model_type.to_owned(),
            needs,
            known: known(),
        });
    }
    FAMILIES
        .iter()
        .find(|f| f.model_types.contains(&model_type))
        .ok_or_else(|| Error::UnknownArchitecture {
            architecture: architecture.to_owned(),
            model_type: model_type.to_owned(),
            known: known(),
        })
}

/// The family for `config`: by `architectures[0]`, else by `model_type`.
pub fn lookup(config: &ModelConfig) -> Result<&'static Family> {
    lookup_names(&config.architecture, &config.model_type)
}

/// Reads `dir/config.json`, finds its family first (so an unsupported
/// architecture is named before any key its config lacks), then validates
/// the config.
pub(crate) fn resolve(dir: &std::path::Path) -> Result<(&'static Family, ModelConfig)> {
    let (value, path) = ModelConfig::read_value(dir)?;
    let (architecture, model_type) = ModelConfig::identify(&value);
    let family = lookup_names(&architecture, &model_type)?;
    let config = ModelConfig::from_value(value, &path)?;
    Ok((family, config))
}
