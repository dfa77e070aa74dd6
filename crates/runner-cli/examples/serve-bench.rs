//! A scripted multi-turn chat workload against `mtp-runner serve`, with
//! speculation on and off and prefix reuse on and off: one JSON line per
//! setting with requests/s and per-request tokens/s (`cargo xtask bench serve`).
//!
//! Each setting starts its own server on 127.0.0.1:0; `--clients` threads
//! share `--conversations` chats of `--turns` turns, every turn re-sending the
//! whole history (as chat front-ends do) with a greedy reply of at most
//! `--max-tokens`; greedy decoding is lossless, so every setting generates
//! the same tokens.
//!
//! ```sh
//! cargo run --release -p runner-cli --example serve-bench -- --bin target/release/mtp-runner
//! ```
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

struct Opts {
    bin: PathBuf,
    model: PathBuf,
    clients: usize,
    conversations: usize,
    turns: usize,
    max_tokens: usize,
}

fn opts() -> Result<Opts> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut o = Opts {
        bin: root.join("target/release/mtp-runner"),
        model: root.join("models/tiny-mtp"),
        clients: 2,
        conversations: 4,
        turns: 4,
        max_tokens: 32,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut v = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--bin" => o.bin = v()?.into(),
            "--model" => o.model = v()?.into(),
            "--clients" => o.clients = v()?.parse()?,
            "--conversations" => o.conversations = v()?.parse()?,
            "--turns" => o.turns = v()?.parse()?,
            "--max-tokens" => o.max_tokens = v()?.parse()?,
            other => bail!(
                "unknown option {other} (known: --bin, --model, --clients, --conversations, \
                 --turns, --max-tokens)"
            ),
        }
    }
    if !o.bin.is_file() {
        bail!(
            "no mtp-runner at {}: build it (cargo build --release -p runner-cli) or pass --bin",
            o.bin.display()
        );
    }
    Ok(o)
}

/// A server of one setting, stopped when dropped.
struct Server {
    child: std::process::Child,
    url: String,
}

impl Server {
    fn start(o: &Opts, extra: &[&str]) -> Result<Server> {
        let mut child = Command::new(&o.bin)
            .args(["serve", "--model"])
            .arg(&o.model)
            .args(["--host", "127.0.0.1", "--port", "0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", o.bin.display()))?;
        let pipe = child.stderr.take().context("server stderr")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on ").nth(1) {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_owned());
                }
            }
        });
        let url = rx
            .recv_timeout(Duration::from_secs(120))
            .context("the server did not report its address")?;
        Ok(Server { child, url })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request's figures.
struct Sample {
    seconds: f64,
    completion_tokens: u64,
    cached_tokens: u64,
}

fn chat(
    agent: &ureq::Agent,
    url: &str,
    messages: &[Value],
    max_tokens: usize,
) -> Result<(String, Sample)> {
    let body = json!({"messages": messages, "max_tokens": max_tokens, "temperature": 0});
    let t = Instant::now();
    let mut r = agent
        .post(format!("{url}/v1/chat/completions"))
        .send(body.to_string())?;
    let v: Value = serde_json::from_str(&r.body_mut().read_to_string()?)?;
    let seconds = t.elapsed().as_secs_f64();
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .with_context(|| format!("no reply in {v}"))?
        .to_owned();
    let u = &v["usage"];
    Ok((
        text,
        Sample {
            seconds,
            completion_tokens: u["completion_tokens"].as_u64().unwrap_or(0),
            cached_tokens: u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0),
        },
    ))
}

/// The turns of conversation `c`.
fn conversation(agent: &ureq::Agent, url: &str, c: usize, o: &Opts) -> Result<Vec<Sample>> {
    let mut messages = vec![json!({"role": "system", "content": "You write short Python."})];
    let mut out = Vec::new();
    for t in 0..o.turns {
        messages.push(json!({"role": "user", "content": format!("def task_{c}_{t}(x):")}));
        let (text, s) = chat(agent, url, &messages, o.max_tokens)?;
        messages.push(json!({"role": "assistant", "content": text}));
        out.push(s);
    }
    Ok(out)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn main() -> Result<()> {
    let o = opts()?;
    for (speculation, reuse) in [("mtp", true), ("mtp", false), ("off", true), ("off", false)] {
        let mut extra = vec!["--speculative", speculation];
        if !reuse {
            extra.push("--no-prefix-reuse");
        }
        let server = Server::start(&o, &extra)?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(600)))
            .build()
            .into();
        // Warm-up: the first forward pays one-time costs.
        chat(
            &agent,
            &server.url,
            &[json!({"role": "user", "content": "hi"})],
            4,
        )?;
        let t = Instant::now();
        let samples: Vec<Sample> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..o.clients)
                .map(|k| {
                    let (agent, url, o) = (agent.clone(), server.url.as_str(), &o);
                    scope.spawn(move || -> Result<Vec<Sample>> {
                        let mut all = Vec::new();
                        for c in (k..o.conversations).step_by(o.clients.max(1)) {
                            all.extend(conversation(&agent, url, c, o)?);
                        }
                        Ok(all)
                    })
                })
                .collect();
            let mut all = Vec::new();
            for h in handles {
                all.extend(h.join().expect("client thread")?);
            }
            Ok::<_, anyhow::Error>(all)
        })?;
        let wall = t.elapsed().as_secs_f64();
        let n = samples.len();
        let tokens: u64 = samples.iter().map(|s| s.completion_tokens).sum();
        let row = json!({
            "bench": "serve",
            "workload": format!("{} chats x {} turns, {} clients, at most {} tokens per reply", o.conversations, o.turns, o.clients, o.max_tokens),
            "speculation": speculation,
            "prefix_reuse": reuse,
            "requests": n,
            "wall_s": wall,
            "requests_per_s": n as f64 / wall,
            "tokens_per_s_per_request_median": median(samples.iter().map(|s| s.completion_tokens as f64 / s.seconds).collect()),
            "tokens_per_s_total": tokens as f64 / wall,
            "cached_tokens_per_request_mean": samples.iter().map(|s| s.cached_tokens).sum::<u64>() as f64 / n.max(1) as f64,
        });
        println!("{row}");
        drop(server);
    }
    Ok(())
}
