//! `mtp-runner quantize`: writes an MLX affine-quantized copy of a model folder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mlx_tensor::{Array, Dtype};
use serde_json::Value;

use super::{QuantConfig, QuantParams, QuantizedTensor};
use crate::error::{Error, Result, read_json};
use crate::weights::{TensorLayout, validate_header, weight_files};

/// Files copied verbatim when present (tokenizer, chat template, defaults).
const COPIED: [&str; 9] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
];

/// What `quantize` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantizeOptions {
    /// Bits per weight: 4 or 8.
    pub bits: u32,
    /// Inputs per scale/bias: 32, 64 or 128.
    pub group_size: u32,
    /// Keep the MTP head's matrices unquantized (in the source dtype), marked
    /// `false` in the config, so drafts are not damaged by quantization.
    pub keep_mtp_precision: bool,
}

impl Default for QuantizeOptions {
    /// mlx-lm's defaults: 4 bits, groups of 64.
    fn default() -> Self {
        QuantizeOptions {
            bits: 4,
            group_size: 64,
            keep_mtp_precision: false,
        }
    }
}

impl QuantizeOptions {
    /// Checks the options on their own.
    pub fn validate(&self) -> Result<()> {
        if !matches!(self.bits, 4 | 8) {
            return Err(Error::InvalidOption {
                option: "--bits",
                message: format!("{} is not supported; use 4 or 8", self.bits),
            });
        }
        if !matches!(self.group_size, 32 | 64 | 128) {
            return Err(Error::InvalidOption {
                option: "--group-size",
                message: format!("{} is not supported; use 32, 64 or 128", self.group_size),
            });
        }
        Ok(())
    }

    fn params(&self) -> QuantParams {
        QuantParams {
            group_size: self.group_size,
            bits: self.bits,
        }
    }
}

/// What `quantize` wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeReport {
    /// Modules stored quantized (module paths, sorted).
    pub quantized: Vec<String>,
    /// Matrices kept in the source dtype (module paths, sorted).
    pub kept: Vec<String>,
    /// Files copied from the source folder.
    pub copied: Vec<String>,
    /// Vision-tower tensors left out (a text-only copy of a multimodal checkpoint).
    pub skipped: usize,
    /// Bytes of the source weights.
    pub source_bytes: u64,
    /// Bytes of the written model.safetensors.
    pub written_bytes: u64,
}

/// True for the matrices of an MTP head, in any of the layouts [`crate::mtp`] knows.
pub(crate) fn is_mtp_module(path: &str, num_hidden_layers: usize) -> bool {
    crate::mtp::MtpLayout::owns(path, num_hidden_layers)
}

