//! MLX quantization: the `quantization` block of config.json and quantized tensors.
//!
//! mlx-lm stores a quantized linear or embedding `{p}` as `{p}.weight`
//! (uint32, `bits`-bit codes packed along the input axis, shape
//! `[out, in · bits / 32]`) and `{p}.scales` (one per group of `group_size`
//! inputs, shape `[out, in / group_size]`), plus, in MLX's `affine` mode
//! only, `{p}.biases` of the scales' shape, dequantizing as
//! `w = scale · code + bias` with scales and biases in the float dtype. The
//! floating-point modes (`mlx_lm.convert --q-mode`) store no biases and
//! uint8 scales, each fixing its group size and bits: `mxfp4` (e2m1 codes,
//! e8m0 scales, 32 / 4), `mxfp8` (e4m3 codes, e8m0 scales, 32 / 8) and
//! `nvfp4` (e2m1 codes, e4m3 scales, 16 / 4). config.json names the
//! defaults and per-module overrides, each with its own mode:
//!
//! ```json
//! "quantization": {"group_size": 16, "bits": 4, "mode": "nvfp4",
//!                  "mtp.fc": false,
//!                  "lm_head": {"group_size": 32, "bits": 8, "mode": "mxfp8"}}
//! ```
//!
//! mlx-lm writes the same block again as `quantization_config`; either key is
//! read. A module is quantized exactly when its `.scales` tensor is present
//! (mlx-lm's rule too); the config then says which mode, `bits` and
//! `group_size` its tensors must match. An nvfp4 expert stack with a
//! per-expert `global_scale` (mlx-lm's `quantize_model(global_scale=True)`,
//! which MLX computes on the GPU only) is refused.

use std::collections::BTreeMap;
use std::path::Path;

use mlx_tensor::ops::QuantMode;
use mlx_tensor::{Array, Dtype, ops};
use serde_json::Value;

use crate::error::{Error, Result, read_json};

/// Bit widths MLX's affine kernels implement.
pub(crate) const SUPPORTED_BITS: [u32; 6] = [2, 3, 4, 5, 6, 8];
/// Group sizes MLX's affine kernels implement.
pub(crate) const SUPPORTED_GROUP_SIZES: [u32; 3] = [32, 64, 128];

/// How one module is quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantParams {
    /// Inputs sharing one scale and bias.
    pub group_size: u32,
    /// Bits per code.
    pub bits: u32,
    /// How codes and scales decode (affine: with biases).
    pub mode: QuantMode,
}

impl QuantParams {
    /// Affine quantization with `group_size` and `bits`.
    pub const fn affine(group_size: u32, bits: u32) -> QuantParams {
        QuantParams {
            group_size,
            bits,
            mode: QuantMode::Affine,
        }
    }

    /// Shape of the packed `uint32` weight of an `[out, input]` matrix.
    pub fn packed_shape(&self, out: usize, input: usize) -> [i32; 2] {
        [out as i32, (input * self.bits as usize / 32) as i32]
    }

    /// Shape of the scales (and biases) of an `[out, input]` matrix.
    pub fn scales_shape(&self, out: usize, input: usize) -> [i32; 2] {
        [out as i32, (input / self.group_size as usize) as i32]
    }
}

/// The `quantization` block: defaults plus per-module overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantConfig {
    /// Parameters of every module not named in `overrides`.
    pub default: QuantParams,
    /// Module path (`model.layers.0.mlp.down_proj`) → its parameters, or
    /// `None` for a module kept unquantized (`false` in the JSON).
    pub overrides: BTreeMap<String, Option<QuantParams>>,
}

impl QuantConfig {
    /// Reads the block from `dir/config.json`; `Ok(None)` when the model is not quantized.
    pub fn load(dir: &Path) -> Result<Option<QuantConfig>> {
        let path = dir.join("config.json");
        if !path.is_file() {
            return Ok(None);
        }
        let v: Value = read_json(&path)?;
        QuantConfig::from_config(&v, &path)
    }

