//! The OpenAI wire format: request parsing and validation (every error names
//! its field), and the response, chunk and usage objects.

use serde::Deserialize;
use serde_json::{Value, json};

use super::engine::{ChatMessage, Finish, Outcome, Params, Prompt};
use super::error::ApiError;

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Endpoint {
    /// `/v1/chat/completions`: `messages`.
    Chat,
    /// `/v1/completions`: `prompt`.
    Completions,
}

impl Endpoint {
    /// The request field that holds the prompt.
    pub(super) fn prompt_field(self) -> &'static str {
        match self {
            Endpoint::Chat => "messages",
            Endpoint::Completions => "prompt",
        }
    }
}

/// Most stop strings a request may give.
pub(super) const MAX_STOP: usize = 16;

/// The request fields we read; others are ignored, as OpenAI's own server
/// ignores fields it does not know. `prompt`, `content` and `stop` take
/// several shapes and are read from [`Value`]s so errors can say which.
#[derive(Debug, Deserialize)]
struct Wire {
    model: Option<String>,
    messages: Option<Vec<WireMessage>>,
    prompt: Option<Value>,
    max_tokens: Option<usize>,
    max_completion_tokens: Option<usize>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    seed: Option<u64>,
    stop: Option<Value>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    n: Option<u64>,
    logprobs: Option<Value>,
    top_logprobs: Option<Value>,
    ignore_eos: Option<bool>,
    logit_bias: Option<serde_json::Map<String, Value>>,
    echo: Option<bool>,
    best_of: Option<u64>,
    suffix: Option<Value>,
    response_format: Option<Value>,
    tools: Option<Vec<Value>>,
}

#[derive(Debug, Deserialize)]
struct WireMessage {
    role: String,
    content: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// A parsed, validated request.
#[derive(Debug)]
pub(super) struct Request {
    /// The prompt.
    pub prompt: Prompt,
    /// Overrides of the server's decoding defaults.
    pub params: Params,
    /// Answer as server-sent events.
    pub stream: bool,
    /// Send a usage chunk before `[DONE]`.
    pub include_usage: bool,
}

/// Parses and checks a request body for `endpoint` on a server of model `served`.
// Long: one branch per request field of the OpenAI API.
pub(super) fn parse(body: &[u8], endpoint: Endpoint, served: &str) -> Result<Request, ApiError> {
    let w = wire(body)?;
    if let Some(m) = &w.model
        && m != served
    {
        return Err(ApiError::unknown_model(m, served));
    }
    unsupported(&w)?;
    let stream = w.stream.unwrap_or(false);
    if w.stream_options.is_some() && !stream {
        return Err(ApiError::invalid(
            "stream_options",
            "`stream_options` is only allowed with `stream: true`".into(),
        ));
    }
    let include_usage = w
        .stream_options
        .as_ref()
        .and_then(|o| o.include_usage)
        .unwrap_or(false);
    let prompt = match endpoint {
        Endpoint::Chat => chat_prompt(w.messages.as_deref())?,
        Endpoint::Completions => text_prompt(w.prompt.as_ref())?,
    };
    Ok(Request {
        prompt,
        params: params(&w)?,
        stream,
        include_usage,
    })
}

/// The body as [`Wire`] fields, or an error naming the field whose type is wrong.
fn wire(body: &[u8]) -> Result<Wire, ApiError> {
    // serde would read a struct from an array too (fields by position).
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(match serde_json::from_slice::<Value>(body) {
            Ok(_) => ApiError::bad_json("the request body must be a JSON object".into()),
            Err(e) => ApiError::bad_json(format!("the request body is not valid JSON: {e}")),
        });
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let w: Wire = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data if path == "." => {
                ApiError::bad_json(format!("the request body must be a JSON object: {inner}"))
            }
            serde_json::error::Category::Data => {
                ApiError::invalid(&path, format!("`{path}`: {inner}"))
            }
            _ => ApiError::bad_json(format!("the request body is not valid JSON: {inner}")),
        }
    })?;
    de.end()
        .map_err(|e| ApiError::bad_json(format!("the request body is not valid JSON: {e}")))?;
    Ok(w)
}

