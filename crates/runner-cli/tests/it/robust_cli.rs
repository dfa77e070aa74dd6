//! The binary under bad input and Ctrl-C: conflicting and out-of-range
//! options, non-UTF-8 input, prompts at the context length and `-n 0` each
//! give exit 2 with a message naming the flag and the fix, or a defined
//! result; SIGINT in prefill or decode stops `generate` with exit 130 and the
//! statistics, and cancels only the current turn of an interactive `chat`.

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};

use runner::testing::{Arch, Fixture};

use crate::common;
use common::{BIN, ENDLESS, check_with_stdin, fixture, generate_args};

#[test]
fn conflicting_and_out_of_range_options_exit_2_naming_the_fix() {
    let dir = fixture(&Fixture::new(Arch::Qwen3));
    let d = dir.path();
    let draft = d.to_str().unwrap();
    for (rest, needles) in [
        (
            &["--temperature", "0", "--top-p", "0.9"][..],
            &["--top-p has no effect with --temperature 0", "drop --top-p"][..],
        ),
        (
            &["--temperature", "0", "--top-k", "5"],
            &["--top-k", "temperature above 0"],
        ),
        (
            &["--speculative", "draft-model"],
            &["--speculative draft-model needs --draft-model DIR"],
        ),
        (
            &["--speculative", "mtp", "--draft-model", draft],
            &["--draft-model is not used with --speculative mtp"],
        ),
        (
            &["--speculative", "off", "--draft-model", draft],
            &["--speculative off", "drop --draft-model"],
        ),
        (&["-n", "-1"], &["'-1'", "--max-tokens"]),
        (&["--top-k", "-3"], &["'-3'", "--top-k"]),
        (&["--repeat-last-n", "-5"], &["--repeat-last-n"]),
        (&["--seed", "-1"], &["--seed"]),
        (&["--temperature", "NaN"], &["temperature", "finite"]),
        (&["--temperature", "inf"], &["temperature"]),
        (&["--min-p", "1"], &["min_p", "[0, 1)"]),
        (&["--repeat-penalty", "-1"], &["repeat_penalty"]),
    ] {
        let mut args = generate_args(d, &["--prompt", "hi"]);
        args.extend_from_slice(rest);
        let out = check_with_stdin(&args, b"", 2, needles);
        assert!(out.stdout.is_empty(), "{rest:?}: nothing generated");
    }
    check_with_stdin(
        &[
            "chat",
            "--model",
            d.to_str().unwrap(),
            "--prefix-cache-mib",
            "18446744073709551615",
        ],
        b"",
        2,
        &["--prefix-cache-mib", "or 0 to turn the cache off"],
    );
}

#[test]
fn prompts_at_the_context_empty_and_max_tokens_zero() {
    // The fixture tokenizer is byte-level: n ASCII bytes are n tokens; context 512.
    let dir = fixture(&Fixture::new(Arch::Llama));
    let d = dir.path();
    let json = |rest: &[&str]| -> serde_json::Value {
        let mut args = generate_args(d, &["--json"]);
        args.extend_from_slice(rest);
        serde_json::from_slice(&check_with_stdin(&args, b"", 0, &[]).stdout).unwrap()
    };
    let at = "x".repeat(511);
    let v = json(&["--prompt", &at, "-n", "50"]);
    assert_eq!(v["prompt_tokens"], 511);
    assert_eq!(v["generated_tokens"], 1, "one position left: one token");
    assert_eq!(v["finish_reason"], "length");
    for len in [512, 513] {
        let p = "x".repeat(len);
        check_with_stdin(
            &generate_args(d, &["--prompt", &p]),
            b"",
            2,
            &[&format!("prompt has {len} tokens"), "context is 512"],
        );
    }
    check_with_stdin(
        &generate_args(d, &["--prompt", ""]),
        b"",
        2,
        &["prompt is empty"],
    );
    let v = json(&["--prompt", "hi", "-n", "0"]);
    assert_eq!(v["generated_tokens"], 0);
    assert_eq!(v["text"], "");
    assert_eq!(v["finish_reason"], "length");
}

#[test]
fn non_utf8_input_is_a_usage_error_naming_the_offset() {
    let dir = fixture(&Fixture::new(Arch::Qwen3));
    let d = dir.path();
    // Prompt on stdin.
    check_with_stdin(
        &generate_args(d, &["-n", "2"]),
        b"ab\xffcd",
        2,
        &["prompt on stdin is not UTF-8", "0xff at offset 2", "iconv"],
    );
    // Prompt as an argument.
    let mut args: Vec<&OsStr> = generate_args(d, &["-n", "2", "--prompt"])
        .into_iter()
        .map(OsStr::new)
        .collect();
    args.push(OsStr::from_bytes(b"a\xc3("));
    check_with_stdin(&args, b"", 2, &["invalid UTF-8"]);
    // A chat script.
    let script = d.join("turns.txt");
    std::fs::write(&script, b"hello\n\xfe\n").unwrap();
    check_with_stdin(
        &[
            "chat",
            "--model",
            d.to_str().unwrap(),
            "--script",
            script.to_str().unwrap(),
        ],
        b"",
        2,
        &["turns.txt is not UTF-8", "offset 6"],
    );
    // An interactive message: skipped, and the chat goes on.
    let out = check_with_stdin(
        &[
            "chat",
            "--model",
            d.to_str().unwrap(),
            "-n",
            "3",
            "--verbose",
        ],
        b"\x80bad\nhello\n/quit\n",
        0,
        &["message is not UTF-8", "message skipped", "turn 1: prompt"],
    );
    assert!(!out.stdout.is_empty(), "the valid message got a reply");
}

