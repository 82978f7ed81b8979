//! The response future of [`RateLimit`](super::RateLimit).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{Request, Response};
use pin_project_lite::pin_project;
use sluice_core::Decision;
use tower_service::Service;

use super::config::Config;
use super::finish;
use super::flow::{self, Step};
use super::mode::{BodyMode, LayerBody, Wrapped};

type Boxed<O, E> = Pin<Box<dyn Future<Output = Result<Response<O>, E>> + Send>>;

pin_project! {
    /// Resolves to the inner service's response, or to the layer's own answer (429, 403,
    /// 503). The hit is decided when this future is first polled. A request that needs no
    /// waiting before the inner service (the usual one) is carried without allocating; one
    /// that waits (body keys, a remote store, a wait mode, a challenge, a lease or a reservation)
    /// is boxed. `M` says which body its responses carry (see [`BodyMode`]).
    pub struct ResponseFuture<S, ReqBody, ResBody, M = Wrapped>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
        M: BodyMode,
    {
        #[pin]
        state: State<S, ReqBody, ResBody, M>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody, ResBody, M>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
        M: BodyMode,
    {
        /// Not polled yet: nothing decided.
        Start {
            config: Option<Arc<Config>>,
            inner: Option<S>,
            // Apart, so the decision reads the head where it lies.
            head: Option<Parts>,
            body: Option<ReqBody>,
        },
        /// Admitted (or passed by a filter): the inner service is answering.
        Inner {
            #[pin]
            future: S::Future,
            config: Arc<Config>,
            admitted: Option<(Option<Decision>, Option<Vec<String>>)>,
        },
        Boxed { future: Boxed<M::Body<ResBody>, S::Error> },
        Done,
    }
}

impl<S, ReqBody, ResBody, M> ResponseFuture<S, ReqBody, ResBody, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    M: BodyMode,
{
    pub(crate) fn new(config: Arc<Config>, inner: S, request: Request<ReqBody>) -> Self {
        let (head, body) = request.into_parts();
        ResponseFuture {
            state: State::Start {
                config: Some(config),
                inner: Some(inner),
                head: Some(head),
                body: Some(body),
            },
        }
    }
}

impl<S, ReqBody, ResBody, M> Future for ResponseFuture<S, ReqBody, ResBody, M>
where
    M: BodyMode,
    M::Body<ResBody>: LayerBody<ResBody> + Send + 'static,
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send,
    S::Error: 'static,
    ReqBody: http_body::Body + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    ResBody: Send + 'static,
{
    type Output = Result<Response<M::Body<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Start {
                    config,
                    inner,
                    head,
                    body,
                } => {
                    // Moved, not cloned: a clone is a write to the count every thread shares.
                    let config = config.take().expect("started once");
                    let (slow, admitted) =
                        match flow::prepare(&config, head.as_mut().expect("started once")) {
                            Step::Answer(response) => {
                                state.set(State::Done);
                                return Poll::Ready(Ok(response.map(M::Body::<ResBody>::full)));
                            }
                            Step::Slow => (true, None),
                            Step::Pass => (false, None),
                            Step::Admit { decision, kept } => (false, Some((decision, kept))),
                        };
                    let mut inner = inner.take().expect("started once");
                    let request = Request::from_parts(
                        head.take().expect("started once"),
                        body.take().expect("started once"),
                    );
                    if slow {
                        let future = Box::pin(flow::slow(config, inner, request));
                        state.set(State::Boxed { future });
                    } else {
                        state.set(State::Inner {
                            future: inner.call(request),
                            config,
                            admitted,
                        });
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
                        return Poll::Ready(Ok(response.map(M::Body::<ResBody>::inner)));
                    };
                    match finish::finish_now(config, decision, kept, response) {
                        Ok(response) => {
                            state.set(State::Done);
                            return Poll::Ready(Ok(response));
                        }
                        Err(unfinished) => {
                            let later = finish::finish_later(config.clone(), unfinished);
                            let future: Boxed<M::Body<ResBody>, S::Error> =
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

impl<S, ReqBody, ResBody, M> fmt::Debug for ResponseFuture<S, ReqBody, ResBody, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    M: BodyMode,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseFuture")
    }
}