/// Fields whose values ask for something this server does not do: the
/// first such field, named, with what to do instead.
fn unsupported(w: &Wire) -> Result<(), ApiError> {
    let asks = |v: &Option<Value>, off: &[Value]| v.as_ref().is_some_and(|v| !off.contains(v));
    let format = w
        .response_format
        .as_ref()
        .map(|f| f.get("type").and_then(Value::as_str));
    let refusals: [(&str, Option<String>); 9] = [
        // The model's own end-of-sequence ids always end generation in `runner`.
        (
            "ignore_eos",
            (w.ignore_eos == Some(true)).then(|| {
                "`ignore_eos` is not supported by this server: drop it (generation ends at the \
                 model's end-of-sequence token, or at `max_tokens`)"
                    .into()
            }),
        ),
        (
            "n",
            w.n.filter(|&n| n != 1)
                .map(|n| format!("`n` is {n}: this server returns one choice per request (n = 1)")),
        ),
        (
            "logprobs",
            asks(&w.logprobs, &[Value::Null, json!(false), json!(0)])
                .then(|| "`logprobs` is not supported by this server: drop it".into()),
        ),
        (
            "top_logprobs",
            asks(&w.top_logprobs, &[Value::Null, json!(0)]).then(|| {
                "`top_logprobs` is not supported by this server (no log-probabilities are \
                 returned): drop it"
                    .into()
            }),
        ),
        (
            "echo",
            (w.echo == Some(true)).then(|| {
                "`echo` is not supported by this server: drop it (the prompt is not repeated in \
                 the answer)"
                    .into()
            }),
        ),
        (
            "best_of",
            w.best_of.filter(|&b| b != 1).map(|b| {
                format!("`best_of` is {b}: this server generates one completion per request (1)")
            }),
        ),
        (
            "suffix",
            asks(&w.suffix, &[Value::Null, json!("")]).then(|| {
                "`suffix` (text after the completion) is not supported by this server: drop it"
                    .into()
            }),
        ),
        (
            "response_format",
            format.filter(|k| *k != Some("text")).map(|k| {
                format!(
                    "`response_format` {}: this server does not constrain its output (JSON or \
                     schema modes); drop it or pass {{\"type\": \"text\"}}",
                    k.map_or_else(|| "has no `type`".to_owned(), |k| format!("is `{k}`"))
                )
            }),
        ),
        (
            "tools",
            w.tools.as_ref().is_some_and(|t| !t.is_empty()).then(|| {
                "`tools` (function calling) is not supported by this server: drop it".into()
            }),
        ),
    ];
    match refusals
        .into_iter()
        .find_map(|(field, why)| why.map(|w| (field, w)))
    {
        Some((field, why)) => Err(ApiError::invalid(field, why)),
        None => Ok(()),
    }
}

/// Most `logit_bias` entries a request may give (OpenAI's own limit).
const MAX_LOGIT_BIAS: usize = 300;

/// `logit_bias`: token ids (JSON object keys) to biases in `[-100, 100]`,
/// as OpenAI's API takes them; ids are checked against the vocabulary later.
fn logit_bias(m: &serde_json::Map<String, Value>) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |msg: String| ApiError::invalid("logit_bias", msg);
    if m.len() > MAX_LOGIT_BIAS {
        return Err(bad(format!(
            "`logit_bias` has {} entries: at most {MAX_LOGIT_BIAS}",
            m.len()
        )));
    }
    m.iter()
        .map(|(k, v)| {
            let id = k.trim().parse::<u32>().map_err(|_| {
                bad(format!(
                    "`logit_bias` key `{k}` is not a token id (a whole number from 0)"
                ))
            })?;
            let b = v
                .as_f64()
                .filter(|b| (-100.0..=100.0).contains(b))
                .ok_or_else(|| {
                    bad(format!(
                        "`logit_bias[\"{k}\"]` is {v}: a bias is a number from -100 to 100"
                    ))
                })?;
            Ok((id, b as f32))
        })
        .collect()
}

