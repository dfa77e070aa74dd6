//! The binary against a hostile but realistic user: absurd sizes and config
//! values, a 20 MB prompt, FIFOs and dangling links in the model folder,
//! Ctrl-C while loading, a reader that goes away, a closed stdout, unreadable
//! input files, `--stop ''` and a chat that fills the context. Each gives the
//! documented exit code and a message naming the thing and the fix.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use runner::testing::{Arch, Fixture};

use crate::common::{BIN, ENDLESS, check, fixture, generate_args};

/// Rewrites `key` of `dir/config.json` as the raw JSON text `value`.
fn set_config(dir: &Path, key: &str, value: &str) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    v[key] = serde_json::Value::Null;
    let text = serde_json::to_string(&v)
        .unwrap()
        .replace(&format!("\"{key}\":null"), &format!("\"{key}\":{value}"));
    std::fs::write(&p, text).unwrap();
}

/// Waits for `child` at most `limit`; kills it and fails when it hangs.
fn wait_within(mut child: std::process::Child, limit: Duration) -> std::process::Output {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("the command hung for {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn huge_size_options_and_absurd_config_values_are_errors_not_aborts() {
    let dir = fixture(&Fixture::new(Arch::Qwen3));
    let d = dir.path();
    // A window far beyond memory is fine: the history grows with the tokens seen.
    for rest in [
        &["--repeat-last-n", "18446744073709551615"][..],
        &[
            "--repeat-last-n",
            "18446744073709551615",
            "--repeat-penalty",
            "1.3",
        ],
    ] {
        let mut args = generate_args(d, &["--prompt", "hi", "-n", "4", "--temperature", "0"]);
        args.extend_from_slice(rest);
        check(&args, 0, &[]);
    }
    for (key, value, needles) in [
        (
            "num_hidden_layers",
            "1000000000",
            &["num_hidden_layers", "more than any model has"][..],
        ),
        (
            "intermediate_size",
            "2000000000",
            &["parameters", "more than any machine"],
        ),
        ("rope_theta", "1e39", &["rope_theta", "finite"]),
        ("rms_norm_eps", "-1e-6", &["rms_norm_eps", "positive"]),
        ("rms_norm_eps", "1e39", &["rms_norm_eps", "finite"]),
    ] {
        let bad = fixture(&Fixture::new(Arch::Qwen3));
        set_config(bad.path(), key, value);
        if key == "intermediate_size" {
            // 10,000 layers of a 2e9-wide MLP: 3.8e15 parameters.
            set_config(bad.path(), "num_hidden_layers", "10000");
        }
        for cmd in [
            generate_args(bad.path(), &["--prompt", "hi", "-n", "2"]),
            vec!["info", "--model", bad.path().to_str().unwrap()],
        ] {
            check(&cmd, 2, needles);
        }
    }
}

#[test]
fn a_20_mb_prompt_fails_fast_as_too_long() {
    let dir = fixture(&Fixture::new(Arch::Llama));
    let t0 = Instant::now();
    let mut child = Command::new(BIN)
        .args(generate_args(dir.path(), &["-n", "2"]))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // The binary stops reading at its limit, so this write ends in a broken pipe.
    let writer = std::thread::spawn(move || {
        let _ = std::io::Write::write_all(&mut stdin, &vec![b'x'; 20 << 20]);
    });
    let o = wait_within(child, Duration::from_secs(60));
    writer.join().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    for n in [
        "prompt too long",
        "stdin holds more than",
        "context is 512 tokens",
    ] {
        assert!(err.contains(n), "`{err}` should mention `{n}`");
    }
    // A long --prompt is refused by its length before it is tokenized.
    let long = "y".repeat(100_000);
    check(
        &generate_args(dir.path(), &["--prompt", &long]),
        2,
        &["prompt too long", "bytes of text", "context is 512 tokens"],
    );
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "refusing both took {:?}",
        t0.elapsed()
    );
}

#[test]
fn non_regular_files_in_the_model_folder_are_refused_before_opening() {
    for name in ["tokenizer.json", "config.json", "model.safetensors"] {
        let dir = fixture(&Fixture::new(Arch::Qwen3));
        let p = dir.path().join(name);
        std::fs::remove_file(&p).unwrap();
        assert!(Command::new("mkfifo").arg(&p).status().unwrap().success());
        let m = dir.path().to_str().unwrap();
        for args in [
            generate_args(dir.path(), &["--prompt", "hi", "-n", "2"]),
            vec!["info", "--model", m],
            vec!["chat", "--model", m],
        ] {
            let child = Command::new(BIN)
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let o = wait_within(child, Duration::from_secs(60));
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
            assert!(
                err.contains(name) && err.contains("FIFO"),
                "{args:?}: {err}"
            );
        }
    }
    // A dangling symlink for an optional file is an error, not an absent file.
    let dir = fixture(&Fixture::new(Arch::Qwen3));
    let p = dir.path().join("tokenizer_config.json");
    std::fs::remove_file(&p).unwrap();
    std::os::unix::fs::symlink("/nonexistent/tokenizer_config.json", &p).unwrap();
    check(
        &generate_args(dir.path(), &["--prompt", "hi"]),
        2,
        &[
            "tokenizer_config.json",
            "dangling symlink",
            "download the file again",
        ],
    );
}

