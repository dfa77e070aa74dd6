//! Shared helpers: random-weight fixtures in temporary folders.
#![allow(dead_code)]

pub(crate) mod chi2;
pub(crate) mod parity;

use std::path::Path;

use std::sync::atomic::AtomicBool;

use runner::testing::{Arch, Fixture, write_checkpoint};
use runner::{GenerateOptions, Generation, LoadOptions, LoadedModel, Session, Tokenizer};

/// The one place tests call [`Session::generate`] without a cancel flag or
/// a text callback, so a change of its signature touches this file only.
pub(crate) trait Generate {
    /// Generates from `prompt` with `opts`, never cancelled, text discarded.
    fn run(
        &mut self,
        tok: &Tokenizer,
        prompt: &[u32],
        opts: &GenerateOptions,
    ) -> runner::Result<Generation>;
}

impl Generate for Session<'_> {
    fn run(
        &mut self,
        tok: &Tokenizer,
        prompt: &[u32],
        opts: &GenerateOptions,
    ) -> runner::Result<Generation> {
        self.generate(tok, prompt, opts, &AtomicBool::new(false), |_| {})
    }
}

/// Writes `fx` into a fresh temporary folder.
pub(crate) fn write(fx: &Fixture, seed: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    write_checkpoint(dir.path(), fx, seed).expect("fixture writes");
    dir
}

/// Loads a model folder with default options.
pub(crate) fn load(dir: &Path) -> LoadedModel {
    runner::load(dir, LoadOptions::default(), |_, _| {}).expect("fixture loads")
}

/// A loaded fixture of `arch` (the folder lives as long as the returned guard).
pub(crate) fn fixture(arch: Arch) -> (tempfile::TempDir, LoadedModel) {
    let dir = write(&Fixture::new(arch), 7);
    let m = load(dir.path());
    (dir, m)
}

/// Largest absolute difference of two equal-length slices.
pub(crate) fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Runs `body` in a child process of this test binary, alone (for tests
/// that measure process-wide state, such as MLX's memory figures, which the
/// other tests of the one test binary would disturb). `test` is the test's
/// path (`module::name`); the child runs exactly that test and `body` there.
pub(crate) fn own_process(test: &str, body: impl FnOnce()) {
    const CHILD: &str = "MTP_TEST_OWN_PROCESS";
    if std::env::var_os(CHILD).is_some() {
        body();
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = std::process::Command::new(exe)
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .expect("the test binary runs again");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{test} in its own process: {}\n{stdout}\n{stderr}",
        out.status
    );
}
