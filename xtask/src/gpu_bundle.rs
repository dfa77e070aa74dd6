//! `cargo xtask gpu-bundle`: everything the GPU machine needs (it has no Rust and no internet), cut into parts that each fit one device call.
//!
//! The bundle holds stripped release binaries (`mtp-runner`, the runner
//! examples, this xtask), the shared libraries they need beyond libmlx
//! (OpenBLAS and its Fortran runtime), and MLX for CUDA: from the sha256-pinned
//! `mlx-cuda-13` wheel only `mlx/lib`, `mlx/include/{cccl,mlx}` and
//! `mlx_cuda_13.libs` (what the runtime JIT needs, ../shared/reference/mlx-cuda.md
//! §1), plus the `mlx` Python bindings and `mlx-lm` for the same-weights race.
//! All of it goes into one `bundle.tar.xz`, cut into `p1 .. pN` folders of at
//! most `--part-mib` each with `gpu.sh`. The models, the CPU reference and the
//! mlx-lm scripts travel inside the bundle too (from HEAD, in `root/`), so the
//! run does not depend on the working tree that travels with each call.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::bins;
use crate::cmd;
use crate::split;

/// One pinned wheel.
struct Wheel {
    spec: &'static str,
    file: &'static str,
    sha256: &'static str,
}

const WHEELS: &[Wheel] = &[
    Wheel {
        spec: "mlx-cuda-13==0.32.4",
        file: "mlx_cuda_13-0.32.4-py3-none-manylinux_2_35_x86_64.whl",
        sha256: "94cb48fba73e5ee39467e51c35c51c691123359ca17bafd1a24cf92ad6732bee",
    },
    Wheel {
        spec: "mlx==0.32.4",
        file: "mlx-0.32.4-cp312-cp312-manylinux_2_35_x86_64.whl",
        sha256: "b517badcb8174f8937699465a0ba5b58c2daeaa9bd13d69b1e6ab13401d24a74",
    },
    Wheel {
        spec: "mlx-lm==0.32.2",
        file: "mlx_lm-0.32.2-py3-none-any.whl",
        sha256: "5c0991248cfff5872503d74f466d2532dd8cb7fb3670cb9be7a06d7305dadc04",
    },
];

/// What of the CUDA wheel travels (the rest, cute/cutlass headers, is not needed at run time).
const CUDA_KEEP: &[&str] = &[
    "mlx/lib",
    "mlx/include/cccl",
    "mlx/include/mlx",
    // The quantized matmul kernels (`qmm_*`, `cute_dequant.cuh`) include cute and cutlass.
    "mlx/include/cute",
    "mlx/include/cutlass",
    "mlx_cuda_13.libs",
];

/// Libraries our binaries need that a bare Ubuntu with torch may lack (sonames from `ldd`).
const EXTRA_LIBS: &[&str] = &["libopenblas.so.0", "libgfortran.so.5", "libquadmath.so.0"];

/// What the run reads from the repository, taken from HEAD.
const ROOT_FILES: &[&str] = &[
    "models/tiny-mtp",
    "models/tiny-draft",
    "models/tiny-hybrid-mtp",
    "models/tiny-moe-mtp",
    "xtask/assets/gpu-reference.json",
    "crates/runner/examples/mlx_lm_decode.py",
    "crates/runner/examples/mlx_lm_spec.py",
    "crates/runner/examples/mlx_lm_scale.py",
];

/// The device tool's limit on what one call carries, working tree included.
const CALL_LIMIT: u64 = 64 << 20;

const USAGE: &str = "\
usage: cargo xtask gpu-bundle [--out DIR] [--part-mib N] [--wheels DIR] [--no-build]
  --out DIR      bundle folder under the git-ignored /.gpu/ (default .gpu/bundle)
  --part-mib N   most MiB per part folder, one part per device call (default 45)
  --wheels DIR   where the pinned wheels are downloaded and kept (default .gpu/wheels)
  --no-build     use the release binaries already in target/release";

