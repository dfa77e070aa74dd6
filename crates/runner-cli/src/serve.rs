//! `mtp-runner serve`: an OpenAI-compatible HTTP server (axum on tokio).
//!
//! One model and one engine thread ([`engine`], the only user of `runner`
//! here) serve requests in arrival order from a bounded queue; the HTTP side
//! ([`routes`], [`api`]) parses, validates and tokenizes on tokio's thread and
//! talks to the engine over channels. The engine keeps one session and one
//! prefix cache for all requests, so a chat that re-sends its history reuses
//! the cached prefix (draft caches included).

mod api;
mod body;
mod conn;
mod engine;
mod error;
mod metrics;
mod routes;

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::args::ServeArgs;
use anyhow::{Context, Result};

/// A `--host` that does not resolve, or a `--max-body-bytes` of 0, fails
/// now (a usage error), not after the load.
fn check_listening(a: &ServeArgs) -> Result<()> {
    if a.max_body_bytes == 0 {
        return Err(crate::Usage(
            "--max-body-bytes 0 would refuse every POST with 413: pass 1 or more (default \
             4194304)"
                .into(),
        )
        .into());
    }
    match std::net::ToSocketAddrs::to_socket_addrs(&(a.host.as_str(), a.port)) {
        Ok(_) => Ok(()),
        Err(e) => Err(crate::Usage(format!(
            "--host {}: {e}; pass an address of this machine (127.0.0.1, 0.0.0.0, ::1) or a \
             name that resolves to one",
            a.host
        ))
        .into()),
    }
}

/// Runs `serve` until SIGINT or SIGTERM.
#[allow(clippy::print_stderr)]
pub(crate) fn run(a: ServeArgs) -> Result<u8> {
    check_listening(&a)?;
    let model_id = match &a.served_model_name {
        Some(n) => n.clone(),
        None => model_name(&a.decode.model),
    };
    let prefix_cache_bytes = crate::validate::prefix_cache_bytes(a.prefix_cache_mib)?;
    let metrics = Arc::new(metrics::Metrics::default());
    let config = engine::EngineConfig {
        decode: a.decode,
        model_id,
        queue: a.queue_size,
        prefix_cache_bytes,
        prefix_reuse: !a.no_prefix_reuse,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    // Signals are caught from here on, also while the model loads.
    let mut signals = rt.block_on(async { Signals::new() })?;
    let (engine, thread) = engine::start(config, Arc::clone(&metrics))?;
    let stopper = engine.stopper();
    let read_timeout = Duration::from_secs(a.read_timeout);
    let state = routes::AppState {
        engine,
        metrics,
        max_body: a.max_body_bytes,
        read_timeout,
        ids: Arc::new(AtomicU64::new(1)),
    };
    let grace = Duration::from_secs(a.shutdown_timeout);
    let served = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .with_context(|| {
                format!(
                    "listening on {}:{} (pass another --port, or 0 for any free one)",
                    a.host, a.port
                )
            })?;
        let addr = listener.local_addr().context("reading the bound address")?;
        let card = state.engine.card().clone();
        eprintln!(
            "mtp-runner serve: listening on http://{addr} (model {}, speculation {}, context {})",
            card.id, card.speculation, card.context_length
        );
        let (first_tx, first_rx) = tokio::sync::oneshot::channel::<()>();
        let watcher = tokio::spawn(async move {
            signals.next().await;
            eprintln!(
                "mtp-runner serve: stopping: finishing requests in flight (up to {}s; a second \
                 signal cancels them)",
                grace.as_secs()
            );
            stopper.drain();
            let _ = first_tx.send(());
            tokio::select! {
                () = signals.next() => {}
                () = tokio::time::sleep(grace) => {}
            }
            eprintln!("mtp-runner serve: cancelling the requests in flight");
            stopper.abort_all();
        });
        let app = routes::router(state);
        conn::serve(listener, app, read_timeout, async {
            let _ = first_rx.await;
        })
        .await;
        watcher.abort();
        anyhow::Ok(())
    });
    // The router (and with it every queue sender) is gone: the engine ends.
    let _ = thread.join();
    served?;
    eprintln!("mtp-runner serve: stopped");
    Ok(0)
}

/// The folder's last component, as the default model id.
fn model_name(dir: &std::path::Path) -> String {
    dir.canonicalize()
        .ok()
        .as_deref()
        .unwrap_or(dir)
        .file_name()
        .map_or_else(|| "model".to_owned(), |n| n.to_string_lossy().into_owned())
}

/// SIGINT, SIGTERM and SIGHUP (a closed terminal, as `generate` takes it)
/// as one stream of "a signal came".
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            hup: signal(SignalKind::hangup()).context("installing the SIGHUP handler")?,
        })
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
            _ = self.hup.recv() => {}
        }
    }
}
