//! `mtp-runner quantize`: writes an MLX affine-quantized copy of a model folder.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use mlx_tensor::{Array, Dtype};
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{Error, Result, read_json};
use crate::files::Presence;
use crate::out_dir::StagedDir;
use crate::quant::{QuantConfig, QuantParams, QuantizedTensor};
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

/// True for the matrices of an MTP head, in any of the layouts [`crate::models::mtp`] knows.
///
/// The prefixes are those of `MtpLayout::prefix`, written out because
/// `quant` sits below `mtp` in the module graph (`mtp` → `weights` → `quant`).
pub(crate) fn is_mtp_module(path: &str, num_hidden_layers: usize) -> bool {
    path.starts_with("mtp.")
        || path.starts_with("model.mtp_layers.")
        || path.starts_with(&format!("model.layers.{num_hidden_layers}."))
}

/// Quantizes every linear and embedding matrix of the model in `src` into a
/// new folder `dst`: `model.safetensors` (norms and other vectors unchanged),
/// `config.json` with the `quantization` block (and its `quantization_config`
/// copy), the tokenizer and generation files, and a README.md saying how it
/// was made. `dst` must not exist or be empty.
///
/// The folder is staged: claimed before the long work, filled in a hidden
/// sibling and renamed into place only when complete, so
/// it is never seen without its last files and two runs into one `dst`
/// cannot both succeed.
pub fn quantize_folder(src: &Path, dst: &Path, opts: &QuantizeOptions) -> Result<QuantizeReport> {
    quantize_folder_cancellable(src, dst, opts, &AtomicBool::new(false))
}

/// [`quantize_folder`], checking `cancel` between tensors: once it is set the
/// staging folder is removed and [`Error::Interrupted`] returned.
// Long: the writer's steps in order (read, quantize, write, config, README).
pub fn quantize_folder_cancellable(
    src: &Path,
    dst: &Path,
    opts: &QuantizeOptions,
    cancel: &AtomicBool,
) -> Result<QuantizeReport> {
    opts.validate()?;
    crate::files::check_model_folder(src)?;
    let config_path = src.join("config.json");
    let config = ModelConfig::load(src)?;
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
    // Every source file is checked before the long work: a file that cannot
    // be read fails now, not after minutes of quantizing.
    let files = weight_files(src)?;
    let mut source_bytes = 0;
    for file in &files {
        validate_header(file)?;
        readable(file)?;
        source_bytes += file_len(file)?;
    }
    let copied: Vec<&str> = COPIED
        .into_iter()
        .filter(|f| matches!(crate::files::regular(&src.join(f)), Ok(Presence::File(_))))
        .collect();
    for f in &copied {
        readable(&src.join(f))?;
    }
    let staged = StagedDir::claim(dst)?;
    let interrupted = || Error::Interrupted {
        what: format!(
            "quantizing stopped; the partial output was removed and {} was not created",
            dst.display()
        ),
    };

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
        source_bytes,
        written_bytes: 0,
    };
    for file in &files {
        for (name, a) in mlx_tensor::io::load_safetensors(file)?.tensors {
            if cancel.load(Ordering::Relaxed) {
                return Err(interrupted());
            }
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
            let (scales, biases) = (q.scales.as_type(source)?, q.biases.as_type(source)?);
            // Evaluated here, one matrix at a time, so the work is spread
            // between the cancel checks instead of all happening in the save.
            mlx_tensor::eval(&[q.weight.clone(), scales.clone(), biases.clone()])?;
            // Scales and biases in the source dtype, as mlx-lm stores them.
            out.push((name, q.weight));
            out.push((format!("{module}.scales"), scales));
            out.push((format!("{module}.biases"), biases));
            report.quantized.push(module.to_owned());
        }
    }
    report.quantized.sort();
    report.kept.sort();
    if cancel.load(Ordering::Relaxed) {
        return Err(interrupted());
    }

    let dir = staged.path();
    let weights_path = dir.join("model.safetensors");
    let data_bytes: usize = out.iter().map(|(_, a)| a.nbytes()).sum();
    mlx_tensor::io::save_safetensors(&weights_path, out.iter().map(|(n, a)| (n.as_str(), a)))
        .map_err(|e| Error::Write {
            path: weights_path.clone(),
            source: std::io::Error::other(format!(
                "{e} (the disk is probably full; nothing was left behind)"
            )),
        })?;
    report.written_bytes = check_saved(&weights_path, data_bytes)?;

    let block = quant.to_json();
    raw["quantization"] = block.clone();
    raw["quantization_config"] = block;
    let text = serde_json::to_string_pretty(&raw).expect("JSON values serialise");
    staged.write(&dir.join("config.json"), (text + "\n").as_bytes())?;

    for f in copied {
        staged.copy(&src.join(f), &dir.join(f))?;
        report.copied.push(f.to_owned());
    }
    staged.write(
        &dir.join("README.md"),
        readme(src, opts, &report).as_bytes(),
    )?;
    if cancel.load(Ordering::Relaxed) {
        return Err(interrupted());
    }
    staged.commit()?;
    tracing::info!(
        quantized = report.quantized.len(),
        kept = report.kept.len(),
        bytes = report.written_bytes,
        "quantized checkpoint written"
    );
    Ok(report)
}

/// Opens `path` and reads one byte, so an unreadable file (permissions, an
/// I/O error) fails before the long work rather than in the middle of it.
fn readable(path: &Path) -> Result<()> {
    let io = |source| Error::Io {
        path: path.to_owned(),
        source,
    };
    let mut f = crate::files::open_regular(path)?;
    let mut byte = [0u8; 1];
    std::io::Read::read(&mut f, &mut byte).map_err(io)?;
    Ok(())
}

/// The length of a safetensors file MLX just wrote, after checking that all
/// of it reached the file: MLX's writer does not report a short write (a full
/// disk), so the size is compared with the header and the `data` bytes.
fn check_saved(path: &Path, data: usize) -> Result<u64> {
    let short = |message: String| Error::Write {
        path: path.to_owned(),
        source: std::io::Error::other(message),
    };
    let len = std::fs::metadata(path)
        .map_err(|source| Error::Write {
            path: path.to_owned(),
            source,
        })?
        .len();
    let mut n = [0u8; 8];
    let header = std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut n))
        .map(|()| u64::from_le_bytes(n));
    let expected = match header {
        Ok(h) => 8 + h + data as u64,
        Err(_) => u64::MAX,
    };
    if len != expected {
        return Err(short(format!(
            "only {len} bytes reached the file, {} expected: the disk is probably full (free \
             some space and retry; nothing was left behind)",
            if expected == u64::MAX {
                "more".to_owned()
            } else {
                expected.to_string()
            }
        )));
    }
    Ok(len)
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
