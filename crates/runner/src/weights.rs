//! Safetensors checkpoints: header validation, (sharded) loading, typed lookup.
//!
//! Every file's header is checked here before MLX sees it, so a corrupt or
//! lying header becomes an error naming the file instead of a crash or an
//! allocation of whatever size the header claims.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};

use mlx_tensor::{Array, Dtype};
use serde::Deserialize;

use crate::error::{Error, Result, read_json};
use crate::fp8::{FP8_DTYPE, Fp8Config};
use crate::quant::{QuantConfig, QuantizedTensor};

mod layout;
mod vars;

pub(crate) use layout::TensorLayout;
pub(crate) use vars::Vars;

/// The largest header accepted (the same limit as the `safetensors` crate).
const MAX_HEADER: u64 = 100_000_000;

/// A header entry: what one file says about one tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorEntry {
    /// Safetensors dtype name (`BF16`, `F32`, ...).
    pub dtype: String,
    /// Shape.
    pub shape: Vec<usize>,
}

/// Validates one file's header against the file length; returns its tensors.
pub fn validate_header(path: &Path) -> Result<BTreeMap<String, TensorEntry>> {
    let corrupt = |message: String| Error::Safetensors {
        path: path.to_owned(),
        message,
    };
    let io = |source| Error::Io {
        path: path.to_owned(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let len = file.metadata().map_err(io)?.len();
    let mut n_bytes = [0u8; 8];
    if len < 8 {
        return Err(corrupt(format!(
            "file is {len} bytes, shorter than the 8-byte header length"
        )));
    }
    file.read_exact(&mut n_bytes).map_err(io)?;
    let n = u64::from_le_bytes(n_bytes);
    if n > MAX_HEADER || n > len - 8 {
        return Err(corrupt(format!(
            "header claims {n} bytes but the file has {} after the length field",
            len - 8
        )));
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header).map_err(io)?;
    let text =
        std::str::from_utf8(&header).map_err(|e| corrupt(format!("header is not UTF-8: {e}")))?;
    let data_len = len - 8 - n;
    check_entries(text, data_len).map_err(corrupt)?;
    let meta: safetensors::tensor::Metadata =
        serde_json::from_str(text).map_err(|e| corrupt(format!("header: {e}")))?;
    let mut out = BTreeMap::new();
    let mut end = 0usize;
    for (name, info) in meta.tensors() {
        end = end.max(info.data_offsets.1);
        out.insert(
            name,
            TensorEntry {
                dtype: format!("{:?}", info.dtype),
                shape: info.shape.clone(),
            },
        );
    }
    if end as u64 != data_len {
        return Err(corrupt(format!(
            "header describes {end} data bytes but the file holds {data_len}"
        )));
    }
    Ok(out)
}

/// One header entry as written, before any check.
#[derive(Debug, Deserialize)]
struct RawEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: (usize, usize),
}

/// Checks every entry of a header on its own and then their byte ranges
/// together, so a bad entry is named: the `safetensors` crate says only
/// "invalid shape, data type, or offset", and names the tensor after a bad
/// offset rather than the one that has it.
fn check_entries(header: &str, data_len: u64) -> std::result::Result<(), String> {
    let entries: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(header).map_err(|e| format!("header: {e}"))?;
    let mut ranges = Vec::with_capacity(entries.len());
    for (name, v) in entries {
        if name == "__metadata__" {
            continue;
        }
        let e: RawEntry = serde_json::from_value(v).map_err(|e| {
            format!(
                "header entry of tensor `{name}`: {e} (an entry is {{\"dtype\": \"BF16\", \
                 \"shape\": [..], \"data_offsets\": [begin, end]}})"
            )
        })?;
        let dtype: safetensors::Dtype =
            serde_json::from_value(e.dtype.clone().into()).map_err(|_| {
                format!(
                    "tensor `{name}`: dtype `{}` is not a safetensors dtype",
                    e.dtype
                )
            })?;
        let (begin, end) = e.data_offsets;
        if begin > end || end as u64 > data_len {
            return Err(format!(
                "tensor `{name}`: data_offsets [{begin}, {end}] do not lie within the \
                 {data_len} data bytes (the file is truncated or the header is wrong)"
            ));
        }
        let bits = e
            .shape
            .iter()
            .try_fold(dtype.bitsize(), |a, &d| a.checked_mul(d));
        if bits.is_none_or(|b| b % 8 != 0 || b / 8 != end - begin) {
            return Err(format!(
                "tensor `{name}`: shape {:?} of {} does not fill its {} bytes \
                 (data_offsets [{begin}, {end}])",
                e.shape,
                e.dtype,
                end - begin
            ));
        }
        ranges.push((begin, end, name));
    }
    ranges.sort();
    for pair in ranges.windows(2) {
        let ((_, a_end, a), (b_begin, _, b)) = (&pair[0], &pair[1]);
        if b_begin != a_end {
            let how = if b_begin < a_end {
                "overlaps"
            } else {
                "leaves a gap after"
            };
            return Err(format!(
                "tensor `{b}` (from byte {b_begin}) {how} tensor `{a}` (to byte {a_end})"
            ));
        }
    }
    if let Some((begin, _, name)) = ranges.first()
        && *begin != 0
    {
        return Err(format!(
            "the first tensor `{name}` starts at byte {begin}, not 0"
        ));
    }
    Ok(())
}

#[derive(Debug, Deserialize)]
struct Index {
    weight_map: BTreeMap<String, String>,
}

/// The safetensors files of a model folder, in load order.
pub fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let idx: Index = read_json(&index)?;
        let files: BTreeSet<&String> = idx.weight_map.values().collect();
        if files.is_empty() {
            return Err(Error::InvalidConfig {
                path: index,
                key: "weight_map",
                message: "lists no tensors; write the shard of every tensor, or delete the \
                          index and keep one model.safetensors"
                    .into(),
            });
        }
        for f in &files {
            if !is_plain_file_name(f) {
                return Err(Error::InvalidConfig {
                    path: index,
                    key: "weight_map",
                    message: format!(
                        "shard `{f}` is not a file name in the model folder; shards must sit \
                         beside the index (no `/`, `\\` or `..`)"
                    ),
                });
            }
        }
        let files: Vec<PathBuf> = files.into_iter().map(|f| dir.join(f)).collect();
        let single = dir.join("model.safetensors");
        if single.is_file() && !files.contains(&single) {
            // Two sets of weights. The index wins, as in vLLM (transformers
            // takes the single file, mlx-lm loads both): a folder re-sharded
            // in place keeps its old single file, never an index it lacked.
            tracing::warn!(
                index = %index.display(),
                ignored = %single.display(),
                "the folder holds both a shard index and model.safetensors: loading the \
                 index's shards; delete whichever is stale"
            );
        }
        for f in &files {
            if !f.is_file() {
                return Err(Error::MissingFile {
                    path: f.clone(),
                    hint: "listed in model.safetensors.index.json; download every shard",
                });
            }
        }
        return Ok(files);
    }
    let single = dir.join("model.safetensors");
    let found = safetensors_in(dir)?;
    if single.is_file() {
        // Shards beside the single file (a second, unindexed set) are not
        // read: said, as transformers and mlx-lm would read something else.
        let others: Vec<String> = found
            .iter()
            .filter(|f| **f != single)
            .map(|f| f.display().to_string())
            .collect();
        if !others.is_empty() {
            tracing::warn!(
                loaded = %single.display(),
                ignored = %others.join(", "),
                "the folder holds model.safetensors and other *.safetensors files without an \
                 index: loading model.safetensors alone; delete the stale files, or write a \
                 model.safetensors.index.json naming every shard"
            );
        }
        return Ok(vec![single]);
    }
    if found.is_empty() {
        return Err(Error::MissingFile {
            path: single,
            hint: "no *.safetensors weights in the model folder",
        });
    }
    Ok(found)
}

