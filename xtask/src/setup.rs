//! `cargo xtask setup`: installs what a fresh machine lacks (OpenBLAS; optionally a Python venv).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Result, bail};

use crate::cmd;

/// Where Debian/Ubuntu's `libopenblas0-pthread` puts the library.
const OPENBLAS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
];

/// The reference-tools venv: `$MLX_CACHE_DIR/venv`, else `~/.cache/mtp-runner/venv`.
pub(crate) fn venv_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("MLX_CACHE_DIR") {
        return PathBuf::from(d).join("venv");
    }
    let home = std::env::var_os("HOME").map_or_else(|| cmd::root().join("target"), PathBuf::from);
    home.join(".cache/mtp-runner/venv")
}

/// The OpenBLAS library, when installed.
pub(crate) fn openblas_path() -> Option<&'static str> {
    OPENBLAS.iter().copied().find(|p| Path::new(p).is_file())
}

pub(crate) fn run(args: &[String]) -> Result<()> {
    let mut python = false;
    for a in args {
        match a.as_str() {
            "--python" => python = true,
            other => bail!("unknown `setup` option `{other}` (known: --python)"),
        }
    }
    openblas()?;
    if python {
        venv()?;
    }
    Ok(())
}

fn openblas() -> Result<()> {
    if !cfg!(target_os = "linux") {
        eprintln!("xtask: setup: not Linux, nothing to install (macOS uses Accelerate)");
        return Ok(());
    }
    if OPENBLAS.iter().any(|p| Path::new(p).is_file()) {
        eprintln!("xtask: setup: OpenBLAS present");
        return Ok(());
    }
    let uid = cmd::output("id -u", Command::new("id").arg("-u")).unwrap_or_default();
    if uid.trim() != "0" {
        eprintln!(
            "xtask: setup: OpenBLAS missing and not root; run `sudo apt-get install -y libopenblas0-pthread` \
             (without it f32 matmul is 4-12x slower)"
        );
        return Ok(());
    }
    let install = || {
        cmd::run(
            "apt-get install",
            Command::new("apt-get")
                .args([
                    "install",
                    "-y",
                    "--no-install-recommends",
                    "libopenblas0-pthread",
                ])
                .env("DEBIAN_FRONTEND", "noninteractive"),
        )
    };
    if install().is_err() {
        // A fresh image often has no package lists yet.
        cmd::run("apt-get update", Command::new("apt-get").arg("update"))?;
        install()?;
    }
    eprintln!(
        "xtask: setup: installed OpenBLAS; rebuild so mlx-tensor links it (`cargo build` picks it up)"
    );
    Ok(())
}

fn venv() -> Result<()> {
    let dir = venv_dir();
    if !dir.join("bin/python3").is_file() {
        cmd::run(
            "python venv",
            Command::new("python3").args(["-m", "venv"]).arg(&dir),
        )?;
    }
    let reqs = cmd::root().join("xtask/train/requirements.txt");
    if reqs.is_file() {
        cmd::run(
            "pip install",
            Command::new(dir.join("bin/python3"))
                .args(["-m", "pip", "install", "--quiet", "-r"])
                .arg(&reqs),
        )?;
    } else {
        eprintln!(
            "xtask: setup: {} not found; the venv has no extra packages",
            reqs.display()
        );
    }
    eprintln!(
        "xtask: setup: `cargo xtask train-tiny` and `ref-check` now use {}",
        dir.display()
    );
    Ok(())
}
