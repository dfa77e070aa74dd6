//! `config.json` and `generation_config.json` of a Hugging Face model folder.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result, read_json};

mod defaults;
mod hybrid;
mod rope_keys;

pub use hybrid::{HybridConfig, LayerKind};

/// A token id or a list of them (`eos_token_id` is either in the wild).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenIds {
    /// One id.
    One(u32),
    /// Several ids.
    Many(Vec<u32>),
}

impl<'de> Deserialize<'de> for TokenIds {
    /// An integer in `0..=u32::MAX` or a list of them; anything else is an
    /// error that says what a token id is (serde's own untagged-enum message
    /// named neither the key nor the rule).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error as _;
        use serde_json::Value;
        let v = Value::deserialize(d)?;
        let id = |x: &Value| x.as_u64().and_then(|i| u32::try_from(i).ok());
        match &v {
            Value::Array(a) => a
                .iter()
                .map(id)
                .collect::<Option<Vec<u32>>>()
                .map(TokenIds::Many),
            x => id(x).map(TokenIds::One),
        }
        .ok_or_else(|| {
            D::Error::custom(format!(
                "a token id (`eos_token_id`, `bos_token_id`, `pad_token_id`) must be an \
                 integer from 0 to {} or a list of them; got {v}",
                u32::MAX
            ))
        })
    }
}

impl TokenIds {
    /// The ids as a list.
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }
}

/// `rope_scaling` as found in config.json (`type` or `rope_type` names the kind).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(expecting = "an object such as {\"rope_type\": \"yarn\", \"factor\": 4.0}, or null")]
pub(crate) struct RopeScalingRaw {
    /// The kind, old spelling.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The kind, new spelling.
    pub rope_type: Option<String>,
    /// Scaling factor.
    pub factor: Option<f32>,
    /// Llama 3: low-frequency factor.
    pub low_freq_factor: Option<f32>,
    /// Llama 3: high-frequency factor.
    pub high_freq_factor: Option<f32>,
    /// Llama 3 / YaRN: the context the base model was trained on.
    pub original_max_position_embeddings: Option<usize>,
    /// YaRN: rotations at which interpolation ends (32 when absent).
    pub beta_fast: Option<f32>,
    /// YaRN: rotations at which extrapolation ends (1 when absent).
    pub beta_slow: Option<f32>,
    /// YaRN: numerator weight of the attention scale.
    pub mscale: Option<f32>,
    /// YaRN: denominator weight of the attention scale.
    pub mscale_all_dim: Option<f32>,
    /// YaRN: the attention scale, given outright.
    pub attention_factor: Option<f32>,
    /// YaRN: round the correction range to whole dimensions (true when absent).
    pub truncate: Option<bool>,
}

/// How rotary frequencies are scaled.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor`.
    Linear {
        /// The divisor.
        factor: f32,
    },
    /// Llama 3.1 style frequency-dependent scaling.
    Llama3 {
        /// Scaling factor.
        factor: f32,
        /// Low-frequency factor.
        low_freq_factor: f32,
        /// High-frequency factor.
        high_freq_factor: f32,
        /// Trained context.
        original_max_position_embeddings: usize,
    },
    /// YaRN (NTK-by-parts interpolation plus an attention scale), as
    /// transformers' `_compute_yarn_parameters` computes it.
    Yarn {
        /// Context extension factor.
        factor: f32,
        /// Trained context.
        original_max_position_embeddings: usize,
        /// Rotations at which interpolation ends.
        beta_fast: f32,
        /// Rotations at which extrapolation ends.
        beta_slow: f32,
        /// Multiplies the rotated part of q and k (so the logits by its square).
        attention_factor: f32,
        /// Round the correction range to whole dimensions.
        truncate: bool,
    },
}