/// Builds the bundle and prints the device-call sequence.
// Long: the bundle's steps in order, each a few lines.
pub(crate) fn run(args: &[String]) -> Result<()> {
    let root = cmd::root();
    let (mut out, mut part_mib, mut wheels, mut build) = (
        root.join(".gpu/bundle"),
        45u64,
        root.join(".gpu/wheels"),
        true,
    );
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().with_context(|| format!("`{a}` needs a value"));
        match a.as_str() {
            "--out" => out = root.join(val()?),
            "--part-mib" => part_mib = val()?.parse().context("--part-mib: a whole number")?,
            "--wheels" => wheels = root.join(val()?),
            "--no-build" => build = false,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown gpu-bundle option `{other}`\n{USAGE}"),
        }
    }
    if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        bail!(
            "gpu-bundle makes x86-64 Linux binaries for the H200 machine: run it on x86-64 Linux"
        );
    }
    let rel = out
        .strip_prefix(&root)
        .context("--out must be inside the repository (the device call carries it)")?
        .to_path_buf();
    exclude_gpu_dir(&root)?;
    fetch_wheels(&wheels)?;
    if build {
        bins::build_all()?;
    } else {
        bins::assume_built();
    }
    let stage = out.join("stage");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(stage.join("bin"))?;
    std::fs::create_dir_all(stage.join("lib"))?;
    std::fs::create_dir_all(stage.join("sp"))?;
    for b in bins::ALL {
        strip(&bins::path(*b)?, &stage.join("bin").join(b.name))?;
    }
    // This very binary; /proc/self/exe stays readable even when a concurrent
    // `cargo xtask` has replaced the file on disk meanwhile.
    let me = out.join("xtask.unstripped");
    std::fs::copy("/proc/self/exe", &me).context("copying the running xtask")?;
    strip(&me, &stage.join("bin/xtask"))?;
    std::fs::remove_file(&me)?;
    copy_extra_libs(&bins::path(bins::MTP_RUNNER)?, &stage.join("lib"))?;
    unpack_wheels(&wheels, &out.join("unpacked"), &stage.join("sp"))?;
    let commit = crate::machine::commit();
    std::fs::write(stage.join("COMMIT"), format!("{commit}\n"))?;
    committed_files(&root, &stage.join("root"))?;

    let tarball = out.join("bundle.tar.xz");
    cmd::run(
        "tar.xz",
        Command::new("tar")
            .env("XZ_OPT", "-1 -T0")
            .arg("-C")
            .arg(&stage)
            .arg("-cJf")
            .arg(&tarball)
            .arg("."),
    )?;
    let bytes = std::fs::read(&tarball)?;
    let sha = split::sha256_hex(&bytes);
    let part_bytes = part_mib << 20;
    let nchunks = (bytes.len() as u64).div_ceil(part_bytes.saturating_sub(split::PART_OVERHEAD));
    let chunks: Vec<String> = (0..nchunks)
        .map(|i| format!("bundle.tar.xz.{i:02}"))
        .collect();
    let manifest = format!(
        "COMMIT={commit}\nBUNDLE_SHA256={sha}\nNCHUNKS={nchunks}\nCHUNKS=\"{}\"\n",
        chunks.join(" ")
    );
    let script = std::fs::read(root.join("xtask/assets/gpu.sh"))?;
    let dirs = split::write_parts(
        &tarball,
        &out,
        part_bytes,
        &[("gpu.sh", script), ("MANIFEST", manifest.into_bytes())],
    )?;
    assert_eq!(
        dirs.len() as u64,
        nchunks,
        "the manifest names {nchunks} chunks but {} parts were written",
        dirs.len()
    );
    std::fs::remove_file(&tarball)?;
    std::fs::remove_dir_all(&stage)?;
    report(&root, &rel, &dirs, bytes.len() as u64, &commit)
}