/// The decoding fields as engine [`Params`].
fn params(w: &Wire) -> Result<Params, ApiError> {
    let top_k = match w.top_k {
        None => None,
        // -1 is vLLM's "off"; 0 is ours.
        Some(-1 | 0) => Some(0),
        Some(k) if k > 0 => Some(k as usize),
        Some(k) => {
            return Err(ApiError::invalid(
                "top_k",
                format!("`top_k` is {k}: pass a number of tokens above 0, or 0 or -1 for off"),
            ));
        }
    };
    Ok(Params {
        max_tokens: w.max_completion_tokens.or(w.max_tokens),
        temperature: w.temperature,
        top_p: w.top_p,
        top_k,
        min_p: w.min_p,
        seed: w.seed,
        stop: w.stop.as_ref().map(stops).transpose()?,
        presence_penalty: w.presence_penalty,
        frequency_penalty: w.frequency_penalty,
        repetition_penalty: w.repetition_penalty,
        logit_bias: w.logit_bias.as_ref().map(logit_bias).transpose()?,
    })
}

fn chat_prompt(messages: Option<&[WireMessage]>) -> Result<Prompt, ApiError> {
    let Some(messages) = messages else {
        return Err(ApiError::invalid(
            "messages",
            "`messages` is required: an array of {\"role\", \"content\"} objects".into(),
        ));
    };
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "`messages` is empty: send at least one message".into(),
        ));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            other => {
                return Err(ApiError::invalid(
                    &format!("messages[{i}].role"),
                    format!(
                        "`messages[{i}].role` is `{other}`: use system, developer, user or \
                         assistant"
                    ),
                ));
            }
        };
        let field = format!("messages[{i}].content");
        let content = match &m.content {
            None | Some(Value::Null) if role == "assistant" => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => text_parts(parts, &field)?,
            _ => {
                return Err(ApiError::invalid(
                    &field,
                    format!("`{field}` must be a string or an array of text parts"),
                ));
            }
        };
        out.push(ChatMessage {
            role: role.to_owned(),
            content,
        });
    }
    Ok(Prompt::Chat(out))
}

/// The text of an array of `{"type": "text", "text": ...}` parts, joined.
fn text_parts(parts: &[Value], field: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, p) in parts.iter().enumerate() {
        match (p["type"].as_str(), p["text"].as_str()) {
            (Some("text"), Some(t)) => text.push_str(t),
            _ => {
                return Err(ApiError::invalid(
                    &format!("{field}[{j}]"),
                    format!(
                        "`{field}[{j}]` is not a text part: this server takes \
                         {{\"type\": \"text\", \"text\": ...}} parts only"
                    ),
                ));
            }
        }
    }
    Ok(text)
}

fn text_prompt(prompt: Option<&Value>) -> Result<Prompt, ApiError> {
    let bad = || {
        ApiError::invalid(
            "prompt",
            "`prompt` must be a string, an array of one string, or an array of token ids".into(),
        )
    };
    match prompt {
        None | Some(Value::Null) => Err(ApiError::invalid(
            "prompt",
            "`prompt` is required: the text to continue".into(),
        )),
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(items)) => match items.as_slice() {
            [Value::String(s)] => Ok(Prompt::Text(s.clone())),
            [Value::Array(ids)] => token_ids(ids).ok_or_else(bad),
            [_, _, ..] if items.iter().all(Value::is_string) => Err(ApiError::invalid(
                "prompt",
                format!(
                    "`prompt` holds {} prompts: send one prompt per request",
                    items.len()
                ),
            )),
            ids => token_ids(ids).ok_or_else(bad),
        },
        Some(_) => Err(bad()),
    }
}

fn token_ids(ids: &[Value]) -> Option<Prompt> {
    ids.iter()
        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect::<Option<Vec<u32>>>()
        .map(Prompt::Tokens)
}

