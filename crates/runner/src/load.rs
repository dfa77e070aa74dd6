//! Loading a model folder: config, weights, tokenizer, family; and `info`,
//! which validates the same way without reading tensor data.

use std::collections::BTreeMap;
use std::path::Path;

use mlx_tensor::Dtype;

use crate::config::{GenerationConfig, ModelConfig};
use crate::draft_head::{DraftHeadSetup, DraftQuant, DraftVocab};
use crate::error::{Error, Result};
use crate::models::Model;
use crate::models::layers::LinearLayout;
use crate::models::mtp::MtpLayout;
use crate::models::registry::{Family, resolve};
use crate::models::trunk_ends::{MLX_DROPPED_MTP, unused};
use crate::tokenizer::Tokenizer;
use crate::weights::Weights;

/// How to load.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    /// Compute dtype (f32 is fastest on the CPU).
    pub dtype: Dtype,
    /// Linear weight layout.
    pub layout: LinearLayout,
    /// Load even when the checkpoint holds tensors the family does not use
    /// (by default an error naming them: the config would not describe the
    /// weights, and the output would be silently wrong).
    pub allow_unused_tensors: bool,
    /// The precision of the MTP head's drafting weights (default: what pays
    /// on this backend; see [`DraftQuant`]).
    pub draft_quant: DraftQuant,
    /// The vocabulary the MTP head drafts over (default: all of it, unless
    /// `MTP_DRAFT_VOCAB` says otherwise; see [`DraftVocab`]).
    pub draft_vocab: DraftVocab,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            dtype: Dtype::Float32,
            layout: LinearLayout::DEFAULT,
            allow_unused_tensors: false,
            draft_quant: DraftQuant::Auto,
            draft_vocab: DraftVocab::Auto,
        }
    }
}

/// A model ready to generate.
#[derive(Debug)]
pub struct LoadedModel {
    /// The network.
    pub model: Box<dyn Model>,
    /// Its tokenizer.
    pub tokenizer: Tokenizer,
    /// `generation_config.json` defaults.
    pub generation_config: GenerationConfig,
    /// What `info` reports.
    pub info: ModelInfo,
    /// How load set up the MTP head's drafting (see
    /// [`LoadOptions::draft_quant`] and [`LoadOptions::draft_vocab`]);
    /// [`DraftHeadSetup::is_plain`] when the head drafts as loaded, or there
    /// is no head.
    pub draft_head: DraftHeadSetup,
}

/// Loads `dir`; `progress(done, total)` is called per weight file.
pub fn load(
    dir: &Path,
    opts: LoadOptions,
    progress: impl FnMut(usize, usize),
) -> Result<LoadedModel> {
    // robust2: refuse FIFOs, devices, dangling links and git-lfs pointers before any open.
    crate::files::check_model_folder(dir)?;
    let (family, config) = resolve(dir)?;
    let generation_config = GenerationConfig::load(dir)?;
    let tokenizer = Tokenizer::load(dir, &config, &generation_config)?;
    let mut weights = Weights::load(dir, opts.dtype, progress)?;
    let info = ModelInfo::from_parts(family.name, &config, &weights);
    let mut model = (family.build)(&config, &mut weights, opts.layout)?;
    check_unused(family, &weights, opts.allow_unused_tensors)?;
    let mut special = tokenizer.eos_ids().to_vec();
    special.extend(tokenizer.inner().get_added_tokens_decoder().keys().copied());
    let asked = DraftHeadSetup::resolve(
        opts.draft_quant,
        opts.draft_vocab,
        model.vocab_size(),
        &special,
        mlx_tensor::default_device(),
        opts.dtype,
    )?;
    let draft_head = if !asked.is_plain() && model.adapt_draft_head(&asked)? {
        if let Some(p) = asked.quant {
            tracing::info!(
                bits = p.bits,
                group_size = p.group_size,
                "MTP head drafts with quantized weights"
            );
        }
        if let Some(ids) = &asked.vocab {
            tracing::info!(ids = ids.len(), "MTP head drafts over a vocabulary subset");
        }
        asked
    } else {
        DraftHeadSetup::default()
    };
    tracing::info!(
        family = family.name,
        params = info.parameter_count,
        "model loaded"
    );
    Ok(LoadedModel {
        model,
        tokenizer,
        generation_config,
        info,
        draft_head,
    })
}