/// The `*.safetensors` files of `dir`, sorted.
fn safetensors_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|source| Error::Io {
            path: dir.to_owned(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    found.sort();
    Ok(found)
}

/// Fails on the first float tensor of `converted` that holds a NaN or an
/// infinity, naming it and saying whether the file or the conversion to
/// `dtype` (an f32 value beyond f16's range, say) put it there.
///
/// Checked once at load rather than per generated token: a damaged weight
/// would otherwise surface as NaN logits that sampling silently turns into
/// arbitrary tokens. One reduction per tensor, one host read per file.
///
/// Each probe makes a temporary the size of its tensor, so the probes are
/// evaluated in batches of at most 1/32 of the file's float bytes (or one
/// tensor, when a tensor is larger): the load's peak memory stays within a
/// few percent of the weights (`tests/it/moe.rs` holds a 4-bit MoE model to
/// 10%), where evaluating them all at once could double the float bytes.
pub(crate) fn check_finite(
    sources: &[(String, Array)],
    converted: &[Array],
    dtype: Dtype,
) -> Result<()> {
    // `x * 0` is 0 for every finite x and NaN for NaN and ±inf, so the sum is
    // finite exactly when every element is.
    let probe = |a: &Array| -> Result<Array> {
        let axes: Vec<i32> = (0..a.ndim() as i32).collect();
        let zero = Array::scalar(0.0, a.dtype())?;
        Ok(a.multiply(&zero)?
            .sum(&axes, false)?
            .as_type(Dtype::Float32)?)
    };
    let floats: Vec<usize> = (0..converted.len())
        .filter(|&i| converted[i].dtype().is_float())
        .collect();
    if floats.is_empty() {
        return Ok(());
    }
    let total: usize = floats.iter().map(|&i| converted[i].nbytes()).sum();
    let budget = (total / 32).max(1);
    let mut probes = Vec::with_capacity(floats.len());
    let (mut batch, mut bytes) = (Vec::new(), 0);
    for &i in &floats {
        batch.push(probe(&converted[i])?);
        bytes += converted[i].nbytes();
        if bytes >= budget {
            mlx_tensor::eval(&batch)?;
            probes.append(&mut batch);
            bytes = 0;
        }
    }
    probes.append(&mut batch);
    let sums: Vec<f32> = mlx_tensor::ops::stack(&probes, 0)?.to_vec()?;
    let Some(bad) = sums.iter().position(|s| !s.is_finite()) else {
        return Ok(());
    };
    let (name, source) = &sources[floats[bad]];
    let in_file = source.dtype() == dtype || !probe(source)?.item::<f32>()?.is_finite();
    Err(Error::NonFiniteWeights {
        name: name.clone(),
        cause: if in_file {
            "the file stores them: the checkpoint is damaged; download or convert it again".into()
        } else {
            format!(
                "converting from {} to {} overflowed; load with a wider dtype (--dtype f32)",
                source.dtype().safetensors_name(),
                dtype.safetensors_name()
            )
        },
    })
}

/// `matrix` under the leading axes `lead`.
fn stacked(lead: &[usize], matrix: [i32; 2]) -> Vec<i32> {
    lead.iter().map(|&d| d as i32).chain(matrix).collect()
}

/// True for a name that stays inside its folder when joined to it: an index
/// from the outside world must not make the loader read other files.
fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && !Path::new(name).is_absolute()
}