fn stops(v: &Value) -> Result<Vec<String>, ApiError> {
    let list: Vec<String> = match v {
        Value::Null => Vec::new(),
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .map(|i| i.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or_else(|| {
                ApiError::invalid(
                    "stop",
                    "`stop` must be a string or an array of strings".into(),
                )
            })?,
        _ => {
            return Err(ApiError::invalid(
                "stop",
                "`stop` must be a string or an array of strings".into(),
            ));
        }
    };
    if list.len() > MAX_STOP {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "`stop` has {} strings: at most {MAX_STOP} are allowed",
                list.len()
            ),
        ));
    }
    if list.iter().any(String::is_empty) {
        return Err(ApiError::invalid(
            "stop",
            "`stop` holds an empty string, which would stop before any text: drop it".into(),
        ));
    }
    Ok(list)
}

/// The fields every response and chunk of one request shares.
#[derive(Debug, Clone)]
pub(super) struct Head {
    /// `chatcmpl-N` or `cmpl-N`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// The served model id.
    pub model: String,
    /// The endpoint.
    pub endpoint: Endpoint,
}

impl Head {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completions, _) => "text_completion",
        }
    }

    fn wrap(&self, chunk: bool, choices: Value, usage: Option<Value>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }

    /// The whole (non-streaming) response.
    pub(super) fn response(&self, text: &str, o: &Outcome) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
                "finish_reason": o.finish.name(),
            }),
            Endpoint::Completions => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": o.finish.name(),
            }),
        };
        self.wrap(false, json!([choice]), Some(usage(o)))
    }

    /// The first chunk of a chat stream: the assistant's role.
    pub(super) fn role_chunk(&self) -> Value {
        self.wrap(
            true,
            json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
            None,
        )
    }

    /// A chunk carrying `text`.
    pub(super) fn text_chunk(&self, text: &str) -> Value {
        self.piece(text, None)
    }

    /// The chunk that ends the choice.
    pub(super) fn finish_chunk(&self, finish: Finish) -> Value {
        self.piece("", Some(finish))
    }

    fn piece(&self, text: &str, finish: Option<Finish>) -> Value {
        let finish = finish.map(Finish::name);
        let choice = match (self.endpoint, finish) {
            (Endpoint::Chat, None) => {
                json!({"index": 0, "delta": {"content": text}, "logprobs": null, "finish_reason": null})
            }
            (Endpoint::Chat, Some(f)) => {
                json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": f})
            }
            (Endpoint::Completions, f) => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": f})
            }
        };
        self.wrap(true, json!([choice]), None)
    }

    /// The chunk with no choices and the usage (`stream_options.include_usage`).
    pub(super) fn usage_chunk(&self, o: &Outcome) -> Value {
        self.wrap(true, json!([]), Some(usage(o)))
    }
}

