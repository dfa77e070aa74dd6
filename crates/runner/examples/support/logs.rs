//! Logs for the benchmark examples: with `RUST_LOG` set (e.g.
//! `runner::depth=trace`, the auto controller's decisions and rounds) the
//! runner's logs go to stderr, so the rows on stdout stay clean.

/// Installs the stderr subscriber when `RUST_LOG` is set.
pub(crate) fn init_from_env() {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
    }
}