    /// Reads `quantization` (or, failing that, `quantization_config`) from a
    /// parsed config.json; `path` names the file in errors.
    pub fn from_config(config: &Value, path: &Path) -> Result<Option<QuantConfig>> {
        let (key, block) = match (
            config.get("quantization"),
            config.get("quantization_config"),
        ) {
            (Some(b), _) if !b.is_null() => ("quantization", b),
            (_, Some(b)) if !b.is_null() => ("quantization_config", b),
            _ => return Ok(None),
        };
        let bad = |message: String| Error::InvalidConfig {
            path: path.to_owned(),
            key,
            message,
        };
        let obj = block
            .as_object()
            .ok_or_else(|| bad(format!("must be an object, found {block}")))?;
        // fp8 weights are dequantized as they load (`crate::fp8`): not MLX quantization.
        if obj.get("quant_method").and_then(Value::as_str) == Some("fp8") {
            return Ok(None);
        }
        if let Some(method) = obj.get("quant_method") {
            return Err(bad(format!(
                "quant_method {method} is neither MLX affine quantization nor block-scaled fp8; \
                 convert the model with `mtp-runner quantize` or mlx_lm.convert"
            )));
        }
        // `params` refuses a mode other than affine, here and per module.
        let default = params(obj, None, "").map_err(bad)?;
        let mut overrides = BTreeMap::new();
        for (name, v) in obj {
            if matches!(
                name.as_str(),
                "group_size" | "bits" | "mode" | "global_scale"
            ) {
                continue;
            }
            let p = match v {
                Value::Bool(false) => None,
                Value::Bool(true) => Some(default),
                Value::Object(o) => Some(params(o, Some(default), name).map_err(bad)?),
                other => {
                    return Err(bad(format!(
                        "module `{name}`: expected false or {{\"group_size\", \"bits\", \"mode\"}}, \
                         found {other}"
                    )));
                }
            };
            overrides.insert(name.clone(), p);
        }
        Ok(Some(QuantConfig { default, overrides }))
    }

    /// The parameters of module `path`, or `None` when it is kept unquantized.
    pub fn for_module(&self, path: &str) -> Option<QuantParams> {
        match self.overrides.get(path) {
            Some(p) => *p,
            None => Some(self.default),
        }
    }

    /// The JSON block mlx-lm writes (defaults with their mode, overrides).
    pub fn to_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        m.insert("group_size".into(), self.default.group_size.into());
        m.insert("bits".into(), self.default.bits.into());
        m.insert("mode".into(), self.default.mode.name().into());
        for (name, p) in &self.overrides {
            let v = match p {
                None => Value::Bool(false),
                // A module without a mode is affine (see `params`), as
                // mlx-lm's own predicates write it.
                Some(p) if p.mode == QuantMode::Affine => {
                    serde_json::json!({"group_size": p.group_size, "bits": p.bits})
                }
                Some(p) => serde_json::json!({
                    "group_size": p.group_size, "bits": p.bits, "mode": p.mode.name()
                }),
            };
            m.insert(name.clone(), v);
        }
        Value::Object(m)
    }
}