/// Prints the part sizes, the travelling-tree check and the exact device calls.
// Long: the printed text itself, one block per way of using the parts.
fn report(root: &Path, rel: &Path, dirs: &[PathBuf], total: u64, commit: &str) -> Result<()> {
    let tree = tree_bytes(root)?;
    let mib = |b: u64| b as f64 / f64::from(1 << 20);
    println!(
        "gpu-bundle: commit {commit}, bundle.tar.xz {:.1} MiB in {} part(s) under {}",
        mib(total),
        dirs.len(),
        rel.display()
    );
    let mut worst = 0;
    for d in dirs {
        let b = split::dir_bytes(d)?;
        worst = worst.max(b);
        println!(
            "  {}  {:.1} MiB",
            d.strip_prefix(root).unwrap_or(d).display(),
            mib(b)
        );
    }
    println!(
        "working tree that travels with every call (tracked + untracked-not-ignored): {:.1} MiB; \
         with the largest part: {:.1} MiB (device limit {:.0} MiB)",
        mib(tree),
        mib(tree + worst),
        mib(CALL_LIMIT)
    );
    if tree + split::PART_OVERHEAD >= CALL_LIMIT {
        println!(
            "WARNING: the working tree alone ({:.1} MiB) exceeds the device call's {:.0} MiB: every call \
             will be refused until the tree is smaller (the bundle carries its own models, so the \
             run needs none of models/ from the tree).",
            mib(tree),
            mib(CALL_LIMIT)
        );
    } else if tree + worst > CALL_LIMIT {
        println!(
            "WARNING: tree + part exceeds the device call's {:.0} MiB: the call will be refused. \
             Rerun with --part-mib {} or less (more calls), or make the tree smaller.",
            mib(CALL_LIMIT),
            (CALL_LIMIT - tree - split::PART_OVERHEAD) >> 20
        );
    }
    println!(
        "\ndevice calls, in order, back to back (the machine stays warm about 30 s after a call; /tmp/stage is lost when it goes cold):"
    );
    let n = dirs.len();
    for (i, d) in dirs.iter().enumerate() {
        let p = d.strip_prefix(root).unwrap_or(d).display().to_string();
        let command = if i + 1 == n {
            format!("bash {p}/gpu.sh stage && bash {p}/gpu.sh run")
        } else {
            format!("bash {p}/gpu.sh stage")
        };
        let timeout = if i + 1 == n { 600 } else { 120 };
        println!(
            "  {}. run(kind=\"nvidia-h200\", carry=[\"{p}\"], timeout_s={timeout}, command=\"{command}\")",
            i + 1
        );
    }
    println!(
        "results come back in $OUT: gpu-check.json, results-gpu.json, gpu-check.log, bench.log, nvidia-smi.txt\n\
         then here: cargo xtask bench --merge <files_at>/results-gpu.json  (adds the GPU rows, redraws docs/bench)"
    );
    if let Some(last) = dirs.last() {
        let p = last
            .strip_prefix(root)
            .unwrap_or(last)
            .display()
            .to_string();
        println!(
            "\nthe spec-scale matrix (tiny, 1.7b, 8b upscales built on the device; ours and mlx-lm, bf16 and f32) \
             in one call instead of the last one above (the same earlier calls first):\n  \
             {n}. run(kind=\"nvidia-h200\", carry=[\"{p}\"], timeout_s=600, command=\"bash {p}/gpu.sh stage && bash {p}/gpu.sh spec-scale\")\n\
             results in $OUT: results-spec-scale.json, spec-scale-rows.jsonl (every row as it came), spec-scale.log, nvidia-smi.txt\n\
             then here: cargo xtask bench --merge <files_at>/results-spec-scale.json  \
             (if the call was cut short: cargo xtask bench --merge <files_at>/spec-scale-rows.jsonl)"
        );
        println!(
            "\nor both in one call (gpu-check, then the matrix in bf16, depths 1-6 and auto, with mlx-lm plain in the time left):\n  \
             {n}. run(kind=\"nvidia-h200\", carry=[\"{p}\"], timeout_s=600, command=\"bash {p}/gpu.sh stage && bash {p}/gpu.sh check-scale\")\n\
             results in $OUT: gpu-check.json, gpu-check.log and the spec-scale files above"
        );
    }
    Ok(())
}

/// Bytes of the tracked and untracked-not-ignored files (what a device call sends).
fn tree_bytes(root: &Path) -> Result<u64> {
    let list = cmd::output(
        "git ls-files",
        Command::new("git").current_dir(root).args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ]),
    )?;
    Ok(list
        .split('\0')
        .filter(|p| !p.is_empty())
        .filter_map(|p| std::fs::symlink_metadata(root.join(p)).ok())
        .map(|m| m.len())
        .sum())
}

/// The committed (HEAD) [`ROOT_FILES`] into `dest`, the repository root `gpu.sh`
/// runs in: the run needs nothing from the working tree, whose models may be
/// absent (or too large to travel beside a part).
fn committed_files(root: &Path, dest: &Path) -> Result<()> {
    std::fs::create_dir_all(dest)?;
    let archive = dest.join("files.tar");
    cmd::run(
        "git archive",
        Command::new("git")
            .current_dir(root)
            .args(["archive", "--format=tar", "-o"])
            .arg(&archive)
            .arg("HEAD")
            .args(ROOT_FILES),
    )?;
    cmd::run(
        "untar",
        Command::new("tar")
            .arg("-C")
            .arg(dest)
            .arg("-xf")
            .arg(&archive),
    )?;
    std::fs::remove_file(&archive)?;
    Ok(())
}

