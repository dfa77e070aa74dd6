//! `cargo xtask`: the one entry point for CI checks, benchmarks, fixtures and set-up.
//!
//! xtask builds no MLX code itself: it drives `cargo`, `apt-get` and the Python
//! scripts under `xtask/train/`. Its output is its interface, so it prints.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod bench;
mod bins;
mod ci;
mod cmd;
mod deps;
mod gpu_bundle;
mod gpu_check;
mod machine;
mod python;
mod report;
mod setup;
mod soak;
mod spec_scale;
mod split;
mod tidy;
mod upscale;

use std::process::ExitCode;

use anyhow::{Result, bail};

const USAGE: &str = "\
usage: cargo xtask <command> [args]

commands:
  ci                 fmt check, clippy and rustdoc -D warnings, dependency-graph and tidy checks, all tests
  deps               check the crate graph against docs/ARCHITECTURE.md alone
  tidy               house-style checks: `//!` openers, no `kind()` strings, unused
                     dependencies, functions over 80 lines, module cycles
  bench [<suite>]    all suites -> docs/bench/results.json + README.md (plots); one suite:
                     JSON lines on stdout; `bench list` lists them, `bench --merge F.json`
  gpu-check [...]    parity and losslessness checks on a GPU (exit 3: no GPU); docs/gpu.md
  gpu-bundle [...]   binaries + MLX CUDA for the H200 machine, in parts, with gpu.sh
  soak [...]         chat turns with MTP until 20,000 tokens; memory JSON summary
  setup [--python]   install missing system prerequisites (OpenBLAS); --python also makes
                     the reference-tools venv
  upscale [...]      widen a trained model to a benchmark shape, same outputs (--shape 24l|1.7b|8b|0.6b)
  train-tiny [...]   python3 xtask/train/train.py [...]
  ref-check [...]    python3 xtask/train/ref_check.py [...]
  ref-formats [...]  python3 xtask/train/ref_formats.py [...]: rewrite the checkpoint-format fixtures
                     (transformers + mlx-lm) under crates/runner/tests/fixtures/formats
  ref-fp-modes [...] python3 xtask/train/ref_fp_modes.py [...]: the mlx-lm mxfp4 / mxfp8 / nvfp4
                     fixtures, converted from the shipped *-mlx-f32 folders
";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` prints the context chain on one line; no backtrace noise.
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (command, rest) = match args.split_first() {
        Some((c, rest)) => (c.as_str(), rest),
        None => {
            eprint!("{USAGE}");
            bail!("no command given");
        }
    };
    match command {
        "ci" => ci::run(rest),
        "deps" => deps::run(),
        "tidy" => tidy::run(),
        "bench" => bench::run(rest),
        "gpu-check" => gpu_check::run(rest),
        "gpu-bundle" => gpu_bundle::run(rest),
        "setup" => setup::run(rest),
        "soak" => soak::run(rest),
        "upscale" => upscale::run(rest),
        "train-tiny" => python::run_script("train.py", rest),
        "ref-check" => python::run_script("ref_check.py", rest),
        "ref-formats" => python::run_script("ref_formats.py", rest),
        "ref-fp-modes" => python::run_script("ref_fp_modes.py", rest),
        "help" | "-h" | "--help" => {
            print!("{USAGE}");
            Ok(())
        }
        other => {
            eprint!("{USAGE}");
            bail!("unknown command `{other}`")
        }
    }
}