/// Reads `mode`, `group_size` and `bits` from `o`.
///
/// A missing mode is affine, at the top and per module alike: mlx-lm passes
/// a module's dict to `to_quantized`, whose default mode is affine, and its
/// model predicates write affine overrides without one (the MoE routers'
/// `{"group_size": 64, "bits": 8}` inside an mxfp4 model). A missing size is
/// `fallback`'s (a module's default) when that has the same mode, else the
/// mode's own: the sizes a floating-point mode fixes, and for an affine
/// module under a floating-point default mlx-lm's 64 / 4 (a top-level
/// affine block must name both).
fn params(
    o: &serde_json::Map<String, Value>,
    fallback: Option<QuantParams>,
    module: &str,
) -> std::result::Result<QuantParams, String> {
    let at = if module.is_empty() {
        String::new()
    } else {
        format!("module `{module}`: ")
    };
    let mode = match o.get("mode") {
        None => QuantMode::Affine,
        Some(v) => v.as_str().and_then(QuantMode::from_name).ok_or_else(|| {
            let names = QuantMode::ALL.map(QuantMode::name);
            format!(
                "{at}mode {v} is not an MLX quantization mode ({names:?}); \
                 re-quantize with `mtp-runner quantize` or mlx_lm.convert"
            )
        })?,
    };
    if o.get("global_scale")
        .is_some_and(|v| v != &Value::Bool(false))
    {
        return Err(format!(
            "{at}`global_scale` (one nvfp4 tensor scale per expert) is not supported: \
             MLX applies it on the GPU only; convert without it (mlx_lm.convert does by default)"
        ));
    }
    let own = |(g, b): (i32, i32)| QuantParams {
        group_size: g as u32,
        bits: b as u32,
        mode,
    };
    let fallback = match fallback {
        Some(p) if p.mode == mode => Some(p),
        Some(_) => Some(own(mode.fixed().unwrap_or((64, 4)))),
        None => mode.fixed().map(own),
    };
    let field = |key: &str, allowed: &[u32], fb: Option<u32>| -> std::result::Result<u32, String> {
        let n = match (o.get(key), fb) {
            (Some(v), _) => v
                .as_u64()
                .ok_or_else(|| format!("{at}`{key}` must be a positive integer, found {v}"))?,
            (None, Some(d)) => return Ok(d),
            (None, None) => return Err(format!("{at}`{key}` is missing")),
        };
        if !allowed.iter().any(|&a| u64::from(a) == n) {
            return Err(format!(
                "{at}`{key}` is {n}; MLX's {} mode supports {allowed:?}",
                mode.name()
            ));
        }
        Ok(n as u32)
    };
    let (groups, bits) = match mode.fixed() {
        Some((g, b)) => (vec![g as u32], vec![b as u32]),
        None => (SUPPORTED_GROUP_SIZES.to_vec(), SUPPORTED_BITS.to_vec()),
    };
    Ok(QuantParams {
        group_size: field("group_size", &groups, fallback.map(|p| p.group_size))?,
        bits: field("bits", &bits, fallback.map(|p| p.bits))?,
        mode,
    })
}

/// A quantized `[out, in]` matrix (or a stack of them): packed codes,
/// scales and, in affine mode, biases.
#[derive(Debug, Clone)]
pub struct QuantizedTensor {
    /// `[out, in · bits / 32]` uint32 codes.
    pub weight: Array,
    /// `[out, in / group_size]`: in the compute dtype (affine) or uint8
    /// (the floating-point modes).
    pub scales: Array,
    /// `[out, in / group_size]` in the compute dtype; present exactly in affine mode.
    pub biases: Option<Array>,
    /// How the codes were packed.
    pub params: QuantParams,
    /// What dequantization gives: the compute dtype.
    pub dtype: Dtype,
}

impl QuantizedTensor {
    /// Quantizes a dense `[out, in]` matrix (`in` must be a multiple of the group size).
    pub fn quantize(dense: &Array, params: QuantParams) -> Result<QuantizedTensor> {
        let (weight, scales, biases) =
            dense.quantize_mode(params.group_size as i32, params.bits as i32, params.mode)?;
        Ok(QuantizedTensor {
            weight,
            scales,
            biases,
            params,
            dtype: dense.dtype(),
        })
    }

    /// The same tensor with `f` applied to each stored array (a row pick, a slice).
    pub fn map(&self, mut f: impl FnMut(&Array) -> Result<Array>) -> Result<QuantizedTensor> {
        Ok(QuantizedTensor {
            weight: f(&self.weight)?,
            scales: f(&self.scales)?,
            biases: self.biases.as_ref().map(&mut f).transpose()?,
            params: self.params,
            dtype: self.dtype,
        })
    }

