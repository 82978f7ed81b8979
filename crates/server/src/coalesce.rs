//! Write coalescing for HTTP/2 connections: the answers of many streams leave in one write.
//!
//! hyper runs each HTTP/2 request as a task of its own; a finished answer wakes the
//! connection's task, and tokio runs a task woken that way next (its LIFO slot), before the
//! other requests' tasks already queued. The connection then wrote each answer as soon as it
//! was ready: one `writev` per 1.3 answers under 8 requests in flight per connection, where a
//! single-threaded runtime (Limitador's) writes 8 answers at once. System time was half the
//! server's CPU per decision.
//!
//! [`Coalesce`] keeps what the connection writes, and the first time the connection flushes
//! it yields instead (waking itself, which puts its task behind the tasks already queued);
//! the next flush writes everything held in one system call. Nothing waits for more than
//! one turn of the worker's queue, and a connection with one request in flight pays one
//! extra poll of its task, no extra system call (a read that would block is answered from
//! tokio's readiness cache).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes held before a write goes out without waiting for a flush.
const MAX_HELD: usize = 64 * 1024;

/// A stream whose writes are held until a flush that comes after one yield.
pub(crate) struct Coalesce<S> {
    inner: S,
    held: Vec<u8>,
    /// Bytes of `held` already written.
    written: usize,
    /// The task has yielded once since it last wrote what it held.
    yielded: bool,
}

impl<S> Coalesce<S> {
    pub(crate) fn new(inner: S) -> Coalesce<S> {
        Coalesce {
            inner,
            held: Vec::new(),
            written: 0,
            yielded: false,
        }
    }

    pub(crate) fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncWrite + Unpin> Coalesce<S> {
    /// Writes everything held.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.held.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.held[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.held.clear();
        self.written = 0;
        self.yielded = false;
        Poll::Ready(Ok(()))
    }

    /// Room for `len` more bytes: drains first when the held bytes have reached the bound.
    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.held.len() >= MAX_HELD {
            ready!(self.poll_drain(cx))?;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Coalesce<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalesce<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_room(cx))?;
        this.held.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        ready!(this.poll_room(cx))?;
        let mut n = 0;
        for buf in bufs {
            this.held.extend_from_slice(buf);
            n += buf.len();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.written < this.held.len() {
            if !this.yielded {
                // Behind the tasks already queued: the answers they finish join this write.
                this.yielded = true;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            ready!(this.poll_drain(cx))?;
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    use super::*;

    /// A sink counting its write calls.
    #[derive(Default)]
    struct Sink {
        bytes: Vec<u8>,
        writes: usize,
    }

    impl AsyncWrite for Sink {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.writes += 1;
            self.bytes.extend_from_slice(buf);
            Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    struct CountWakes(AtomicUsize);

    impl Wake for CountWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn writes_held_until_the_flush_after_a_yield_leave_in_one_write() {
        let wakes = Arc::new(CountWakes(AtomicUsize::new(0)));
        let waker = wakes.clone().into();
        let mut cx = Context::from_waker(&waker);
        let mut stream = Coalesce::new(Sink::default());
        let mut s = Pin::new(&mut stream);
        assert!(s.as_mut().poll_write(&mut cx, b"one ").is_ready());
        // The first flush yields: pending, the task woken, nothing written yet.
        assert!(s.as_mut().poll_flush(&mut cx).is_pending());
        assert_eq!(wakes.0.load(Ordering::Relaxed), 1);
        assert_eq!(s.get_ref().writes, 0);
        let bufs = [io::IoSlice::new(b"two "), io::IoSlice::new(b"three")];
        assert!(s.as_mut().poll_write_vectored(&mut cx, &bufs).is_ready());
        assert!(matches!(
            s.as_mut().poll_flush(&mut cx),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(s.get_ref().writes, 1);
        assert_eq!(s.get_ref().bytes, b"one two three");
        // A flush with nothing held neither yields nor writes.
        assert!(matches!(
            s.as_mut().poll_flush(&mut cx),
            Poll::Ready(Ok(()))
        ));
        assert_eq!(wakes.0.load(Ordering::Relaxed), 1);
        // The next batch yields once again.
        assert!(s.as_mut().poll_write(&mut cx, b"!").is_ready());
        assert!(s.as_mut().poll_flush(&mut cx).is_pending());
        assert!(s.as_mut().poll_shutdown(&mut cx).is_ready());
        assert_eq!(s.get_ref().writes, 2);
        assert_eq!(s.get_ref().bytes, b"one two three!");
    }

    #[test]
    fn a_full_hold_is_written_without_waiting_for_a_flush() {
        let waker = Arc::new(CountWakes(AtomicUsize::new(0))).into();
        let mut cx = Context::from_waker(&waker);
        let mut stream = Coalesce::new(Sink::default());
        let mut s = Pin::new(&mut stream);
        let chunk = vec![7u8; MAX_HELD];
        assert!(s.as_mut().poll_write(&mut cx, &chunk).is_ready());
        assert_eq!(s.get_ref().writes, 0);
        assert!(s.as_mut().poll_write(&mut cx, b"x").is_ready());
        assert_eq!(s.get_ref().writes, 1);
        assert_eq!(s.get_ref().bytes.len(), MAX_HELD);
    }
}
