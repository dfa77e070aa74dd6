//! Block-scaled fp8 checkpoints (DeepSeek-V3, the `-FP8` releases of Qwen3,
//! Qwen3.5 and GLM): dequantized to the compute dtype as they are loaded.
//!
//! Such a checkpoint stores each quantized linear `{p}` as `{p}.weight`
//! (`F8_E4M3`, shape `[out, in]`) and `{p}.weight_scale_inv` (a float per
//! block of `weight_block_size = [rows, cols]` weights, shape
//! `[ceil(out / rows), ceil(in / cols)]`), and says so in config.json:
//!
//! ```json
//! "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
//!                         "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
//! ```
//!
//! A weight is `code · scale_inv` of its block (the name notwithstanding, the
//! stored factor multiplies), computed in f32 and rounded once to the compute
//! dtype, as mlx-lm's and transformers' dequantization do. Embeddings, norms,
//! routers and usually `lm_head` stay in bf16 and load as any float tensor.
//! "Dynamic" activation scaling is a property of fp8 kernels, not of the
//! weights: the dequantized model computes in the compute dtype. A checkpoint
//! with static activation scales, another fp8 format or a weight without its
//! scale is refused, naming what and why.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mlx_tensor::{Array, Dtype};
use serde_json::Value;

use crate::error::{Error, Result};

/// The safetensors dtype of the quantized weights.
pub(crate) const FP8_DTYPE: &str = "F8_E4M3";
/// The suffix of a weight's block scales.
const SCALE_SUFFIX: &str = "_scale_inv";

/// The `quant_method: "fp8"` block of config.json.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fp8Config {
    /// Weights per scale, `[rows, cols]`; `None`: one scale per tensor.
    pub(crate) block: Option<[usize; 2]>,
}

impl Fp8Config {
    /// The block of a config whose `quantization_config` (or `quantization`)
    /// names `quant_method: "fp8"`; `Ok(None)` for any other config.
    pub(crate) fn from_config(config: &Value, path: &Path) -> Result<Option<Fp8Config>> {
        // The block `QuantConfig` reads: `quantization`, else `quantization_config`.
        let Some((key, obj)) = ["quantization", "quantization_config"]
            .into_iter()
            .find(|k| config.get(k).is_some_and(|v| !v.is_null()))
            .and_then(|k| Some((k, config.get(k)?.as_object()?)))
        else {
            return Ok(None);
        };
        if obj.get("quant_method").and_then(Value::as_str) != Some("fp8") {
            return Ok(None);
        }
        let bad = |message: String| Error::InvalidConfig {
            path: path.to_owned(),
            key,
            message,
        };
        if let Some(fmt) = obj.get("fmt").filter(|v| !v.is_null())
            && fmt.as_str() != Some("e4m3")
        {
            return Err(bad(format!(
                "fp8 format {fmt} is not supported; only e4m3 (`float8_e4m3fn`) weights load"
            )));
        }
        if let Some(s) = obj.get("activation_scheme").filter(|v| !v.is_null())
            && s.as_str() != Some("dynamic")
        {
            return Err(bad(format!(
                "fp8 activation_scheme {s} is not supported: static activation scales are \
                 calibrated for fp8 kernels; use a checkpoint with \"dynamic\" scaling or the bf16 \
                 release"
            )));
        }
        let block = match obj.get("weight_block_size") {
            None | Some(Value::Null) => None,
            Some(v) => {
                let dims: Option<Vec<usize>> = v.as_array().map(|a| {
                    a.iter()
                        .filter_map(|d| d.as_u64().filter(|&d| d > 0).map(|d| d as usize))
                        .collect()
                });
                match dims.as_deref() {
                    Some(&[r, c]) if v.as_array().is_some_and(|a| a.len() == 2) => Some([r, c]),
                    _ => {
                        return Err(bad(format!(
                            "weight_block_size must be two positive integers such as [128, 128], \
                             found {v}"
                        )));
                    }
                }
            }
        };
        Ok(Some(Fp8Config { block }))
    }

    /// The scale grid of a weight of `shape` (`[.., out, in]`): the leading
    /// axes, then one scale per block.
    fn scale_shape(&self, shape: &[usize]) -> Option<Vec<usize>> {
        let [lead @ .., out, input] = shape else {
            return None;
        };
        let mut s = lead.to_vec();
        match self.block {
            Some([r, c]) => s.extend([out.div_ceil(r), input.div_ceil(c)]),
            None => s.extend([1, 1]),
        }
        Some(s)
    }
}