/// Streams a child's stderr lines and stdout byte counts to channels, so the
/// test waits on events (never on time).
struct Watched {
    child: Child,
    _dog: common::Watchdog,
    stderr: Receiver<String>,
    stdout: Receiver<Vec<u8>>,
}

impl Watched {
    fn spawn(args: &[&str]) -> Watched {
        let mut child = Command::new(BIN)
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (etx, stderr) = channel();
        let err = BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            for line in err.lines() {
                if etx.send(line.unwrap()).is_err() {
                    break;
                }
            }
        });
        let (otx, stdout) = channel();
        let mut out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = out.read(&mut buf) {
                if otx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Watched {
            _dog: common::Watchdog::new(&child),
            child,
            stderr,
            stdout,
        }
    }

    /// Waits for a stderr line containing `needle`; returns it.
    fn stderr_line(&self, needle: &str) -> String {
        loop {
            let line = self
                .stderr
                .recv()
                .unwrap_or_else(|_| panic!("the child exited before printing `{needle}`"));
            if line.contains(needle) {
                return line;
            }
        }
    }

    /// Waits for some stdout bytes.
    fn some_stdout(&self) -> Vec<u8> {
        self.stdout
            .recv()
            .expect("the child exited before printing text")
    }

    fn interrupt(&self) {
        let ok = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    fn send(&mut self, text: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(text.as_bytes()).unwrap();
        stdin.flush().unwrap();
    }

    /// Closes stdin, waits for the exit; returns the code and the rest of stderr.
    fn finish(mut self) -> (Option<i32>, Vec<u8>, String) {
        drop(self.child.stdin.take());
        let status = self.child.wait().unwrap();
        let rest: Vec<String> = self.stderr.iter().collect();
        let out: Vec<u8> = self.stdout.iter().flatten().collect();
        (status.code(), out, rest.join("\n"))
    }
}

/// A model whose context leaves room for an effectively endless reply.
fn long_context() -> tempfile::TempDir {
    fixture(&Fixture {
        context: 400_000,
        ..Fixture::new(Arch::Llama)
    })
}

#[test]
fn ctrl_c_in_prefill_exits_130_with_statistics() {
    let dir = long_context();
    let mut w = Watched::spawn(&generate_args(
        dir.path(),
        &[
            &["-n", "300000", "--json", "--speculative", "off"][..],
            &ENDLESS,
        ]
        .concat(),
    ));
    // 60,000 prompt tokens: 30 prefill chunks whose attention grows with the position.
    w.send(&"x".repeat(60_000));
    drop(w.child.stdin.take());
    w.stderr_line("generating");
    w.interrupt();
    let (code, out, err) = w.finish();
    assert_eq!(code, Some(130), "stderr: {err}");
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["finish_reason"], "cancelled");
    assert_eq!(v["prompt_tokens"], 60_000);
    assert_eq!(v["generated_tokens"], 0, "stopped inside prefill");
    assert!(
        err.contains("interrupted: prompt: 60000 tokens") && err.contains("finish: cancelled"),
        "{err}"
    );
}

#[test]
fn ctrl_c_in_decode_prints_the_text_so_far_and_statistics() {
    let dir = long_context();
    let w = Watched::spawn(&generate_args(
        dir.path(),
        &[
            &["--prompt", "go", "-n", "300000", "--speculative", "off"][..],
            &ENDLESS,
        ]
        .concat(),
    ));
    let first = w.some_stdout();
    w.interrupt();
    let (code, rest, err) = w.finish();
    assert_eq!(code, Some(130), "stderr: {err}");
    let text = [first, rest].concat();
    assert!(text.len() > 1, "the text generated so far is printed");
    let line = err
        .lines()
        .find(|l| l.starts_with("interrupted: "))
        .unwrap_or_else(|| panic!("no statistics line in {err}"));
    assert!(
        line.contains("finish: cancelled") && line.contains("tokens/s"),
        "{line}"
    );
}

#[test]
fn ctrl_c_in_interactive_chat_cancels_only_the_current_turn() {
    let dir = long_context();
    let model = dir.path().to_str().unwrap();
    let mut w =
        Watched::spawn(&[&["chat", "--model", model, "-n", "300000"][..], &ENDLESS].concat());
    for (turn, message) in [(1, "Tell me a story\n"), (2, "And then?\n")] {
        w.send(message);
        // The turn clears the flag before it logs this line: a Ctrl-C sent
        // earlier (while stdout still held the last turn's text, say) would be
        // spent at the prompt and leave this turn running for 300,000 tokens.
        w.stderr_line("generating a reply");
        w.some_stdout();
        w.interrupt();
        let line = w.stderr_line("interrupted: ");
        assert!(
            line.contains(&format!("turn {turn}: prompt")) && line.contains("finish: cancelled"),
            "{line}"
        );
        if turn == 2 {
            assert!(
                line.contains("live"),
                "turn 2 reuses the live caches: {line}"
            );
        }
    }
    w.send("/stats\n/quit\n");
    let (code, _, err) = w.finish();
    assert_eq!(code, Some(0), "the chat survives two Ctrl-Cs: {err}");
    assert!(err.contains("turn 2: prompt"), "{err}");
}