/// Fails when tensors are left over after the family took its own.
fn check_unused(family: &Family, w: &Weights, allow: bool) -> Result<()> {
    let left = unused(w);
    if left.is_empty() {
        return Ok(());
    }
    if allow {
        tracing::warn!(count = left.len(), first = %left[0], "unused tensors in checkpoint (allowed)");
        return Ok(());
    }
    const SHOWN: usize = 5;
    let mut names = left
        .iter()
        .take(SHOWN)
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ");
    if left.len() > SHOWN {
        names += &format!(" and {} more", left.len() - SHOWN);
    }
    Err(Error::UnusedTensors {
        family: family.name,
        count: left.len(),
        names,
    })
}

/// What a model folder holds, read from config.json and the safetensors headers only.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    /// Registered family name.
    pub family: String,
    /// `architectures[0]`.
    pub architecture: String,
    /// `model_type`.
    pub model_type: String,
    /// Elements over all tensors (MTP tensors included, vision towers not).
    pub parameter_count: usize,
    /// Tensor counts by stored dtype.
    pub dtypes: BTreeMap<String, usize>,
    /// True when the checkpoint carries MTP head tensors.
    pub mtp_head: bool,
    /// The MTP head's tensor layout (`qwen3.5`, `deepseek-v3`, `mimo`), when there is one.
    pub mtp_layout: Option<&'static str>,
    /// MTP layers declared in config.json.
    pub mtp_layers_declared: usize,
    /// MTP layers the checkpoint holds (the head drafts with the first).
    pub mtp_layers_present: usize,
    /// Why a declared head is absent, when the folder says (an mlx-lm conversion).
    pub mtp_note: Option<&'static str>,
    /// How the checkpoint wraps its text model (`transformers`, `transformers-multimodal`, `mlx-lm-multimodal`).
    pub tensor_layout: &'static str,
    /// Vision-tower tensors left out by the text-only runner: `(tensors, elements)`.
    pub skipped: (usize, usize),
    /// Context length.
    pub context_length: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Residual width.
    pub hidden_size: usize,
    /// Vocabulary rows.
    pub vocab_size: usize,
}

impl ModelInfo {
    fn from_parts(family: &str, c: &ModelConfig, w: &Weights) -> ModelInfo {
        let layout = MtpLayout::detect(c, |name| w.stored_shape(name).is_some());
        let mlx = w.layout().mlx_converted || w.quantization().is_some();
        ModelInfo {
            family: family.to_owned(),
            architecture: c.architecture.clone(),
            model_type: c.model_type.clone(),
            parameter_count: w.parameter_count(),
            dtypes: w.source_dtypes().clone(),
            mtp_head: layout.is_some(),
            mtp_layout: layout.map(MtpLayout::name),
            mtp_layers_declared: c.mtp_layers,
            mtp_layers_present: layout.map_or(0, |l| l.layers_present(c, w.all_names())),
            mtp_note: (layout.is_none() && c.mtp_layers > 0 && mlx).then_some(MLX_DROPPED_MTP),
            tensor_layout: w.layout().name,
            skipped: w.skipped(),
            context_length: c.max_position_embeddings,
            layers: c.num_hidden_layers,
            hidden_size: c.hidden_size,
            vocab_size: c.vocab_size,
        }
    }
}

/// Reads `info` from config.json and the validated safetensors headers: no
/// tensor data is read, but the family's loader runs over placeholders of
/// the stored shapes, so every name and shape is checked and `info` fails
/// exactly where loading would (unused tensors included).
pub fn inspect(dir: &Path) -> Result<ModelInfo> {
    // robust2: refuse FIFOs, devices, dangling links and git-lfs pointers before any open.
    crate::files::check_model_folder(dir)?;
    let (family, config) = resolve(dir)?;
    let mut weights = Weights::from_headers(dir, Dtype::Float32)?;
    let info = ModelInfo::from_parts(family.name, &config, &weights);
    (family.build)(&config, &mut weights, LinearLayout::DEFAULT)?;
    check_unused(family, &weights, false)?;
    Ok(info)
}