    /// Joins `parts` (quantized alike, at least one) array by array with
    /// `join` (a concatenation or a stack).
    pub fn join(
        parts: &[QuantizedTensor],
        join: impl Fn(&[Array]) -> mlx_tensor::Result<Array>,
    ) -> Result<QuantizedTensor> {
        let first = &parts[0];
        assert!(
            parts
                .iter()
                .all(|p| p.params == first.params && p.biases.is_some() == first.biases.is_some()),
            "parts quantized differently: {:?}",
            parts.iter().map(|p| p.params).collect::<Vec<_>>()
        );
        let pick = |f: fn(&QuantizedTensor) -> &Array| -> Result<Array> {
            let v: Vec<Array> = parts.iter().map(|t| f(t).clone()).collect();
            Ok(join(&v)?)
        };
        Ok(QuantizedTensor {
            weight: pick(|t| &t.weight)?,
            scales: pick(|t| &t.scales)?,
            biases: match first.biases {
                Some(_) => Some(pick(|t| t.biases.as_ref().expect("checked above"))?),
                None => None,
            },
            params: first.params,
            dtype: first.dtype,
        })
    }

    /// `x @ W.T` for `x` of shape `[..., in]`. On the CPU, 4- or 8-bit
    /// affine codes go to our few-rows kernel (see [`cpu_rows_take`]; more
    /// rows than it takes, a prefill chunk, in slices of
    /// [`ops::ROWS_MATMUL_MAX_ROWS`] rows), and so does a floating-point
    /// mode's product of up to [`ops::ROWS_MATMUL_MAX_ROWS`] rows (a step,
    /// a verify, a draft step); a floating-point product of at least
    /// [`FP_DENSE_MIN_ROWS`] rows goes to the dense product on `W`
    /// dequantized a block at a time ([`QuantizedTensor::dense_matmul_t`]);
    /// everything else, and every product on a GPU, to MLX's
    /// `quantized_matmul`, which never materialises `W`.
    pub fn matmul_t(&self, x: &Array) -> Result<Array> {
        if cpu_fp_dense(x, self) {
            return self.dense_matmul_t(x, dense_block_rows(x.dim(-1), FP_DENSE_BLOCK_BYTES));
        }
        if let Some(rows) = cpu_rows_take(x, self) {
            let product = |x: &Array| {
                ops::quant_rows_matmul_t_mode(
                    x,
                    &self.weight,
                    &self.scales,
                    self.biases.as_ref(),
                    self.params.group_size as i32,
                    self.params.bits as i32,
                    self.params.mode,
                )
            };
            let max = ops::ROWS_MATMUL_MAX_ROWS;
            if rows <= max {
                return Ok(product(x)?);
            }
            let k = x.dim(-1);
            let flat = x.reshape(&[rows, k])?;
            let parts = (0..rows)
                .step_by(max as usize)
                .map(|r| product(&flat.slice_axis(0, r, (r + max).min(rows))?))
                .collect::<mlx_tensor::Result<Vec<_>>>()?;
            let mut shape = x.shape().to_vec();
            *shape.last_mut().expect("rank ≥ 2") = self.weight.dim(0);
            return Ok(ops::concatenate(&parts, 0)?.reshape(&shape)?);
        }
        Ok(ops::quantized_matmul_mode(
            x,
            &self.weight,
            &self.scales,
            self.biases.as_ref(),
            true,
            self.params.group_size as i32,
            self.params.bits as i32,
            self.params.mode,
        )?)
    }