#[derive(Debug, Deserialize)]
struct RawConfig {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    model_type: String,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    intermediate_size: usize,
    #[serde(default = "default_eps")]
    rms_norm_eps: f32,
    #[serde(default = "default_theta")]
    rope_theta: f32,
    rope_scaling: Option<RopeScalingRaw>,
    #[serde(default = "default_ctx")]
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    attention_bias: Option<bool>,
    vocab_size: usize,
    bos_token_id: Option<TokenIds>,
    eos_token_id: Option<TokenIds>,
    torch_dtype: Option<String>,
    /// transformers 5 writes `torch_dtype` under this name.
    dtype: Option<serde_json::Value>,
    mtp_num_hidden_layers: Option<usize>,
    num_nextn_predict_layers: Option<usize>,
    mtp_norm_zero_centered: Option<bool>,
    #[serde(default)]
    layer_types: Vec<String>,
    full_attention_interval: Option<usize>,
    linear_num_key_heads: Option<usize>,
    linear_num_value_heads: Option<usize>,
    linear_key_head_dim: Option<usize>,
    linear_value_head_dim: Option<usize>,
    linear_conv_kernel_dim: Option<usize>,
    partial_rotary_factor: Option<f32>,
    attn_output_gate: Option<bool>,
    #[serde(default)]
    mlp_bias: bool,
    sliding_window: Option<usize>,
    hidden_act: Option<String>,
}

/// The largest size a config may give a dimension (MLX shapes are `i32`).
const MAX_DIM: usize = i32::MAX as usize;

fn default_eps() -> f32 {
    1e-6
}
fn default_theta() -> f32 {
    10_000.0
}
fn default_ctx() -> usize {
    4096
}

/// A validated model config.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// `architectures[0]` (empty when absent).
    pub architecture: String,
    /// `model_type`.
    pub model_type: String,
    /// Residual stream width.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); divides `num_attention_heads`.
    pub num_key_value_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// MLP width.
    pub intermediate_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base.
    pub rope_theta: f32,
    /// RoPE frequency scaling.
    pub rope_scaling: RopeScaling,
    /// Context length.
    pub max_position_embeddings: usize,
    /// The unembedding reuses the embedding matrix.
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry a bias; `None` lets the family decide (Qwen2: yes).
    pub attention_bias: Option<bool>,
    /// Rows of the embedding.
    pub vocab_size: usize,
    /// Begin-of-sequence ids.
    pub bos_token_id: Vec<u32>,
    /// End-of-sequence ids.
    pub eos_token_id: Vec<u32>,
    /// The checkpoint's dtype as declared (`torch_dtype`, or transformers 5's `dtype`).
    pub torch_dtype: Option<String>,
    /// Declared MTP layers (`mtp_num_hidden_layers` or `num_nextn_predict_layers`).
    pub mtp_layers: usize,
    /// `mtp_norm_zero_centered`: whether the MTP head's RMSNorm weights are
    /// stored zero-centred (see [`crate::models::mtp::zero_centred_norms`] for the rule
    /// when it is absent).
    pub mtp_norm_zero_centered: Option<bool>,
    /// Fraction of each attention head that RoPE rotates (`partial_rotary_factor`, 1 when absent).
    pub partial_rotary_factor: f32,
    /// Layer plan and Gated DeltaNet shapes of a hybrid model (Qwen3.5 /
    /// Qwen3-Next); `None` when the config declares no linear-attention layers.
    pub hybrid: Option<HybridConfig>,
    /// The MLP projections carry biases (`mlp_bias`, Llama).
    pub mlp_bias: bool,
    /// `sliding_window` as written (null and absent are `None`); each family
    /// decides which layers use it (see [`ModelConfig::raw`]).
    pub sliding_window: Option<usize>,
    /// The config as read, after `text_config` and `rope_parameters` were
    /// flattened: the family-specific keys a family checks for itself.
    pub raw: serde_json::Value,
}

impl ModelConfig {
    /// Reads `dir/config.json`.
    pub fn load(dir: &Path) -> Result<ModelConfig> {
        let path = dir.join("config.json");
        if !path.is_file() {
            return Err(Error::MissingFile {
                path,
                hint: "a model folder needs the Hugging Face config.json next to its safetensors",
            });
        }
        let value: serde_json::Value = read_json(&path)?;
        Self::from_value(value, &path)
    }

    /// Parses config JSON text; `path` names it in errors.
    pub fn from_json(text: &str, path: &Path) -> Result<ModelConfig> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| Error::Json {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        Self::from_value(value, path)
    }

