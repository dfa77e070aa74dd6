//! MLX affine quantization: the `quantization` block of config.json and quantized tensor triples.
//!
//! mlx-lm stores a quantized linear or embedding `{p}` as three tensors:
//! `{p}.weight` (uint32, `bits`-bit codes packed along the input axis, shape
//! `[out, in · bits / 32]`), `{p}.scales` and `{p}.biases` (one per group of
//! `group_size` inputs, shape `[out, in / group_size]`), dequantizing as
//! `w = scale · code + bias`. config.json names the defaults and per-module
//! overrides:
//!
//! ```json
//! "quantization": {"group_size": 64, "bits": 4, "mode": "affine",
//!                  "mtp.fc": false, "lm_head": {"group_size": 64, "bits": 8}}
//! ```
//!
//! mlx-lm writes the same block again as `quantization_config`; either key is
//! read. A module is quantized exactly when its `.scales` tensor is present
//! (mlx-lm's rule too); the config then says which `bits` and `group_size`
//! its shapes must match.

use std::collections::BTreeMap;
use std::path::Path;

use mlx_tensor::{Array, ops};
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
}

impl QuantParams {
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
        if let Some(method) = obj.get("quant_method") {
            return Err(bad(format!(
                "quant_method {method} is not MLX affine quantization; convert the model with \
                 `mtp-runner quantize` or mlx_lm.convert"
            )));
        }
        if let Some(mode) = obj.get("mode")
            && mode != "affine"
        {
            return Err(bad(format!(
                "mode {mode} is not supported (only \"affine\"); re-quantize with `mtp-runner quantize`"
            )));
        }
        let default = params(obj, None, "").map_err(bad)?;
        let mut overrides = BTreeMap::new();
        for (name, v) in obj {
            if matches!(name.as_str(), "group_size" | "bits" | "mode") {
                continue;
            }
            let p = match v {
                Value::Bool(false) => None,
                Value::Bool(true) => Some(default),
                Value::Object(o) => Some(params(o, Some(default), name).map_err(bad)?),
                other => {
                    return Err(bad(format!(
                        "module `{name}`: expected false or {{\"group_size\", \"bits\"}}, found {other}"
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

    /// The JSON block mlx-lm writes (defaults, `"mode": "affine"`, overrides).
    pub fn to_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        m.insert("group_size".into(), self.default.group_size.into());
        m.insert("bits".into(), self.default.bits.into());
        m.insert("mode".into(), "affine".into());
        for (name, p) in &self.overrides {
            let v = match p {
                None => Value::Bool(false),
                Some(p) => serde_json::json!({"group_size": p.group_size, "bits": p.bits}),
            };
            m.insert(name.clone(), v);
        }
        Value::Object(m)
    }
}

/// Reads `group_size` and `bits` from `o`, each defaulting to `fallback`'s.
fn params(
    o: &serde_json::Map<String, Value>,
    fallback: Option<QuantParams>,
    module: &str,
) -> std::result::Result<QuantParams, String> {
    let field = |key: &str, allowed: &[u32], fb: Option<u32>| -> std::result::Result<u32, String> {
        let at = if module.is_empty() {
            String::new()
        } else {
            format!("module `{module}`: ")
        };
        let n = match (o.get(key), fb) {
            (Some(v), _) => v
                .as_u64()
                .ok_or_else(|| format!("{at}`{key}` must be a positive integer, found {v}"))?,
            (None, Some(d)) => return Ok(d),
            (None, None) => return Err(format!("{at}`{key}` is missing")),
        };
        if !allowed.iter().any(|&a| u64::from(a) == n) {
            return Err(format!("{at}`{key}` is {n}; MLX supports {allowed:?}"));
        }
        Ok(n as u32)
    };
    Ok(QuantParams {
        group_size: field(
            "group_size",
            &SUPPORTED_GROUP_SIZES,
            fallback.map(|p| p.group_size),
        )?,
        bits: field("bits", &SUPPORTED_BITS, fallback.map(|p| p.bits))?,
    })
}

/// An affine-quantized `[out, in]` matrix: packed codes, scales, biases.
#[derive(Debug, Clone)]
pub struct QuantizedTensor {
    /// `[out, in · bits / 32]` uint32 codes.
    pub weight: Array,
    /// `[out, in / group_size]`, in the compute dtype.
    pub scales: Array,
    /// `[out, in / group_size]`, in the compute dtype.
    pub biases: Array,
    /// How the codes were packed.
    pub params: QuantParams,
}

impl QuantizedTensor {
    /// Quantizes a dense `[out, in]` matrix (`in` must be a multiple of the group size).
    pub fn quantize(dense: &Array, params: QuantParams) -> Result<QuantizedTensor> {
        let (weight, scales, biases) =
            dense.quantize(params.group_size as i32, params.bits as i32)?;
        Ok(QuantizedTensor {
            weight,
            scales,
            biases,
            params,
        })
    }

    /// `x @ W.T` for `x` of shape `[..., in]`, without materialising `W`.
    pub fn matmul_t(&self, x: &Array) -> Result<Array> {
        Ok(ops::quantized_matmul(
            x,
            &self.weight,
            &self.scales,
            &self.biases,
            true,
            self.params.group_size as i32,
            self.params.bits as i32,
        )?)
    }

    /// Rows `indices` of `W`, dequantized: an embedding lookup.
    pub fn rows(&self, indices: &Array) -> Result<Array> {
        Ok(ops::dequantize(
            &self.weight.take(indices, 0)?,
            &self.scales.take(indices, 0)?,
            &self.biases.take(indices, 0)?,
            self.params.group_size as i32,
            self.params.bits as i32,
        )?)
    }

    /// The whole matrix, dequantized.
    pub fn dequantize(&self) -> Result<Array> {
        Ok(ops::dequantize(
            &self.weight,
            &self.scales,
            &self.biases,
            self.params.group_size as i32,
            self.params.bits as i32,
        )?)
    }

    /// The three arrays (to evaluate or save).
    pub fn arrays(&self) -> Vec<Array> {
        vec![
            self.weight.clone(),
            self.scales.clone(),
            self.biases.clone(),
        ]
    }
}

/// The precision of the MTP head's drafting weights (its unembedding,
/// projection and block; the trunk keeps its own), chosen at load: see
/// `MtpHead::quantized` for why any choice keeps the output exact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DraftQuant {
    /// `MTP_DRAFT_QUANT` (`off`, `q8`, `q4`) when set, else [`DraftQuant::default_for`].
    #[default]
    Auto,
    /// The head drafts with the weights as loaded.
    Off,
    /// Affine quantization to this many bits (4 or 8), groups of 64.
    Bits(u32),
}

/// The group size of a quantized draft head (MLX's and mlx-lm's default).
pub(crate) const DRAFT_GROUP_SIZE: u32 = 64;

impl DraftQuant {
    /// Reads `off`, `q8` or `q4` (`auto` for [`DraftQuant::Auto`]).
    pub fn parse(s: &str) -> Result<DraftQuant> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(DraftQuant::Auto),
            "off" | "none" => Ok(DraftQuant::Off),
            "q8" | "8" => Ok(DraftQuant::Bits(8)),
            "q4" | "4" => Ok(DraftQuant::Bits(4)),
            other => Err(Error::InvalidOption {
                option: "draft-quant",
                message: format!("`{other}` is not one of auto, off, q8, q4"),
            }),
        }
    }

    /// The choice without `MTP_DRAFT_QUANT`: what pays on `device` for a
    /// model loaded in `dtype` (see docs/gpu.md, "draft head precision").
    pub fn default_for(device: mlx_tensor::Device, dtype: mlx_tensor::Dtype) -> DraftQuant {
        let _ = (device, dtype);
        DraftQuant::Off
    }

    /// The parameters to quantize with, or `None` for full precision:
    /// `Auto` resolved through `MTP_DRAFT_QUANT` (an unreadable value is an
    /// error naming the variable) and then [`DraftQuant::default_for`].
    pub fn resolve(
        self,
        device: mlx_tensor::Device,
        dtype: mlx_tensor::Dtype,
    ) -> Result<Option<QuantParams>> {
        let chosen = match self {
            DraftQuant::Auto => match std::env::var("MTP_DRAFT_QUANT") {
                Ok(v) => match DraftQuant::parse(&v) {
                    Ok(DraftQuant::Auto) => DraftQuant::default_for(device, dtype),
                    Ok(q) => q,
                    Err(_) => {
                        return Err(Error::InvalidOption {
                            option: "MTP_DRAFT_QUANT",
                            message: format!("`{v}` is not one of auto, off, q8, q4"),
                        });
                    }
                },
                Err(_) => DraftQuant::default_for(device, dtype),
            },
            q => q,
        };
        match chosen {
            DraftQuant::Bits(bits @ (4 | 8)) => Ok(Some(QuantParams {
                group_size: DRAFT_GROUP_SIZE,
                bits,
            })),
            DraftQuant::Bits(bits) => Err(Error::InvalidOption {
                option: "draft-quant",
                message: format!("{bits} bits: a draft head is quantized to 4 or 8 bits"),
            }),
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_tensor::{Device, Dtype};

    /// `DraftQuant::parse(input)` is `want`, or an `InvalidOption` on
    /// `draft-quant` naming the input and every accepted value.
    fn check(input: &str, want: Option<DraftQuant>) {
        match (DraftQuant::parse(input), want) {
            (Ok(got), Some(want)) => assert_eq!(got, want, "parse({input:?})"),
            (Err(e), None) => {
                let Error::InvalidOption { option, message } = &e else {
                    panic!("parse({input:?}): not InvalidOption: {e:?}");
                };
                assert_eq!(*option, "draft-quant", "parse({input:?})");
                let named = format!("`{}`", input.trim().to_ascii_lowercase());
                assert!(message.contains(&named), "parse({input:?}): {message}");
                for accepted in ["auto", "off", "q8", "q4"] {
                    assert!(message.contains(accepted), "parse({input:?}): {message}");
                }
            }
            (got, want) => panic!("parse({input:?}) = {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn draft_quant_parses_its_names_and_rejects_the_rest() {
        check("auto", Some(DraftQuant::Auto));
        check("off", Some(DraftQuant::Off));
        check("q8", Some(DraftQuant::Bits(8)));
        check("q4", Some(DraftQuant::Bits(4)));
        check("  Q4\n", Some(DraftQuant::Bits(4)));
        check("AUTO", Some(DraftQuant::Auto));
        check(" Off ", Some(DraftQuant::Off));
        check("q3", None);
        check("", None);
        check("eight", None);
        check("q16", None);
        check("Q2", None);
    }

    #[test]
    fn explicit_draft_quant_resolves_to_group_64_at_4_or_8_bits() {
        for device in [Device::Cpu, Device::Gpu] {
            for dtype in [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16] {
                let resolve = |q: DraftQuant| q.resolve(device, dtype);
                for bits in [4, 8] {
                    assert_eq!(
                        resolve(DraftQuant::Bits(bits)).unwrap(),
                        Some(QuantParams {
                            group_size: 64,
                            bits
                        }),
                        "{bits} bits on {device:?} {dtype:?}"
                    );
                }
                assert_eq!(resolve(DraftQuant::Off).unwrap(), None);
                // MLX implements 3, 2, 5 and 6 bits too; a draft head takes 4 or 8 only.
                for bits in [0, 2, 3, 16] {
                    match resolve(DraftQuant::Bits(bits)) {
                        Err(Error::InvalidOption { option, message }) => {
                            assert_eq!(option, "draft-quant");
                            assert!(
                                message.contains(&format!("{bits} bits"))
                                    && message.contains("4 or 8"),
                                "{message}"
                            );
                        }
                        other => panic!("Bits({bits}) resolved to {other:?}"),
                    }
                }
            }
        }
    }

    /// Without `MTP_DRAFT_QUANT`, `Auto` is [`DraftQuant::default_for`]. Read
    /// only: tests share the process environment, so none sets the variable
    /// (the CLI tests run the binary with it set), and when the caller's
    /// environment sets it there is nothing to check here.
    #[test]
    fn auto_draft_quant_without_the_variable_is_the_backend_default() {
        if std::env::var_os("MTP_DRAFT_QUANT").is_some() {
            return;
        }
        for device in [Device::Cpu, Device::Gpu] {
            for dtype in [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16] {
                let default = DraftQuant::default_for(device, dtype);
                assert_ne!(default, DraftQuant::Auto, "{device:?} {dtype:?}");
                assert_eq!(
                    DraftQuant::Auto.resolve(device, dtype).unwrap(),
                    default.resolve(device, dtype).unwrap(),
                    "{device:?} {dtype:?}"
                );
            }
        }
    }
}