/// `dir/config.json` parsed, or `null` when there is none (a folder of
/// weights alone).
fn config_json(dir: &Path) -> Result<serde_json::Value> {
    let path = dir.join("config.json");
    if path.is_file() {
        read_json(&path)
    } else {
        Ok(serde_json::Value::Null)
    }
}

/// The tensors of a checkpoint, converted to the compute dtype, taken by name.
#[derive(Debug)]
pub struct Weights {
    tensors: HashMap<String, Array>,
    /// Tensors per source dtype name, for `info`.
    source_dtypes: BTreeMap<String, usize>,
    /// Stored shape per tensor name (all tensors, including ones never taken).
    shapes: BTreeMap<String, Vec<usize>>,
    dtype: Dtype,
    /// The `quantization` block of config.json, when the checkpoint is quantized.
    quant: Option<QuantConfig>,
    /// How the text model is wrapped (see [`TensorLayout`]).
    layout: TensorLayout,
    /// Tensors of towers a text model does not read (vision), left unloaded:
    /// `(count, elements)`.
    skipped: (usize, usize),
    /// Header placeholders instead of data: the load validates names and
    /// shapes only (`info`).
    dry: bool,
}

/// Every tensor of `files`' headers by name, for [`crate::fp8::check_headers`].
pub(crate) fn header_index(
    files: &[(PathBuf, BTreeMap<String, TensorEntry>)],
) -> crate::fp8::HeaderIndex<'_> {
    files
        .iter()
        .flat_map(|(_, e)| {
            e.iter()
                .map(|(n, e)| (n.as_str(), (e.dtype.as_str(), e.shape.as_slice())))
        })
        .collect()
}