    /// A nested `text_config` and transformers 5 `rope_parameters` are
    /// flattened first (see [`hybrid`]; keys given in two places must agree,
    /// see [`rope_keys`]), then the model type's defaults fill the keys it
    /// leaves out (see [`defaults`]).
    pub(crate) fn from_value(value: serde_json::Value, path: &Path) -> Result<ModelConfig> {
        rope_keys::check(&value, path)?;
        let mut value = hybrid::normalise(value);
        if let Some(top) = value.as_object_mut() {
            defaults::apply(top);
        }
        // Every layer of a Qwen3.5-MoE model is sparse, so its config has no
        // dense `intermediate_size`; the expert width stands in for it (the
        // size checks and any dense layer a family would build read it).
        if value.get("intermediate_size").is_none()
            && let Some(moe) = value.get("moe_intermediate_size").cloned()
        {
            value["intermediate_size"] = moe;
        }
        must_be_object(&value, path)?;
        // The error names the key whose value has the wrong type.
        let raw: RawConfig =
            serde_path_to_error::deserialize(value.clone()).map_err(|e| Error::Json {
                path: path.to_owned(),
                message: format!("key `{}`: {}", e.path(), e.inner()),
            })?;
        Self::from_raw(raw, value, path)
    }

    /// `architectures[0]` and `model_type` of a config.json value, read before
    /// anything else so an unsupported architecture is named as such rather
    /// than by the first key its config lacks.
    pub fn identify(value: &serde_json::Value) -> (String, String) {
        let v = hybrid::normalise(value.clone());
        let arch = v["architectures"][0]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let model_type = v["model_type"].as_str().unwrap_or_default().to_owned();
        (arch, model_type)
    }

    /// Reads `dir/config.json` as JSON (not yet validated).
    pub fn read_value(dir: &Path) -> Result<(serde_json::Value, PathBuf)> {
        let path = dir.join("config.json");
        if !path.is_file() {
            return Err(Error::MissingFile {
                path,
                hint: "a model folder needs the Hugging Face config.json next to its safetensors",
            });
        }
        let value = read_json(&path)?;
        must_be_object(&value, &path)?;
        Ok((value, path))
    }

    /// An error for a config key whose computation the family does not implement.
    pub fn unsupported_key(&self, key: &'static str, message: String) -> Error {
        Error::InvalidConfig {
            path: PathBuf::from("config.json"),
            key,
            message,
        }
    }