#[test]
fn ctrl_c_while_loading_exits_130_at_once() {
    // Big enough that loading takes a while after the device is chosen.
    let src = crate::common::slow_fixture();
    let mut child = Command::new(BIN)
        .args(generate_args(src.path(), &["--prompt", "hi", "-n", "5"]))
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _dog = crate::common::Watchdog::new(&child);
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    // The device line comes after the handler is installed, before loading.
    loop {
        let mut line = String::new();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "exited early: {seen}"
        );
        seen.push_str(&line);
        if line.contains("device") {
            break;
        }
    }
    let ok = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    err.read_to_string(&mut seen).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "{seen}");
    assert!(
        seen.contains("interrupted (Ctrl-C or SIGTERM/SIGHUP) before generation started"),
        "{seen}"
    );
}

/// A model whose context leaves room for an effectively endless reply.
fn long_context() -> tempfile::TempDir {
    fixture(&Fixture {
        context: 400_000,
        ..Fixture::new(Arch::Llama)
    })
}

#[test]
fn a_reader_that_goes_away_or_a_closed_stdout_ends_with_141() {
    let dir = long_context();
    let args = generate_args(
        dir.path(),
        &[
            &["--prompt", "go", "-n", "300000", "--speculative", "off"][..],
            &ENDLESS,
        ]
        .concat(),
    );
    // `| head -c 10`: read ten bytes, close the pipe.
    let mut child = Command::new(BIN)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ten = [0u8; 10];
    child.stdout.take().unwrap().read_exact(&mut ten).unwrap();
    // (dropped: the pipe is closed)
    let o = wait_within(child, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(141), "{err}");
    assert!(
        !err.contains("error"),
        "a reader that left wants no message: {err}"
    );
    // stdout closed from the start: nothing can be written, so nothing is generated.
    for cmd in [
        args.clone(),
        vec!["info", "--model", dir.path().to_str().unwrap()],
    ] {
        let o = Command::new("sh")
            .arg("-c")
            .arg("exec \"$0\" \"$@\" >&-")
            .arg(BIN)
            .args(&cmd)
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(141), "{cmd:?}: {err}");
        assert!(err.contains("stdout is closed"), "{err}");
    }
    // `>/dev/null` is an open stdout: the run succeeds.
    let o = Command::new(BIN)
        .args(generate_args(dir.path(), &["--prompt", "go", "-n", "3"]))
        .stdout(Stdio::from(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/null")
                .unwrap(),
        ))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
}

#[test]
fn input_file_failures_exit_2_naming_the_file_once() {
    let dir = fixture(&Fixture::new(Arch::Qwen3));
    let m = dir.path().to_str().unwrap();
    // A --script that cannot be read: any I/O error on an input file is exit 2.
    let o = check(
        &["chat", "--model", m, "--script", m],
        2,
        &["cannot read", m, "Is a directory"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        err.matches("Is a directory").count(),
        1,
        "the cause is not repeated: {err}"
    );
    // The help's exit-code table says so.
    let o = check(&["generate", "--help"], 0, &[]);
    let help = String::from_utf8_lossy(&o.stdout);
    for n in ["unreadable", "141", "stdout closed", "dangling symlink"] {
        assert!(help.contains(n), "--help should mention `{n}`: {help}");
    }
    // `--stop ''` would stop before anything.
    check(
        &generate_args(dir.path(), &["--prompt", "hi", "--stop", ""]),
        2,
        &["--stop ''", "non-empty"],
    );
}

#[test]
fn a_chat_reply_cut_by_the_context_says_so() {
    // Context 512: a first message of 470 bytes leaves room for a few tokens.
    let dir = fixture(&Fixture::new(Arch::Qwen3));
    let script = dir.path().join("turns.txt");
    std::fs::write(&script, format!("{}\n", "a".repeat(470))).unwrap();
    let o = check(
        &[
            "chat",
            "--model",
            dir.path().to_str().unwrap(),
            "--script",
            script.to_str().unwrap(),
            "-n",
            "400",
            "--temperature",
            "0",
        ],
        0,
        &[],
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    if v["finish_reason"] == "length" {
        assert!(
            err.contains("reply cut") && err.contains("context of 512 tokens"),
            "{v} / {err}"
        );
    } else {
        panic!("the fixture's greedy reply should run into the context: {v}");
    }
}

#[test]
fn non_finite_logits_stop_with_the_likely_cause() {
    // 1e-40 is a valid temperature, but dividing the logits by it overflows f32.
    let tiny = crate::common::bundled("tiny-mtp");
    for spec in [
        &["--speculative", "off"][..],
        &["--speculative", "mtp", "--draft-tokens", "2"],
        &["--speculative", "mtp"],
    ] {
        let mut args = generate_args(&tiny, &["--prompt", "def f", "--temperature", "1e-40"]);
        args.extend_from_slice(spec);
        let o = check(
            &args,
            2,
            &[
                "non-finite logits",
                "position",
                "temperature 1e-40",
                "greedy",
            ],
        );
        assert!(o.stdout.len() <= 1, "{spec:?}: no garbage text is printed");
    }
}