/// The header entries of every file of `dir`, checking that no tensor is in two files.
fn headers(files: &[PathBuf]) -> Result<Vec<(PathBuf, BTreeMap<String, TensorEntry>)>> {
    let mut seen: HashMap<String, PathBuf> = HashMap::new();
    let mut out = Vec::with_capacity(files.len());
    for path in files {
        let entries = validate_header(path)?;
        for name in entries.keys() {
            if let Some(first) = seen.insert(name.clone(), path.clone()) {
                return Err(Error::DuplicateTensor {
                    name: name.clone(),
                    first,
                    second: path.clone(),
                });
            }
        }
        out.push((path.clone(), entries));
    }
    Ok(out)
}

impl Weights {
    /// Validates and loads every file of `dir`, converting floats to `dtype`.
    ///
    /// Packed `uint32` weights of a quantized checkpoint (see [`crate::quant`])
    /// are kept as they are; their scales and biases become `dtype` like every
    /// other float tensor. `progress(done, total)` is called after each file is
    /// materialised. A tensor stored in two shard files is an error naming both;
    /// vision-tower tensors ([`TensorLayout::skips`]) are not loaded.
    pub fn load(dir: &Path, dtype: Dtype, progress: impl FnMut(usize, usize)) -> Result<Weights> {
        Self::read(dir, dtype, false, progress)
    }

    /// The checkpoint's headers as zero-cost placeholders of the stored shapes
    /// and dtypes: a family's loader run over them checks every name and shape
    /// without reading tensor data (what `info` does).
    pub fn from_headers(dir: &Path, dtype: Dtype) -> Result<Weights> {
        Self::read(dir, dtype, true, |_, _| {})
    }

