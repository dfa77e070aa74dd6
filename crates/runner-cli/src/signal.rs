//! Ctrl-C: one handler for the whole process, whose effect depends on the phase.
//! SIGTERM (a supervisor, `timeout`) and SIGHUP (a closed terminal) take the
//! same handler (ctrlc's `termination` feature), so they clean up as Ctrl-C
//! does and exit 130 too.
//!
//! While a model loads (or anything else that only reads) nothing needs
//! cleaning up, and a read may block for long, so Ctrl-C ends the process at
//! once with exit 130. While generating or writing it only sets a flag that
//! the work checks (every token, every tensor), so the text so far is printed
//! and a staging folder is removed before the exit.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use anyhow::{Context, Result};

/// Ctrl-C exits at once.
const IMMEDIATE: u8 = 0;
/// Ctrl-C sets the flag.
const COOPERATIVE: u8 = 1;

static MODE: AtomicU8 = AtomicU8::new(IMMEDIATE);

/// The installed handler: its flag, and the switch between the two phases.
#[derive(Debug, Clone)]
pub(crate) struct Interrupt {
    flag: Arc<AtomicBool>,
}

impl Interrupt {
    /// Installs the handler (once per process), in the immediate mode.
    pub(crate) fn install() -> Result<Interrupt> {
        let flag = Arc::new(AtomicBool::new(false));
        let f = Arc::clone(&flag);
        ctrlc::set_handler(move || {
            if MODE.load(Ordering::SeqCst) == IMMEDIATE {
                #[allow(clippy::print_stderr)]
                {
                    eprintln!(
                        "interrupted (Ctrl-C or SIGTERM/SIGHUP) before generation started; nothing was written"
                    );
                }
                mlx_tensor::exit_now(i32::from(crate::EXIT_INTERRUPTED));
            }
            f.store(true, Ordering::SeqCst);
        })
        .context("installing the Ctrl-C handler")?;
        Ok(Interrupt { flag })
    }

    /// The flag Ctrl-C sets in the cooperative mode.
    pub(crate) fn flag(&self) -> &Arc<AtomicBool> {
        &self.flag
    }

    /// From now on Ctrl-C only sets the flag (generation, writing).
    pub(crate) fn cooperative(&self) {
        MODE.store(COOPERATIVE, Ordering::SeqCst);
    }
}
