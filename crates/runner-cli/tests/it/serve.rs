//! `mtp-runner serve` over HTTP, each test with its own server on an
//! ephemeral loopback port (127.0.0.1:0) and `models/tiny-mtp`: the
//! malformed-input table, the event-stream format, 16 concurrent clients,
//! a client killed mid-stream, a multi-turn chat's prefix reuse against cold
//! runs, `/metrics` against the responses, shutdown by signal, slow and
//! half-closed clients on raw sockets, and the official `openai` Python
//! client. Every loop is bounded in count and time.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::common;

/// Longest any single step of a test waits.
const PATIENCE: Duration = Duration::from_secs(120);

/// A running server, killed when dropped.
struct Server {
    child: Child,
    url: String,
    stderr: Arc<Mutex<String>>,
    agent: ureq::Agent,
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(PATIENCE))
        .build()
        .into()
}

impl Server {
    /// `serve --model models/tiny-mtp --port 0 extra..`, once it listens.
    fn start(extra: &[&str]) -> Server {
        let model = common::bundled("tiny-mtp");
        let mut child = Command::new(common::BIN)
            .args(["serve", "--model", model.to_str().unwrap()])
            .args(["--host", "127.0.0.1", "--port", "0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        {
            let pipe = child.stderr.take().unwrap();
            let log = Arc::clone(&stderr);
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    if let Some(rest) = line.split("listening on ").nth(1) {
                        let url = rest.split_whitespace().next().unwrap_or("").to_owned();
                        let _ = tx.send(url);
                    }
                    let mut l = log.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
            });
        }
        let url = match rx.recv_timeout(PATIENCE) {
            Ok(u) => u,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "the server did not report its address: {}",
                    stderr.lock().unwrap()
                );
            }
        };
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        Server {
            child,
            url,
            stderr,
            agent: agent(),
        }
    }

    /// POSTs `body` to `path`: the status and the body as JSON (`Null` when it is not).
    fn post(&self, path: &str, body: &str) -> (u16, Value) {
        let mut r = self
            .agent
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .send(body)
            .unwrap();
        let status = r.status().as_u16();
        let text = r.body_mut().read_to_string().unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn post_json(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post(path, &body.to_string())
    }

    /// GETs `path`: the status and the body.
    fn get(&self, path: &str) -> (u16, String) {
        let mut r = self
            .agent
            .get(format!("{}{path}", self.url))
            .call()
            .unwrap();
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    }

    /// Opens a `stream: true` request; the reader yields its lines.
    fn stream(&self, path: &str, body: &Value) -> Lines {
        let r = self
            .agent
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .send(body.to_string())
            .unwrap();
        assert_eq!(r.status().as_u16(), 200, "{body}");
        let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(ct.starts_with("text/event-stream"), "{ct}");
        Lines(BufReader::new(Box::new(r.into_body().into_reader())))
    }

    /// One figure of `/metrics` (the sample whose name and labels are `key`), 0 when absent.
    fn metric(&self, key: &str) -> f64 {
        metric(&self.get("/metrics").1, key)
    }

    /// Sends `signal` (`TERM`, `INT`) to the server.
    fn signal(&self, signal: &str) {
        let ok = Command::new("kill")
            .args([format!("-{signal}"), self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{signal}");
    }

    /// Waits (bounded) for the server to exit.
    fn wait(&mut self) -> ExitStatus {
        let t = Instant::now();
        while t.elapsed() < PATIENCE {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "the server did not exit within {PATIENCE:?}: {}",
            self.stderr.lock().unwrap()
        );
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lines of an event stream.
struct Lines(BufReader<Box<dyn std::io::Read + Send>>);

impl Lines {
    /// The next `data:` payload (`None` at the end of the body).
    fn next_data(&mut self) -> Option<String> {
        loop {
            let mut line = String::new();
            if self.0.read_line(&mut line).unwrap() == 0 {
                return None;
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() || line.starts_with(':') {
                continue;
            }
            let data = line.strip_prefix("data: ");
            assert!(data.is_some(), "an event line that is not data: `{line}`");
            return data.map(str::to_owned);
        }
    }

    /// Every payload up to `[DONE]` (which must be the last), as JSON.
    fn all(mut self) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let d = self.next_data().expect("the stream ended before [DONE]");
            if d == "[DONE]" {
                assert_eq!(self.next_data(), None, "data after [DONE]");
                return out;
            }
            out.push(serde_json::from_str(&d).unwrap());
        }
    }
}

/// The value of the sample `key` (name with labels) in a Prometheus text, 0 when absent.
fn metric(text: &str, key: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

fn chat_body(messages: &Value, max_tokens: usize) -> Value {
    json!({"model": "tiny-mtp", "messages": messages, "max_tokens": max_tokens, "temperature": 0})
}

fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

fn content(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no content in {v}"))
        .to_owned()
}

/// Path, body, status, the error's `param`, words its message must hold.
type Case<'a> = (&'a str, String, u16, Option<&'a str>, Vec<&'a str>);

#[test]
fn malformed_input_gets_its_status_and_names_the_field() {
    let s = Server::start(&["--max-body-bytes", "65536"]);
    let long_prompt = "a b ".repeat(3000);
    let table: Vec<Case<'_>> = vec![
        (
            "/v1/chat/completions",
            "{".into(),
            400,
            None,
            vec!["not valid JSON"],
        ),
        (
            "/v1/chat/completions",
            "[1]".into(),
            400,
            None,
            vec!["JSON object"],
        ),
        (
            "/v1/chat/completions",
            "{}".into(),
            400,
            Some("messages"),
            vec!["required"],
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user("x"), "model": "gpt-9"}).to_string(),
            400,
            Some("model"),
            vec!["gpt-9", "tiny-mtp"],
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user("x"), "temperature": "hot"}).to_string(),
            400,
            Some("temperature"),
            vec!["invalid type"],
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user("x"), "temperature": -1}).to_string(),
            400,
            Some("temperature"),
            vec![">= 0"],
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user("x"), "top_p": 0}).to_string(),
            400,
            Some("top_p"),
            vec!["(0, 1]"],
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user("x"), "min_p": 1.0}).to_string(),
            400,
            Some("min_p"),
            vec!["[0, 1)"],
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user("x"), "max_tokens": -5}).to_string(),
            400,
            Some("max_tokens"),
            vec!["max_tokens"],
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "wizard", "content": "x"}]}).to_string(),
            400,
            Some("messages[0].role"),
            vec!["wizard"],
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user("x"), "stop": ""}).to_string(),
            400,
            Some("stop"),
            vec!["empty"],
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user(&long_prompt)}).to_string(),
            400,
            Some("messages"),
            vec!["context is 2048 tokens"],
        ),
        (
            "/v1/completions",
            "{}".into(),
            400,
            Some("prompt"),
            vec!["required"],
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 99999]}).to_string(),
            400,
            Some("prompt"),
            vec!["99999", "8192"],
        ),
        (
            "/v1/completions",
            json!({"prompt": long_prompt}).to_string(),
            400,
            Some("prompt"),
            vec!["context is 2048 tokens"],
        ),
        (
            "/v1/completions",
            json!({"prompt": "x".repeat(70_000)}).to_string(),
            413,
            None,
            vec!["65536-byte"],
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "logit_bias": {"99999": -100}}).to_string(),
            400,
            Some("logit_bias"),
            vec!["99999", "8192"],
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user("x"), "logit_bias": {"5": 250}}).to_string(),
            400,
            Some("logit_bias"),
            vec!["-100 to 100"],
        ),
        (
            "/v1/chat/completions",
            json!({"messages": user("x"), "logit_bias": {"5": 1, "05": 2}}).to_string(),
            400,
            Some("logit_bias"),
            vec!["token 5 twice"],
        ),
        ("/v1/nowhere", "{}".into(), 404, None, vec!["/v1/nowhere"]),
    ];
    for (path, body, status, param, words) in &table {
        let (got, v) = s.post(path, body);
        let shown = &body[..body.len().min(80)];
        assert_eq!(got, *status, "{path} {shown}: {v}");
        let e = &v["error"];
        assert!(
            e["type"].is_string(),
            "{path} {shown}: no error object: {v}"
        );
        assert_eq!(e["param"].as_str(), *param, "{path} {shown}: {v}");
        let msg = e["message"].as_str().unwrap();
        for w in words {
            assert!(msg.contains(w), "{path} {shown}: `{msg}` should say `{w}`");
        }
    }
    // The too-long prompt names its own length too.
    let (_, v) = s.post_json("/v1/completions", &json!({"prompt": long_prompt}));
    let msg = v["error"]["message"].as_str().unwrap();
    let n: usize = msg
        .split("the prompt has ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no prompt length in `{msg}`"));
    assert!(n >= 2048, "{msg}");
    let (got, _) = s.get("/v1/chat/completions");
    assert_eq!(got, 405);
    // After all of that the server still answers.
    let (got, v) = s.post_json("/v1/chat/completions", &chat_body(&user("hi"), 4));
    assert_eq!(got, 200, "{v}");
    // A request that fails while it runs (a temperature that scales the
    // logits past f32's range, found after the prefill wrote the caches) is
    // a 400 naming the cause, and the engine lives on: the next request used
    // to panic the engine thread on the caches it left written.
    let broken = json!({"prompt": "Hello there", "max_tokens": 10, "temperature": 1e-45});
    let (got, v) = s.post_json("/v1/completions", &broken);
    assert_eq!(got, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("non-finite") && msg.contains("temperature"),
        "{msg}"
    );
    let (got, v) = s.post_json(
        "/v1/completions",
        &json!({"prompt": "Hello there", "max_tokens": 3}),
    );
    assert_eq!(got, 200, "after a failed request: {v}");
    assert_eq!(s.get("/health").0, 200);
    // A logit bias is honoured: +100 on one token makes a greedy answer
    // that token over and over, where the unbiased answer is not.
    let text = |bias: Value, n: usize| {
        let body =
            json!({"prompt": [7, 8, 9], "max_tokens": n, "temperature": 0, "logit_bias": bias});
        let (got, v) = s.post_json("/v1/completions", &body);
        assert_eq!(got, 200, "{v}");
        v["choices"][0]["text"].as_str().unwrap().to_owned()
    };
    let one = text(json!({"70": 100}), 1);
    assert!(!one.is_empty());
    let forced = text(json!({"70": 100}), 6);
    assert_eq!(forced, one.repeat(6));
    assert_ne!(text(json!({}), 6), forced, "control: unbiased");
}

