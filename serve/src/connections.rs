//! Accepting and serving connections, bounded so that clients who never finish a request cannot
//! hold the server's file descriptors.
//!
//! `axum::serve` waits for a request's headers, and for the next request on a kept-alive
//! connection, forever; and the token is checked only once the headers are complete. So anyone
//! who can reach a `--listen 0.0.0.0` server could open connections, send half a header (or
//! nothing) and exhaust the process's descriptors without a token. Here every connection must
//! finish its headers within [`HEADER_READ_TIMEOUT`], a response the client stops reading is
//! abandoned after [`WRITE_STALL_TIMEOUT`] (pipelined requests whose answers are never read, an
//! event stream of a page that stopped reading), and at most [`MAX_CONNECTIONS`] are open.

use std::future::Future;
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

/// How long a client has to send a request's headers. hyper starts this clock whenever it
/// waits for a request head: when the connection opens and again after each response on a
/// kept-alive connection (`proto/h1/conn.rs`, `poll_read_head`), so it also closes a connection
/// left idle between requests. It never runs while a response is written, so an event stream
/// lives as long as its page.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a response may wait for the client to take more of it. hyper has no such bound: a
/// client that pipelines requests and never reads the answers, or a page that stopped reading
/// its event stream, would hold its connection (and one of [`MAX_CONNECTIONS`]) forever. A
/// reading browser takes bytes as fast as they come; one that has not taken any for this long is
/// gone or hostile.
pub const WRITE_STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long, after an interrupt, a response being written may take to finish. An event stream
/// never finishes (it lasts as long as its page), so without this bound an open dashboard tab
/// kept the server from stopping.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The most connections served at once. An open page holds one for its event stream and a few
/// for its fetches, so this is far more than operators need, and far below the usual limit of
/// 1024 descriptors a process may hold.
pub const MAX_CONNECTIONS: usize = 256;

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting, lets each open
/// connection finish the response it is writing, and returns when all are closed.
///
/// With [`MAX_CONNECTIONS`] open the server accepts no more until one closes: the next
/// connections wait in the kernel's listen backlog, holding no descriptor of ours, rather than
/// being accepted and closed, which would refuse an operator's page whenever a burst (or an
/// attacker) fills the slots for the few seconds [`HEADER_READ_TIMEOUT`] lets each one live.
pub async fn serve_until(listener: TcpListener, app: Router, shutdown: impl Future<Output = ()>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let (stop, stopping) = watch::channel(false);
    let mut shutdown = pin!(shutdown);
    loop {
        let next = async {
            // The semaphore is never closed, so a permit always comes.
            let slot = slots.clone().acquire_owned().await.ok()?;
            Some((slot, accept(&listener).await))
        };
        let (slot, stream) = tokio::select! {
            next = next => match next {
                Some(accepted) => accepted,
                None => break,
            },
            () = &mut shutdown => break,
        };
        tokio::spawn(connection(stream, app.clone(), slot, stopping.clone()));
    }
    drop(listener);
    stop.send_replace(true);
    // Each connection holds its slot until it closes: all slots back means all closed.
    let _ = slots.acquire_many(MAX_CONNECTIONS as u32).await;
}

/// The next connection. Accepting fails for one connection (it was reset before we took it) or
/// for the process (no descriptor left); either way the listener is still good, and a pause
/// keeps the second kind from spinning while descriptors are short.
async fn accept(listener: &TcpListener) -> TcpStream {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => return stream,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                eprintln!("loopx-serve: warning: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    )
}

/// Serves one connection's requests until it closes, or until shutdown, when the response in
/// progress (if any) gets [`SHUTDOWN_GRACE`] to finish and the connection is closed. `_slot` is
/// given back on return.
async fn connection(
    stream: TcpStream,
    app: Router,
    _slot: OwnedSemaphorePermit,
    mut stopping: watch::Receiver<bool>,
) {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let stream = StallLimited::new(stream, WRITE_STALL_TIMEOUT);
    let mut conn =
        pin!(builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app)));
    tokio::select! {
        // A client that hangs up, sends garbage or runs out of time ends here: nothing to report.
        _ = conn.as_mut() => return,
        // An error means the sender is gone, which happens only after shutdown began.
        _ = stopping.wait_for(|stop| *stop) => {}
    }
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, conn).await;
}

/// A connection whose writes fail with `TimedOut` once one has waited `limit` for the client to
/// make room (see [`WRITE_STALL_TIMEOUT`]); hyper then closes it. Reads pass through: hyper's own
/// header-read timeout bounds them.
struct StallLimited {
    stream: TcpStream,
    limit: Duration,
    /// Armed when a write finds no room, disarmed by the next write that makes progress.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl StallLimited {
    fn new(stream: TcpStream, limit: Duration) -> StallLimited {
        StallLimited {
            stream,
            limit,
            stalled: None,
        }
    }

    /// `poll` of a write: progress disarms the deadline; no room arms it, and a deadline that
    /// passed turns the wait into `TimedOut`.
    fn bounded<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(Pin<&mut TcpStream>, &mut Context<'_>) -> Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match poll(Pin::new(&mut self.stream), cx) {
            Poll::Ready(result) => {
                self.stalled = None;
                Poll::Ready(result)
            }
            Poll::Pending => {
                let limit = self.limit;
                let deadline = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
                match deadline.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client stopped reading the response",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl AsyncRead for StallLimited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for StallLimited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.bounded(cx, |s, cx| s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.bounded(cx, |s, cx| s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.bounded(cx, |s, cx| s.poll_flush(cx))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.bounded(cx, |s, cx| s.poll_shutdown(cx))
    }
}
