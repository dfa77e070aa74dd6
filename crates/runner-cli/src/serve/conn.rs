//! The HTTP/1 connections: the accept loop, the header read timeout and
//! graceful shutdown.
//!
//! `axum::serve` builds its hyper connections without a timer (so no header
//! timeout: a client that sends its head a byte at a time, or never ends it,
//! holds its connection forever) and offers no way to set one; this loop is
//! `axum::serve` with it.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use axum::Router;
use axum::serve::Listener;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// Serves `app` on `listener` until `stop` resolves; then accepts no more
/// connections, closes the idle ones, and returns once the others have sent
/// their responses.
///
/// `read_timeout` bounds the wait for a request's whole head, counted from
/// the connection's start or, on a keep-alive connection, from the end of the
/// previous response (hyper's timer is one deadline, not one per read); the
/// body has its own ([`super::body`]), and generating and sending a response
/// has none. It also bounds how long a stalled client can hold up shutdown.
pub(super) async fn serve(
    mut listener: TcpListener,
    app: Router,
    read_timeout: Duration,
    stop: impl Future<Output = ()>,
) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(read_timeout)
        // A read EOF is a client that is gone, and its request is cancelled:
        // TCP cannot tell a half-close (`shutdown(SHUT_WR)` after a whole
        // request) from a close, and taking EOFs for half-closes would let a
        // client that left a non-streaming request keep the engine busy to
        // the end of its budget (seen: 1,900 tokens, 9 s, after the client
        // had closed at 0.5 s). Half-closing clients are rare; hyper's
        // default serves the rest better.
        .half_close(false);
    let graceful = GracefulShutdown::new();
    let mut stop = pin!(stop);
    loop {
        // axum's `Listener` retries failed accepts (and backs off when out
        // of file descriptors) rather than failing the server.
        let (io, peer) = tokio::select! {
            conn = Listener::accept(&mut listener) => conn,
            () = &mut stop => break,
        };
        no_delay(&io, peer);
        let conn = http.serve_connection(TokioIo::new(io), TowerToHyperService::new(app.clone()));
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            // Timeouts, resets and malformed heads end here; hyper has
            // answered what can still be answered.
            if let Err(e) = conn.await {
                tracing::debug!("connection from {peer}: {e}");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Turns Nagle's algorithm off on an accepted connection: a streamed reply is
/// one small write per token, and with Nagle on a write waits for the ACK of
/// the one before it, which a client's delayed ACK holds back (up to 40 ms
/// on Linux, 200 ms elsewhere), so tokens would arrive in bursts. A socket
/// that refuses the option is still served.
fn no_delay(io: &tokio::net::TcpStream, peer: std::net::SocketAddr) {
    if let Err(e) = io.set_nodelay(true) {
        tracing::debug!("connection from {peer}: TCP_NODELAY: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_connections_send_small_writes_at_once() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let client = tokio::net::TcpStream::connect(addr);
            let ((io, peer), _client) =
                tokio::join!(async { listener.accept().await.unwrap() }, client);
            assert!(!io.nodelay().unwrap(), "the default this turns off");
            no_delay(&io, peer);
            assert!(io.nodelay().unwrap());
        });
    }
}