/// The `usage` object, with `prompt_tokens_details.cached_tokens` and the
/// `speculation` extension (the keys of `generate --json`).
pub(super) fn usage(o: &Outcome) -> Value {
    json!({
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": o.completion_tokens,
        "total_tokens": o.prompt_tokens + o.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": o.cached_tokens},
        "speculation": o.speculation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `body` for the chat endpoint; returns the error's param, or "ok".
    fn check(body: &str, want_param: &str) {
        let got = match parse(body.as_bytes(), Endpoint::Chat, "m") {
            Ok(_) => "ok".to_owned(),
            Err(e) => e.body()["error"]["param"]
                .as_str()
                .unwrap_or("-")
                .to_owned(),
        };
        assert_eq!(got, want_param, "{body}");
    }

    const MSG: &str = r#""messages":[{"role":"user","content":"hi"}]"#;

    #[test]
    fn each_bad_field_is_named() {
        check(&format!("{{{MSG}}}"), "ok");
        check(
            &format!(r#"{{{MSG},"model":"m","n":1,"logprobs":false}}"#),
            "ok",
        );
        check("{", "-");
        check("[]", "-");
        check("{} x", "-");
        check("{}", "messages");
        check(r#"{"messages":[]}"#, "messages");
        check(
            r#"{"messages":[{"role":"tool","content":"x"}]}"#,
            "messages[0].role",
        );
        check(
            r#"{"messages":[{"role":"user","content":5}]}"#,
            "messages[0].content",
        );
        check(
            r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
            "messages[0].content[0]",
        );
        check(r#"{"messages":[{"content":"x"}]}"#, "messages[0]");
        check(&format!(r#"{{{MSG},"model":"other"}}"#), "model");
        check(&format!(r#"{{{MSG},"temperature":"hot"}}"#), "temperature");
        check(&format!(r#"{{{MSG},"max_tokens":-1}}"#), "max_tokens");
        check(&format!(r#"{{{MSG},"seed":-3}}"#), "seed");
        check(&format!(r#"{{{MSG},"top_k":-2}}"#), "top_k");
        check(&format!(r#"{{{MSG},"stop":[1]}}"#), "stop");
        check(&format!(r#"{{{MSG},"stop":""}}"#), "stop");
        check(&format!(r#"{{{MSG},"n":2}}"#), "n");
        check(&format!(r#"{{{MSG},"ignore_eos":true}}"#), "ignore_eos");
        check(&format!(r#"{{{MSG},"logprobs":true}}"#), "logprobs");
        check(&format!(r#"{{{MSG},"top_logprobs":3}}"#), "top_logprobs");
        check(&format!(r#"{{{MSG},"top_logprobs":0}}"#), "ok");
        check(&format!(r#"{{{MSG},"echo":true}}"#), "echo");
        check(&format!(r#"{{{MSG},"best_of":3}}"#), "best_of");
        check(&format!(r#"{{{MSG},"suffix":"x"}}"#), "suffix");
        check(
            &format!(r#"{{{MSG},"response_format":{{"type":"json_object"}}}}"#),
            "response_format",
        );
        check(
            &format!(r#"{{{MSG},"tools":[{{"type":"function"}}]}}"#),
            "tools",
        );
        check(
            &format!(
                r#"{{{MSG},"echo":false,"best_of":1,"suffix":"","tools":[],"response_format":{{"type":"text"}},"logit_bias":{{"5":-100,"7":2.5}}}}"#
            ),
            "ok",
        );
        check(
            &format!(r#"{{{MSG},"logit_bias":{{"x":1}}}}"#),
            "logit_bias",
        );
        check(
            &format!(r#"{{{MSG},"logit_bias":{{"-1":1}}}}"#),
            "logit_bias",
        );
        check(
            &format!(r#"{{{MSG},"logit_bias":{{"5":101}}}}"#),
            "logit_bias",
        );
        check(
            &format!(r#"{{{MSG},"logit_bias":{{"5":"a"}}}}"#),
            "logit_bias",
        );
        check(&format!(r#"{{{MSG},"logit_bias":[1]}}"#), "logit_bias");
        check(
            &format!(r#"{{{MSG},"stream_options":{{"include_usage":true}}}}"#),
            "stream_options",
        );
    }

    #[test]
    fn prompts_take_their_documented_shapes() {
        let p = |body: &str| parse(body.as_bytes(), Endpoint::Completions, "m").map(|r| r.prompt);
        assert!(matches!(p(r#"{"prompt":"a"}"#), Ok(Prompt::Text(t)) if t == "a"));
        assert!(matches!(p(r#"{"prompt":["a"]}"#), Ok(Prompt::Text(t)) if t == "a"));
        assert!(matches!(p(r#"{"prompt":[1,2]}"#), Ok(Prompt::Tokens(t)) if t == [1, 2]));
        assert!(matches!(p(r#"{"prompt":[[3]]}"#), Ok(Prompt::Tokens(t)) if t == [3]));
        for bad in [
            r#"{}"#,
            r#"{"prompt":["a","b"]}"#,
            r#"{"prompt":[-1]}"#,
            r#"{"prompt":{}}"#,
        ] {
            assert!(p(bad).is_err(), "{bad}");
        }
    }
}
