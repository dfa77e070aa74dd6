//! Running child processes from the workspace root, with the step named in every error.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

/// The workspace root: `$MTP_ROOT` when set, else the parent of `xtask/` when
/// this binary runs in the checkout it was built from, else the current folder
/// (a prebuilt xtask started in a copy of the repository, as `gpu.sh` does).
pub(crate) fn root() -> PathBuf {
    if let Some(r) = std::env::var_os("MTP_ROOT") {
        return PathBuf::from(r);
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root");
    if built.join("Cargo.toml").is_file() {
        built.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."))
    }
}

/// `cargo` as the one running xtask (respects `$CARGO`), started in the workspace root.
pub(crate) fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(root());
    c
}

/// `cargo run --quiet --release -p {package} --example {example} -- {args}`.
pub(crate) fn release_example(package: &str, example: &str, args: &[String]) -> Command {
    let mut c = cargo();
    c.args([
        "run",
        "--quiet",
        "--release",
        "-p",
        package,
        "--example",
        example,
        "--",
    ])
    .args(args);
    c
}

/// Runs `cmd` to completion with inherited output; fails naming `what` when it fails.
pub(crate) fn run(what: &str, cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: {what}: {}", show(cmd));
    let start = Instant::now();
    let status = cmd
        .status()
        .with_context(|| format!("{what}: cannot start `{}`", show(cmd)))?;
    eprintln!(
        "xtask: {what}: {status} in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    if !status.success() {
        bail!("{what} failed ({status}): `{}`", show(cmd));
    }
    Ok(())
}

/// Runs `cmd` and returns its stdout; fails with its stderr when it fails.
pub(crate) fn output(what: &str, cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("{what}: cannot start `{}`", show(cmd)))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): `{}`\n{}",
            out.status,
            show(cmd),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8(out.stdout).with_context(|| format!("{what}: output is not UTF-8"))
}

/// The command line, for messages.
fn show(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}
