//! The model's tokenizer (`tokenizer.json`) with its special tokens and chat template.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::{GenerationConfig, ModelConfig};
use crate::error::{Error, Result, read_json};

/// A special token as written in tokenizer_config.json: a string or `{"content": ...}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum SpecialToken {
    Text(String),
    Object { content: String },
}

impl SpecialToken {
    fn text(&self) -> &str {
        match self {
            SpecialToken::Text(s) => s,
            SpecialToken::Object { content } => content,
        }
    }
}

/// A chat template: one string, or named variants (`default` is used).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Template {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Debug, Clone, Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

#[derive(Debug, Default, Deserialize)]
struct TokenizerConfig {
    bos_token: Option<SpecialToken>,
    eos_token: Option<SpecialToken>,
    pad_token: Option<SpecialToken>,
    chat_template: Option<Template>,
}

/// The chat template as transformers picks it: `chat_template.jinja`, else
/// `chat_template.json` (`{"chat_template": ...}`), else tokenizer_config.json's;
/// of named templates the one named `default` (transformers refuses a list
/// without one, which is kept here as the error chat then reports).
fn chat_template(
    dir: &Path,
    config: Option<Template>,
) -> Result<Option<std::result::Result<String, String>>> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        let bytes = crate::error::read(&jinja)?;
        let text = String::from_utf8(bytes).map_err(|e| Error::InvalidConfig {
            path: jinja.clone(),
            key: "chat_template",
            message: format!("the template is not UTF-8 text ({e})"),
        })?;
        return Ok(Some(Ok(text)));
    }
    #[derive(Deserialize)]
    struct File {
        chat_template: Option<Template>,
    }
    let json = dir.join("chat_template.json");
    let template = if json.is_file() {
        read_json::<File>(&json)?.chat_template.or(config)
    } else {
        config
    };
    Ok(template.map(|t| match t {
        Template::One(s) => Ok(s),
        Template::Named(v) => match v.iter().find(|t| t.name == "default") {
            Some(t) => Ok(t.template.clone()),
            None => Err(format!(
                "the named templates ({}) include none called `default`, which chat uses \
                 (transformers refuses this list too): name the chat template `default`",
                v.iter()
                    .map(|t| format!("`{}`", t.name))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        },
    }))
}

/// A loaded tokenizer with the ids generation needs.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<(u32, String)>,
    eos_ids: Vec<u32>,
    eos_text: Option<String>,
    pad: Option<u32>,
    /// The template, or why there is none to use (no template: `None`).
    chat_template: Option<std::result::Result<String, String>>,
    config_path: PathBuf,
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json` and `dir/tokenizer_config.json` (optional), taking
    /// end-of-sequence ids from generation_config, then config.json, then the tokenizer config.
    pub fn load(dir: &Path, config: &ModelConfig, gen_cfg: &GenerationConfig) -> Result<Tokenizer> {
        let path = dir.join("tokenizer.json");
        if !path.is_file() {
            return Err(Error::MissingFile {
                path,
                hint: "the model folder needs a Hugging Face tokenizer.json",
            });
        }
        let inner = tokenizers::Tokenizer::from_file(&path).map_err(|e| Error::Tokenizer {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let config_path = dir.join("tokenizer_config.json");
        let tc: TokenizerConfig = if config_path.is_file() {
            read_json(&config_path)?
        } else {
            TokenizerConfig::default()
        };
        let n = inner.get_vocab_size(true);
        if n > config.vocab_size {
            return Err(Error::VocabMismatch {
                tokenizer: n,
                model: config.vocab_size,
            });
        }
        let id = |t: &Option<SpecialToken>| {
            t.as_ref().and_then(|t| {
                inner
                    .token_to_id(t.text())
                    .map(|id| (id, t.text().to_owned()))
            })
        };
        let bos = id(&tc.bos_token).or_else(|| {
            let b = *config.bos_token_id.first()?;
            Some((b, inner.id_to_token(b)?))
        });
        let mut eos_ids: Vec<u32> = gen_cfg
            .eos_token_id
            .as_ref()
            .map(|t| t.to_vec())
            .unwrap_or_default();
        for &e in &config.eos_token_id {
            if !eos_ids.contains(&e) {
                eos_ids.push(e);
            }
        }
        if let Some((e, _)) = id(&tc.eos_token)
            && !eos_ids.contains(&e)
        {
            eos_ids.push(e);
        }
        drop_outside_vocab(&mut eos_ids, config.vocab_size);
        let chat_template = chat_template(dir, tc.chat_template)?;
        Ok(Tokenizer {
            bos,
            eos_text: tc.eos_token.as_ref().map(|t| t.text().to_owned()),
            eos_ids,
            pad: id(&tc.pad_token).map(|(i, _)| i),
            chat_template,
            config_path,
            inner,
        })
    }

    /// Wraps a tokenizer built in memory (tests).
    pub fn from_tokenizer(inner: tokenizers::Tokenizer, eos_ids: Vec<u32>) -> Tokenizer {
        Tokenizer {
            inner,
            bos: None,
            eos_ids,
            eos_text: None,
            pad: None,
            chat_template: None,
            config_path: PathBuf::from("tokenizer_config.json"),
        }
    }

    /// Token ids of `text`; `special` adds the template's special tokens (BOS).
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, special)
            .map_err(|e| Error::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The most text bytes a prompt of `context` tokens can span: `context`
    /// times the longest token's spelling (a token spells at most the bytes
    /// of its vocabulary string: byte-level `Ġ` and SentencePiece `▁` are
    /// longer than the byte they stand for), times 4 for normalisers that
    /// shrink text (composing accents). Longer text cannot fit the context.
    pub fn max_text_bytes(&self, context: usize) -> usize {
        let longest = self
            .inner
            .get_vocab(true)
            .keys()
            .map(String::len)
            .max()
            .unwrap_or(1)
            .max(1);
        context.saturating_mul(longest).saturating_mul(4)
    }

    /// [`Tokenizer::encode`] for a prompt that must fit `context` tokens,
    /// failing fast with [`Error::PromptTooLarge`] when it cannot: text longer
    /// than [`Tokenizer::max_text_bytes`] is refused unread, and long text is
    /// first counted in 64 KiB pieces (memory per piece, not per prompt),
    /// stopping once the count passes twice the context. Text that passes is
    /// tokenized whole, so the ids are exactly [`Tokenizer::encode`]'s; the
    /// caller still checks their count against the context.
    pub fn encode_within(&self, text: &str, special: bool, context: usize) -> Result<Vec<u32>> {
        const PIECE: usize = 64 << 10;
        let limit = self.max_text_bytes(context);
        if text.len() > limit {
            return Err(Error::PromptTooLarge {
                found: format!(
                    "{} bytes of text, more than the {limit} that {context} tokens of this \
                     tokenizer can spell",
                    text.len()
                ),
                context,
            });
        }
        if text.len() > PIECE {
            let mut counted = 0usize;
            let mut rest = text;
            while !rest.is_empty() {
                let mut end = rest.len().min(PIECE);
                while !rest.is_char_boundary(end) {
                    end += 1;
                }
                // End a piece after whitespace where there is some, so that
                // pieces split where the pre-tokenizer splits anyway.
                if end < rest.len()
                    && let Some(ws) = rest[..end].rfind(char::is_whitespace)
                    && ws > 0
                {
                    end = ws;
                }
                counted += self.encode(&rest[..end], false)?.len();
                rest = &rest[end..];
                if counted > context.saturating_mul(2) {
                    return Err(Error::PromptTooLarge {
                        found: format!(
                            "{} bytes of text, at least {counted} tokens (counted in pieces, \
                             stopped early)",
                            text.len()
                        ),
                        context,
                    });
                }
            }
        }
        self.encode(text, special)
    }

    /// Text of `ids`, skipping special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| Error::Encode(e.to_string()))
    }

    /// Tokens in the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// End-of-sequence ids.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    /// A copy that also ends generation at `ids` (for example a chat
    /// template's end-of-turn token).
    pub fn with_extra_eos(&self, ids: &[u32]) -> Tokenizer {
        let mut t = self.clone();
        for &id in ids {
            if !t.eos_ids.contains(&id) {
                t.eos_ids.push(id);
            }
        }
        t
    }

    /// Begin-of-sequence id and text.
    pub fn bos(&self) -> Option<(u32, &str)> {
        self.bos.as_ref().map(|(i, s)| (*i, s.as_str()))
    }

    /// End-of-sequence text (for chat templates).
    pub fn eos_text(&self) -> Option<&str> {
        self.eos_text.as_deref()
    }

    /// Padding id.
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }

    /// The chat template, or an error naming tokenizer_config.json.
    pub fn chat_template(&self) -> Result<&str> {
        match &self.chat_template {
            Some(Ok(t)) => Ok(t),
            Some(Err(why)) => Err(Error::InvalidConfig {
                path: self.config_path.clone(),
                key: "chat_template",
                message: why.clone(),
            }),
            None => Err(Error::NoChatTemplate {
                path: self.config_path.clone(),
            }),
        }
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Drops the end ids at or past `vocab` with a warning: the model can never
/// produce them, so they never end anything (kept, they would also widen a
/// drafting vocabulary's special ids past the unembedding).
fn drop_outside_vocab(eos_ids: &mut Vec<u32>, vocab: usize) {
    let outside: Vec<u32> = eos_ids
        .iter()
        .copied()
        .filter(|&e| e as usize >= vocab)
        .collect();
    if outside.is_empty() {
        return;
    }
    eos_ids.retain(|e| !outside.contains(e));
    tracing::warn!(
        ids = ?outside,
        vocab_size = vocab,
        kept = ?eos_ids,
        "`eos_token_id` (config.json / generation_config.json) names ids outside the \
         model's vocabulary: it can never produce them, so they are ignored"
    );
}
