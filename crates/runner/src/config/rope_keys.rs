//! Keys config.json may give in more than one place, which transformers 5
//! and mlx-lm look for in different orders: `rope_theta` and
//! `partial_rotary_factor` (top level, `rope_scaling`, `rope_parameters`),
//! the scaling itself (`rope_scaling` or `rope_parameters`), and
//! `tie_word_embeddings` (top level or `text_config`).
//!
//! transformers 5 takes the RoPE dict from `rope_scaling` when it is set
//! (not null), else `rope_parameters`, and reads `rope_theta` and
//! `partial_rotary_factor` from that dict first, the top level second.
//! mlx-lm reads the top level first. Where the places agree both compute the
//! same and we follow transformers; where they disagree the config is
//! refused naming both places, since either reading would surprise someone.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The RoPE keys that live both at the top level and inside the RoPE dict.
const SHARED: [&str; 2] = ["rope_theta", "partial_rotary_factor"];

/// The value of `key` in `m`, a JSON null counting as absent.
fn given<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    m.get(key).filter(|v| !v.is_null())
}

/// Two config values are the same number (10000 and 1e4 are) or the same JSON.
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// Moves the RoPE dict's `rope_theta` and `partial_rotary_factor` to the top
/// level and makes the dict `rope_scaling`, as transformers 5 reads them:
/// `rope_scaling` when set, else `rope_parameters`; the dict's values first.
/// [`check`] has refused the configs where this differs from mlx-lm.
pub(super) fn lift(top: &mut Map<String, Value>) {
    let dict = given(top, "rope_scaling")
        .or_else(|| given(top, "rope_parameters"))
        .and_then(Value::as_object)
        .cloned();
    let Some(dict) = dict else {
        return;
    };
    for key in SHARED {
        if let Some(v) = given(&dict, key) {
            top.insert(key.into(), v.clone());
        }
    }
    top.insert("rope_scaling".into(), Value::Object(dict));
}

/// Refuses a config whose places for the same key disagree (see the module
/// docs). `outer` is config.json as read, before `text_config` is flattened.
pub(super) fn check(outer: &Value, path: &Path) -> Result<()> {
    let Some(outer) = outer.as_object() else {
        return Ok(());
    };
    let bad = |key: &'static str, message: String| Error::InvalidConfig {
        path: path.to_owned(),
        key,
        message,
    };
    let text = outer.get("text_config").and_then(Value::as_object);
    if let Some(text) = text
        && let (Some(a), Some(b)) = (
            given(outer, "tie_word_embeddings"),
            given(text, "tie_word_embeddings"),
        )
        && !same(a, b)
    {
        return Err(bad(
            "tie_word_embeddings",
            format!(
                "is {a} at the top level but {b} in text_config: transformers reads the top \
                 level, mlx-lm text_config; make the two agree"
            ),
        ));
    }
    // The flattened view: text_config's keys first, as `hybrid::normalise` merges them.
    let get = |key: &str| {
        text.and_then(|t| given(t, key))
            .or_else(|| given(outer, key))
    };
    let scaling = get("rope_scaling").and_then(Value::as_object);
    let params = get("rope_parameters").and_then(Value::as_object);
    for key in SHARED {
        let places: Vec<(&str, &Value)> = [
            ("rope_scaling", scaling.and_then(|s| given(s, key))),
            ("rope_parameters", params.and_then(|p| given(p, key))),
            ("the top level", get(key)),
        ]
        .into_iter()
        .filter_map(|(place, v)| v.map(|v| (place, v)))
        .collect();
        let Some(&(first, v)) = places.first() else {
            continue;
        };
        if let Some((other, w)) = places.iter().find(|(_, w)| !same(v, w)) {
            return Err(bad(
                key,
                format!(
                    "is {v} in {first} but {w} in {other}: transformers 5 reads the RoPE dict \
                     first, mlx-lm the top level; give one value"
                ),
            ));
        }
        if scaling.is_some() && params.is_some() && first == "rope_parameters" && places.len() == 1
        {
            return Err(bad(
                key,
                format!(
                    "is {v} in rope_parameters only, beside a rope_scaling without it: \
                     transformers 5 then reads rope_scaling alone (and its default {key}), \
                     mlx-lm uses {v}; put {key} into rope_scaling as well, or keep only one of \
                     the two blocks"
                ),
            ));
        }
    }
    Ok(())
}
