//! The response body of [`RateLimit`](super::RateLimit): the inner service's body (with the
//! lease of a concurrency policy, held until the body ends), or the layer's own answer.

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use sluice_limiter::Lease;

pin_project! {
    /// The inner service's body, or the bytes of the layer's own answer.
    ///
    /// Under a layer whose policy has a concurrency leaf (`user:3 concurrent`), the body
    /// also carries the request's [`Lease`]: the slot stays held while the body streams, and
    /// is released when the body ends (its last frame, or an error), or when it is dropped
    /// (the client went away). A streaming download keeps its slot until it is done.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        // The lease comes first so it is dropped (released) before the inner body is.
        Held { lease: Option<Box<Lease>>, #[pin] body: B },
        Full { bytes: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B) -> ResponseBody<B> {
        ResponseBody {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn full(bytes: Bytes) -> ResponseBody<B> {
        let bytes = (!bytes.is_empty()).then_some(bytes);
        ResponseBody {
            kind: Kind::Full { bytes },
        }
    }

    /// This body, now holding `lease` until it ends or is dropped. (Boxed: the lease is
    /// several words, and the usual body without one should not grow for it.)
    pub(crate) fn holding(self, lease: Lease) -> ResponseBody<B> {
        match self.kind {
            Kind::Inner { body } | Kind::Held { body, .. } => ResponseBody {
                kind: Kind::Held {
                    lease: Some(Box::new(lease)),
                    body,
                },
            },
            // The layer's own answers hold nothing; the lease goes now.
            full @ Kind::Full { .. } => ResponseBody { kind: full },
        }
    }

    /// Whether the body still holds a concurrency lease.
    pub fn holds_lease(&self) -> bool {
        matches!(&self.kind, Kind::Held { lease: Some(_), .. })
    }
}

impl<B: From<Bytes>> ResponseBody<B> {
    /// The body as the inner service's own type: its body untouched, or the layer's answer
    /// converted with `From<Bytes>`. For servers that want the inner type back, such as
    /// `axum::serve` (`response.map(ResponseBody::into_body)` on a layer wrapped around a
    /// `Router`): unlike `axum::body::Body::new`, this boxes nothing.
    ///
    /// A concurrency lease the body holds is released here, since the inner type cannot
    /// carry it: under a concurrency policy, serve the `ResponseBody` itself (for axum,
    /// `axum::body::Body::new(body)`) so the slot is held while the body streams.
    pub fn into_body(self) -> B {
        match self.kind {
            Kind::Inner { body } => body,
            Kind::Held { lease, body } => {
                static WARNED: AtomicBool = AtomicBool::new(false);
                if lease.is_some() && !WARNED.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "ResponseBody::into_body released a concurrency lease before the body \
                         was sent; serve the ResponseBody itself to hold it while it streams"
                    );
                }
                body
            }
            Kind::Full { bytes } => B::from(bytes.unwrap_or_default()),
        }
    }
}

impl<B: fmt::Debug> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { body } => f.debug_tuple("Inner").field(body).finish(),
            Kind::Held { lease, body } => f
                .debug_struct("Held")
                .field("lease", &lease.as_ref().map(|l| l.id()))
                .field("body", body)
                .finish(),
            Kind::Full { bytes } => f.debug_tuple("Full").field(bytes).finish(),
        }
    }
}

impl<B: Body<Data = Bytes>> Body for ResponseBody<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx),
            KindProj::Held { lease, mut body } => {
                let frame = std::task::ready!(body.as_mut().poll_frame(cx));
                // Released before the last frame is handed on, so a client that has seen
                // the end of the body finds the slot free.
                if !matches!(frame, Some(Ok(_))) || body.is_end_stream() {
                    *lease = None;
                }
                Poll::Ready(frame)
            }
            KindProj::Full { bytes } => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } | Kind::Held { body, .. } => body.is_end_stream(),
            Kind::Full { bytes } => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } | Kind::Held { body, .. } => body.size_hint(),
            Kind::Full { bytes } => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}