/// The name of the scales of weight `name` (`{p}.weight` → `{p}.weight_scale_inv`).
pub(crate) fn scale_name(name: &str) -> String {
    format!("{name}{SCALE_SUFFIX}")
}

/// True for a block-scale tensor's name.
pub(crate) fn is_scale(name: &str) -> bool {
    name.ends_with(SCALE_SUFFIX)
}

/// Every tensor of a checkpoint's headers: name → (safetensors dtype, shape).
pub(crate) type HeaderIndex<'a> = HashMap<&'a str, (&'a str, &'a [usize])>;

/// Checks every fp8 weight against its scales over all the checkpoint's
/// headers (the scales of a weight may sit in another shard): present, of a
/// float dtype, with the grid `config` implies; and no scales without their
/// weight. `config` is `None` when config.json declares no fp8 quantization.
pub(crate) fn check_headers(all: &HeaderIndex<'_>, config: Option<Fp8Config>) -> Result<()> {
    for (&name, &(dtype, shape)) in all {
        if dtype == FP8_DTYPE {
            let Some(config) = config else {
                return Err(Error::TensorDtype {
                    name: name.to_owned(),
                    dtype: format!(
                        "{FP8_DTYPE}, but config.json declares no fp8 quantization (add the \
                         checkpoint's \"quantization_config\": {{\"quant_method\": \"fp8\", ...}})"
                    ),
                });
            };
            let scale = scale_name(name);
            let Some(&(s_dtype, s_shape)) = all.get(scale.as_str()) else {
                return Err(Error::MissingTensor {
                    name: scale,
                    count: all.len(),
                });
            };
            if !matches!(s_dtype, "F32" | "F16" | "BF16") {
                return Err(Error::TensorDtype {
                    name: scale,
                    dtype: format!("{s_dtype} (fp8 block scales are floats)"),
                });
            }
            let want = config.scale_shape(shape);
            let per_tensor = config.block.is_none() && s_shape.iter().product::<usize>() == 1;
            if want.as_deref() != Some(s_shape) && !per_tensor {
                return Err(Error::InvalidConfig {
                    path: PathBuf::from("config.json"),
                    key: "quantization_config",
                    message: format!(
                        "`{scale}` has shape {:?}, but weight `{name}` {:?} with \
                         weight_block_size {:?} needs {want:?}; the checkpoint and its config \
                         disagree",
                        s_shape, shape, config.block
                    ),
                });
            }
        } else if let Some(weight) = name.strip_suffix(SCALE_SUFFIX)
            && all.get(weight).is_none_or(|&(d, _)| d != FP8_DTYPE)
        {
            return Err(Error::TensorDtype {
                name: name.to_owned(),
                dtype: format!("block scales without an {FP8_DTYPE} weight `{weight}`"),
            });
        }
    }
    Ok(())
}

/// Every fp8 scale tensor of the checkpoint, unread (MLX reads a file's
/// tensors on first use), by the name of the weight it scales.
pub(crate) fn collect_scales(files: &[PathBuf]) -> Result<HashMap<String, Array>> {
    let mut scales = HashMap::new();
    for f in files {
        for (name, a) in mlx_tensor::io::load_safetensors(f)?.tensors {
            if let Some(weight) = name.strip_suffix(SCALE_SUFFIX) {
                scales.insert(weight.to_owned(), a);
            }
        }
    }
    Ok(scales)
}

