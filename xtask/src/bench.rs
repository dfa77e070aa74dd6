//! `cargo xtask bench <suite>`: benchmark suites, each printing JSON lines on stdout.
//!
//! To add a suite, write a `fn(&[String]) -> Result<()>` and add a row to [`SUITES`].

use anyhow::{Result, bail};

use crate::cmd;

/// One benchmark suite: its name, a one-line description, and how to run it.
struct Suite {
    name: &'static str,
    about: &'static str,
    run: fn(&[String]) -> Result<()>,
}

/// The suites `cargo xtask bench` knows, in the order `bench list` shows them.
const SUITES: &[Suite] = &[Suite {
    name: "gemm",
    about: "x[m,2048] @ w[2048,2048] for m = 1, 4, 8 in f32 and bf16 (mlx-tensor example `gemm`)",
    run: gemm,
}];

/// Dispatches to the named suite, passing the remaining arguments through.
pub fn run(args: &[String]) -> Result<()> {
    let Some((name, rest)) = args.split_first() else {
        list();
        bail!("`bench` needs a suite name");
    };
    if name == "list" {
        list();
        return Ok(());
    }
    match SUITES.iter().find(|s| s.name == name) {
        Some(suite) => (suite.run)(rest),
        None => {
            list();
            bail!("unknown bench suite `{name}`")
        }
    }
}

fn list() {
    eprintln!("bench suites:");
    for s in SUITES {
        eprintln!("  {:<8} {}", s.name, s.about);
    }
}

/// A release build of an example, run with `args` passed through.
fn release_example(package: &str, example: &str, args: &[String]) -> Result<()> {
    cmd::run(
        &format!("bench {example}"),
        cmd::cargo()
            .args([
                "run",
                "--quiet",
                "--release",
                "-p",
                package,
                "--example",
                example,
                "--",
            ])
            .args(args),
    )
}

fn gemm(args: &[String]) -> Result<()> {
    release_example("mlx-tensor", "gemm", args)
}
