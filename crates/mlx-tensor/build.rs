//! Finds (or fetches) the official MLX build from PyPI and compiles the cxx bridge.
//!
//! Order of lookup:
//! 1. `MLX_DIR`: a folder holding `include/mlx/mlx.h` and `lib/libmlx.*` (for
//!    example an unpacked wheel's `mlx/` folder or a local MLX install).
//! 2. The cache folder (`MLX_CACHE_DIR`, else `$XDG_CACHE_HOME/mtp-runner` or
//!    `~/.cache/mtp-runner`): the pinned wheel is downloaded there once with
//!    `python3 -m pip download`, its sha256 checked, and unpacked.
//!
//! Dependents read `DEP_MLX_LIBDIR` (for their rpath) and `DEP_MLX_OPENBLAS`
//! (the OpenBLAS to link as a direct dependency, empty when absent).

use sha2::{Digest, Sha256};
use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const MLX_VERSION: &str = "0.32.4";

/// One pinned wheel: PyPI package, platform tag, file name and sha256.
struct Wheel {
    package: &'static str,
    platform: &'static str,
    file: &'static str,
    sha256: &'static str,
}

const WHEELS: &[(&str, &str, Wheel)] = &[
    (
        "linux",
        "x86_64",
        Wheel {
            package: "mlx-cpu",
            platform: "manylinux_2_35_x86_64",
            file: "mlx_cpu-0.32.4-py3-none-manylinux_2_35_x86_64.whl",
            sha256: "0e0a24fa2ce8b6b94d2e6a90604e8813aa8e29fcb918bb2aa01cfb6d133d8cee",
        },
    ),
    (
        "linux",
        "aarch64",
        Wheel {
            package: "mlx-cpu",
            platform: "manylinux_2_35_aarch64",
            file: "mlx_cpu-0.32.4-py3-none-manylinux_2_35_aarch64.whl",
            sha256: "1289e85e64af1fd16380bf331438bfe4afe875d27afc3e0bcf35f427c488fadd",
        },
    ),
    (
        "macos",
        "aarch64",
        Wheel {
            package: "mlx-metal",
            platform: "macosx_14_0_arm64",
            file: "mlx_metal-0.32.4-py3-none-macosx_14_0_arm64.whl",
            sha256: "8019b2db622599267d66cc168b2f0dbf5af929790a6c3b3913e00eabc42a7947",
        },
    ),
];

const OPENBLAS_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/openblas-pthread",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread",
];

fn main() {
    if let Err(msg) = run() {
        // A build script's panic message is what cargo shows: make it the fix.
        panic!("\n\nmlx-tensor: {msg}\n\n");
    }
}

fn run() -> Result<(), String> {
    println!("cargo:rerun-if-env-changed=MLX_DIR");
    println!("cargo:rerun-if-env-changed=MLX_CACHE_DIR");
    println!("cargo:rerun-if-changed=cpp/shim.h");
    println!("cargo:rerun-if-changed=cpp/shim.cc");
    println!("cargo:rerun-if-changed=cpp/cpu_pool.h");
    println!("cargo:rerun-if-changed=cpp/rows_kernels.h");
    println!("cargo:rerun-if-changed=cpp/rows_dense.cc");
    println!("cargo:rerun-if-changed=cpp/rows_quant.h");
    println!("cargo:rerun-if-changed=cpp/rows_quant.cc");
    println!("cargo:rerun-if-changed=cpp/rows_decode_affine.cc");
    println!("cargo:rerun-if-changed=cpp/rows_decode_fp.cc");
    println!("cargo:rerun-if-changed=cpp/rows_gather.cc");
    println!("cargo:rerun-if-changed=cpp/attention_cpu.cc");
    println!("cargo:rerun-if-changed=cpp/fused_cpu.cc");
    println!("cargo:rerun-if-changed=cpp/cpu_primitive.h");
    println!("cargo:rerun-if-changed=cpp/kv_cpu.cc");
    println!("cargo:rerun-if-changed=cpp/kv_holds.h");
    println!("cargo:rerun-if-changed=src/ffi.rs");

    let prefix = match env::var_os("MLX_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => fetch_wheel()?,
    };
    let include = prefix.join("include");
    let lib = prefix.join("lib");
    if !include.join("mlx/mlx.h").is_file() {
        return Err(format!(
            "{} has no include/mlx/mlx.h; MLX_DIR must point at an MLX {MLX_VERSION} install \
             (the `mlx/` folder of an unpacked mlx-cpu or mlx-metal wheel)",
            prefix.display()
        ));
    }

    let is_macos = env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("macos");
    let openblas = if is_macos {
        None
    } else {
        OPENBLAS_DIRS
            .iter()
            .map(Path::new)
            .find(|d| d.join("libopenblas.so.0").is_file())
    };
    if !is_macos {
        // Installing (or removing) OpenBLAS after a build must relink: watch
        // the library when found, else the folder it would appear in.
        let watched = match openblas {
            Some(dir) => dir.join("libopenblas.so.0"),
            None => OPENBLAS_DIRS
                .iter()
                .filter_map(|d| Path::new(d).parent())
                .find(|p| p.is_dir())
                .map_or_else(PathBuf::new, Path::to_path_buf),
        };
        if !watched.as_os_str().is_empty() {
            println!("cargo:rerun-if-changed={}", watched.display());
        }
    }

    let mut build = cxx_build::bridge("src/ffi.rs");
    if openblas.is_some() {
        build.define("MTP_OPENBLAS", None);
    }
    build
        .file("cpp/shim.cc")
        .file("cpp/rows_dense.cc")
        .file("cpp/rows_quant.cc")
        .file("cpp/rows_decode_affine.cc")
        .file("cpp/rows_decode_fp.cc")
        .file("cpp/rows_gather.cc")
        .file("cpp/attention_cpu.cc")
        .file("cpp/fused_cpu.cc")
        .file("cpp/kv_cpu.cc")
        .include(&include)
        .include(env::var("CARGO_MANIFEST_DIR").unwrap() + "/..")
        .std("c++20")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        .opt_level(2)
        .compile("mlxshim");

    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    // For this crate's own tests and examples; dependents add it from DEP_MLX_LIBDIR.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    println!("cargo:libdir={}", lib.display());
    println!("cargo:include={}", include.display());

    if is_macos {
        println!("cargo:rustc-link-lib=framework=Metal");
        println!("cargo:rustc-link-lib=framework=Foundation");
        println!("cargo:rustc-link-lib=framework=Accelerate");
        return Ok(());
    }
    match openblas {
        Some(dir) => {
            // The shim calls `openblas_get_config`, so every binary that links
            // mlx-tensor gets libopenblas.so.0 as a direct NEEDED entry, listed
            // before libmlx.so's own reference BLAS: the dynamic loader then binds
            // MLX's `cblas_sgemm` to OpenBLAS (4-12x faster f32 matmul).
            println!("cargo:rustc-link-search=native={}", dir.display());
            println!("cargo:rustc-link-lib=dylib:+verbatim=libopenblas.so.0");
        }
        None => println!(
            "cargo:warning=OpenBLAS not found: MLX will use its bundled reference BLAS (f32 matmul 4-12x slower). \
             Fix: apt-get install libopenblas0-pthread"
        ),
    }
    Ok(())
}

