//! Measures plain greedy decode speed on a model folder, one JSON line per run.
//!
//! `cargo run --release -p runner --example decode-bench -- --model DIR [--tokens N] [--runs R] [--layout view|pre] [--no-pipeline] [--prompt TEXT]`
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use runner::LinearLayout;
use runner::{GenerateOptions, LoadOptions, SamplingOptions, Session};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut model, mut tokens, mut runs) = (None, 128usize, 3usize);
    let mut layout = LinearLayout::DEFAULT;
    let mut prompt = "Once upon a time".to_owned();
    let mut pipeline = true;
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--model" => model = Some(PathBuf::from(val()?)),
            "--tokens" => tokens = val()?.parse()?,
            "--runs" => runs = val()?.parse()?,
            "--prompt" => prompt = val()?,
            "--no-pipeline" => pipeline = false,
            "--layout" => {
                layout = match val()?.as_str() {
                    "view" => LinearLayout::TransposedView,
                    "pre" => LinearLayout::PreTransposed,
                    other => return Err(format!("--layout {other}: view or pre").into()),
                }
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let model = model.ok_or("--model DIR is required")?;
    let opts = LoadOptions {
        layout,
        ..LoadOptions::default()
    };
    let m = runner::load(&model, opts, |_, _| {})?;
    let ids = m.tokenizer.encode(&prompt, true)?;
    let gen_opts = GenerateOptions {
        max_tokens: tokens,
        sampling: SamplingOptions::greedy(),
        pipeline,
        ..GenerateOptions::default()
    };
    let never = AtomicBool::new(false);
    // Warm-up run (allocator and BLAS threads).
    Session::new(m.model.as_ref()).generate(&m.tokenizer, &ids, &gen_opts, &never, |_| {})?;
    for run in 0..runs {
        let g = Session::new(m.model.as_ref()).generate(
            &m.tokenizer,
            &ids,
            &gen_opts,
            &never,
            |_| {},
        )?;
        let line = serde_json::json!({
            "engine": "mtp-runner", "layout": format!("{layout:?}"), "pipeline": pipeline, "run": run,
            "prompt_tokens": g.stats.prompt_tokens, "generated_tokens": g.stats.generated_tokens,
            "prefill_tps": g.stats.prefill_tps(), "decode_tps": g.stats.decode_tps(),
        });
        std::io::Write::write_all(&mut std::io::stdout(), format!("{line}\n").as_bytes())?;
    }
    // Skip static destructors: OpenBLAS's exit-time shutdown can hang (see `exit_now`).
    std::io::Write::flush(&mut std::io::stdout())?;
    mlx_tensor::exit_now(0)
}
