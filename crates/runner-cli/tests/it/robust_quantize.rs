//! `quantize` never leaves a half-written `--out`: two runs into one folder
//! (one wins, the other fails clearly), Ctrl-C in the middle, a source file
//! that cannot be opened, and a full disk (on a small tmpfs, where this
//! machine lets the test mount one) each leave either the complete folder or
//! nothing, and nothing that blocks a rerun.
// A skipped case says so on stderr.
#![allow(clippy::print_stderr)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use runner::testing::{Arch, Fixture};

use crate::common::{BIN, check, fixture};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn staging(out: &Path) -> PathBuf {
    let name = out.file_name().unwrap().to_str().unwrap();
    out.with_file_name(format!(".{name}.partial"))
}

/// The copied files of `src` that a complete output folder must hold.
fn assert_complete(src: &Path, out: &Path) {
    for f in [
        "config.json",
        "model.safetensors",
        "README.md",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(out.join(f).is_file(), "{} lacks {f}", out.display());
    }
    if src.join("generation_config.json").is_file() {
        assert!(out.join("generation_config.json").is_file());
    }
    check(&["info", "--model", s(out)], 0, &[]);
    assert!(!staging(out).exists(), "no staging folder is left");
}

/// Nothing at `out` and no staging folder: a rerun is not blocked.
fn assert_nothing(out: &Path) {
    assert!(!out.exists(), "{} should not exist", out.display());
    assert!(!staging(out).exists(), "the staging folder was removed");
}

#[test]
fn two_runs_into_one_folder_one_wins_the_other_fails_clearly() {
    let src = fixture(&Fixture::new(Arch::Qwen3));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("q");
    let spawn = || {
        Command::new(BIN)
            .args(["quantize", "--model", s(src.path()), "--out", s(&out)])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (
        crate::common::output_within(a),
        crate::common::output_within(b),
    );
    let codes = [a.status.code(), b.status.code()];
    let loser = if codes[0] == Some(0) { &b } else { &a };
    assert!(
        codes.contains(&Some(0)) && codes.contains(&Some(2)),
        "exactly one run wins: {codes:?}; stderr {} / {}",
        String::from_utf8_lossy(&a.stderr),
        String::from_utf8_lossy(&b.stderr)
    );
    let err = String::from_utf8_lossy(&loser.stderr);
    assert!(
        [
            "being written by another run",
            "not empty",
            "filled by another run"
        ]
        .iter()
        .any(|n| err.contains(n)),
        "the loser says why: {err}"
    );
    assert_complete(src.path(), &out);
    // A third run finds the folder taken.
    check(
        &["quantize", "--model", s(src.path()), "--out", s(&out)],
        2,
        &["not empty"],
    );
    // A staging folder left by a killed run is named, with the fix.
    let out2 = tmp.path().join("q2");
    std::fs::create_dir(staging(&out2)).unwrap();
    check(
        &["quantize", "--model", s(src.path()), "--out", s(&out2)],
        2,
        &["being written by another run", ".q2.partial", "delete"],
    );
}

#[test]
fn ctrl_c_term_or_hup_while_quantizing_leaves_nothing() {
    // SIGTERM (a supervisor, `timeout`) and SIGHUP (a closed terminal) are
    // handled as Ctrl-C is: before, they killed the process and left the
    // staging folder, which then refused every later run into that --out.
    for signal in ["INT", "TERM", "HUP"] {
        interrupted_quantize_leaves_nothing(signal);
    }
}

fn interrupted_quantize_leaves_nothing(signal: &str) {
    // Large enough that the tensors take a while between the claim and the commit.
    let src = crate::common::slow_fixture();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("q");
    let child = Command::new(BIN)
        .args(["quantize", "--model", s(src.path()), "--out", s(&out)])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The claim is the staging folder: interrupt once it exists.
    let t0 = Instant::now();
    while !staging(&out).exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "{signal}: no staging folder appeared"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let ok = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let o = crate::common::output_within(child);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(130), "{signal}: stderr: {err}");
    assert!(
        err.contains("interrupted") && err.contains("removed"),
        "{signal}: {err}"
    );
    assert_nothing(&out);
}

#[test]
fn a_source_file_that_cannot_be_opened_fails_before_any_work() {
    let src = fixture(&Fixture::new(Arch::Qwen3));
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("q");
    let m = s(src.path());
    // A FIFO would block the open forever; it is refused by type.
    let fifo = src.path().join("generation_config.json");
    let _ = std::fs::remove_file(&fifo);
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    check(
        &["quantize", "--model", m, "--out", s(&out)],
        2,
        &["generation_config.json", "FIFO", "not a regular file"],
    );
    assert_nothing(&out);
    // A dangling symlink is a broken download, not an absent file.
    std::fs::remove_file(&fifo).unwrap();
    std::os::unix::fs::symlink(src.path().join("gone.json"), &fifo).unwrap();
    check(
        &["quantize", "--model", m, "--out", s(&out)],
        2,
        &["generation_config.json", "dangling symlink", "gone.json"],
    );
    assert_nothing(&out);
    // A git-lfs pointer in place of the weights gets the hint.
    std::fs::remove_file(&fifo).unwrap();
    std::fs::write(
        src.path().join("model.safetensors"),
        "version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 9\n",
    )
    .unwrap();
    check(
        &["quantize", "--model", m, "--out", s(&out)],
        2,
        &["model.safetensors", "git-lfs pointer", "git lfs pull"],
    );
    assert_nothing(&out);
}

/// A tmpfs of `size` mounted at a new folder, unmounted on drop; `None`
/// (with a message) where this machine does not allow mounting.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipped: cannot mount a tmpfs here (needs root and mount rights)");
            return None;
        }
        Some(Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

#[test]
fn a_full_disk_names_the_file_being_written_and_leaves_nothing() {
    let Some(disk) = Tmpfs::mount("48k") else {
        return;
    };
    let src = fixture(&Fixture::new(Arch::Qwen3));
    let out = disk.0.path().join("q");
    let args = ["quantize", "--model", s(src.path()), "--out", s(&out)];
    for _ in 0..2 {
        // The rerun meets the same full disk, not a folder left behind.
        let o = check(&args, 1, &["cannot write", ".q.partial/"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("No space left") || err.contains("disk is probably full"),
            "{err}"
        );
        assert!(
            !err.contains("cannot read"),
            "a write failure is not worded as a read: {err}"
        );
        assert_nothing(&out);
    }
}