/// `codes` (the `uint8` an `F8_E4M3` tensor loads as) times the scale of
/// each block, in f32: `[.., out, in]` with scales `[.., ceil(out / r),
/// ceil(in / c)]` (or one scale).
pub(crate) fn dequantize(codes: &Array, scale: &Array, config: Fp8Config) -> Result<Array> {
    let w = codes.from_fp8(Dtype::Float32)?;
    let scale = scale.as_type(Dtype::Float32)?;
    let shape = w.shape().to_vec();
    let nd = shape.len();
    if scale.size() == 1 || nd < 2 {
        return Ok(w.multiply(&scale.reshape(&[])?)?);
    }
    let [r, c] = config
        .block
        .unwrap_or([shape[nd - 2] as usize, shape[nd - 1] as usize]);
    let s = scale.shape().to_vec();
    let (so, si) = (s[nd - 2], s[nd - 1]);
    let lead = &shape[..nd - 2];
    // Each scale spread over its block: [.., so, 1, si, 1] → [.., so·r, si·c],
    // cut to the weight's own extent (the last blocks may be partial).
    let spread =
        |dims: &[i32]| -> Vec<i32> { lead.iter().copied().chain(dims.iter().copied()).collect() };
    let full = scale
        .reshape(&spread(&[so, 1, si, 1]))?
        .broadcast_to(&spread(&[so, r as i32, si, c as i32]))?
        .reshape(&spread(&[so * r as i32, si * c as i32]))?;
    let full = full.slice_range(&vec![0; nd], &shape)?;
    Ok(w.multiply(&full)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cfg(block: Value) -> Result<Option<Fp8Config>> {
        let v = json!({"quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
            "activation_scheme": "dynamic", "weight_block_size": block}});
        Fp8Config::from_config(&v, Path::new("config.json"))
    }

    #[test]
    fn the_config_block_is_read_and_checked() {
        assert_eq!(
            cfg(json!([128, 128])).unwrap(),
            Some(Fp8Config {
                block: Some([128, 128])
            })
        );
        assert_eq!(cfg(Value::Null).unwrap(), Some(Fp8Config { block: None }));
        for bad in [
            json!([128]),
            json!([0, 128]),
            json!("128"),
            json!([128, 128, 1]),
        ] {
            let e = cfg(bad.clone()).unwrap_err().to_string();
            assert!(e.contains("weight_block_size"), "{bad}: {e}");
        }
        let other = json!({"quantization_config": {"quant_method": "awq"}});
        assert_eq!(
            Fp8Config::from_config(&other, Path::new("c")).unwrap(),
            None
        );
        let e5 = json!({"quantization_config": {"quant_method": "fp8", "fmt": "e5m2"}});
        let e = Fp8Config::from_config(&e5, Path::new("c")).unwrap_err();
        assert!(e.to_string().contains("e5m2"), "{e}");
        let st =
            json!({"quantization_config": {"quant_method": "fp8", "activation_scheme": "static"}});
        let e = Fp8Config::from_config(&st, Path::new("c")).unwrap_err();
        assert!(e.to_string().contains("static"), "{e}");
    }

    /// A 5 × 7 weight in 2 × 3 blocks (partial blocks on both axes): each
    /// element is its code's value times its own block's scale.
    #[test]
    fn each_weight_takes_its_own_blocks_scale() {
        let codes: Vec<u8> = (0..35).map(|i| 0x30 + (i as u8 % 16)).collect();
        let scales: Vec<f32> = (0..9).map(|i| 0.5 + i as f32).collect();
        let a = Array::from_slice(&codes, &[5, 7]).unwrap();
        let s = Array::from_slice(&scales, &[3, 3]).unwrap();
        let config = Fp8Config {
            block: Some([2, 3]),
        };
        let got: Vec<f32> = dequantize(&a, &s, config).unwrap().to_vec().unwrap();
        let value: Vec<f32> = a.from_fp8(Dtype::Float32).unwrap().to_vec().unwrap();
        for i in 0..5 {
            for j in 0..7 {
                let want = value[i * 7 + j] * scales[(i / 2) * 3 + j / 3];
                assert_eq!(got[i * 7 + j], want, "[{i}, {j}]");
            }
        }
        // Stacked experts: the leading axis keeps its own scales.
        let a3 = Array::from_slice(&[codes.clone(), codes].concat(), &[2, 5, 7]).unwrap();
        let s3: Vec<f32> = scales
            .iter()
            .chain(scales.iter().map(|x| x * 2.0).collect::<Vec<_>>().iter())
            .copied()
            .collect();
        let s3 = Array::from_slice(&s3, &[2, 3, 3]).unwrap();
        let got3: Vec<f32> = dequantize(&a3, &s3, config).unwrap().to_vec().unwrap();
        assert_eq!(&got3[..35], &got[..]);
        let doubled: Vec<f32> = got.iter().map(|x| x * 2.0).collect();
        assert_eq!(&got3[35..], &doubled[..]);
    }
}