    // Long: headers, duplicates, layout and per-file loading are one pass over the files.
    fn read(
        dir: &Path,
        dtype: Dtype,
        dry: bool,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Weights> {
        let files = headers(&weight_files(dir)?)?;
        let fp8 = Fp8Config::from_config(&config_json(dir)?, &dir.join("config.json"))?;
        crate::fp8::check_headers(&header_index(&files), fp8)?;
        let mut scales = match fp8 {
            Some(_) if !dry => crate::fp8::collect_scales(
                &files.iter().map(|(p, _)| p.clone()).collect::<Vec<_>>(),
            )?,
            _ => HashMap::new(),
        };
        let layout =
            TensorLayout::detect(files.iter().flat_map(|(_, e)| e.keys().map(String::as_str)));
        let mut w = Weights {
            tensors: HashMap::new(),
            source_dtypes: BTreeMap::new(),
            shapes: BTreeMap::new(),
            dtype,
            quant: QuantConfig::load(dir)?,
            layout,
            skipped: (0, 0),
            dry,
        };
        let mut packed = Vec::new();
        let total = files.len();
        for (i, (path, entries)) in files.into_iter().enumerate() {
            for (name, e) in &entries {
                if TensorLayout::skips(name) {
                    w.skipped.0 += 1;
                    w.skipped.1 += e.shape.iter().product::<usize>();
                    continue;
                }
                if crate::fp8::is_scale(name) && fp8.is_some() {
                    // Part of its weight (checked with it above), not a tensor of its own.
                    continue;
                }
                if e.dtype == "U32" && name.ends_with(".weight") {
                    packed.push(name.clone());
                } else if e.dtype == "U8" && name.ends_with(".scales") {
                    // The scales of MLX's floating-point modes (e8m0 or e4m3),
                    // checked against the mode by `take_quantized_stack`.
                } else if !matches!(e.dtype.as_str(), "F32" | "F16" | "BF16" | FP8_DTYPE) {
                    return Err(Error::TensorDtype {
                        name: name.clone(),
                        dtype: e.dtype.clone(),
                    });
                }
                *w.source_dtypes.entry(e.dtype.clone()).or_default() += 1;
                w.shapes.insert(name.clone(), e.shape.clone());
            }
            if dry {
                for (name, e) in &entries {
                    if TensorLayout::skips(name) || (crate::fp8::is_scale(name) && fp8.is_some()) {
                        continue;
                    }
                    let stored = match e.dtype.as_str() {
                        "U32" => Dtype::Uint32,
                        "U8" => Dtype::Uint8,
                        _ => dtype,
                    };
                    let shape: Vec<i32> = e.shape.iter().map(|&d| d as i32).collect();
                    // A broadcast scalar: the shape and dtype, no buffer.
                    let a = Array::scalar(0.0, stored)?.broadcast_to(&shape)?;
                    w.tensors.insert(name.clone(), a);
                }
                continue;
            }
            let file = mlx_tensor::io::load_safetensors(&path)?;
            let mut converted = Vec::with_capacity(file.tensors.len());
            let mut sources = Vec::with_capacity(file.tensors.len());
            for (name, a) in file.tensors {
                if TensorLayout::skips(&name) || (crate::fp8::is_scale(&name) && fp8.is_some()) {
                    continue;
                }
                if let (Some(config), Some(scale)) = (fp8, scales.remove(&name)) {
                    // The codes times their blocks' scales, rounded once to
                    // `dtype`; the f32 product is not held after the file's
                    // evaluation (the check below rebuilds it on a failure).
                    let c = crate::fp8::dequantize(&a, &scale, config)?.as_type(dtype)?;
                    converted.push(c.clone());
                    sources.push((name.clone(), crate::fp8::dequantize(&a, &scale, config)?));
                    w.tensors.insert(name, c);
                    continue;
                }
                let c = if a.dtype() == dtype || !a.dtype().is_float() {
                    a.clone()
                } else {
                    a.as_type(dtype)?
                };
                converted.push(c.clone());
                sources.push((name.clone(), a));
                w.tensors.insert(name, c);
            }
            mlx_tensor::eval(&converted)?;
            check_finite(&sources, &converted, dtype)?;
            progress(i + 1, total);
        }
        w.check_packed(&packed)?;
        if w.skipped.0 > 0 {
            tracing::info!(
                tensors = w.skipped.0,
                params = w.skipped.1,
                "vision tower left out (text-only runner)"
            );
        }
        Ok(w)
    }

    /// Every `uint32` weight must be one third of a quantized triple.
    fn check_packed(&self, packed: &[String]) -> Result<()> {
        for name in packed {
            let module = name.strip_suffix(".weight").unwrap_or(name);
            if !self.tensors.contains_key(&format!("{module}.scales")) {
                return Err(Error::TensorDtype {
                    name: name.clone(),
                    dtype: "U32 without a matching `.scales` tensor (not an MLX quantized weight)"
                        .into(),
                });
            }
            if self.quant.is_none() {
                return Err(Error::InvalidConfig {
                    path: PathBuf::from("config.json"),
                    key: "quantization",
                    message: format!(
                        "absent, but `{name}` is a quantized weight; add the block mlx-lm wrote \
                         ({{\"group_size\": 64, \"bits\": 4}}) or re-quantize with `mtp-runner quantize`"
                    ),
                });
            }
        }
        Ok(())
    }

    /// Wraps in-memory tensors (tests and checkpoint writers).
    pub fn from_map(tensors: HashMap<String, Array>, dtype: Dtype) -> Weights {
        let shapes = tensors
            .iter()
            .map(|(k, v)| (k.clone(), v.shape().iter().map(|&d| d as usize).collect()))
            .collect();
        let mut source_dtypes = BTreeMap::new();
        for a in tensors.values() {
            *source_dtypes
                .entry(a.dtype().safetensors_name().to_owned())
                .or_default() += 1;
        }
        let layout = TensorLayout::detect(tensors.keys().map(String::as_str));
        Weights {
            tensors,
            source_dtypes,
            shapes,
            dtype,
            quant: None,
            layout,
            skipped: (0, 0),
            dry: false,
        }
    }

    /// Sets the quantization block (for in-memory quantized tensors).
    pub fn with_quantization(mut self, quant: Option<QuantConfig>) -> Weights {
        self.quant = quant;
        self
    }

    /// The quantization block of the checkpoint, if any.
    pub fn quantization(&self) -> Option<&QuantConfig> {
        self.quant.as_ref()
    }

    /// The compute dtype.
    pub fn dtype(&self) -> Dtype {
        self.dtype
    }

    /// True when `name` is present (and not yet taken).
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The stored shape of `name` (taken or not), from the header.
    pub fn stored_shape(&self, name: &str) -> Option<Vec<usize>> {
        self.shapes.get(name).cloned()
    }

    /// How the checkpoint wraps its text model.
    pub fn layout(&self) -> &TensorLayout {
        &self.layout
    }

    /// Vision-tower tensors left out: `(tensors, elements)`.
    pub fn skipped(&self) -> (usize, usize) {
        self.skipped
    }

    /// True when the tensors are header placeholders ([`Weights::from_headers`]).
    pub fn is_dry(&self) -> bool {
        self.dry
    }

    /// The view of the whole checkpoint at `prefix`.
    pub fn vars(&mut self, prefix: &str) -> Vars<'_> {
        Vars::new(self, prefix)
    }