    /// `x @ W.T` for `x` of shape `[..., in]` through MLX's f32 matmul
    /// (OpenBLAS on the CPU): `W` (2-D) dequantized into f32 `block_rows`
    /// output rows at a time, each block multiplied by `x` widened to f32,
    /// the blocks' products joined along the last axis and rounded once to
    /// `x`'s dtype. Each block's codes and scales are scheduled after the
    /// previous block's product ([`crate::schedule::after`]), so the f32
    /// transient is a few blocks' worth however large `W` is (see
    /// [`FP_DENSE_BLOCK_BYTES`]). `matmul_t` takes this path for a long
    /// floating-point-mode product on the CPU ([`FP_DENSE_MIN_ROWS`]);
    /// `block_rows` is a parameter so that tests can force uneven blocks.
    pub fn dense_matmul_t(&self, x: &Array, block_rows: i32) -> Result<Array> {
        assert!(
            block_rows >= 1 && self.weight.ndim() == 2,
            "dense_matmul_t: {block_rows} rows a block of a rank-{} weight",
            self.weight.ndim()
        );
        let out = self.weight.dim(0);
        let xf = x.as_type(Dtype::Float32)?;
        let mut blocks: Vec<Array> = Vec::with_capacity((out / block_rows + 1) as usize);
        for start in (0..out).step_by(block_rows as usize) {
            let stop = (start + block_rows).min(out);
            let mut part = self.map(|a| {
                let a = a.slice_axis(0, start, stop)?;
                match blocks.last() {
                    Some(prev) => crate::schedule::after(&a, prev, 0),
                    None => Ok(a),
                }
            })?;
            part.dtype = Dtype::Float32;
            blocks.push(xf.matmul(&part.dequantize()?.t()?)?);
        }
        Ok(ops::concatenate(&blocks, -1)?.as_type(x.dtype())?)
    }

    /// Rows `indices` of `W`, dequantized: an embedding lookup.
    pub fn rows(&self, indices: &Array) -> Result<Array> {
        self.map(|a| Ok(a.take(indices, 0)?))?.dequantize()
    }

    /// The whole matrix, dequantized into [`QuantizedTensor::dtype`].
    pub fn dequantize(&self) -> Result<Array> {
        Ok(ops::dequantize_mode(
            &self.weight,
            &self.scales,
            self.biases.as_ref(),
            self.params.group_size as i32,
            self.params.bits as i32,
            self.params.mode,
            self.dtype,
        )?)
    }

    /// The stored arrays (to evaluate or save).
    pub fn arrays(&self) -> Vec<Array> {
        let mut v = vec![self.weight.clone(), self.scales.clone()];
        v.extend(self.biases.clone());
        v
    }
}

thread_local! {
    /// `MTP_CPU_QROWS=0` turns the quantized few-rows CPU kernel off (default
    /// on), in every mode: products it would take go to MLX's `quantized_matmul`.
    static CPU_QROWS: crate::switch::Flag = const { std::cell::Cell::new(None) };
}

/// Turns the quantized few-rows CPU kernel on or off for this thread's later
/// products (default on, unless `MTP_CPU_QROWS=0`): for measurement.
pub fn set_cpu_quant_rows(on: bool) {
    crate::switch::set(&CPU_QROWS, on);
}

/// The fewest rows of `x` for which [`QuantizedTensor::matmul_t`] in a
/// floating-point mode (mxfp4, mxfp8, nvfp4) on the CPU dequantizes `W`
/// and multiplies densely ([`QuantizedTensor::dense_matmul_t`]) instead of
/// taking our few-rows kernel ([`cpu_rows_take`]).
///
/// Why: MLX's CPU `quantized_matmul` runs each row of `x` through the whole
/// weight on its own, and in these modes decodes every code again for every
/// row, so a prefill chunk costs its rows times a one-row step: tiny-mtp's
/// 802-token prompt took 10.9 s (mxfp4), 47.2 s (mxfp8) and 11.1 s (nvfp4)
/// to its first token against 0.45 s in f32; dense, 0.79 / 0.76 / 0.69 s
/// (`generate --json --speculative off`, medians of 3). Dequantizing costs
/// about one pass over the weight whatever the rows (MLX's fp4 decoding, a
/// table gather, about 14 ns a weight; fp8 about 4), then OpenBLAS
/// multiplies at its f32 rate. Measured (`examples/gemm.rs --fp`, 2-core
/// x86-64, median ms, MLX's `quantized_matmul` against dequantize + f32
/// matmul), a 1,536 × 512 weight: mxfp4 8 / 24 / 32 / 128 rows 2.8 / 13.0
/// / 18.1 / 71.0 against 7.3 / 12.8 / 12.3 / 12.1; nvfp4 3.0 / 15.4 / 19.8
/// / 46.7 against 7.6 / 11.9 / 11.5 / 10.7; mxfp8 1 / 8 rows 2.6 / 12.6
/// against 3.3 / 2.3. A 32,000 × 512 weight, 32 rows: mxfp4 372 against
/// 330, nvfp4 431 against 336. The threshold sits just above the rows a
/// decode step, a verify or a draft step takes (up to
/// [`ops::ROWS_MATMUL_MAX_ROWS`]): those go to our rows kernel, which
/// decodes each block of weight rows once for all rows (faster than both
/// routes above at those row counts, see [`cpu_rows_take`]) and whose rows
/// do not depend on each other, so a verify row equals the one-row step's
/// product bit for bit (a dense verify row would not). Prefill chunks of
/// more rows keep the dense route, where OpenBLAS's GEMM is the faster
/// multiplier.
const FP_DENSE_MIN_ROWS: i32 = ops::ROWS_MATMUL_MAX_ROWS + 1;

