//! Random-weight checkpoints for tests, examples and benchmarks (feature `testing`).
//!
//! [`write_checkpoint`] writes a complete model folder (config.json,
//! model.safetensors, a byte-level BPE tokenizer.json and tokenizer_config.json)
//! for any registered family, so tests run without the network.

use std::path::Path;

use mlx_tensor::{Array, Dtype, random};
use serde_json::{Value, json};

use crate::error::{Error, Result};

/// The fixture families.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2 style.
    Llama,
    /// Llama 3 with `rope_scaling` of type `llama3`.
    Llama3,
    /// Mistral.
    Mistral,
    /// Qwen2 (q/k/v bias).
    Qwen2,
    /// Qwen3 (q/k norm).
    Qwen3,
}

impl Arch {
    /// Every fixture family.
    pub const ALL: [Arch; 5] = [
        Arch::Llama,
        Arch::Llama3,
        Arch::Mistral,
        Arch::Qwen2,
        Arch::Qwen3,
    ];

    /// Parses `llama`, `llama3`, `mistral`, `qwen2`, `qwen3`.
    pub fn parse(s: &str) -> Option<Arch> {
        Some(match s {
            "llama" => Arch::Llama,
            "llama3" => Arch::Llama3,
            "mistral" => Arch::Mistral,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            _ => return None,
        })
    }

    fn names(self) -> (&'static str, &'static str) {
        match self {
            Arch::Llama | Arch::Llama3 => ("LlamaForCausalLM", "llama"),
            Arch::Mistral => ("MistralForCausalLM", "mistral"),
            Arch::Qwen2 => ("Qwen2ForCausalLM", "qwen2"),
            Arch::Qwen3 => ("Qwen3ForCausalLM", "qwen3"),
        }
    }
}

/// Shape and options of a fixture.
#[derive(Debug, Clone)]
pub struct Fixture {
    /// Family.
    pub arch: Arch,
    /// Tie the unembedding to the embedding.
    pub tied: bool,
    /// Residual width.
    pub hidden: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Per-head width.
    pub head_dim: usize,
    /// MLP width.
    pub intermediate: usize,
    /// Embedding rows (at least [`TOKENIZER_VOCAB`]).
    pub vocab: usize,
    /// Context length.
    pub context: usize,
    /// Stored dtype of the weights.
    pub dtype: Dtype,
    /// Add a complete Qwen3.5-layout MTP head (`mtp.*`).
    pub mtp: bool,
    /// Write a chat template into tokenizer_config.json.
    pub chat_template: bool,
}

impl Fixture {
    /// A small fixture of `arch`.
    pub fn new(arch: Arch) -> Fixture {
        Fixture {
            arch,
            tied: matches!(arch, Arch::Qwen2 | Arch::Qwen3),
            hidden: 64,
            layers: 2,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            intermediate: 128,
            vocab: 272,
            context: 512,
            dtype: Dtype::Float32,
            mtp: false,
            chat_template: true,
        }
    }

    /// The config.json this fixture writes.
    pub fn config_json(&self) -> Value {
        let (arch, model_type) = self.arch.names();
        let mut c = json!({
            "architectures": [arch],
            "model_type": model_type,
            "hidden_size": self.hidden,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "max_position_embeddings": self.context,
            "tie_word_embeddings": self.tied,
            "vocab_size": self.vocab,
            "bos_token_id": EOT,
            "eos_token_id": [EOT, IM_END],
            "torch_dtype": match self.dtype { Dtype::Bfloat16 => "bfloat16", Dtype::Float16 => "float16", _ => "float32" },
        });
        if self.arch == Arch::Llama3 {
            c["rope_scaling"] = json!({
                "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64
            });
        }
        if self.arch == Arch::Mistral {
            // As Mistral v0.2 and later write it: full attention. Absent, the
            // window would be transformers' default 4096.
            c["sliding_window"] = Value::Null;
        }
        if self.mtp {
            c["mtp_num_hidden_layers"] = json!(1);
        }
        c
    }

