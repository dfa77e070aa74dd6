//! `cargo xtask ci`: the whole gate, in the order that fails fastest.

use std::time::Instant;

use anyhow::{Result, bail};

use crate::{cmd, deps};

/// fmt check, clippy with `-D warnings`, the dependency-graph check, then all tests.
pub fn run(args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        bail!("`ci` takes no arguments (got `{a}`)");
    }
    let start = Instant::now();
    cmd::run("fmt", cmd::cargo().args(["fmt", "--all", "--", "--check"]))?;
    cmd::run(
        "clippy",
        cmd::cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    deps::run()?;
    cmd::run("test", cmd::cargo().args(["test", "--workspace"]))?;
    eprintln!("xtask: ci passed in {:.0} s", start.elapsed().as_secs_f64());
    Ok(())
}
