//! The response future and body of [`RateLimit`](super::RateLimit).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

type Boxed<B, E> = Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, E>> + Send>>;

/// Resolves to the inner service's response, or to the layer's own answer (429, 403, 503).
pub struct ResponseFuture<B, E> {
    inner: Boxed<B, E>,
}

impl<B, E> ResponseFuture<B, E> {
    pub(crate) fn new<F>(future: F) -> ResponseFuture<B, E>
    where
        F: Future<Output = Result<Response<ResponseBody<B>>, E>> + Send + 'static,
    {
        ResponseFuture {
            inner: Box::pin(future),
        }
    }
}

impl<B, E> Future for ResponseFuture<B, E> {
    type Output = Result<Response<ResponseBody<B>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<B, E> fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}

pin_project! {
    /// The inner service's body, or the bytes of the layer's own answer.
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
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
}

impl<B: fmt::Debug> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Inner { body } => f.debug_tuple("Inner").field(body).finish(),
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
            KindProj::Full { bytes } => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Full { bytes } => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Full { bytes } => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}