    // Long: one check per config key, each naming the key in its error.
    fn from_raw(raw: RawConfig, value: serde_json::Value, path: &Path) -> Result<ModelConfig> {
        let hybrid = hybrid::parse(&raw, path)?;
        let bad = |key: &'static str, message: String| Error::InvalidConfig {
            path: path.to_owned(),
            key,
            message,
        };
        for (key, v) in [
            ("hidden_size", raw.hidden_size),
            ("num_hidden_layers", raw.num_hidden_layers),
            ("num_attention_heads", raw.num_attention_heads),
            ("intermediate_size", raw.intermediate_size),
            ("vocab_size", raw.vocab_size),
            ("max_position_embeddings", raw.max_position_embeddings),
        ] {
            if v == 0 {
                return Err(bad(key, "must be positive".into()));
            }
            // MLX shapes are i32: a larger size would wrap when a layer is built.
            if v > MAX_DIM {
                return Err(bad(key, format!("{v} exceeds the largest size {MAX_DIM}")));
            }
        }
        let heads = raw.num_attention_heads;
        let kv = raw.num_key_value_heads.unwrap_or(heads);
        if kv == 0 || !heads.is_multiple_of(kv) {
            return Err(bad(
                "num_key_value_heads",
                format!("{kv} must be positive and divide num_attention_heads ({heads})"),
            ));
        }
        let head_dim = match raw.head_dim {
            Some(0) => return Err(bad("head_dim", "must be positive".into())),
            Some(d) => d,
            None if raw.hidden_size.is_multiple_of(heads) => raw.hidden_size / heads,
            None => {
                return Err(bad(
                    "head_dim",
                    format!(
                        "absent, and hidden_size {} is not a multiple of num_attention_heads {heads}",
                        raw.hidden_size
                    ),
                ));
            }
        };
        if head_dim.checked_mul(heads).is_none_or(|w| w > MAX_DIM) {
            return Err(bad(
                "head_dim",
                format!("{head_dim} × {heads} heads exceeds the largest size {MAX_DIM}"),
            ));
        }
        if head_dim % 2 != 0 {
            return Err(bad("head_dim", format!("{head_dim} must be even for RoPE")));
        }
        // robust2: a value that parsed to infinity (1e39 into f32) is as wrong as a negative one.
        if !raw.rope_theta.is_finite() || raw.rope_theta <= 0.0 {
            return Err(bad(
                "rope_theta",
                format!(
                    "{} must be a positive finite number (f32 holds up to 3.4e38)",
                    raw.rope_theta
                ),
            ));
        }
        if !raw.rms_norm_eps.is_finite() || raw.rms_norm_eps <= 0.0 {
            return Err(bad(
                "rms_norm_eps",
                format!(
                    "{} must be a small positive finite number (typically 1e-5 or 1e-6); zero or \
                     a negative value makes RMSNorm divide by zero or take the root of a \
                     negative number",
                    raw.rms_norm_eps
                ),
            ));
        }
        if let Some(f) = raw.partial_rotary_factor
            && !f.is_finite()
        {
            return Err(bad(
                "partial_rotary_factor",
                format!("{f} must be a finite number in (0, 1]"),
            ));
        }
        check_model_size(&raw, head_dim, kv).map_err(|m| bad("num_hidden_layers", m))?;
        let rope_scaling = match raw.rope_scaling {
            None => RopeScaling::None,
            Some(s) => parse_scaling(s, raw.max_position_embeddings, path)?,
        };
        // transformers' ACT2FN maps `swish` to the same SiLU.
        if let Some(act) = &raw.hidden_act
            && act != "silu"
            && act != "swish"
        {
            return Err(bad(
                "hidden_act",
                format!("`{act}` is not implemented (every supported family uses silu)"),
            ));
        }
        // mlx-lm rotates interleaved pairs when this is true (weights converted
        // from Meta's own checkpoints); transformers has no such key.
        if value["rope_traditional"] == serde_json::Value::Bool(true) {
            return Err(bad(
                "rope_traditional",
                "true (RoPE over interleaved pairs, as mlx-lm reads it) is not implemented: \
                 every family here rotates half-split pairs as transformers does; convert the \
                 model from its Hugging Face checkpoint"
                    .into(),
            ));
        }
        // transformers 5 writes Qwen2-MoE's unused window as 0 beside
        // `use_sliding_window: false`: no window, not a bad one.
        let unused = value["use_sliding_window"] == serde_json::Value::Bool(false);
        let sliding_window = match raw.sliding_window {
            Some(0) if unused => None,
            Some(0) => return Err(bad("sliding_window", "must be positive or null".into())),
            w => w,
        };
        Ok(ModelConfig {
            architecture: raw.architectures.first().cloned().unwrap_or_default(),
            model_type: raw.model_type,
            hidden_size: raw.hidden_size,
            num_hidden_layers: raw.num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: kv,
            head_dim,
            intermediate_size: raw.intermediate_size,
            rms_norm_eps: raw.rms_norm_eps,
            rope_theta: raw.rope_theta,
            rope_scaling,
            max_position_embeddings: raw.max_position_embeddings,
            tie_word_embeddings: raw.tie_word_embeddings,
            attention_bias: raw.attention_bias,
            vocab_size: raw.vocab_size,
            bos_token_id: raw.bos_token_id.map(|t| t.to_vec()).unwrap_or_default(),
            eos_token_id: raw.eos_token_id.map(|t| t.to_vec()).unwrap_or_default(),
            torch_dtype: raw.torch_dtype.or_else(|| {
                raw.dtype
                    .as_ref()
                    .and_then(|d| d.as_str())
                    .map(str::to_owned)
            }),
            mtp_layers: raw
                .mtp_num_hidden_layers
                .or(raw.num_nextn_predict_layers)
                .unwrap_or(0),
            mtp_norm_zero_centered: raw.mtp_norm_zero_centered,
            partial_rotary_factor: hybrid::rotary_factor(
                raw.partial_rotary_factor,
                head_dim,
                path,
            )?,
            hybrid,
            mlp_bias: raw.mlp_bias,
            sliding_window,
            raw: value,
        })
    }
}