#[test]
fn streams_are_openai_chunks_that_end_in_done_and_equal_the_whole_response() {
    let s = Server::start(&[]);
    let (status, health) = s.get("/health");
    assert_eq!((status, health.as_str()), (200, r#"{"status":"ok"}"#));
    let models: Value = serde_json::from_str(&s.get("/v1/models").1).unwrap();
    assert_eq!(models["data"][0]["id"], "tiny-mtp");
    assert_eq!(models["data"][0]["max_model_len"], 2048);

    let msgs = user("def fibonacci(n):");
    let (_, whole) = s.post_json("/v1/chat/completions", &chat_body(&msgs, 24));
    let mut body = chat_body(&msgs, 24);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let chunks = s.stream("/v1/chat/completions", &body).all();
    assert!(chunks.len() >= 4, "{chunks:?}");
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"), "{id}");
    for c in &chunks {
        assert_eq!(c["id"], id, "{c}");
        assert_eq!(c["object"], "chat.completion.chunk", "{c}");
        assert_eq!(c["model"], "tiny-mtp", "{c}");
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let (usage_chunk, rest) = chunks.split_last().unwrap();
    let (finish, pieces) = rest.split_last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    let finish_reason = &finish["choices"][0]["finish_reason"];
    assert_eq!(finish_reason, &whole["choices"][0]["finish_reason"]);
    assert!(finish_reason == "stop" || finish_reason == "length");
    let text: String = pieces
        .iter()
        .map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(text, content(&whole));
    let (u, w) = (&usage_chunk["usage"], &whole["usage"]);
    assert_eq!(u["completion_tokens"], w["completion_tokens"]);
    assert_eq!(u["prompt_tokens"], w["prompt_tokens"]);
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
    );
    // The same prompt again is served from the cache (all but its last token).
    assert_eq!(
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        u["prompt_tokens"].as_u64().unwrap() - 1
    );
    for key in [
        "method",
        "rounds",
        "drafted",
        "accepted",
        "acceptance_rate",
        "per_position_acceptance",
        "mean_accepted_length",
        "depth_over_time",
        "depth_histogram",
    ] {
        assert!(!u["speculation"][key].is_null(), "speculation.{key} in {u}");
    }
    assert_eq!(u["speculation"]["method"], "mtp");

    // Completions: `text` pieces, no role chunk, no usage chunk unless asked.
    let body = json!({"prompt": "import os\n", "max_tokens": 16, "temperature": 0});
    let (_, whole) = s.post_json("/v1/completions", &body);
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let chunks = s.stream("/v1/completions", &sbody).all();
    let text: String = chunks
        .iter()
        .map(|c| {
            assert_eq!(c["object"], "text_completion", "{c}");
            assert!(c.get("usage").is_none(), "{c}");
            c["choices"][0]["text"].as_str().unwrap()
        })
        .collect();
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        whole["choices"][0]["finish_reason"]
    );
}

#[test]
fn sixteen_clients_of_four_requests_get_the_sequential_greedy_outputs() {
    let s = Server::start(&[]);
    let prompts: Vec<String> = (0..8).map(|i| format!("def f{i}(x):")).collect();
    let body = |p: &str| chat_body(&user(p), 12);
    let expected: Vec<String> = prompts
        .iter()
        .map(|p| {
            let (status, v) = s.post_json("/v1/chat/completions", &body(p));
            assert_eq!(status, 200, "{v}");
            content(&v)
        })
        .collect();
    let (url, prompts) = (s.url.clone(), Arc::new(prompts));
    let clients: Vec<_> = (0..16)
        .map(|c| {
            let (url, prompts) = (url.clone(), Arc::clone(&prompts));
            std::thread::spawn(move || {
                let a = agent();
                (0..4)
                    .map(|r| {
                        let i = (c * 4 + r) % prompts.len();
                        let mut resp = a
                            .post(format!("{url}/v1/chat/completions"))
                            .send(body(&prompts[i]).to_string())
                            .unwrap();
                        let status = resp.status().as_u16();
                        let v: Value =
                            serde_json::from_str(&resp.body_mut().read_to_string().unwrap())
                                .unwrap();
                        (i, status, v)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut answered = 0;
    for c in clients {
        for (i, status, v) in c.join().unwrap() {
            assert_eq!(status, 200, "{v}");
            assert_eq!(content(&v), expected[i], "prompt {i}");
            answered += 1;
        }
    }
    assert_eq!(answered, 64);
    assert_eq!(
        s.metric("mtp_runner:http_requests_total{route=\"/v1/chat/completions\",status=\"200\"}"),
        72.0
    );
}

#[test]
#[allow(clippy::print_stderr)]
fn a_client_killed_mid_stream_stops_its_decoding_and_frees_the_engine() {
    let s = Server::start(&[]);
    let long = json!({"prompt": "import os\n", "max_tokens": 600,
        "temperature": 0, "stream": true});
    let mut lines = s.stream("/v1/completions", &long);
    for _ in 0..3 {
        assert!(lines.next_data().is_some());
    }
    drop(lines);
    let t = Instant::now();
    let (status, v) = s.post_json(
        "/v1/completions",
        &json!({"prompt": "import sys\n", "max_tokens": 8, "temperature": 0}),
    );
    let next_took = t.elapsed();
    assert_eq!(status, 200, "{v}");
    let text = s.get("/metrics").1;
    assert_eq!(
        metric(
            &text,
            "mtp_runner:request_success_total{finished_reason=\"cancelled\"}"
        ),
        1.0,
        "{text}"
    );
    let killed_tokens = metric(&text, "mtp_runner:generation_tokens_total")
        - v["usage"]["completion_tokens"].as_f64().unwrap();
    assert!(
        killed_tokens < 200.0,
        "the killed stream generated {killed_tokens} tokens"
    );
    assert!(next_took < PATIENCE, "{next_took:?}");
    // The control: left running, the killed request generates its whole budget.
    let (_, full) = s.post_json(
        "/v1/completions",
        &json!({"prompt": "import os\n", "max_tokens": 600, "temperature": 0}),
    );
    assert_eq!(full["usage"]["completion_tokens"], 600, "{}", full["usage"]);
    eprintln!(
        "killed stream: {killed_tokens} tokens generated; the next request took {next_took:?}"
    );
}

#[test]
fn a_five_turn_chat_reuses_a_growing_prefix_and_equals_cold_runs() {
    let warm = Server::start(&[]);
    let cold = Server::start(&["--no-prefix-reuse"]);
    let mut messages: Vec<Value> = Vec::new();
    let mut last_cached = 0;
    for turn in 1..=5 {
        messages.push(json!({"role": "user", "content": format!("turn {turn}: def g{turn}(")}));
        let body = chat_body(&Value::Array(messages.clone()), 16);
        let (s1, w) = warm.post_json("/v1/chat/completions", &body);
        let (s2, c) = cold.post_json("/v1/chat/completions", &body);
        assert_eq!((s1, s2), (200, 200), "{w} {c}");
        assert_eq!(content(&w), content(&c), "turn {turn}");
        let cached = |v: &Value| {
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
        };
        assert_eq!(cached(&c), 0, "turn {turn}: the cold server reused {c}");
        if turn > 1 {
            assert!(
                cached(&w) > last_cached,
                "turn {turn}: cached {} after {last_cached}",
                cached(&w)
            );
        }
        assert!(cached(&w) < w["usage"]["prompt_tokens"].as_u64().unwrap());
        last_cached = cached(&w);
        messages.push(json!({"role": "assistant", "content": content(&w)}));
    }
    assert!(last_cached > 0);
}

#[test]
fn metrics_agree_with_the_responses() {
    let s = Server::start(&[]);
    let (mut prompt, mut completion, mut cached, mut drafted, mut accepted) = (0, 0, 0, 0, 0);
    let mut drafts = 0;
    for p in ["def a(", "class B:", "def a("] {
        let (status, v) = s.post_json("/v1/chat/completions", &chat_body(&user(p), 20));
        assert_eq!(status, 200, "{v}");
        let u = &v["usage"];
        prompt += u["prompt_tokens"].as_u64().unwrap();
        completion += u["completion_tokens"].as_u64().unwrap();
        cached += u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        drafted += u["speculation"]["drafted"].as_u64().unwrap();
        accepted += u["speculation"]["accepted"].as_u64().unwrap();
        drafts += u["speculation"]["depth_over_time"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d.as_u64() != Some(0))
            .count() as u64;
    }
    let text = s.get("/metrics").1;
    let m = |k: &str| metric(&text, k);
    assert_eq!(m("mtp_runner:prompt_tokens_total"), prompt as f64, "{text}");
    assert_eq!(m("mtp_runner:generation_tokens_total"), completion as f64);
    assert_eq!(m("mtp_runner:prompt_tokens_cached_total"), cached as f64);
    assert!(cached > 0, "the repeated prompt was not reused");
    let mtp = |name: &str| {
        m(&format!(
            "mtp_runner:spec_decode_{name}_total{{method=\"mtp\"}}"
        ))
    };
    assert_eq!(mtp("num_draft_tokens"), drafted as f64);
    assert_eq!(mtp("num_accepted_tokens"), accepted as f64);
    assert_eq!(mtp("num_drafts"), drafts as f64);
    assert!(drafted > 0);
    let per_pos: f64 = (0..16)
        .map(|p| {
            m(&format!(
                "mtp_runner:spec_decode_num_accepted_tokens_per_pos_total{{method=\"mtp\",position=\"{p}\"}}"
            ))
        })
        .sum();
    assert_eq!(per_pos, accepted as f64);
    assert_eq!(m("mtp_runner:time_to_first_token_seconds_count"), 3.0);
    assert_eq!(m("mtp_runner:num_requests_waiting"), 0.0);
    assert_eq!(
        m("mtp_runner:http_requests_total{route=\"/v1/chat/completions\",status=\"200\"}"),
        3.0
    );
    for l in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let value = l.rsplit(' ').next().unwrap();
        assert!(value.parse::<f64>().is_ok(), "not a sample: `{l}`");
    }
}

#[test]
fn a_full_queue_answers_429_and_the_queued_request_still_runs() {
    let s = Server::start(&["--queue-size", "1"]);
    let long = json!({"prompt": "import os\n", "max_tokens": 1900,
        "temperature": 0, "stream": true});
    let mut running = s.stream("/v1/completions", &long);
    assert!(running.next_data().is_some());
    let url = s.url.clone();
    let queued = std::thread::spawn(move || {
        let mut r = agent()
            .post(format!("{url}/v1/completions"))
            .send(json!({"prompt": "x", "max_tokens": 2}).to_string())
            .unwrap();
        (r.status().as_u16(), r.body_mut().read_to_string().unwrap())
    });
    let t = Instant::now();
    while s.metric("mtp_runner:num_requests_waiting") < 1.0 {
        assert!(t.elapsed() < PATIENCE, "the second request never queued");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (status, v) = s.post_json("/v1/completions", &json!({"prompt": "y"}));
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "queue_full");
    drop(running);
    let (status, body) = queued.join().unwrap();
    assert_eq!(status, 200, "{body}");
}

#[test]
fn sigterm_finishes_the_stream_in_flight_and_exits_zero() {
    let mut s = Server::start(&[]);
    let body = json!({"prompt": "import os\n", "max_tokens": 48,
        "temperature": 0, "stream": true});
    let mut lines = s.stream("/v1/completions", &body);
    assert!(lines.next_data().is_some());
    s.signal("TERM");
    let mut last = Value::Null;
    while let Some(d) = lines.next_data() {
        if d == "[DONE]" {
            break;
        }
        last = serde_json::from_str(&d).unwrap();
    }
    assert_eq!(last["choices"][0]["finish_reason"], "length", "{last}");
    assert_eq!(s.wait().code(), Some(0), "{}", s.stderr.lock().unwrap());

    // With no grace the one in flight is cancelled, and the exit is still 0.
    let mut s = Server::start(&["--shutdown-timeout", "0"]);
    let body = json!({"prompt": "import os\n", "max_tokens": 1900,
        "temperature": 0, "stream": true});
    let mut lines = s.stream("/v1/completions", &body);
    assert!(lines.next_data().is_some());
    s.signal("INT");
    let mut last = Value::Null;
    let mut pieces = 0;
    while let Some(d) = lines.next_data() {
        if d == "[DONE]" {
            break;
        }
        last = serde_json::from_str(&d).unwrap();
        pieces += 1;
    }
    assert_eq!(last["choices"][0]["finish_reason"], "cancelled", "{last}");
    assert!(pieces < 1900, "{pieces}");
    assert_eq!(s.wait().code(), Some(0), "{}", s.stderr.lock().unwrap());
}

#[test]
#[allow(clippy::print_stderr)]
fn the_openai_python_client_chats_with_and_without_streaming() {
    let has_client = Command::new("python3")
        .args(["-c", "import openai"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_client {
        eprintln!(
            "skipped: `python3 -c 'import openai'` failed; `python3 -m pip install openai` runs \
             this test (.ci/run installs a pinned version)"
        );
        return;
    }
    let s = Server::start(&[]);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/serve_openai.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(&s.url)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("openai client: ok"), "{stdout}");
}

/// How long a raw-socket client waits for the server to answer or close:
/// far above `--read-timeout 1`, far below a server that never times out.
const RAW_PATIENCE: Duration = Duration::from_secs(20);

/// A server with `--read-timeout 1` whose client opens a new connection per
/// request: a pooled one idle for a second may be closed under its feet.
fn impatient_server() -> Server {
    let mut s = Server::start(&["--read-timeout", "1"]);
    s.agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(PATIENCE))
        .max_idle_connections(0)
        .build()
        .into();
    s
}

/// A raw connection to `s`.
fn raw(s: &Server) -> TcpStream {
    TcpStream::connect(s.url.strip_prefix("http://").unwrap()).unwrap()
}

/// Sends `head`, then (with `trickle`) that byte every 100 ms until the
/// server answers or closes; returns what it sent back once it closed, and
/// how long after `head` that was. Panics after [`RAW_PATIENCE`].
fn send_slowly(c: &mut TcpStream, head: &[u8], trickle: Option<u8>) -> (String, Duration) {
    let t = Instant::now();
    c.write_all(head).unwrap();
    c.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0; 4096];
    loop {
        assert!(
            t.elapsed() < RAW_PATIENCE,
            "the server still holds the connection after {RAW_PATIENCE:?}; it sent `{}`",
            String::from_utf8_lossy(&got)
        );
        match c.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if let (Some(b), true) = (trickle, got.is_empty()) {
                    // A write that fails means the server has closed: the
                    // next read says how.
                    let _ = c.write_all(&[b]);
                }
            }
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("reading the raw connection: {e}"),
        }
    }
    (String::from_utf8_lossy(&got).into_owned(), t.elapsed())
}

/// A whole `POST path` request with a JSON body.
fn raw_post(path: &str, body: &Value) -> Vec<u8> {
    let body = body.to_string();
    format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[test]
fn a_head_that_stalls_or_trickles_is_cut_off_after_the_read_timeout() {
    let s = impatient_server();
    let stalled_head: &[u8] = b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Ty";
    let trickled_head: &[u8] = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ";
    let mut stalled = raw(&s);
    let mut trickled = raw(&s);
    let clients = [
        std::thread::spawn(move || send_slowly(&mut stalled, stalled_head, None)),
        std::thread::spawn(move || send_slowly(&mut trickled, trickled_head, Some(b'a'))),
    ];
    // Both hold their connections while a third client is served.
    let (status, v) = s.post_json("/v1/completions", &json!({"prompt": "x", "max_tokens": 2}));
    assert_eq!(status, 200, "{v}");
    for (client, name) in clients.into_iter().zip(["stalled", "trickled"]) {
        let (got, took) = client.join().unwrap();
        // A late head is not answered: the connection is closed.
        assert_eq!(got, "", "{name}");
        assert!(
            took >= Duration::from_millis(900),
            "{name}: cut after {took:?}"
        );
    }
}

#[test]
fn a_body_that_stalls_or_trickles_gets_408_after_the_read_timeout() {
    let s = impatient_server();
    let head = "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n\
                Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"prompt\": ";
    for trickle in [None, Some(b' ')] {
        let (got, took) = send_slowly(&mut raw(&s), head.as_bytes(), trickle);
        assert!(took >= Duration::from_millis(900), "{trickle:?}: {took:?}");
        assert!(got.starts_with("HTTP/1.1 408"), "{trickle:?}: {got}");
        assert!(got.contains("connection: close"), "{got}");
        let (_, body) = got.split_once("\r\n\r\n").unwrap();
        let v: Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "request_timeout", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("--read-timeout"),
            "{v}"
        );
    }
    let key = "mtp_runner:http_requests_total{route=\"/v1/completions\",status=\"408\"}";
    assert_eq!(s.metric(key), 2.0);
    let (status, v) = s.post_json("/v1/completions", &json!({"prompt": "x", "max_tokens": 2}));
    assert_eq!(status, 200, "{v}");
}

#[test]
fn a_stream_that_outlives_the_read_timeout_is_not_cut() {
    let s = impatient_server();
    let t = Instant::now();
    let body = json!({"prompt": "import os\n", "max_tokens": 1900,
        "temperature": 0, "stream": true});
    let chunks = s.stream("/v1/completions", &body).all();
    let took = t.elapsed();
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length", "{last}");
    assert!(
        took > Duration::from_secs(2),
        "the stream took {took:?}: too short to outlive --read-timeout 1 and show anything; \
         raise max_tokens"
    );
}

#[test]
fn a_client_that_closes_after_a_non_streaming_request_stops_its_decoding() {
    let s = Server::start(&[]);
    let long = json!({"prompt": "import os\n", "max_tokens": 1900, "temperature": 0});
    // Closed for good, and only its sending side (a half-close, which TCP
    // shows the server as the same EOF): both are taken for a client that
    // is gone, so neither request keeps the engine for its 1,900 tokens.
    for half in [false, true] {
        let t = Instant::now();
        while s.metric("mtp_runner:num_requests_running") > 0.0 {
            assert!(t.elapsed() < PATIENCE, "the last request never ended");
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut c = raw(&s);
        c.write_all(&raw_post("/v1/completions", &long)).unwrap();
        let waiting = s.metric("mtp_runner:request_success_total{finished_reason=\"cancelled\"}");
        // Wait until the request runs, so the close lands during decoding.
        let t = Instant::now();
        while s.metric("mtp_runner:num_requests_running") < 1.0 {
            assert!(t.elapsed() < PATIENCE, "the request never started");
            std::thread::sleep(Duration::from_millis(5));
        }
        if half {
            c.shutdown(Shutdown::Write).unwrap();
        } else {
            drop(c);
        }
        let t = Instant::now();
        while s.metric("mtp_runner:request_success_total{finished_reason=\"cancelled\"}")
            < waiting + 1.0
        {
            assert!(t.elapsed() < PATIENCE, "half-close {half}: never cancelled");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    let made = s.metric("mtp_runner:generation_tokens_total");
    assert!(
        made < 2.0 * 1900.0 * 0.5,
        "{made} tokens for two cancelled requests"
    );
    // The server goes on serving.
    let (status, v) = s.post_json(
        "/v1/completions",
        &json!({"prompt": "x", "max_tokens": 2, "temperature": 0}),
    );
    assert_eq!(status, 200, "{v}");
}

#[test]
fn read_timeout_out_of_range_is_a_usage_error_naming_the_flag() {
    let model = common::bundled("tiny-mtp");
    for bad in ["0", "-1", "3601", "18446744073709551616", "1.5", "soon"] {
        let out = common::check(
            &[
                "serve",
                "--model",
                model.to_str().unwrap(),
                "--port",
                "0",
                "--read-timeout",
                bad,
            ],
            2,
            &["--read-timeout", "from 1 to 3600"],
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("listening"), "{bad}: {err}");
    }
}