/// Adds `/.gpu/` to `.git/info/exclude` (not `.gitignore`) when missing.
fn exclude_gpu_dir(root: &Path) -> Result<()> {
    // `--git-path` resolves to the common git dir in a linked worktree (whose `.git` is a file).
    let rel = cmd::output(
        "git rev-parse",
        Command::new("git")
            .current_dir(root)
            .args(["rev-parse", "--git-path", "info/exclude"]),
    )?;
    let path = root.join(rel.trim());
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    if !text.lines().any(|l| l.trim() == "/.gpu/") {
        std::fs::create_dir_all(path.parent().context("exclude path")?)?;
        std::fs::write(
            &path,
            format!(
                "{text}{}/.gpu/\n",
                if text.ends_with('\n') || text.is_empty() {
                    ""
                } else {
                    "\n"
                }
            ),
        )?;
        eprintln!("gpu-bundle: added /.gpu/ to .git/info/exclude");
    }
    Ok(())
}

/// Downloads each pinned wheel once (`pip download`) and checks its sha256.
fn fetch_wheels(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    for w in WHEELS {
        let path = dir.join(w.file);
        if path.is_file() && sha256_file(&path)? == w.sha256 {
            continue;
        }
        cmd::run(
            &format!("pip download {}", w.spec),
            Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "download",
                    "--quiet",
                    "--no-deps",
                    "--only-binary=:all:",
                ])
                .args(["--python-version", "3.12", "--implementation", "cp"])
                .args(["--platform", "manylinux_2_35_x86_64", "-d"])
                .arg(dir)
                .arg(w.spec),
        )?;
        let got = sha256_file(&path)?;
        if got != w.sha256 {
            let _ = std::fs::remove_file(&path);
            bail!(
                "{}: sha256 {got}, pinned {}; the file was removed. If PyPI really changed it, check and update the pin in xtask/src/gpu_bundle.rs",
                w.file,
                w.sha256
            );
        }
    }
    Ok(())
}

fn sha256_file(path: &Path) -> Result<String> {
    Ok(split::sha256_hex(
        &std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
    ))
}

/// The CUDA wheel's [`CUDA_KEEP`] paths and all of the Python wheels, into `sp`.
fn unpack_wheels(wheels: &Path, tmp: &Path, sp: &Path) -> Result<()> {
    let _ = std::fs::remove_dir_all(tmp);
    let unzip = |whl: &Path, to: &Path| {
        cmd::run(
            "unzip wheel",
            Command::new("python3")
                .args(["-m", "zipfile", "-e"])
                .arg(whl)
                .arg(to),
        )
    };
    unzip(&wheels.join(WHEELS[0].file), tmp)?;
    for keep in CUDA_KEEP {
        let (from, to) = (tmp.join(keep), sp.join(keep));
        std::fs::create_dir_all(to.parent().context("keep path")?)?;
        std::fs::rename(&from, &to).with_context(|| format!("the CUDA wheel has no {keep}"))?;
    }
    std::fs::remove_dir_all(tmp)?;
    for w in &WHEELS[1..] {
        unzip(&wheels.join(w.file), sp)?;
    }
    Ok(())
}

/// `strip` a copy of `from` to `to` (falls back to a plain copy without `strip`).
fn strip(from: &Path, to: &Path) -> Result<()> {
    let ok = Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(to)
        .arg(from)
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        std::fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    }
    Ok(())
}

/// Copies the [`EXTRA_LIBS`] that `ldd bin` resolves into `lib` (under their sonames).
fn copy_extra_libs(bin: &Path, lib: &Path) -> Result<()> {
    let ldd = cmd::output("ldd", Command::new("ldd").arg(bin))?;
    for line in ldd.lines() {
        let mut words = line.split_whitespace();
        let (Some(name), Some("=>"), Some(path)) = (words.next(), words.next(), words.next())
        else {
            continue;
        };
        if EXTRA_LIBS.contains(&name) {
            std::fs::copy(path, lib.join(name)).with_context(|| format!("copying {path}"))?;
        }
    }
    Ok(())
}