/// The most bytes of f32 weight one block of a dense floating-point-mode
/// product dequantizes ([`QuantizedTensor::dense_matmul_t`]).
///
/// Why: whole, a large matrix's f32 copy would be a transient of its own
/// size per product (a 151,936 × 4,096 lm_head: 2.5 GB, against 0.3 GB in
/// mxfp4), and MLX's fp4 dequantization builds temporaries of about 2.3
/// times that. In blocks, each scheduled after the one before, the
/// transient stops growing with the matrix. Peak memory of one product in
/// mxfp4 with 16 MiB blocks, its output included: 64 rows through a 65,536
/// or 131,072 × 1,024 weight 141 / 157 MiB (552 / 702 MiB with the blocks
/// unchained, which MLX's breadth-first order runs side by side); 128 rows
/// through 16,384 × 4,096, 125 MiB. Beyond the output it is about 7
/// blocks' bytes in fp4 and 5 in fp8 at every block size tried (8 to 64
/// MiB): MLX's CPU stream runs a few blocks ahead. Larger blocks were no
/// faster (16,384 × 4,096, 128 rows: 1.26 s at 16 MiB, 1.22 s at 64 MiB,
/// within this 2-core host's noise).
const FP_DENSE_BLOCK_BYTES: usize = 16 << 20;

/// Output rows per block of [`QuantizedTensor::dense_matmul_t`]: as many
/// `inputs`-wide f32 rows as fit `block_bytes`, at least one.
fn dense_block_rows(inputs: i32, block_bytes: usize) -> i32 {
    let row = (inputs.max(1) as usize) * size_of::<f32>();
    (block_bytes / row).clamp(1, i32::MAX as usize) as i32
}

/// Whether `x @ q.W.T` goes to [`QuantizedTensor::dense_matmul_t`]: on a
/// CPU default device, a floating-point mode, a 2-D weight, a float `x` of
/// at least [`FP_DENSE_MIN_ROWS`] rows (see there for why).
fn cpu_fp_dense(x: &Array, q: &QuantizedTensor) -> bool {
    let k = if x.ndim() >= 1 { x.dim(-1) } else { 0 };
    k > 0
        && q.params.mode != QuantMode::Affine
        && q.weight.ndim() == 2
        && x.size() / k as usize >= FP_DENSE_MIN_ROWS as usize
        && matches!(x.dtype(), Dtype::Float32 | Dtype::Bfloat16 | Dtype::Float16)
        && mlx_tensor::default_device() == mlx_tensor::Device::Cpu
}

