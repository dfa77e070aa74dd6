//! What the CLI test binaries share: the binary, fixture checkpoints, the
//! `generate` command line, and one run-and-check of the exit code and stderr.
// Each test binary compiles this module and uses a different part of it.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use runner::testing::{Fixture, write_checkpoint};

/// The `mtp-runner` binary under test.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_mtp-runner");

/// A Qwen3 checkpoint large enough (hidden 512, 12 layers) that loading or
/// quantizing it takes long enough to interrupt (seed 1).
pub(crate) fn slow_fixture() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let fx = Fixture {
        hidden: 512,
        intermediate: 1536,
        layers: 12,
        heads: 8,
        kv_heads: 4,
        head_dim: 64,
        ..Fixture::new(runner::testing::Arch::Qwen3)
    };
    write_checkpoint(dir.path(), &fx, 1).unwrap();
    dir
}

/// A temporary checkpoint of `fx` (seed 3).
pub(crate) fn fixture(fx: &Fixture) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), fx, 3).unwrap();
    dir
}

/// A bundled model folder, `models/<name>`.
pub(crate) fn bundled(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name)
}

/// `generate --model <model> rest..`.
pub(crate) fn generate_args<'a, P: AsRef<Path> + ?Sized>(
    model: &'a P,
    rest: &[&'a str],
) -> Vec<&'a str> {
    let mut v = vec!["generate", "--model", model.as_ref().to_str().unwrap()];
    v.extend_from_slice(rest);
    v
}

/// Runs the binary with `args`, `stdin` written and closed; stdout and stderr captured.
pub(crate) fn run_with_stdin<S: AsRef<OsStr>>(args: &[S], stdin: &[u8]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// Runs the binary with `args` and an empty stdin.
pub(crate) fn run<S: AsRef<OsStr>>(args: &[S]) -> Output {
    run_with_stdin(args, b"")
}

/// Runs with `args` and `stdin`, checks the exit code and that stderr mentions each of `needles`.
pub(crate) fn check_with_stdin<S: AsRef<OsStr>>(
    args: &[S],
    stdin: &[u8],
    code: i32,
    needles: &[&str],
) -> Output {
    let out = run_with_stdin(args, stdin);
    let err = String::from_utf8_lossy(&out.stderr);
    let shown: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
    assert_eq!(out.status.code(), Some(code), "{shown:?}: stderr {err}");
    for n in needles {
        assert!(
            err.contains(n),
            "{shown:?}: stderr `{err}` should mention `{n}`"
        );
    }
    out
}

/// [`check_with_stdin`] with an empty stdin.
pub(crate) fn check<S: AsRef<OsStr>>(args: &[S], code: i32, needles: &[&str]) -> Output {
    check_with_stdin(args, b"", code, needles)
}