    /// Removes and returns `name`, checking its shape.
    pub fn take(&mut self, name: &str, expected: &[i32]) -> Result<Array> {
        match self.take_optional(name, expected)? {
            Some(a) => Ok(a),
            None => Err(Error::MissingTensor {
                name: name.to_owned(),
                count: self.shapes.len(),
            }),
        }
    }

    /// Removes every tensor under `prefix` not taken yet, unread; returns how many.
    pub(crate) fn discard_prefix(&mut self, prefix: &str) -> usize {
        let before = self.tensors.len();
        self.tensors.retain(|name, _| !name.starts_with(prefix));
        before - self.tensors.len()
    }

    /// Like [`Weights::take`], but absence is `Ok(None)`.
    ///
    /// A quantized `[out, in]` weight asked for this way comes back dequantized
    /// (in the compute dtype), so a layer that does not know quantization still
    /// loads; [`Weights::take_quantized`] keeps it packed.
    pub fn take_optional(&mut self, name: &str, expected: &[i32]) -> Result<Option<Array>> {
        if let (Some(module), &[out, input]) = (name.strip_suffix(".weight"), expected)
            && self.tensors.contains_key(&format!("{module}.scales"))
        {
            let q = self.take_quantized(module, out as usize, input as usize)?;
            return match q {
                // No data to dequantize: a placeholder of the dense shape.
                Some(_) if self.dry => Ok(Some(
                    Array::scalar(0.0, self.dtype)?.broadcast_to(expected)?,
                )),
                Some(q) => Ok(Some(q.dequantize()?.as_type(self.dtype)?)),
                None => Ok(None),
            };
        }
        self.take_stored(name, expected)
    }

    /// The tensor as stored (no dequantization), checking its shape.
    fn take_stored(&mut self, name: &str, expected: &[i32]) -> Result<Option<Array>> {
        let Some(a) = self.tensors.remove(name) else {
            return Ok(None);
        };
        let found = a.shape().to_vec();
        if found != expected {
            return Err(Error::TensorShape {
                name: name.to_owned(),
                expected: expected.to_vec(),
                found,
            });
        }
        Ok(Some(a))
    }

    /// Takes the quantized triple of module `module` (an `[out, input]` matrix):
    /// `Ok(None)` when the checkpoint stores it dense (no `{module}.scales`).
    ///
    /// The shapes must match the config's `bits` and `group_size` for the module.
    pub fn take_quantized(
        &mut self,
        module: &str,
        out: usize,
        input: usize,
    ) -> Result<Option<QuantizedTensor>> {
        self.take_quantized_stack(module, &[], out, input)
    }

