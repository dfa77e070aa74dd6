//! Per-position draft acceptance of greedy MTP decoding, for replaying depth
//! policies offline: for each position `p` of the plain greedy reply to
//! each prompt, how many of six drafts from `p` match the reply (`L(p)`).
//! A round at depth `d` from `p` then accepts `min(d, L(p))`.
//!
//! `cargo run --release -p runner --example accept-replay -- --model DIR
//! [--tokens N] [--prompts FILE.json]` prints one JSON line per prompt:
//! `{"prompt": i, "lengths": [L(0), L(1), ...]}`; on tiny-mtp that is
//! `src/depth/tiny_mtp_lengths.jsonl`, which `depth/sim.rs` replays.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use runner::{DepthPolicy, GenerateOptions, LoadOptions, SamplingOptions, Session};
use serde_json::json;

const DEPTH: usize = 6;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut model, mut tokens, mut prompts) = (None, 256, None);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--model" => model = Some(PathBuf::from(val()?)),
            "--tokens" => tokens = val()?.parse()?,
            "--prompts" => prompts = Some(PathBuf::from(val()?)),
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    let model = model.ok_or("--model DIR is required")?;
    let prompts: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(prompts.unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("../../xtask/assets/spec-scale-prompts.json")
        }))?)?;
    let m = runner::load(&model, LoadOptions::default(), |_, _| {})?;
    let cancel = AtomicBool::new(false);
    let opts = |max_tokens, depth| GenerateOptions {
        max_tokens,
        sampling: SamplingOptions::greedy(),
        depth,
        ..GenerateOptions::default()
    };
    for (i, text) in prompts.iter().enumerate() {
        // As the benchmark (`scale-bench`) encodes its prompts: token 0 first.
        let mut prompt = vec![0];
        prompt.extend(m.tokenizer.encode(text, false)?);
        let reply = Session::new(m.model.as_ref())
            .generate(
                &m.tokenizer,
                &prompt,
                &opts(tokens, DepthPolicy::Fixed(0)),
                &cancel,
                |_| {},
            )?
            .token_ids;
        let mut lengths = Vec::new();
        // Position p: the prompt and the first p + 1 reply tokens committed
        // (the first comes from the prefill), the round drafts from there.
        for p in 0..reply.len().saturating_sub(1) {
            let mut context = prompt.clone();
            context.extend_from_slice(&reply[..p]);
            let g = Session::with_mtp(m.model.as_ref())?.generate(
                &m.tokenizer,
                &context,
                &opts(DEPTH + 2, DepthPolicy::Fixed(DEPTH)),
                &cancel,
                |_| {},
            )?;
            let s = g.speculation.expect("speculative");
            let n = g.token_ids.len().min(reply.len() - p);
            assert_eq!(
                g.token_ids[..n],
                reply[p..p + n],
                "position {p}: not the plain reply"
            );
            // The first round drafts DEPTH and accepts L, emitting L + 1 of
            // the budget of DEPTH + 2; the next one drafts what is left
            // after its own next token: DEPTH - L.
            assert_eq!(s.depth_over_time[0], DEPTH, "{:?}", s.depth_over_time);
            let l = DEPTH - s.depth_over_time[1];
            lengths.push(l);
        }
        println!("{}", json!({"prompt": i, "lengths": lengths}));
    }
    Ok(())
}