/// Quantizes every linear and embedding matrix of the model in `src` into a
/// new folder `dst`: `model.safetensors` (norms and other vectors unchanged),
/// `config.json` with the `quantization` block (and its `quantization_config`
/// copy), the tokenizer and generation files, and a README.md saying how it
/// was made. `dst` must not exist or be empty.
// Long: the writer's steps in order (read, quantize, write, config, README).
pub fn quantize_folder(src: &Path, dst: &Path, opts: &QuantizeOptions) -> Result<QuantizeReport> {
    opts.validate()?;
    let config_path = src.join("config.json");
    let (_, config) = crate::model::resolve(src)?;
    let mut raw: Value = read_json(&config_path)?;
    if QuantConfig::from_config(&raw, &config_path)?.is_some() {
        return Err(Error::InvalidOption {
            option: "--model",
            message: format!(
                "{} is already quantized (config.json has a quantization block); quantize the \
                 unquantized model instead",
                src.display()
            ),
        });
    }
    let h = config.hidden_size;
    if !h.is_multiple_of(opts.group_size as usize) {
        return Err(Error::InvalidOption {
            option: "--group-size",
            message: format!(
                "hidden_size {h} is not a multiple of {}; pick a group size that divides it (32, 64 or 128)",
                opts.group_size
            ),
        });
    }
    check_out_dir(dst)?;

    let mut quant = QuantConfig {
        default: opts.params(),
        overrides: BTreeMap::new(),
    };
    let mut out: Vec<(String, Array)> = Vec::new();
    let mut report = QuantizeReport {
        quantized: Vec::new(),
        kept: Vec::new(),
        copied: Vec::new(),
        skipped: 0,
        source_bytes: 0,
        written_bytes: 0,
    };
    for file in weight_files(src)? {
        validate_header(&file)?;
        report.source_bytes += file_len(&file)?;
        for (name, a) in mlx_tensor::io::load_safetensors(&file)?.tensors {
            if TensorLayout::skips(&name) {
                report.skipped += 1;
                continue;
            }
            if !a.dtype().is_float() {
                return Err(Error::TensorDtype {
                    name,
                    dtype: a.dtype().safetensors_name().to_owned(),
                });
            }
            let module = name
                .strip_suffix(".weight")
                .filter(|_| a.ndim() == 2)
                .map(str::to_owned);
            let Some(module) = module else {
                out.push((name, a));
                continue;
            };
            let module = module.as_str();
            if config.tie_word_embeddings && module == "lm_head" {
                // mlx-lm drops the redundant copy of a tied head; so do we.
                continue;
            }
            if opts.keep_mtp_precision && is_mtp_module(module, config.num_hidden_layers) {
                quant.overrides.insert(module.to_owned(), None);
                report.kept.push(module.to_owned());
                out.push((name, a));
                continue;
            }
            let input = a.dim(1) as usize;
            if !input.is_multiple_of(opts.group_size as usize) {
                return Err(Error::InvalidOption {
                    option: "--group-size",
                    message: format!(
                        "`{name}` has {input} inputs, not a multiple of {}; pick a group size that divides it",
                        opts.group_size
                    ),
                });
            }
            let source = a.dtype();
            let q = QuantizedTensor::quantize(&a.as_type(Dtype::Float32)?, opts.params())?;
            // Scales and biases in the source dtype, as mlx-lm stores them.
            out.push((name, q.weight));
            out.push((format!("{module}.scales"), q.scales.as_type(source)?));
            out.push((format!("{module}.biases"), q.biases.as_type(source)?));
            report.quantized.push(module.to_owned());
        }
    }
    report.quantized.sort();
    report.kept.sort();

    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| Error::Io { path, source }
    };
    std::fs::create_dir_all(dst).map_err(io(dst))?;
    let weights_path = dst.join("model.safetensors");
    mlx_tensor::io::save_safetensors(&weights_path, out.iter().map(|(n, a)| (n.as_str(), a)))?;
    report.written_bytes = file_len(&weights_path)?;

    let block = quant.to_json();
    raw["quantization"] = block.clone();
    raw["quantization_config"] = block;
    let text = serde_json::to_string_pretty(&raw).expect("JSON values serialise");
    let p = dst.join("config.json");
    std::fs::write(&p, text + "\n").map_err(io(&p))?;

    for f in COPIED {
        let from = src.join(f);
        if from.is_file() {
            let to = dst.join(f);
            std::fs::copy(&from, &to).map_err(io(&from))?;
            report.copied.push(f.to_owned());
        }
    }
    let p = dst.join("README.md");
    std::fs::write(&p, readme(src, opts, &report)).map_err(io(&p))?;
    tracing::info!(
        quantized = report.quantized.len(),
        kept = report.kept.len(),
        bytes = report.written_bytes,
        "quantized checkpoint written"
    );
    Ok(report)
}

/// `dst` must be absent or an empty folder, so nothing is overwritten.
fn check_out_dir(dst: &Path) -> Result<()> {
    if !dst.exists() {
        return Ok(());
    }
    let bad = |message: String| Error::InvalidOption {
        option: "--out",
        message,
    };
    if !dst.is_dir() {
        return Err(bad(format!(
            "{} exists and is not a folder; pass a new folder path",
            dst.display()
        )));
    }
    let mut entries = std::fs::read_dir(dst).map_err(|source| Error::Io {
        path: dst.to_owned(),
        source,
    })?;
    if entries.next().is_some() {
        return Err(bad(format!(
            "{} exists and is not empty; pass a new folder or empty it first",
            dst.display()
        )));
    }
    Ok(())
}

fn file_len(path: &Path) -> Result<u64> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|source| Error::Io {
            path: PathBuf::from(path),
            source,
        })
}

/// The generated README.md: where the checkpoint came from and how it was quantized.
fn readme(src: &Path, opts: &QuantizeOptions, r: &QuantizeReport) -> String {
    let name = src
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| src.display().to_string());
    let mtp = if opts.keep_mtp_precision {
        format!(
            "The MTP head's {} matrices are kept unquantized (`--keep-mtp-precision`; marked `false` in the quantization block).",
            r.kept.len()
        )
    } else {
        "The MTP head, if any, is quantized like the trunk.".to_owned()
    };
    format!(
        "# {name} ({bits}-bit)\n\n\
         Quantized by `mtp-runner quantize --bits {bits} --group-size {g}{flag}` from `{name}`: \
         MLX affine quantization, {bits} bits, group size {g}, for {n} linear and embedding matrices; \
         norms are unchanged. {mtp}\n\n\
         The layout is mlx-lm's (`weight` uint32-packed, `scales`, `biases`; `quantization` in \
         config.json), so the folder loads in mtp-runner and in mlx-lm.\n",
        bits = opts.bits,
        g = opts.group_size,
        flag = if opts.keep_mtp_precision {
            " --keep-mtp-precision"
        } else {
            ""
        },
        n = r.quantized.len(),
    )
}
