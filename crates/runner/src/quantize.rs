//! `mtp-runner quantize`: writes an MLX-quantized copy of a model folder
//! (affine, or one of MLX's floating-point modes: mxfp4, mxfp8, nvfp4).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use mlx_tensor::ops::QuantMode;
use mlx_tensor::{Array, Dtype};
use serde_json::Value;

use crate::config::{GenerationConfig, ModelConfig};
use crate::error::{Error, Result, read_json};
use crate::files::Presence;
use crate::fp8::Fp8Config;
use crate::out_dir::StagedDir;
use crate::quant::{QuantConfig, QuantParams, QuantizedTensor};
use crate::tokenizer::Tokenizer;
use crate::weights::{TensorLayout, check_finite, validate_header, weight_files};

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
    /// How codes and scales decode: affine (codes, scales and biases in the
    /// source dtype) or a floating-point mode (e2m1 / e4m3 codes, uint8
    /// scales, no biases), whose bits and group size are fixed.
    pub mode: QuantMode,
    /// Bits per weight: 4 or 8 (affine); the mode's own otherwise.
    pub bits: u32,
    /// Inputs per scale/bias: 32, 64 or 128 (affine); the mode's own otherwise.
    pub group_size: u32,
    /// Keep the MTP head's matrices unquantized (in the source dtype), marked
    /// `false` in the config, so drafts are not damaged by quantization.
    pub keep_mtp_precision: bool,
}

impl Default for QuantizeOptions {
    /// mlx-lm's defaults: affine, 4 bits, groups of 64.
    fn default() -> Self {
        QuantizeOptions::for_mode(QuantMode::Affine)
    }
}

impl QuantizeOptions {
    /// The defaults of `mode` (mlx-lm's `convert --q-mode`): affine at 4
    /// bits in groups of 64; mxfp4 4 / 32, mxfp8 8 / 32, nvfp4 4 / 16.
    pub fn for_mode(mode: QuantMode) -> QuantizeOptions {
        let (group_size, bits) = mode.fixed().unwrap_or((64, 4));
        QuantizeOptions {
            mode,
            bits: bits as u32,
            group_size: group_size as u32,
            keep_mtp_precision: false,
        }
    }

    /// Checks the options on their own.
    pub fn validate(&self) -> Result<()> {
        if let Some((g, b)) = self.mode.fixed() {
            let fixed = |option, value: u32, fixed: i32, what| {
                if value == fixed as u32 {
                    return Ok(());
                }
                Err(Error::InvalidOption {
                    option,
                    message: format!(
                        "{value} does not fit --mode {}, whose {what} is always {fixed}; \
                         leave it out",
                        self.mode.name()
                    ),
                })
            };
            fixed("--bits", self.bits, b, "bit width")?;
            return fixed("--group-size", self.group_size, g, "group size");
        }
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
            mode: self.mode,
        }
    }
}

/// What `quantize` wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizeReport {
    /// Modules stored quantized (module paths, sorted).
    pub quantized: Vec<String>,
    /// The quantized modules packed with other parameters than asked (MoE
    /// routers: 8 bits, group 64), as `(module, bits, group size)`, sorted.
    pub other_precision: Vec<(String, u32, u32)>,
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

