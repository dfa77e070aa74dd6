//! Writing to stdout: a reader that went away (`| head`) or a closed stdout
//! ends the work at once with [`crate::EXIT_OUTPUT_CLOSED`]; any other write
//! failure is a runtime error worded as a write.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// stdout cannot take output: its reader went away, or it was closed when
/// the process started (exit [`crate::EXIT_OUTPUT_CLOSED`]).
#[derive(Debug)]
pub(crate) struct OutputClosed(pub String);

impl std::fmt::Display for OutputClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OutputClosed {}

/// The error for a failed write to stdout: [`OutputClosed`] for a broken
/// pipe, else a runtime error naming the write.
pub(crate) fn write_error(e: std::io::Error) -> anyhow::Error {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        OutputClosed("stdout was closed by its reader (broken pipe); generation stopped".into())
            .into()
    } else {
        anyhow::Error::new(e).context("cannot write the output to stdout")
    }
}

/// Streams generated text to stdout; the first failed write sets `cancel`, so
/// generation stops at the next token instead of running to `--max-tokens`.
pub(crate) struct Stream<'a> {
    out: std::io::StdoutLock<'static>,
    cancel: &'a AtomicBool,
    error: Option<std::io::Error>,
}

impl<'a> Stream<'a> {
    /// A stream that sets `cancel` when a write fails.
    pub(crate) fn new(cancel: &'a AtomicBool) -> Stream<'a> {
        Stream {
            out: std::io::stdout().lock(),
            cancel,
            error: None,
        }
    }

    /// Writes and flushes `text`, unless an earlier write failed.
    pub(crate) fn text(&mut self, text: &str) {
        if self.error.is_some() {
            return;
        }
        if let Err(e) = self
            .out
            .write_all(text.as_bytes())
            .and_then(|()| self.out.flush())
        {
            self.error = Some(e);
            self.cancel.store(true, Ordering::SeqCst);
        }
    }

    /// The first write failure, as the error to exit with.
    pub(crate) fn failed(&mut self) -> Option<anyhow::Error> {
        self.error.take().map(write_error)
    }

    /// The locked stdout, for what follows the stream.
    pub(crate) fn out(&mut self) -> &mut std::io::StdoutLock<'static> {
        &mut self.out
    }
}

/// Fails with [`OutputClosed`] when stdout was closed at start.
///
/// A process started with stdout closed gets `/dev/null` opened read-write
/// on it by Rust's runtime (so no later `open` can take descriptor 1), and
/// every write then "succeeds". A user's `>/dev/null` opens it write-only,
/// so on Linux the two are told apart by the descriptor's access mode.
/// Elsewhere this check finds nothing.
pub(crate) fn check_stdout_open() -> anyhow::Result<()> {
    if stdout_was_closed() {
        return Err(OutputClosed(
            "stdout is closed, so nothing could be written; run with stdout open (redirect it \
             to a file, or to /dev/null to discard the output)"
                .into(),
        )
        .into());
    }
    Ok(())
}

#[cfg(target_os = "linux")]
fn stdout_was_closed() -> bool {
    let is_null = std::fs::read_link("/proc/self/fd/1").is_ok_and(|p| p == *"/dev/null");
    if !is_null {
        return false;
    }
    let Ok(info) = std::fs::read_to_string("/proc/self/fdinfo/1") else {
        return false;
    };
    // `flags:` is octal; the low two bits are the access mode (2 = O_RDWR).
    info.lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
        .is_some_and(|flags| flags & 3 == 2)
}

#[cfg(not(target_os = "linux"))]
fn stdout_was_closed() -> bool {
    false
}