fn cache_root() -> PathBuf {
    if let Some(dir) = env::var_os("MLX_CACHE_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(dir).join("mtp-runner");
    }
    match env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(".cache/mtp-runner"),
        None => PathBuf::from(env::var("OUT_DIR").unwrap()).join("mlx-cache"),
    }
}

/// Downloads, verifies and unpacks the pinned wheel; returns its `mlx/` folder.
fn fetch_wheel() -> Result<PathBuf, String> {
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let Some((_, _, wheel)) = WHEELS.iter().find(|(o, a, _)| *o == os && *a == arch) else {
        return Err(format!(
            "no pinned MLX {MLX_VERSION} wheel for {os}/{arch}. Set MLX_DIR to an MLX install \
             (folder with include/mlx/mlx.h and lib/libmlx.*)"
        ));
    };
    let root = cache_root().join(format!("mlx-{MLX_VERSION}"));
    let unpacked = root.join(wheel.file.trim_end_matches(".whl"));
    let prefix = unpacked.join("mlx");
    if prefix.join("include/mlx/mlx.h").is_file() {
        return Ok(prefix);
    }
    std::fs::create_dir_all(&root)
        .map_err(|e| format!("cannot create cache folder {}: {e}", root.display()))?;
    let whl = root.join(wheel.file);
    if !whl.is_file() || sha256_file(&whl)? != wheel.sha256 {
        let status = Command::new("python3")
            .args(["-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"])
            .args(["--platform", wheel.platform, "--dest"])
            .arg(&root)
            .arg(format!("{}=={MLX_VERSION}", wheel.package))
            .status()
            .map_err(|e| {
                format!(
                    "cannot run `python3 -m pip` to fetch {} ({e}). Install python3 with pip, or download \
                     {} (sha256 {}) yourself, unzip it and set MLX_DIR to its mlx/ folder",
                    wheel.package, wheel.file, wheel.sha256
                )
            })?;
        if !status.success() || !whl.is_file() {
            return Err(format!(
                "`python3 -m pip download {}=={MLX_VERSION}` failed (is PyPI reachable?). Alternatively \
                 download {} (sha256 {}), unzip it and set MLX_DIR to its mlx/ folder",
                wheel.package, wheel.file, wheel.sha256
            ));
        }
    }
    let got = sha256_file(&whl)?;
    if got != wheel.sha256 {
        let _ = std::fs::remove_file(&whl);
        return Err(format!(
            "checksum mismatch for {}: expected {}, got {got}; the file was removed, rebuild to fetch it again",
            whl.display(),
            wheel.sha256
        ));
    }
    // Unpack into a temporary folder first so an interrupted unpack is never mistaken for a complete one.
    let tmp = root.join(format!("{}.partial", wheel.file));
    let _ = std::fs::remove_dir_all(&tmp);
    let status = Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&whl)
        .arg(&tmp)
        .status()
        .map_err(|e| {
            format!(
                "cannot run `python3 -m zipfile` to unpack {}: {e}",
                whl.display()
            )
        })?;
    if !status.success() {
        return Err(format!("unpacking {} failed", whl.display()));
    }
    let _ = std::fs::remove_dir_all(&unpacked);
    std::fs::rename(&tmp, &unpacked)
        .map_err(|e| format!("cannot move {} into place: {e}", tmp.display()))?;
    Ok(prefix)
}

fn sha256_file(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    Ok(Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}