/// Quantizes every linear and embedding matrix and every MoE expert stack
/// (see `plan`) of the model in `src` into a new folder `dst`:
/// `model.safetensors` (norms and other vectors unchanged),
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
    // The files it copies are read as the loader reads them: a source whose
    // generation_config.json or tokenizer would not load is refused now, not
    // written into an output that would not load either. A folder of weights
    // alone (no tokenizer.json, to be added later) is quantized as before.
    let generation_config = GenerationConfig::load(src)?;
    if matches!(
        crate::files::regular(&src.join("tokenizer.json"))?,
        Presence::File(_)
    ) {
        Tokenizer::load(src, &config, &generation_config)?;
    }
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
                "hidden_size {h} is not a multiple of {}; {}",
                opts.group_size,
                match opts.mode.fixed() {
                    None => "pick a group size that divides it (32, 64 or 128)".to_owned(),
                    Some(_) => format!(
                        "--mode {} cannot quantize this model; use --mode affine",
                        opts.mode.name()
                    ),
                }
            ),
        });
    }
    // Every source file is checked before the long work: a file that cannot
    // be read fails now, not after minutes of quantizing.
    let files = weight_files(src)?;
    let fp8 = Fp8Config::from_config(&raw, &config_path)?;
    let mut headers = Vec::with_capacity(files.len());
    let mut source_bytes = 0;
    for file in &files {
        headers.push((file.clone(), validate_header(file)?));
        readable(file)?;
        source_bytes += file_len(file)?;
    }
    crate::fp8::check_headers(&crate::weights::header_index(&headers), fp8)?;
    // An fp8 source is dequantized to bf16 (its compute dtype) as it is read.
    let mut scales = match fp8 {
        Some(_) => crate::fp8::collect_scales(&files)?,
        None => HashMap::new(),
    };
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
        other_precision: Vec::new(),
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
            if fp8.is_some() && crate::fp8::is_scale(&name) {
                continue;
            }
            let a = match (fp8, scales.remove(&name)) {
                (Some(config), Some(scale)) => {
                    crate::fp8::dequantize(&a, &scale, config)?.as_type(Dtype::Bfloat16)?
                }
                _ => a,
            };
            if !a.dtype().is_float() {
                return Err(Error::TensorDtype {
                    name,
                    dtype: a.dtype().safetensors_name().to_owned(),
                });
            }
            // A NaN or infinity would be packed into codes and scales that
            // look valid: refused, naming the tensor, as the loader refuses
            // it. One tensor at a time, as it is packed: the file's tensors
            // are not all held at once.
            let pair = (name, a);
            check_finite(
                std::slice::from_ref(&pair),
                std::slice::from_ref(&pair.1),
                pair.1.dtype(),
            )?;
            let (name, a) = pair;
            match plan(&name, a, &config, opts)? {
                Plan::Copy(a) => out.push((name, a)),
                Plan::Drop => {}
                Plan::Keep(a) => {
                    let module = name.strip_suffix(".weight").map(str::to_owned);
                    // A fused hub expert tensor has no module path to mark;
                    // its loader reads it dense whatever the block says.
                    if let Some(m) = &module {
                        quant.overrides.insert(m.clone(), None);
                    }
                    report.kept.push(module.unwrap_or_else(|| name.clone()));
                    out.push((name, a));
                }
                Plan::Pack(parts) => {
                    for (module, w, params) in parts {
                        if params != opts.params() {
                            quant.overrides.insert(module.clone(), Some(params));
                            let (b, g) = (params.bits, params.group_size);
                            report.other_precision.push((module.clone(), b, g));
                        }
                        out.extend(pack(&module, &w, params)?);
                        report.quantized.push(module);
                    }
                }
            }
        }
    }
    report.quantized.sort();
    report.other_precision.sort();
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

/// What the writer does with one source tensor.
enum Plan {
    /// Written as stored: norms, biases, convolutions, other vectors.
    Copy(Array),
    /// Left out: the redundant `lm_head` of a tied model (mlx-lm drops it too).
    Drop,
    /// An MTP head matrix kept in the source dtype (`--keep-mtp-precision`).
    Keep(Array),
    /// Matrices (or `[E, out, in]` expert stacks) to pack: module path, the
    /// dense tensor, its parameters. One fused hub `gate_up_proj` gives two.
    Pack(Vec<(String, Array, QuantParams)>),
}

/// mlx-lm's Qwen MoE predicate (`quant_predicate` of qwen3_moe, qwen3_next,
/// qwen3_5): the router and the shared-expert gate are quantized at 8 bits
/// in groups of 64 whatever the model's bits, since a 4-bit router flips
/// expert choices. GLM-4-MoE's router is not a linear in mlx-lm (it is
/// never quantized there), so it is kept dense.
fn router_params(module: &str, model_type: &str) -> Option<Option<QuantParams>> {
    if !(module.ends_with("mlp.gate") || module.ends_with("shared_expert_gate")) {
        return None;
    }
    Some((model_type != "glm4_moe").then_some(QuantParams::affine(64, 8)))
}