    /// Random tensors with HF names, f32 (converted to `dtype` when written).
    pub fn tensors(&self, seed: u64) -> Result<Vec<(String, Array)>> {
        let (h, d, v) = (self.hidden as i32, self.head_dim as i32, self.vocab as i32);
        let (nq, nkv, inter) = (
            self.heads as i32,
            self.kv_heads as i32,
            self.intermediate as i32,
        );
        let mut n = 0u64;
        let mut rand = |shape: &[i32], std: f32, mean: f32| -> Result<Array> {
            n += 1;
            let key = random::key(seed.wrapping_mul(1_000_003).wrapping_add(n))?;
            let x = random::normal(shape, Dtype::Float32, &key)?;
            Ok(x.multiply(&Array::from_f32(std)?)?
                .add(&Array::from_f32(mean)?)?)
        };
        let lin = |i: i32| 1.0 / (i as f32).sqrt();
        let mut t = vec![(
            "model.embed_tokens.weight".to_owned(),
            rand(&[v, h], 1.0, 0.0)?,
        )];
        let qkv_bias = self.arch == Arch::Qwen2;
        // The MTP head's block is one more decoder layer of the same shape.
        let mut blocks: Vec<String> = (0..self.layers)
            .map(|i| format!("model.layers.{i}"))
            .collect();
        if self.mtp {
            blocks.push("mtp.layers.0".to_owned());
        }
        for p in blocks {
            let a = format!("{p}.self_attn");
            t.push((format!("{p}.input_layernorm.weight"), rand(&[h], 0.1, 1.0)?));
            t.push((
                format!("{p}.post_attention_layernorm.weight"),
                rand(&[h], 0.1, 1.0)?,
            ));
            for (name, out) in [("q_proj", nq * d), ("k_proj", nkv * d), ("v_proj", nkv * d)] {
                t.push((format!("{a}.{name}.weight"), rand(&[out, h], lin(h), 0.0)?));
                if qkv_bias {
                    t.push((format!("{a}.{name}.bias"), rand(&[out], 0.1, 0.0)?));
                }
            }
            t.push((
                format!("{a}.o_proj.weight"),
                rand(&[h, nq * d], lin(nq * d), 0.0)?,
            ));
            if self.arch == Arch::Qwen3 {
                t.push((format!("{a}.q_norm.weight"), rand(&[d], 0.1, 1.0)?));
                t.push((format!("{a}.k_norm.weight"), rand(&[d], 0.1, 1.0)?));
            }
            t.push((
                format!("{p}.mlp.gate_proj.weight"),
                rand(&[inter, h], lin(h), 0.0)?,
            ));
            t.push((
                format!("{p}.mlp.up_proj.weight"),
                rand(&[inter, h], lin(h), 0.0)?,
            ));
            t.push((
                format!("{p}.mlp.down_proj.weight"),
                rand(&[h, inter], lin(inter), 0.0)?,
            ));
        }
        t.push(("model.norm.weight".to_owned(), rand(&[h], 0.1, 1.0)?));
        if !self.tied {
            t.push(("lm_head.weight".to_owned(), rand(&[v, h], 0.5, 0.0)?));
        }
        if self.mtp {
            t.push((
                "mtp.fc.weight".to_owned(),
                rand(&[h, 2 * h], lin(2 * h), 0.0)?,
            ));
            t.push(("mtp.norm.weight".to_owned(), rand(&[h], 0.1, 1.0)?));
            for norm in ["pre_fc_norm_embedding", "pre_fc_norm_hidden"] {
                t.push((format!("mtp.{norm}.weight"), rand(&[h], 0.1, 1.0)?));
            }
        }
        Ok(t)
    }
}

/// Id of `<|endoftext|>` in the fixture tokenizer.
pub const EOT: u32 = 256;
/// Id of `<|im_start|>`.
pub const IM_START: u32 = 257;
/// Id of `<|im_end|>`.
pub const IM_END: u32 = 258;
/// Tokens in the fixture tokenizer.
pub const TOKENIZER_VOCAB: usize = 259;

/// GPT-2's byte → printable character table used by byte-level BPE.
fn byte_chars() -> Vec<char> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32)
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut table = vec![' '; 256];
    for (b, c) in bs.iter().zip(cs) {
        table[*b as usize] = char::from_u32(c).expect("valid code point");
    }
    table
}

/// A byte-level BPE tokenizer.json: id = byte value, plus three special tokens.
pub fn tokenizer_json() -> Value {
    let vocab: serde_json::Map<String, Value> = byte_chars()
        .into_iter()
        .enumerate()
        .map(|(i, c)| (c.to_string(), json!(i)))
        .collect();
    let added: Vec<Value> = [
        (EOT, "<|endoftext|>"),
        (IM_START, "<|im_start|>"),
        (IM_END, "<|im_end|>"),
    ]
    .iter()
    .map(|(id, s)| {
        json!({"id": id, "content": s, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    })
    .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": []}
    })
}

/// The ChatML template the fixture ships.
pub const CHAT_TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// Writes a complete model folder for `fx` with weights drawn from `seed`.
pub fn write_checkpoint(dir: &Path, fx: &Fixture, seed: u64) -> Result<()> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| Error::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let write = |name: &str, v: &Value| -> Result<()> {
        let p = dir.join(name);
        let text = serde_json::to_string_pretty(v).expect("JSON values serialise");
        std::fs::write(&p, text).map_err(io(&p))
    };
    write("config.json", &fx.config_json())?;
    write("tokenizer.json", &tokenizer_json())?;
    let mut tc =
        json!({"eos_token": "<|im_end|>", "bos_token": null, "pad_token": "<|endoftext|>"});
    if fx.chat_template {
        tc["chat_template"] = json!(CHAT_TEMPLATE);
    }
    write("tokenizer_config.json", &tc)?;
    let tensors = fx.tensors(seed)?;
    let mut stored = Vec::with_capacity(tensors.len());
    for (name, a) in &tensors {
        stored.push((name.as_str(), a.as_type(fx.dtype)?));
    }
    mlx_tensor::io::save_safetensors(
        &dir.join("model.safetensors"),
        stored.iter().map(|(n, a)| (*n, a)),
    )?;
    Ok(())
}