/// The row count of `x` when `x @ q.W.T` goes to
/// [`ops::quant_rows_matmul_t_mode`]: on a CPU default device, a float `x`
/// and a 2-D weight, and either affine mode, 4 or 8 bits in groups of 32,
/// 64 or 128 with scales and biases in `x`'s dtype, any number of rows (a
/// plain step, a verify, a draft step, a prefill chunk in slices), or a
/// floating-point mode (mxfp4, mxfp8, nvfp4: its own group size and bits,
/// uint8 scales, no biases) and 1 to [`ops::ROWS_MATMUL_MAX_ROWS`] rows
/// (more go dense, see [`FP_DENSE_MIN_ROWS`]).
///
/// Why: MLX's CPU `quantized_matmul` runs each row of `x` through the whole
/// weight on its own (1 / 2 / 4 / 8 rows of a 1,024² 8-bit weight: 1.2 /
/// 2.3 / 4.7 / 8.5 ms on the 2-core x86-64 host), so a verify of k + 1 rows
/// cost k + 1 plain steps and an MTP flush of a plain stretch as many steps
/// again: auto speculation ran at 0.61 (8-bit) and 0.73 (4-bit) of plain
/// decoding on tiny-mtp (`cargo xtask bench`, session 27). The kernel
/// dequantizes each block of weight rows once for all rows. A prefill chunk
/// has the same problem at scale: tiny-mtp's 880-token prompt took 14.8 s to
/// its first token at 4 bits through MLX (0.40 s unquantized in f32); in
/// slices of 32 rows the kernel multiplies at about the rate of OpenBLAS's
/// f32 GEMM (`examples/gemm.rs --k 1024 --n 3072 --weights 24 --m 32`:
/// `qrows-4` 40.8 ms, `qrows-8` 47.4, f32 `matmul` 48.6, `qmm-4` 2,108).
///
/// The floating-point modes (1 to [`ops::ROWS_MATMUL_MAX_ROWS`] rows) are
/// worse still in MLX, which decodes every code again for every row; the
/// kernel decodes each block of weight rows once (e2m1 / e4m3 codes times an
/// e8m0 / e4m3 scale, exactly MLX's `dequantize`). `examples/gemm.rs --fp
/// mxfp4,mxfp8,nvfp4 --m 1,2,5,8,32 --dtypes f32` (2-core AMD EPYC x86-64,
/// medians of 15 rounds, ms, `fp-qmm` MLX against `fp-rows` ours), 1 / 2 /
/// 5 / 8 / 32 rows; a 1,536 × 512 weight (`--n 1536 --k 512`): mxfp4 0.66 /
/// 1.16 / 1.86 / 4.39 / 17.7 against 0.18 / 0.12 / 0.25 / 0.29 / 0.78;
/// mxfp8 2.92 / 3.27 / 10.5 / 21.9 / 92.3 against 0.19 / 0.24 / 0.46 / 0.63
/// / 0.62; nvfp4 0.68 / 1.22 / 2.26 / 5.22 / 20.6 against 0.10 / 0.16 /
/// 0.21 / 0.35 / 0.59. A 4,096 × 1,024 weight: mxfp4 3.12 / 6.12 / 9.16 /
/// 15.4 / 57.4 against 0.61 / 0.77 / 0.75 / 1.16 / 4.83; mxfp8 13.0 / 30.6 /
/// 39.3 / 64.3 / 252 against 0.77 / 0.89 / 0.70 / 1.88 / 5.05; nvfp4 3.18 /
/// 7.22 / 9.19 / 14.9 / 59.4 against 0.68 / 0.76 / 0.69 / 1.66 / 2.93 (the
/// host is shared and noisy: small cases vary by 2x between runs). tiny-mtp
/// quantized by `mtp-runner quantize --mode MODE`, `generate --json -n 128
/// -p "Once upon a time"`, decode tokens/s, medians of 5 alternating runs,
/// `MTP_CPU_QROWS=0` (MLX's kernel) against on: `--speculative off` mxfp4
/// 79.7 against 252, mxfp8 19.9 against 181, nvfp4 61.9 against 211; the
/// default (MTP) 70.3 against 331, 15.5 against 215, 48.0 against 220
/// (the same tokens either way, and speculative equal to plain).
fn cpu_rows_take(x: &Array, q: &QuantizedTensor) -> Option<i32> {
    let k = x.dim(-1);
    if x.ndim() < 2 || k <= 0 || mlx_tensor::default_device() != mlx_tensor::Device::Cpu {
        return None;
    }
    let rows = i32::try_from(x.size() / k as usize).ok()?;
    let fp_rows_fit = q.params.mode.fixed().is_none() || rows <= ops::ROWS_MATMUL_MAX_ROWS;
    let takes = rows >= 1 && fp_rows_fit && q.weight.ndim() == 2 && rows_kernel_codes(x, q);
    takes.then_some(rows)
}

