//! Plain vs speculative greedy decoding (MTP head, draft model, n-gram
//! lookup) per draft depth, one JSON line per (method, depth).
//!
//! `cargo run --release -p runner --example spec-bench -- --model DIR
//! [--draft-model DIR] [--methods off,mtp,draft-model,ngram] [--depths auto,1,2,3,4]
//! [--tokens N] [--runs R] [--prompt TEXT]`
//!
//! Each line: `{"bench":"spec","engine":"mtp-runner","method":"off|mtp|draft-model|ngram",
//! "depth":"auto"|N,"tokens_per_s":..,"acceptance_rate":..,"mean_accepted_length":..,
//! "per_position_acceptance":[..],"generated_tokens":..,"runs":R}` with the median decode tokens/s over the
//! timed runs (after one warm-up) and the speculation figures of the median
//! run. `off` is printed once, at depth 0. A method the model cannot use (MTP
//! without a head) is skipped with a note on stderr.
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use runner::DepthPolicy;
use runner::{GenerateOptions, Generation, LoadOptions, LoadedModel, SamplingOptions, Session};
use runner::{NgramOptions, load_draft};
use serde_json::{Value, json};

#[path = "support/logs.rs"]
mod logs;

/// The bundled draft model, used when `--draft-model` is not given.
fn default_draft() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/tiny-draft")
}

fn parse_depth(s: &str) -> Result<DepthPolicy, String> {
    match s {
        "auto" => Ok(DepthPolicy::default()),
        n => n
            .parse()
            .map(DepthPolicy::Fixed)
            .map_err(|_| format!("--depths: `{n}` is not `auto` or a number")),
    }
}

fn depth_json(d: DepthPolicy) -> Value {
    match d {
        DepthPolicy::Fixed(n) => json!(n),
        DepthPolicy::Auto { .. } => json!("auto"),
    }
}

/// A session of `method`, or `None` when the model cannot draft that way.
fn session<'m>(
    method: &str,
    m: &'m LoadedModel,
    draft: Option<&'m LoadedModel>,
) -> Option<Session<'m>> {
    let target = m.model.as_ref();
    match method {
        "off" => Some(Session::new(target)),
        "mtp" => Session::with_mtp(target).ok(),
        "draft-model" => draft.map(|d| Session::with_draft_model(target, d.model.as_ref())),
        "ngram" => Some(Session::with_ngram(target, NgramOptions::default())),
        _ => None,
    }
}

// A benchmark binary: notes go to stderr, results to stdout.
#[allow(clippy::print_stderr)]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    logs::init_from_env();
    let mut args = std::env::args().skip(1);
    let (mut model, mut draft_dir, mut tokens, mut runs) =
        (None, default_draft(), 128usize, 3usize);
    let mut methods = vec![
        "off".to_owned(),
        "mtp".into(),
        "draft-model".into(),
        "ngram".into(),
    ];
    let mut depths = vec![DepthPolicy::default()];
    depths.extend((1..=4).map(DepthPolicy::Fixed));
    let mut prompt = "Once upon a time".to_owned();
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--model" => model = Some(PathBuf::from(val()?)),
            "--draft-model" => draft_dir = PathBuf::from(val()?),
            "--tokens" => tokens = val()?.parse()?,
            "--runs" => runs = val()?.parse()?,
            "--prompt" => prompt = val()?,
            "--methods" => methods = val()?.split(',').map(str::to_owned).collect(),
            "--depths" => {
                depths = val()?
                    .split(',')
                    .map(parse_depth)
                    .collect::<Result<_, _>>()?
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let model = model.ok_or("--model DIR is required")?;
    if runs == 0 {
        return Err("--runs must be at least 1".into());
    }
    let m = runner::load(&model, LoadOptions::default(), |_, _| {})?;
    let draft = if methods.iter().any(|x| x == "draft-model") {
        Some(load_draft(
            &draft_dir,
            &model,
            &m.tokenizer,
            LoadOptions::default(),
        )?)
    } else {
        None
    };
    let ids = m.tokenizer.encode(&prompt, true)?;
    let never = AtomicBool::new(false);
    for method in &methods {
        let policies = if method == "off" {
            vec![DepthPolicy::Fixed(0)]
        } else {
            depths.clone()
        };
        for depth in policies {
            let opts = GenerateOptions {
                max_tokens: tokens,
                sampling: SamplingOptions::greedy(),
                depth,
                ..GenerateOptions::default()
            };
            let mut timed: Vec<Generation> = Vec::with_capacity(runs);
            for run in 0..=runs {
                let Some(mut s) = session(method, &m, draft.as_ref()) else {
                    eprintln!(
                        "spec-bench: skipping `{method}`: {} cannot draft that way",
                        model.display()
                    );
                    break;
                };
                let g = s.generate(&m.tokenizer, &ids, &opts, &never, |_| {})?;
                // Run 0 warms up allocators and BLAS threads.
                if run > 0 {
                    timed.push(g);
                }
            }
            if timed.is_empty() {
                break;
            }
            timed.sort_by(|a, b| a.stats.decode_tps().total_cmp(&b.stats.decode_tps()));
            let median = &timed[timed.len() / 2];
            // A plain run has no speculation figures: acceptance 0, one token a round.
            let spec = median.speculation.as_ref();
            let line = json!({
                "bench": "spec", "engine": "mtp-runner", "method": method,
                "depth": depth_json(depth),
                "tokens_per_s": median.stats.decode_tps(),
                "acceptance_rate": spec.map_or(0.0, |s| s.acceptance_rate()),
                "mean_accepted_length": spec.filter(|s| s.rounds > 0).map_or(1.0, |s| s.mean_accepted_length()),
                "per_position_acceptance": spec.map_or(Vec::new(), |s| s.per_position_acceptance()),
                "generated_tokens": median.stats.generated_tokens,
                "runs": runs,
            });
            std::io::Write::write_all(&mut std::io::stdout(), format!("{line}\n").as_bytes())?;
        }
    }
    // Skip static destructors: OpenBLAS's exit-time shutdown can hang (see `exit_now`).
    std::io::Write::flush(&mut std::io::stdout())?;
    mlx_tensor::exit_now(0)
}
