//! The response future and body of [`RateLimit`](super::RateLimit).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use sluice_core::Decision;
use tower_service::Service;

use super::config::Config;
use super::flow::{self, Step};

type Boxed<B, E> = Pin<Box<dyn Future<Output = Result<Response<ResponseBody<B>>, E>> + Send>>;

pin_project! {
    /// Resolves to the inner service's response, or to the layer's own answer (429, 403,
    /// 503). The hit is decided when this future is first polled. A request that needs no
    /// waiting before the inner service (the usual one) is carried without allocating; one
    /// that waits (body keys, a remote store, a wait mode, a challenge) is boxed.
    pub struct ResponseFuture<S, ReqBody, ResBody>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    {
        #[pin]
        state: State<S, ReqBody, ResBody>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody, ResBody>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    {
        /// Not polled yet: nothing decided.
        Start {
            config: Option<Arc<Config>>,
            inner: Option<S>,
            request: Option<Request<ReqBody>>,
        },
        /// Admitted (or passed by a filter): the inner service is answering.
        Inner {
            #[pin]
            future: S::Future,
            config: Arc<Config>,
            admitted: Option<(Option<Decision>, Option<Vec<String>>)>,
        },
        Boxed { future: Boxed<ResBody, S::Error> },
        Done,
    }
}

impl<S, ReqBody, ResBody> ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
    pub(crate) fn new(config: Arc<Config>, inner: S, request: Request<ReqBody>) -> Self {
        ResponseFuture {
            state: State::Start {
                config: Some(config),
                inner: Some(inner),
                request: Some(request),
            },
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send,
    S::Error: 'static,
    ReqBody: http_body::Body + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    ResBody: Send + 'static,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Start {
                    config,
                    inner,
                    request,
                } => {
                    // Moved, not cloned: a clone is a write to the count every thread shares.
                    let config = config.take().expect("started once");
                    let mut inner = inner.take().expect("started once");
                    let request = request.take().expect("started once");
                    match flow::prepare(&config, request) {
                        Step::Answer(response) => {
                            state.set(State::Done);
                            return Poll::Ready(Ok(response.map(ResponseBody::full)));
                        }
                        Step::Slow(request) => {
                            let future = Box::pin(flow::slow(config, inner, request));
                            state.set(State::Boxed { future });
                        }
                        Step::Pass(request) => state.set(State::Inner {
                            future: inner.call(request),
                            config,
                            admitted: None,
                        }),
                        Step::Admit(admitted) => state.set(State::Inner {
                            future: inner.call(admitted.request),
                            config,
                            admitted: Some((admitted.decision, admitted.kept)),
                        }),
                    }
                }
                StateProj::Inner {
                    future,
                    config,
                    admitted,
                } => {
                    let response = match future.poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Err(error)) => {
                            state.set(State::Done);
                            return Poll::Ready(Err(error));
                        }
                        Poll::Ready(Ok(response)) => response,
                    };
                    let Some((decision, kept)) = admitted.take() else {
                        state.set(State::Done);
                        return Poll::Ready(Ok(response.map(ResponseBody::inner)));
                    };
                    match flow::finish_now(config, decision, kept, response) {
                        Ok(response) => {
                            state.set(State::Done);
                            return Poll::Ready(Ok(response));
                        }
                        Err(unfinished) => {
                            let later = flow::finish_later(config.clone(), unfinished);
                            let future: Boxed<ResBody, S::Error> =
                                Box::pin(async move { Ok(later.await) });
                            state.set(State::Boxed { future });
                        }
                    }
                }
                StateProj::Boxed { future } => {
                    let output = std::task::ready!(future.as_mut().poll(cx));
                    state.set(State::Done);
                    return Poll::Ready(output);
                }
                StateProj::Done => panic!("ResponseFuture polled after it completed"),
            }
        }
    }
}

impl<S, ReqBody, ResBody> fmt::Debug for ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
{
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

impl<B: From<Bytes>> ResponseBody<B> {
    /// The body as the inner service's own type: its body untouched, or the layer's answer
    /// converted with `From<Bytes>`. For servers that want the inner type back, such as
    /// `axum::serve` (`response.map(ResponseBody::into_body)` on a layer wrapped around a
    /// `Router`): unlike `axum::body::Body::new`, this boxes nothing.
    pub fn into_body(self) -> B {
        match self.kind {
            Kind::Inner { body } => body,
            Kind::Full { bytes } => B::from(bytes.unwrap_or_default()),
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