/// Whether the rows kernel decodes `q` for a float `x` (any row count), and
/// the switch of [`set_cpu_quant_rows`] is on: affine 4 or 8 bits in groups
/// of 32, 64 or 128 with scales and biases in `x`'s dtype, or a
/// floating-point mode at its own group size and bits with uint8 scales.
fn rows_kernel_codes(x: &Array, q: &QuantizedTensor) -> bool {
    let (group, bits) = (q.params.group_size as i32, q.params.bits as i32);
    let codes = match q.params.mode.fixed() {
        None => {
            matches!(bits, 4 | 8)
                && matches!(group, 32 | 64 | 128)
                && q.scales.dtype() == x.dtype()
                && q.biases.as_ref().is_some_and(|b| b.dtype() == x.dtype())
        }
        Some(fixed) => {
            fixed == (group, bits) && q.scales.dtype() == Dtype::Uint8 && q.biases.is_none()
        }
    };
    codes
        && matches!(x.dtype(), Dtype::Float32 | Dtype::Bfloat16 | Dtype::Float16)
        && crate::switch::get(&CPU_QROWS, "MTP_CPU_QROWS", true)
}

/// Whether a MoE layer's gathered product `x[b] @ q.W[experts[b]].T` (a
/// stacked `[E, out, in]` weight) goes to
/// [`ops::quant_gather_rows_matmul_t`] rather than MLX's `gather_qmm`: on
/// a CPU default device, for the codes and dtypes of the rows kernel (see
/// [`cpu_rows_take`]), any number of rows, unless `MTP_CPU_QROWS=0` or
/// [`set_cpu_quant_rows`]`(false)` sends them back to MLX.
///
/// Why: MLX's CPU `gather_qmm` runs each row through its expert's weight
/// on its own, as its `quantized_matmul` does (see [`cpu_rows_take`]); the
/// primitive groups the rows by expert and decodes each chosen expert's
/// weight once for all of its rows. One projection, 8 experts of 1,024 ×
/// 512, top-2 (`cargo run --release -p mlx-tensor --example gather_rows`,
/// 2-core AMD EPYC x86-64, f32, medians of 31 rounds, ms, `gather_qmm`
/// against ours, 1 row / 4 rows): affine 4-bit 1.28 / 4.73 against 0.20 /
/// 0.63, 8-bit 1.56 / 6.13 against 0.39 / 0.58, mxfp4 0.94 / 3.14 against
/// 0.26 / 0.88 (a host loop of `quant_rows_matmul_t_mode` over the chosen
/// experts' slices: 0.39 / 0.98, 0.51 / 1.26, 0.36 / 1.86). tiny-moe-mtp
/// (8 experts of 64 × 256, top-2: small experts) quantized by `mtp-runner
/// quantize --bits 4 --group-size 64`, `generate --json -n 128 -p "Once
/// upon a time" --speculative off`, decode tokens/s: `gather_qmm` for the
/// experts (rows kernel elsewhere) 218.1 / 268.9 / 262.1, median 262.1;
/// this route 343.9 / 301.1 / 324.6 / 327.9 / 345.2, median 327.9;
/// `MTP_CPU_QROWS=0` (MLX everywhere) median 131.9 of 5 (the same tokens
/// on every route).
pub(crate) fn cpu_gather_rows_takes(x: &Array, q: &QuantizedTensor) -> bool {
    x.ndim() >= 2
        && x.dim(-1) > 0
        && q.weight.ndim() == 3
        && mlx_tensor::default_device() == mlx_tensor::Device::Cpu
        && rows_kernel_codes(x, q)
}
