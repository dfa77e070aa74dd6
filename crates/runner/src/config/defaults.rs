//! What a family's transformers config class fills in for a key that
//! config.json leaves out, where that differs from the generic defaults
//! `RawConfig` uses (`rms_norm_eps` 1e-6, `head_dim` = hidden / heads,
//! `partial_rotary_factor` 1, no sliding window ...).
//!
//! transformers picks the config class by `model_type` (`AutoConfig`), so
//! the table is keyed the same way. Without it a Qwen3.5 config that lacks
//! `partial_rotary_factor` would rotate whole heads where transformers rotates
//! a quarter of each, and a GLM-4.5 config without `rms_norm_eps` would
//! normalise with 1e-6 instead of 1e-5: silently different numbers.
//!
//! A default fills only an absent key: an explicit `null` stays null, as it
//! does in transformers (Mistral's `"sliding_window": null` means no window).

use serde_json::{Map, Value};

/// A default value of one config key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum KeyDefault {
    /// An integer (sizes, counts, layer indices).
    Int(u64),
    /// A float (epsilons, fractions).
    Float(f64),
}

impl KeyDefault {
    fn to_json(self) -> Value {
        match self {
            KeyDefault::Int(n) => n.into(),
            KeyDefault::Float(f) => f.into(),
        }
    }
}

use KeyDefault::{Float, Int};

/// Qwen2 / Qwen3 (dense and MoE): the window a `use_sliding_window: true`
/// config gets when it names none.
const QWEN_WINDOW: (&str, KeyDefault) = ("sliding_window", Int(4096));
/// Qwen2 / Qwen3 / Qwen2-MoE: the first layer `use_sliding_window` applies to
/// (Qwen2-MoE: the layers below it).
const QWEN_MAX_WINDOW_LAYERS: (&str, KeyDefault) = ("max_window_layers", Int(28));
/// Qwen3.5 and Qwen3-Next: 256-wide heads, a quarter of each rotated.
const QWEN_HYBRID: [(&str, KeyDefault); 2] = [
    ("head_dim", Int(256)),
    ("partial_rotary_factor", Float(0.25)),
];

/// `model_type` → the keys whose transformers 5.25 default differs from ours
/// (`configuration_<model>.py` of each family).
const TABLE: &[(&str, &[(&str, KeyDefault)])] = &[
    ("mistral", &[("sliding_window", Int(4096))]),
    ("qwen2", &[QWEN_WINDOW, QWEN_MAX_WINDOW_LAYERS]),
    // MiMo's remote config class extends Qwen2's.
    ("mimo", &[QWEN_WINDOW, QWEN_MAX_WINDOW_LAYERS]),
    (
        "qwen3",
        &[("head_dim", Int(128)), QWEN_WINDOW, QWEN_MAX_WINDOW_LAYERS],
    ),
    ("qwen2_moe", &[QWEN_WINDOW, QWEN_MAX_WINDOW_LAYERS]),
    ("qwen3_moe", &[QWEN_WINDOW]),
    ("qwen3_5", &QWEN_HYBRID),
    ("qwen3_5_text", &QWEN_HYBRID),
    ("qwen3_5_moe", &QWEN_HYBRID),
    ("qwen3_5_moe_text", &QWEN_HYBRID),
    ("qwen3_next", &QWEN_HYBRID),
    (
        "glm4_moe",
        &[
            ("rms_norm_eps", Float(1e-5)),
            ("partial_rotary_factor", Float(0.5)),
            ("n_shared_experts", Int(1)),
            ("first_k_dense_replace", Int(1)),
        ],
    ),
    // DeepSeek-V3 and GLM-4.7-Flash's MLA sizes have no default here: a
    // config without them is refused by name (`models/mla.rs`).
    (
        "deepseek_v3",
        &[
            ("first_k_dense_replace", Int(3)),
            ("n_shared_experts", Int(1)),
            ("n_routed_experts", Int(256)),
            ("num_experts_per_tok", Int(8)),
            ("moe_intermediate_size", Int(2048)),
        ],
    ),
    (
        "glm4_moe_lite",
        &[
            ("rms_norm_eps", Float(1e-5)),
            ("n_shared_experts", Int(1)),
            ("n_routed_experts", Int(64)),
            ("num_experts_per_tok", Int(4)),
            ("moe_intermediate_size", Int(1536)),
        ],
    ),
];

/// Model types whose `head_dim` is their `qk_rope_head_dim` (DeepSeek-V3's
/// config class sets it so, GLM-4.7-Flash's maps the one name to the other):
/// their hidden size need not be a multiple of the heads.
const HEAD_DIM_IS_ROPE: &[&str] = &["deepseek_v3", "glm4_moe_lite"];

/// The defaults of `model_type` (none for a type not in the table).
pub(crate) fn for_model_type(model_type: &str) -> &'static [(&'static str, KeyDefault)] {
    TABLE
        .iter()
        .find(|(t, _)| *t == model_type)
        .map_or(&[], |(_, d)| d)
}

/// Fills the absent keys of a flattened config (`text_config` and
/// `rope_parameters` already lifted) with its model type's defaults.
pub(super) fn apply(top: &mut Map<String, Value>) {
    let model_type = top
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    for (key, d) in for_model_type(&model_type) {
        top.entry(*key).or_insert_with(|| d.to_json());
    }
    if HEAD_DIM_IS_ROPE.contains(&model_type.as_str())
        && !top.contains_key("head_dim")
        && let Some(rope) = top.get("qk_rope_head_dim").cloned()
    {
        top.insert("head_dim".into(), rope);
    }
}
