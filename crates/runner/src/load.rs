//! Loading a model folder: config, weights, tokenizer, family; and `info` without loading.

use std::collections::BTreeMap;
use std::path::Path;

use mlx_tensor::Dtype;

use crate::config::{GenerationConfig, ModelConfig};
use crate::error::Result;
use crate::model::{Model, lookup};
use crate::models::layers::LinearLayout;
use crate::tokenizer::Tokenizer;
use crate::weights::{Weights, validate_header, weight_files};

/// How to load.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    /// Compute dtype (f32 is fastest on the CPU).
    pub dtype: Dtype,
    /// Linear weight layout.
    pub layout: LinearLayout,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            dtype: Dtype::Float32,
            layout: LinearLayout::DEFAULT,
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
}

/// Loads `dir`; `progress(done, total)` is called per weight file.
pub fn load(
    dir: &Path,
    opts: LoadOptions,
    progress: impl FnMut(usize, usize),
) -> Result<LoadedModel> {
    // robust2: refuse FIFOs, devices, dangling links and git-lfs pointers before any open.
    crate::files::check_model_folder(dir)?;
    let config = ModelConfig::load(dir)?;
    let family = lookup(&config)?;
    let generation_config = GenerationConfig::load(dir)?;
    let tokenizer = Tokenizer::load(dir, &config, &generation_config)?;
    let mut weights = Weights::load(dir, opts.dtype, progress)?;
    let info = ModelInfo::from_parts(
        family.name,
        &config,
        weights.all_names(),
        weights.parameter_count(),
        weights.source_dtypes().clone(),
    );
    let model = (family.build)(&config, &mut weights, opts.layout)?;
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
    /// Elements over all tensors (MTP tensors included).
    pub parameter_count: usize,
    /// Tensor counts by stored dtype.
    pub dtypes: BTreeMap<String, usize>,
    /// True when the checkpoint carries MTP head tensors.
    pub mtp_head: bool,
    /// MTP layers declared in config.json.
    pub mtp_layers_declared: usize,
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
    fn from_parts<'a>(
        family: &str,
        c: &ModelConfig,
        names: impl Iterator<Item = &'a str>,
        parameter_count: usize,
        dtypes: BTreeMap<String, usize>,
    ) -> ModelInfo {
        let n = c.num_hidden_layers;
        let eh = format!("model.layers.{n}.eh_proj");
        let mtp_head = names.into_iter().any(|name| {
            name.starts_with("mtp.fc.")
                || name.starts_with(&eh)
                || name.starts_with("model.mtp_layers.0.input_proj")
        });
        ModelInfo {
            family: family.to_owned(),
            architecture: c.architecture.clone(),
            model_type: c.model_type.clone(),
            parameter_count,
            dtypes,
            mtp_head,
            mtp_layers_declared: c.mtp_layers,
            context_length: c.max_position_embeddings,
            layers: n,
            hidden_size: c.hidden_size,
            vocab_size: c.vocab_size,
        }
    }
}

/// Reads `info` from config.json and the validated safetensors headers (no weights loaded).
pub fn inspect(dir: &Path) -> Result<ModelInfo> {
    // robust2: refuse FIFOs, devices, dangling links and git-lfs pointers before any open.
    crate::files::check_model_folder(dir)?;
    let config = ModelConfig::load(dir)?;
    let family = lookup(&config)?;
    let mut names = Vec::new();
    let mut count = 0usize;
    let mut dtypes = BTreeMap::new();
    for f in weight_files(dir)? {
        for (name, e) in validate_header(&f)? {
            count += e.shape.iter().product::<usize>();
            *dtypes.entry(e.dtype).or_insert(0) += 1;
            names.push(name);
        }
    }
    Ok(ModelInfo::from_parts(
        family.name,
        &config,
        names.iter().map(String::as_str),
        count,
        dtypes,
    ))
}
