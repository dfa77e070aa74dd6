//! Property tests of everything that parses bytes from a model folder:
//! config.json, safetensors headers, model.safetensors.index.json,
//! tokenizer.json, tokenizer_config.json and chat templates. Whatever the
//! bytes, the result is `Ok` or a typed `Err`: no panic, no hang, and no
//! allocation of what a lying header claims.
//!
//! Case counts keep each test to a few seconds on a 2-core CI machine.

use std::path::Path;

use proptest::prelude::*;
use runner::Message;
use runner::testing::render_template;
use runner::testing::{Arch, Fixture, tokenizer_json};
use runner::testing::{validate_header, weight_files};
use runner::{GenerationConfig, ModelConfig, Tokenizer};
use serde_json::{Value, json};

/// JSON values that stress a config reader: edges of every numeric type,
/// wrong types, nesting.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        prop::sample::select(vec![
            json!(0),
            json!(1),
            json!(-1),
            json!(2),
            json!(3),
            json!(7),
            json!(64),
            json!(i32::MAX),
            json!(i32::MAX as u64 + 1),
            json!(u64::MAX),
            json!(i64::MIN),
            json!(0.5),
            json!(-0.0),
            json!(1e308),
            json!(1e-300),
        ]),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON numbers are finite", |f| f.is_finite())
            .prop_map(Value::from),
        "\\PC{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
            prop::collection::btree_map("[a-z_]{1,6}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// An edit of one key of a JSON object: remove it or set it to any value.
fn edits(keys: Vec<String>) -> impl Strategy<Value = Vec<(String, Option<Value>)>> {
    prop::collection::vec(
        (
            prop::sample::select(keys),
            prop::option::weighted(0.8, json_value()),
        ),
        1..4,
    )
}

fn apply(mut v: Value, edits: &[(String, Option<Value>)]) -> Value {
    let obj = v.as_object_mut().expect("an object");
    for (k, val) in edits {
        match val {
            Some(val) => obj.insert(k.clone(), val.clone()),
            None => obj.remove(k),
        };
    }
    v
}

fn config_keys() -> Vec<String> {
    let mut keys: Vec<String> = Fixture::new(Arch::Llama3)
        .config_json()
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    keys.extend(
        [
            "rope_scaling",
            "mtp_num_hidden_layers",
            "num_nextn_predict_layers",
            "attention_bias",
            "partial_rotary_factor",
        ]
        .map(str::to_owned),
    );
    keys
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    /// A config.json with keys removed or retyped parses or names its fault;
    /// a config that parses has sizes MLX can hold and resolves to a family or
    /// an `UnknownArchitecture` error.
    #[test]
    fn config_json_edits_never_panic(e in edits(config_keys())) {
        let v = apply(Fixture::new(Arch::Llama3).config_json(), &e);
        let path = Path::new("m/config.json");
        match ModelConfig::from_json(&v.to_string(), path) {
            Ok(c) => {
                for d in [c.hidden_size, c.intermediate_size, c.vocab_size, c.head_dim * c.num_attention_heads] {
                    prop_assert!(d <= i32::MAX as usize, "{} in {}", d, v);
                }
                let _ = runner::testing::lookup(&c);
            }
            Err(err) => prop_assert!(err.to_string().contains("m/config.json"), "{}", err),
        }
    }

    /// Arbitrary text as config.json.
    #[test]
    fn config_json_bytes_never_panic(text in "\\PC{0,64}") {
        let r = ModelConfig::from_json(&text, Path::new("config.json"));
        prop_assert!(r.is_err());
    }
}

/// A safetensors file: the 8-byte length, the header bytes, then `data` bytes.
fn safetensors_bytes(len_field: u64, header: &[u8], data: usize) -> Vec<u8> {
    let mut b = len_field.to_le_bytes().to_vec();
    b.extend_from_slice(header);
    b.resize(b.len() + data, 0x3f);
    b
}

/// A header: tensors with any dtype name, shape and offsets (mostly
/// consistent, sometimes lying).
fn header() -> impl Strategy<Value = (Value, usize)> {
    let dtype = prop::sample::select(vec![
        "F32", "F16", "BF16", "U32", "I64", "BOOL", "F64", "U8", "F8_E4M3", "XYZ",
    ]);
    let dim = prop_oneof![
        8 => 0usize..5,
        1 => Just(usize::MAX),
        1 => Just(1usize << 40),
    ];
    let tensor = (
        dtype,
        prop::collection::vec(dim, 0..4),
        any::<bool>(),
        0usize..64,
    );
    prop::collection::vec(tensor, 0..4).prop_map(|ts| {
        let mut h = serde_json::Map::new();
        let mut off = 0usize;
        for (i, (dtype, shape, honest, lie)) in ts.into_iter().enumerate() {
            let width = match dtype {
                "F32" | "U32" => 4,
                "F16" | "BF16" => 2,
                "I64" | "F64" => 8,
                _ => 1,
            };
            let n = shape
                .iter()
                .try_fold(width, |a: usize, &d| a.checked_mul(d))
                .unwrap_or(usize::MAX);
            let end = if honest {
                off.saturating_add(n)
            } else {
                off.saturating_add(lie)
            };
            h.insert(
                format!("t{i}"),
                json!({"dtype": dtype, "shape": shape, "data_offsets": [off, end]}),
            );
            off = end;
        }
        if h.is_empty() {
            h.insert("__metadata__".into(), json!({"format": "pt"}));
        }
        (Value::Object(h), off)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    /// Any length field over any bytes: an error naming the file, or tensors whose
    /// data fits the file. The header buffer is never larger than the file.
    #[test]
    fn safetensors_bytes_never_panic(
        len_field in prop_oneof![any::<u64>(), 0u64..200],
        header in prop::collection::vec(any::<u8>(), 0..160),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("model.safetensors");
        std::fs::write(&p, safetensors_bytes(len_field, &header, 0)).unwrap();
        if let Err(e) = validate_header(&p) {
            prop_assert!(e.to_string().contains("model.safetensors"), "{}", e);
        }
    }

    /// Structured headers (any dtype, shapes up to 2^64, lying offsets): the
    /// checked header is accepted only when it describes the data exactly, and
    /// loading what it accepts gives tensors or a dtype error.
    #[test]
    fn safetensors_headers_are_checked_against_the_file(
        (h, end) in header(),
        slack in prop_oneof![Just(0i64), -3i64..3],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("model.safetensors");
        let text = h.to_string();
        let data = (end.min(4096) as i64 + slack).max(0) as usize;
        std::fs::write(&p, safetensors_bytes(text.len() as u64, text.as_bytes(), data)).unwrap();
        match validate_header(&p) {
            Ok(entries) => {
                prop_assert_eq!(end, data, "accepted a header for {} bytes over {}", end, data);
                let any_float = entries.values().any(|e| matches!(e.dtype.as_str(), "F32" | "F16" | "BF16"));
                let only_loadable = entries.values().all(|e| matches!(e.dtype.as_str(), "F32" | "F16" | "BF16"));
                if any_float && only_loadable {
                    // The bytes 0x3f3f3f3f are finite in every float dtype.
                    let w = runner::testing::Weights::load(dir.path(), mlx_tensor::Dtype::Float32, |_, _| {});
                    prop_assert!(w.is_ok(), "{:?}", w.err());
                }
            }
            Err(e) => prop_assert!(e.to_string().contains("model.safetensors"), "{}", e),
        }
    }

    /// model.safetensors.index.json with any shard names: the files listed are
    /// inside the model folder, or the error names the index or the shard.
    #[test]
    fn index_files_stay_in_the_folder(
        names in prop::collection::vec(
            prop_oneof![
                Just("model-00001-of-00002.safetensors".to_owned()),
                Just("../outside.safetensors".to_owned()),
                Just("/etc/passwd".to_owned()),
                Just("sub/dir.safetensors".to_owned()),
                Just("..".to_owned()),
                Just(String::new()),
                "\\PC{0,10}",
            ],
            0..4,
        ),
        bad_json in prop::option::weighted(0.1, "\\PC{0,20}"),
    ) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("model-00001-of-00002.safetensors"), b"x").unwrap();
        let map: serde_json::Map<String, Value> = names
            .iter()
            .enumerate()
            .map(|(i, n)| (format!("t{i}"), json!(n)))
            .collect();
        let text = bad_json.unwrap_or_else(|| json!({"metadata": {}, "weight_map": map}).to_string());
        std::fs::write(dir.path().join("model.safetensors.index.json"), text).unwrap();
        match weight_files(dir.path()) {
            Ok(files) => {
                for f in files {
                    prop_assert_eq!(f.parent(), Some(dir.path()), "{:?} escapes the folder", f);
                    prop_assert!(f.is_file());
                }
            }
            Err(e) => {
                let m = e.to_string();
                prop_assert!(m.contains("index.json") || m.contains("not found"), "{}", m);
            }
        }
    }
}

fn tokenizer_keys() -> Vec<String> {
    [
        "version",
        "added_tokens",
        "normalizer",
        "pre_tokenizer",
        "post_processor",
        "decoder",
        "model",
        "truncation",
        "padding",
    ]
    .map(str::to_owned)
    .to_vec()
}

/// Writes tokenizer.json and tokenizer_config.json and loads them.
fn load_tokenizer(tok: &str, tok_config: &str) -> runner::Result<Tokenizer> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), tok).unwrap();
    std::fs::write(dir.path().join("tokenizer_config.json"), tok_config).unwrap();
    let fx = Fixture::new(Arch::Qwen3);
    let config =
        ModelConfig::from_json(&fx.config_json().to_string(), Path::new("config.json")).unwrap();
    Tokenizer::load(dir.path(), &config, &GenerationConfig::default())
}