/// Chooses what happens to tensor `name`.
///
/// Expert stacks are written in mlx-lm's `switch_mlp` layout (what
/// mlx-community ships, and what both our loader and mlx-lm read quantized):
/// the hub's fused `experts.gate_up_proj` `[E, 2I, H]` is split into
/// `switch_mlp.gate_proj` and `switch_mlp.up_proj` `[E, I, H]`, and
/// `experts.down_proj` becomes `switch_mlp.down_proj`; each expert is
/// quantized along its input axis (MLX's `quantize` packs the last axis of
/// any leading batch).
fn plan(name: &str, a: Array, config: &ModelConfig, opts: &QuantizeOptions) -> Result<Plan> {
    let fused = name
        .strip_suffix("experts.gate_up_proj")
        .or_else(|| name.strip_suffix("experts.down_proj"))
        .filter(|_| a.ndim() == 3);
    let module = match fused {
        Some(_) => None,
        None => name
            .strip_suffix(".weight")
            .filter(|m| a.ndim() == 2 || (a.ndim() == 3 && m.contains(".switch_mlp."))),
    };
    let mtp = |m: &str| opts.keep_mtp_precision && is_mtp_module(m, config.num_hidden_layers);
    let params = opts.params();
    if let Some(mlp) = fused {
        if mtp(name) {
            return Ok(Plan::Keep(a));
        }
        let check = |w: &Array| group_divides(name, w, params.group_size);
        if name.ends_with("down_proj") {
            check(&a)?;
            return Ok(Plan::Pack(vec![(
                format!("{mlp}switch_mlp.down_proj"),
                a,
                params,
            )]));
        }
        let i = a.dim(1) / 2;
        check(&a)?;
        let (gate, up) = (a.slice_axis(1, 0, i)?, a.slice_axis(1, i, 2 * i)?);
        return Ok(Plan::Pack(vec![
            (format!("{mlp}switch_mlp.gate_proj"), gate, params),
            (format!("{mlp}switch_mlp.up_proj"), up, params),
        ]));
    }
    let Some(module) = module else {
        return Ok(Plan::Copy(a));
    };
    if config.tie_word_embeddings && module == "lm_head" {
        return Ok(Plan::Drop);
    }
    if mtp(module) {
        return Ok(Plan::Keep(a));
    }
    let params = match router_params(module, &config.model_type) {
        // A router whose width 64 does not divide stays dense, as in mlx-lm.
        Some(Some(p)) if (a.dim(-1) as usize).is_multiple_of(p.group_size as usize) => p,
        Some(_) => return Ok(Plan::Keep(a)),
        None => {
            group_divides(name, &a, params.group_size)?;
            params
        }
    };
    Ok(Plan::Pack(vec![(module.to_owned(), a, params)]))
}

/// Errs unless `group` divides the input (last) axis of `w`, stored as `name`.
fn group_divides(name: &str, w: &Array, group: u32) -> Result<()> {
    let input = w.dim(-1) as usize;
    if input.is_multiple_of(group as usize) {
        return Ok(());
    }
    Err(Error::InvalidOption {
        option: "--group-size",
        message: format!(
            "`{name}` has {input} inputs, not a multiple of {group}; pick a group size that divides it"
        ),
    })
}

/// Quantizes `w` (`[out, in]` or `[E, out, in]`) as module `module`, as
/// mlx-lm stores it: the packed `weight`, and in affine mode `scales` and
/// `biases` in the source dtype; in a floating-point mode the uint8
/// `scales` alone.
fn pack(module: &str, w: &Array, params: QuantParams) -> Result<Vec<(String, Array)>> {
    let source = w.dtype();
    let q = QuantizedTensor::quantize(&w.as_type(Dtype::Float32)?, params)?;
    let mut parts = vec![(format!("{module}.weight"), q.weight)];
    match q.biases {
        Some(biases) => {
            parts.push((format!("{module}.scales"), q.scales.as_type(source)?));
            parts.push((format!("{module}.biases"), biases.as_type(source)?));
        }
        None => parts.push((format!("{module}.scales"), q.scales)),
    }
    // Evaluated here, one matrix at a time, so the work is spread between
    // the cancel checks instead of all happening in the save.
    let arrays: Vec<Array> = parts.iter().map(|(_, a)| a.clone()).collect();
    mlx_tensor::eval(&arrays)?;
    Ok(parts)
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
    let (command, kind, stored) = match opts.mode.fixed() {
        None => (
            format!("--bits {} --group-size {}", opts.bits, opts.group_size),
            "affine".to_owned(),
            "`weight` uint32-packed, `scales`, `biases`",
        ),
        Some(_) => (
            format!("--mode {}", opts.mode.name()),
            opts.mode.name().to_owned(),
            "`weight` uint32-packed, uint8 `scales`, no biases",
        ),
    };
    format!(
        "# {name} ({kind}, {bits}-bit)\n\n\
         Quantized by `mtp-runner quantize {command}{flag}` from `{name}`: \
         MLX {kind} quantization, {bits} bits, group size {g}, for {n} linear and embedding matrices \
         and MoE expert stacks (MoE routers affine at 8 bits, group 64, as mlx-lm quantizes them); \
         norms are unchanged. {mtp}\n\n\
         The layout is mlx-lm's ({stored}; `quantization` in \
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
