//! Shared helpers: random-weight fixtures in temporary folders.
#![allow(dead_code)]

pub(crate) mod chi2;
pub(crate) mod parity;
pub(crate) mod upscale;
// One copy of the own-process runner, kept with mlx-tensor's test helpers.
#[path = "../../../mlx-tensor/tests/it/common/own_process.rs"]
mod own_process;

pub(crate) use own_process::own_process;

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

/// The lazy graph of `a` as primitive name → node count.
pub(crate) fn census(a: &mlx_tensor::Array) -> std::collections::BTreeMap<String, usize> {
    a.pending_census()
        .lines()
        .map(|l| {
            let (name, n) = l.rsplit_once(' ').expect("`Name count` lines");
            (name.to_owned(), n.parse().expect("a count"))
        })
        .collect()
}