/// A config is one JSON object: anything else is refused by what it is
/// (rather than by the architecture it then seems to lack).
fn must_be_object(value: &serde_json::Value, path: &Path) -> Result<()> {
    if value.is_object() {
        return Ok(());
    }
    Err(Error::Json {
        path: path.to_owned(),
        message: format!(
            "the top level is {}, not an object: a config.json is one JSON object of keys \
             (`{{\"model_type\": ...}}`)",
            json_kind(value)
        ),
    })
}

/// What kind of JSON value `v` is, for an error message.
fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

fn parse_scaling(s: RopeScalingRaw, context: usize, path: &Path) -> Result<RopeScaling> {
    let bad = |message: String| Error::InvalidConfig {
        path: path.to_owned(),
        key: "rope_scaling",
        message,
    };
    let kind = s.rope_type.clone().or(s.kind.clone()).unwrap_or_default();
    check_complete(&s, &kind).map_err(bad)?;
    let factor = s.factor.unwrap_or(1.0);
    if !factor.is_finite() || factor <= 0.0 {
        return Err(bad(format!(
            "factor {factor} must be a positive finite number"
        )));
    }
    for (name, v) in [
        ("low_freq_factor", s.low_freq_factor),
        ("high_freq_factor", s.high_freq_factor),
    ] {
        if let Some(v) = v
            && (!v.is_finite() || v <= 0.0)
        {
            return Err(bad(format!("{name} {v} must be a positive finite number")));
        }
    }
    match kind.as_str() {
        "default" | "" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor }),
        "llama3" => {
            // `check_complete` has made sure all three are there.
            let (Some(low), Some(high), Some(original)) = (
                s.low_freq_factor,
                s.high_freq_factor,
                s.original_max_position_embeddings,
            ) else {
                return Err(bad("llama3 needs its parameters".into()));
            };
            // Llama 3 blends the two bands over `high - low`.
            if high <= low {
                return Err(bad(format!(
                    "high_freq_factor {high} must be greater than low_freq_factor {low} \
                     (Llama 3.1 uses 4 and 1)"
                )));
            }
            if original == 0 {
                return Err(bad(
                    "original_max_position_embeddings must be at least 1 (Llama 3.1 uses 8192)"
                        .into(),
                ));
            }
            Ok(RopeScaling::Llama3 {
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: original,
            })
        }
        "yarn" => yarn(&s, context, path),
        other => Err(bad(format!(
            "type `{other}` is not supported (supported: linear, llama3, yarn)"
        ))),
    }
}

/// As transformers does: a kind that scales needs its factor (and Llama 3
/// its whole parameter set), and a factor needs a kind; filled in with
/// guesses, a config that lost a key would run unscaled or scaled wrong
/// without a word. The error is the message for `rope_scaling`.
fn check_complete(s: &RopeScalingRaw, kind: &str) -> std::result::Result<(), String> {
    let need = |keys: &[(&str, bool)]| {
        let missing: Vec<&str> = keys
            .iter()
            .filter(|(_, has)| !has)
            .map(|(k, _)| *k)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(format!(
            "type `{kind}` needs {}: copy rope_scaling from the model's original config.json",
            missing.join(", ")
        ))
    };
    match kind {
        "linear" => need(&[("factor", s.factor.is_some())]),
        "llama3" => need(&[
            ("factor", s.factor.is_some()),
            ("low_freq_factor", s.low_freq_factor.is_some()),
            ("high_freq_factor", s.high_freq_factor.is_some()),
            (
                "original_max_position_embeddings",
                s.original_max_position_embeddings.is_some(),
            ),
        ]),
        // transformers 5 derives a missing factor from the two context lengths.
        "yarn" => need(&[(
            "factor (or original_max_position_embeddings to derive it from)",
            s.factor.is_some() || s.original_max_position_embeddings.is_some(),
        )]),
        "" | "default" if s.factor.is_some_and(|f| f != 1.0) => Err(format!(
            "factor {} is given without `type` / `rope_type`: name the scaling \
             (linear, llama3, yarn), or remove rope_scaling for plain RoPE",
            s.factor.unwrap_or_default()
        )),
        _ => Ok(()),
    }
}