    /// Like [`Weights::take_quantized`] for a stack of `[out, input]`
    /// matrices under leading axes `lead` (mixture-of-experts weights
    /// `[E, out, input]`: codes `[E, out, input · bits / 32]`, scales and
    /// biases `[E, out, input / group_size]`).
    // Long: one check per tensor of the triple, each naming the tensor.
    pub fn take_quantized_stack(
        &mut self,
        module: &str,
        lead: &[usize],
        out: usize,
        input: usize,
    ) -> Result<Option<QuantizedTensor>> {
        let scales_name = format!("{module}.scales");
        if !self.tensors.contains_key(&scales_name) {
            return Ok(None);
        }
        let bad = |message: String| Error::InvalidConfig {
            path: PathBuf::from("config.json"),
            key: "quantization",
            message,
        };
        let quant = self.quant.as_ref().ok_or_else(|| {
            bad(format!(
                "absent, but the checkpoint has `{scales_name}`; add the quantization block \
                 mlx-lm wrote or re-quantize with `mtp-runner quantize`"
            ))
        })?;
        let params = quant.for_module(module).ok_or_else(|| {
            bad(format!(
                "module `{module}` is marked false (unquantized) but the checkpoint has \
                 `{scales_name}`; remove the override or store the module dense"
            ))
        })?;
        if !input.is_multiple_of(params.group_size as usize) {
            return Err(bad(format!(
                "group_size {} does not divide the {input} inputs of `{module}`",
                params.group_size
            )));
        }
        let weight_name = format!("{module}.weight");
        let missing = |name: &str, count: usize| Error::MissingTensor {
            name: name.to_owned(),
            count,
        };
        let count = self.shapes.len();
        let weight = self
            .take_stored(
                &weight_name,
                &stacked(lead, params.packed_shape(out, input)),
            )?
            .ok_or_else(|| missing(&weight_name, count))?;
        if weight.dtype() != Dtype::Uint32 {
            return Err(Error::TensorDtype {
                name: weight_name,
                dtype: format!(
                    "{} (a quantized weight must be U32)",
                    weight.dtype().safetensors_name()
                ),
            });
        }
        let groups = stacked(lead, params.scales_shape(out, input));
        let scales = self
            .take_stored(&scales_name, &groups)?
            .ok_or_else(|| missing(&scales_name, count))?;
        // Affine scales are floats; the floating-point modes' are uint8
        // (e8m0 or e4m3): a mismatch means the config names the wrong mode.
        let mode = params.mode;
        if (scales.dtype() == Dtype::Uint8) == mode.has_biases()
            || !matches!(
                scales.dtype(),
                Dtype::Uint8 | Dtype::Float32 | Dtype::Float16 | Dtype::Bfloat16
            )
        {
            return Err(Error::TensorDtype {
                name: scales_name,
                dtype: format!(
                    "{} (mode \"{}\" stores {} scales; check the config's quantization mode)",
                    scales.dtype().safetensors_name(),
                    mode.name(),
                    if mode.has_biases() { "float" } else { "U8" },
                ),
            });
        }
        let biases_name = format!("{module}.biases");
        let biases = if mode.has_biases() {
            Some(
                self.take_stored(&biases_name, &groups)?
                    .ok_or_else(|| missing(&biases_name, count))?,
            )
        } else if self.tensors.contains_key(&biases_name) {
            return Err(bad(format!(
                "module `{module}` is {} (no biases) but the checkpoint has `{biases_name}`; \
                 the module's mode is probably affine",
                mode.name()
            )));
        } else {
            None
        };
        Ok(Some(QuantizedTensor {
            weight,
            scales,
            biases,
            params,
            dtype: self.dtype,
        }))
    }

    /// Names not taken yet, sorted.
    pub fn remaining(&self) -> Vec<String> {
        let mut v: Vec<String> = self.tensors.keys().cloned().collect();
        v.sort();
        v
    }

    /// Names of every tensor in the checkpoint (vision towers left out), sorted.
    pub fn all_names(&self) -> impl Iterator<Item = &str> {
        self.shapes.keys().map(String::as_str)
    }

    /// Total elements over all tensors in the checkpoint (vision towers left out).
    pub fn parameter_count(&self) -> usize {
        self.shapes
            .values()
            .map(|s| s.iter().product::<usize>())
            .sum()
    }

    /// Tensor counts by source dtype name.
    pub fn source_dtypes(&self) -> &BTreeMap<String, usize> {
        &self.source_dtypes
    }
}
