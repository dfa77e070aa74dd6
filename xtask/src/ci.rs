//! `cargo xtask ci`: the whole gate, in the order that fails fastest.

use std::time::Instant;

use anyhow::{Result, bail};

use crate::{cmd, deps, tidy};

/// fmt check, clippy with `-D warnings`, rustdoc with `-D warnings` (a public
/// item's docs must not link to private ones), the dependency-graph and tidy
/// checks, then all tests.
pub(crate) fn run(args: &[String]) -> Result<()> {
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
    cmd::run(
        "doc",
        cmd::cargo()
            .args(["doc", "--no-deps", "--workspace"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    deps::run()?;
    tidy::run()?;
    // One OpenBLAS thread: its idle threads spin on the 2-core CI machine and
    // slow MLX's own worker down, and OpenBLAS 0.3.21's pthread build can hang
    // in `blas_thread_shutdown_` at the exit of a test binary that used them.
    cmd::run(
        "test",
        cmd::cargo()
            .args(["test", "--workspace"])
            .env("OPENBLAS_NUM_THREADS", "1"),
    )?;
    eprintln!("xtask: ci passed in {:.0} s", start.elapsed().as_secs_f64());
    Ok(())
}
