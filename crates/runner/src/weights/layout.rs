//! Where a checkpoint keeps its text model: the prefixes that Hugging Face's
//! multimodal classes and mlx-lm's conversions wrap around the trunk, and the
//! towers a text runner leaves out.
//!
//! | writer | trunk | unembedding | MTP | left out |
//! | --- | --- | --- | --- | --- |
//! | transformers `*ForCausalLM` | `model.*` | `lm_head.*` | `mtp.*`, ... | |
//! | transformers `*ForConditionalGeneration` (Qwen3.5 hub) | `model.language_model.*` | `lm_head.*` | `mtp.*` | `model.visual.*` |
//! | mlx-lm `convert` of a multimodal source | `language_model.model.*` | `language_model.lm_head.*` | dropped by mlx-lm | `model.visual.*`, `vision_tower.*` |

/// Prefixes of the vision towers (and similar) a text model never reads.
pub(super) const SKIPPED_PREFIXES: [&str; 3] = ["model.visual.", "vision_tower.", "visual."];

/// The checkpoint's wrapping of its text model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorLayout {
    /// Short name for `info`: `transformers`, `transformers-multimodal`, `mlx-lm-multimodal`.
    pub name: &'static str,
    /// Prefix of the trunk (`model`, `model.language_model`, `language_model.model`).
    pub trunk: &'static str,
    /// Prefix of the unembedding module (`lm_head`, `language_model.lm_head`).
    pub lm_head: &'static str,
    /// True when mlx-lm wrote it (its sanitize drops MTP tensors).
    pub mlx_converted: bool,
}

impl TensorLayout {
    /// The plain transformers layout.
    pub const PLAIN: TensorLayout = TensorLayout {
        name: "transformers",
        trunk: "model",
        lm_head: "lm_head",
        mlx_converted: false,
    };

    /// The layout of a checkpoint holding `names`.
    pub fn detect<'a>(names: impl IntoIterator<Item = &'a str>) -> TensorLayout {
        let mut hub = false;
        let mut mlx = false;
        for n in names {
            hub |= n.starts_with("model.language_model.");
            mlx |= n.starts_with("language_model.model.");
        }
        if mlx {
            TensorLayout {
                name: "mlx-lm-multimodal",
                trunk: "language_model.model",
                lm_head: "language_model.lm_head",
                mlx_converted: true,
            }
        } else if hub {
            TensorLayout {
                name: "transformers-multimodal",
                trunk: "model.language_model",
                lm_head: "lm_head",
                mlx_converted: false,
            }
        } else {
            TensorLayout::PLAIN
        }
    }

    /// True for a tensor of a tower the text model leaves out.
    pub fn skips(name: &str) -> bool {
        SKIPPED_PREFIXES.iter().any(|p| name.starts_with(p))
    }
}
