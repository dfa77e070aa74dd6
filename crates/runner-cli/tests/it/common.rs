//! What the CLI test binaries share: the binary, fixture checkpoints, the
//! `generate` command line, and one run-and-check of the exit code and stderr.
// Each test binary compiles this module and uses a different part of it.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

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

/// Flags that keep the fixture from ending a reply by itself. Its greedy
/// replies reach an end-of-turn token after a few hundred tokens, which on a
/// loaded machine can come before a test's Ctrl-C or closed pipe (a chat
/// test then waits at the prompt for an `interrupted:` line that never comes).
pub(crate) const ENDLESS: [&str; 4] = [
    "--logit-bias",
    "256=-100", // EOT
    "--logit-bias",
    "258=-100", // IM_END
];
const _: () = assert!(runner::testing::EOT == 256 && runner::testing::IM_END == 258);

/// How long one child of a test may live before its [`Watchdog`] kills it:
/// far above the slowest child on a loaded 2-core machine, far below CI's limit.
pub(crate) const CHILD_DEADLINE: Duration = Duration::from_secs(600);

/// Kills a child that outlives [`CHILD_DEADLINE`], so a hang (a lost signal,
/// a reply that never ends) fails its test with a message instead of
/// stalling the whole run until CI's limit. Disarmed when dropped: keep it
/// alive until the child has been waited for.
pub(crate) struct Watchdog {
    done: Arc<(Mutex<bool>, Condvar)>,
}

impl Watchdog {
    /// Arms a watchdog over `child`.
    #[allow(clippy::print_stderr)]
    pub(crate) fn new(child: &Child) -> Watchdog {
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let pid = child.id().to_string();
        let d = Arc::clone(&done);
        std::thread::spawn(move || {
            let (lock, cv) = &*d;
            let guard = lock.lock().unwrap();
            let (guard, _) = cv
                .wait_timeout_while(guard, CHILD_DEADLINE, |done| !*done)
                .unwrap();
            if !*guard {
                eprintln!("test watchdog: pid {pid} outlived {CHILD_DEADLINE:?}; killing it");
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
            }
        });
        Watchdog { done }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let (lock, cv) = &*self.done;
        *lock.lock().unwrap() = true;
        cv.notify_all();
    }
}

/// `child`'s output, waited for under a [`Watchdog`].
pub(crate) fn output_within(child: Child) -> Output {
    let _dog = Watchdog::new(&child);
    child.wait_with_output().unwrap()
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
    let dog = Watchdog::new(&child);
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    let out = child.wait_with_output().unwrap();
    drop(dog);
    out
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