/// YaRN parameters with transformers 5's defaults: the factor as given (or
/// `max_position_embeddings / original_max_position_embeddings` when absent),
/// and the attention scale `attention_factor`, else
/// `mscale(factor, mscale) / mscale(factor, mscale_all_dim)` when both are
/// given, else `mscale(factor)` with `mscale(s, m) = 0.1 · m · ln s + 1`.
fn yarn(s: &RopeScalingRaw, context: usize, path: &Path) -> Result<RopeScaling> {
    let bad = |message: String| Error::InvalidConfig {
        path: path.to_owned(),
        key: "rope_scaling",
        message,
    };
    let original = s.original_max_position_embeddings.unwrap_or(context);
    if original == 0 {
        return Err(bad(
            "original_max_position_embeddings must be positive".into()
        ));
    }
    let factor = s.factor.unwrap_or(context as f32 / original as f32);
    if factor.is_nan() || factor <= 0.0 {
        return Err(bad(format!("yarn factor {factor} must be positive")));
    }
    let get = |scale: f32, m: f32| {
        if scale <= 1.0 {
            1.0
        } else {
            0.1 * m * scale.ln() + 1.0
        }
    };
    let attention_factor = match (s.attention_factor, s.mscale, s.mscale_all_dim) {
        (Some(a), _, _) => a,
        (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => get(factor, m) / get(factor, all),
        _ => get(factor, 1.0),
    };
    let beta_fast = s.beta_fast.filter(|b| *b != 0.0).unwrap_or(32.0);
    let beta_slow = s.beta_slow.filter(|b| *b != 0.0).unwrap_or(1.0);
    if !(attention_factor.is_finite() && attention_factor > 0.0) {
        return Err(bad(format!(
            "yarn attention factor {attention_factor} must be positive"
        )));
    }
    Ok(RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: original,
        beta_fast,
        beta_slow,
        attention_factor,
        truncate: s.truncate.unwrap_or(true),
    })
}

/// Most decoder layers a config may declare: far above any released model
/// (a few hundred), far below a count whose layer list alone would exhaust memory.
const MAX_LAYERS: usize = 1 << 14;
/// Most parameters a config may imply: 2^44 (17.6 T), more than any machine
/// can hold even at 4 bits.
const MAX_PARAMETERS: u128 = 1 << 44;

/// robust2: sizes checked against what a machine could hold, before anything is
/// allocated for them (the layer list, caches, tables).
fn check_model_size(raw: &RawConfig, head_dim: usize, kv: usize) -> Result<(), String> {
    let layers = raw.num_hidden_layers;
    if layers > MAX_LAYERS {
        return Err(format!(
            "{layers} layers is more than any model has (the limit is {MAX_LAYERS}); the value \
             is probably corrupt"
        ));
    }
    let (h, i) = (raw.hidden_size as u128, raw.intermediate_size as u128);
    let q = (raw.num_attention_heads * head_dim) as u128;
    let kv = (kv * head_dim) as u128;
    let per_layer = h * q * 2 + h * kv * 2 + 3 * h * i;
    let embed = raw.vocab_size as u128 * h * if raw.tie_word_embeddings { 1 } else { 2 };
    let total = per_layer * layers as u128 + embed;
    if total > MAX_PARAMETERS {
        return Err(format!(
            "hidden_size {}, intermediate_size {}, vocab_size {} and {layers} layers imply {total} \
             parameters, more than any machine can hold (limit {MAX_PARAMETERS}); a value is \
             probably corrupt",
            raw.hidden_size, raw.intermediate_size, raw.vocab_size
        ));
    }
    Ok(())
}

/// Defaults from `generation_config.json` (all optional).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct GenerationConfig {
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// Top-k.
    pub top_k: Option<i64>,
    /// Min-p.
    pub min_p: Option<f32>,
    /// Repetition penalty.
    pub repetition_penalty: Option<f32>,
    /// Whether the model expects sampling (false means greedy).
    pub do_sample: Option<bool>,
    /// End-of-sequence ids overriding config.json's.
    pub eos_token_id: Option<TokenIds>,
    /// Begin-of-sequence id.
    pub bos_token_id: Option<TokenIds>,
    /// Default generation length.
    pub max_new_tokens: Option<usize>,
}

impl GenerationConfig {
    /// Reads `dir/generation_config.json`; absent means all defaults.
    pub fn load(dir: &Path) -> Result<GenerationConfig> {
        let path: PathBuf = dir.join("generation_config.json");
        if !path.is_file() {
            return Ok(GenerationConfig::default());
        }
        read_json(&path)
    }
}
