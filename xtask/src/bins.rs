//! Where xtask finds the project's binaries (a release build, or a folder of prebuilt ones) and the environment they run in.
//!
//! On a machine with cargo, the first use builds the release `mtp-runner` and
//! the runner examples once. `--bin-dir DIR` (or `$MTP_BIN_DIR`) uses the
//! prebuilt binaries in DIR instead, for the GPU machine, which has no Rust.
//! `--mlx-cuda-dir SP` (or `$MTP_MLX_CUDA_DIR`), a site-packages-like folder
//! holding `mlx/lib/libmlx.so` from the `mlx-cuda-13` wheel, puts that library
//! first in the children's `LD_LIBRARY_PATH`: the same binaries then run on
//! CUDA (see ../shared/reference/mlx-cuda.md and docs/gpu.md).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

use crate::cmd;

/// One of our binaries: the package that builds it, whether it is an example, its name.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bin {
    package: &'static str,
    example: bool,
    /// File name, in `target/release[/examples]` or in `--bin-dir`.
    pub name: &'static str,
}

/// The command-line runner.
pub(crate) const MTP_RUNNER: Bin = Bin {
    package: "runner-cli",
    example: false,
    name: "mtp-runner",
};
/// Plain vs speculative decoding per method and depth.
pub(crate) const SPEC_BENCH: Bin = Bin {
    package: "runner",
    example: true,
    name: "spec-bench",
};
/// Plain decode tokens/s.
pub(crate) const DECODE_BENCH: Bin = Bin {
    package: "runner",
    example: true,
    name: "decode-bench",
};
/// Device info, bandwidth, launch overhead, decode floor.
pub(crate) const BANDWIDTH: Bin = Bin {
    package: "runner",
    example: true,
    name: "bandwidth",
};

/// One model, one dtype: plain and MTP per depth, greedy parity, TTFT (`bench spec-scale`).
pub(crate) const SCALE_BENCH: Bin = Bin {
    package: "runner",
    example: true,
    name: "scale-bench",
};

/// Every binary the GPU bundle carries (xtask itself aside).
pub(crate) const ALL: &[Bin] = &[MTP_RUNNER, SPEC_BENCH, DECODE_BENCH, BANDWIDTH, SCALE_BENCH];

static BIN_DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
static CUDA_DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
static BUILT: OnceLock<()> = OnceLock::new();

/// Takes `--bin-dir DIR` and `--mlx-cuda-dir SP` out of `args` (they apply to
/// the whole process) and returns the rest.
pub(crate) fn take_flags(args: &[String]) -> Result<Vec<String>> {
    let (mut bin_dir, mut cuda_dir) = (
        std::env::var_os("MTP_BIN_DIR").map(PathBuf::from),
        std::env::var_os("MTP_MLX_CUDA_DIR").map(PathBuf::from),
    );
    let mut rest = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .with_context(|| format!("`{a}` needs a folder"))
        };
        match a.as_str() {
            "--bin-dir" => bin_dir = Some(val()?.into()),
            "--mlx-cuda-dir" => cuda_dir = Some(val()?.into()),
            _ => rest.push(a.clone()),
        }
    }
    if let Some(d) = &bin_dir {
        for b in ALL {
            if !d.join(b.name).is_file() {
                bail!(
                    "--bin-dir {}: no `{}` there (the folder must hold {})",
                    d.display(),
                    b.name,
                    ALL.iter().map(|b| b.name).collect::<Vec<_>>().join(", ")
                );
            }
        }
    }
    if let Some(d) = &cuda_dir
        && !d.join("mlx/lib/libmlx.so").is_file()
    {
        bail!(
            "--mlx-cuda-dir {}: no mlx/lib/libmlx.so there; point it at the folder the \
             mlx-cuda-13 wheel was unpacked into (it holds mlx/ and mlx_cuda_13.libs/)",
            d.display()
        );
    }
    let _ = BIN_DIR.set(bin_dir);
    let _ = CUDA_DIR.set(cuda_dir);
    Ok(rest)
}

/// The prebuilt folder, when one was given.
pub(crate) fn bin_dir() -> Option<PathBuf> {
    BIN_DIR.get().cloned().flatten()
}

/// Where `b` lives: in `--bin-dir`, else in `target/release` after one release build.
pub(crate) fn path(b: Bin) -> Result<PathBuf> {
    if let Some(d) = bin_dir() {
        return Ok(d.join(b.name));
    }
    build_all()?;
    let release = cmd::root().join("target/release");
    Ok(if b.example {
        release.join("examples").join(b.name)
    } else {
        release.join(b.name)
    })
}

/// One `cargo build --release` of every binary in [`ALL`] (once per process).
pub(crate) fn build_all() -> Result<()> {
    if BUILT.get().is_some() {
        return Ok(());
    }
    let mut c = cmd::cargo();
    c.args(["build", "--quiet", "--release"]);
    let mut packages: Vec<&str> = ALL.iter().map(|b| b.package).collect();
    packages.dedup();
    for p in packages {
        c.args(["-p", p]);
    }
    for b in ALL {
        c.arg(if b.example { "--example" } else { "--bin" })
            .arg(b.name);
    }
    cmd::run("release build", &mut c)?;
    let _ = BUILT.set(());
    Ok(())
}

/// Uses `target/release` as it is, without building.
pub(crate) fn assume_built() {
    let _ = BUILT.set(());
}

/// `b` with `args`, started in the workspace root with [`child_env`] applied.
pub(crate) fn command(b: Bin, args: &[String]) -> Result<Command> {
    let mut c = Command::new(path(b)?);
    c.current_dir(cmd::root()).args(args);
    child_env(&mut c);
    Ok(c)
}

/// The MLX CUDA library first in `LD_LIBRARY_PATH` when `--mlx-cuda-dir` was
/// given, and a persistent PTX cache (NVRTC compiles each kernel once, 2-5 s).
pub(crate) fn child_env(c: &mut Command) {
    if let Some(sp) = CUDA_DIR.get().cloned().flatten() {
        let mut paths = vec![sp.join("mlx/lib")];
        if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
            paths.extend(std::env::split_paths(&old));
        }
        if let Ok(joined) = std::env::join_paths(paths) {
            c.env("LD_LIBRARY_PATH", joined);
        }
    }
    if std::env::var_os("MLX_PTX_CACHE_DIR").is_none() {
        c.env("MLX_PTX_CACHE_DIR", cmd::root().join("target/ptx-cache"));
    }
}
