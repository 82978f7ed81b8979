//! Accepting connections the same way on every listener: a bound on connections held at
//! once, a deadline for a new connection's first byte, a deadline for a connection that stops
//! sending, and accept errors (out of file descriptors) waited out rather than spun on.
//!
//! A connection over the bound is accepted and closed at once, so the kernel's backlog never
//! fills with clients that wait for nothing, and a flood on one listener cannot take the file
//! descriptors the others need.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// How a listener treats its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most connections held at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
    /// A new connection must send its first byte within this time (`None`: no deadline,
    /// for protocols whose clients may connect ahead of need).
    pub first_byte: Option<Duration>,
    /// A connection with a read pending and nothing received for this long is closed; so is
    /// one whose peer reads nothing of a reply for this long.
    pub idle: Duration,
}

/// Counts a listener keeps about its connections.
#[derive(Debug, Default)]
pub(crate) struct ConnectionCounts {
    pub open: AtomicU64,
    pub refused: AtomicU64,
}

/// Pause after an accept error, so a process out of file descriptors waits for one to be
/// freed instead of spinning on `accept`.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// A bound TCP listener with its limits.
pub(crate) struct Listener {
    tcp: TcpListener,
    permits: Arc<Semaphore>,
    limits: Limits,
    name: &'static str,
    counts: Arc<ConnectionCounts>,
}

impl Listener {
    pub(crate) fn new(
        tcp: TcpListener,
        limits: Limits,
        name: &'static str,
        counts: Arc<ConnectionCounts>,
    ) -> Listener {
        Listener {
            tcp,
            permits: Arc::new(Semaphore::new(limits.max_connections.max(1))),
            limits,
            name,
            counts,
        }
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.tcp
            .local_addr()
            .expect("a bound TCP listener has an address")
    }

    /// The next connection within the bound.
    pub(crate) async fn accept(&self) -> Connection {
        let mut failing = false;
        loop {
            let (stream, peer) = match self.tcp.accept().await {
                Ok(accepted) => {
                    if failing {
                        tracing::info!(listener = self.name, "accepting connections again");
                    }
                    failing = false;
                    accepted
                }
                Err(error) => {
                    if !failing {
                        tracing::warn!(listener = self.name, %error, "accept failed; waiting for it to pass");
                    }
                    failing = true;
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            };
            let Ok(permit) = self.permits.clone().try_acquire_owned() else {
                if self.counts.refused.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        listener = self.name,
                        max = self.limits.max_connections,
                        "connection limit reached; closing new connections until some end"
                    );
                }
                drop(stream);
                continue;
            };
            let _ = stream.set_nodelay(true);
            let io = Idle::new(stream, self.limits.idle);
            self.counts.open.fetch_add(1, Ordering::Relaxed);
            return Connection {
                _held: Held {
                    _permit: permit,
                    counts: self.counts.clone(),
                },
                io,
                peer,
                first_byte: self.limits.first_byte,
            };
        }
    }
}

/// What a connection holds until it ends: its place under the bound.
struct Held {
    _permit: OwnedSemaphorePermit,
    counts: Arc<ConnectionCounts>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.counts.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An accepted connection: reads and writes fail once the peer has been idle too long.
pub(crate) struct Connection {
    /// Dropped first (fields drop in order): a connection leaves the count before its
    /// socket closes, so a peer that has seen it closed never reads it still counted in
    /// the metrics. (Last, the hardening test's metrics read once found a silent connection
    /// counted after its peer had seen the close.)
    _held: Held,
    io: Idle<TcpStream>,
    peer: SocketAddr,
    first_byte: Option<Duration>,
}

impl Connection {
    /// Waits for the first byte (without consuming it) within the listener's deadline;
    /// `false` when it did not come in time.
    pub(crate) async fn first_byte(&self) -> bool {
        let Some(deadline) = self.first_byte else {
            return true;
        };
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(deadline, self.io.get_ref().peek(&mut byte)).await,
            Ok(Ok(_))
        )
    }
}

impl AsyncRead for Connection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = SocketAddr;

    fn connect_info(&self) -> SocketAddr {
        self.peer
    }
}

/// A stream that fails with `TimedOut` once it has made no progress for `idle` while a read
/// or a write waits. One timer per connection, moved only when it fires (to the last
/// progress plus `idle`), so a read or write that progresses costs a clock read, not a
/// timer update: re-arming a timer on every I/O (as tokio-io-timeout does) cost about 2 µs
/// of CPU per gRPC request, measured. A silent connection is closed `idle` after its last
/// byte; a busy one re-arms its timer once per `idle`.
pub(crate) struct Idle<S> {
    inner: S,
    idle: Duration,
    last_progress: Instant,
    timer: Pin<Box<Sleep>>,
}

impl<S> Idle<S> {
    pub(crate) fn new(inner: S, idle: Duration) -> Idle<S> {
        let now = Instant::now();
        Idle {
            inner,
            idle,
            last_progress: now,
            timer: Box::pin(tokio::time::sleep_until(now + idle)),
        }
    }

    pub(crate) fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Ready with an error once the idle time has passed since the last progress; pending
    /// (with the timer registered to wake this task) otherwise.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        while self.timer.as_mut().poll(cx).is_ready() {
            let due = self.last_progress + self.idle;
            if due <= Instant::now() {
                return Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connection idle too long",
                ));
            }
            self.timer.as_mut().reset(due);
        }
        Poll::Pending
    }

    /// Passes `ready` through, noting progress; on pending, checks the idle time.
    fn progress<T>(
        &mut self,
        cx: &mut Context<'_>,
        ready: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match ready {
            Poll::Ready(result) => {
                self.last_progress = Instant::now();
                Poll::Ready(result)
            }
            Poll::Pending => self.poll_idle(cx).map(Err),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Idle<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let ready = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.progress(cx, ready)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Idle<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let ready = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.progress(cx, ready)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let ready = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.progress(cx, ready)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let ready = Pin::new(&mut this.inner).poll_flush(cx);
        this.progress(cx, ready)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