/// Pieces of Jinja that real chat templates use, for random templates.
const JINJA: &[&str] = &[
    "{% for m in messages %}",
    "{% endfor %}",
    "{% if add_generation_prompt %}",
    "{% if m.role == 'user' %}",
    "{% else %}",
    "{% endif %}",
    "{{ m.content }}",
    "{{ m['role'] }}",
    "{{ bos_token }}",
    "{{ messages[0].content | trim }}",
    "{{ messages | length }}",
    "{% set ns = namespace(x=0) %}",
    "{% set ns.x = ns.x + 1 %}",
    "{{ raise_exception('no') }}",
    "{{ m.content.strip() }}",
    "{{ 'x' * 3 }}",
    "{% include 'x' %}",
    "{{ loop.index }}",
    "{{ undefined_thing.attr }}",
    "{{ tojson(messages) }}",
    "{{ messages | tojson }}",
    "{%- ",
    " -%}",
    "{{",
    "}}",
    "<|im_start|>",
    "\n",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// tokenizer.json with parts removed or replaced loads or names the file.
    #[test]
    fn tokenizer_json_edits_never_panic(e in edits(tokenizer_keys())) {
        let v = apply(tokenizer_json(), &e);
        if let Err(err) = load_tokenizer(&v.to_string(), "{}") {
            prop_assert!(err.to_string().contains("tokenizer"), "{}", err);
        }
    }

    /// tokenizer_config.json with any special tokens and chat templates; a
    /// template that loads renders to text or a `chat template` error.
    #[test]
    fn tokenizer_config_and_templates_never_panic(
        special in prop::collection::vec((
            prop::sample::select(vec!["bos_token", "eos_token", "pad_token", "chat_template"]),
            prop_oneof![
                json_value(),
                Just(json!("<|im_end|>")),
                Just(json!({"content": "<|endoftext|>"})),
                Just(json!([{"name": "default", "template": "{{ bos_token }}"}, {"name": "tool_use"}])),
            ],
        ), 0..4),
        pieces in prop::collection::vec(prop::sample::select(JINJA), 0..12),
        use_pieces in any::<bool>(),
    ) {
        let mut tc = json!({});
        for (k, v) in special {
            tc[k] = v;
        }
        if use_pieces {
            tc["chat_template"] = json!(pieces.concat());
        }
        match load_tokenizer(&tokenizer_json().to_string(), &tc.to_string()) {
            Ok(t) => {
                let msgs = [Message::new("system", "s"), Message::new("user", "hi")];
                if let Err(e) = runner::apply_chat_template(&t, &msgs) {
                    let m = e.to_string();
                    prop_assert!(m.contains("chat template") || m.contains("chat_template"), "{}", m);
                }
            }
            Err(e) => prop_assert!(e.to_string().contains("tokenizer_config.json"), "{}", e),
        }
    }

    /// Random template text, rendered directly.
    #[test]
    fn any_template_text_renders_or_errs(text in "\\PC{0,40}") {
        let r = render_template(&text, &[Message::new("user", "hi")], true, "", "");
        if let Err(e) = r {
            prop_assert!(e.to_string().starts_with("chat template"), "{}", e);
        }
    }
}

#[test]
fn arbitrary_tokenizer_bytes_are_an_error() {
    for text in ["", "{", "null", "[]", "{\"model\": 1}", "\u{0}\u{1}"] {
        let e = load_tokenizer(text, "{}").unwrap_err().to_string();
        assert!(e.contains("tokenizer.json"), "{text:?}: {e}");
    }
}
