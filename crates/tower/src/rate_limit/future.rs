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
use super::quick::{self, Quick};

type Boxed<O, E> = Pin<Box<dyn Future<Output = Result<Response<O>, E>> + Send>>;

pin_project! {
    /// Resolves to the inner service's response, or to the layer's own answer (429, 403,
    /// 503). A hit that needs no waiting (the usual one) is decided in `call`, which then
    /// calls the inner service at once, on the instance polled ready: this future carries
    /// only the inner service's future, or the answer, without allocating. One that waits
    /// (body keys, a remote store, a wait mode, a challenge, a lease or a reservation) is
    /// decided when this future is first polled, boxed. `M` says which body its responses
    /// carry (see [`BodyMode`]).
    pub struct ResponseFuture<S, ReqBody, ResBody, M = Wrapped>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
        M: BodyMode,
    {
        #[pin]
        state: State<S, ReqBody, ResBody, M>,
    }
}

/// What an admitted response still needs once the inner service answers: the outcome count
/// and the header fields (see [`finish::finish_now`]).
type Finish = (Arc<Config>, Option<Decision>, Option<Vec<String>>);

pin_project! {
    #[project = StateProj]
    enum State<S, ReqBody, ResBody, M>
    where
        S: Service<Request<ReqBody>, Response = Response<ResBody>>,
        M: BodyMode,
    {
        /// The layer's own answer (a refusal, a filter's 403), decided in `call`.
        Answered { response: Option<Response<M::Body<ResBody>>> },
        /// Admitted (or passed by a filter): the inner service is answering.
        Inner {
            #[pin]
            future: S::Future,
            finish: Option<Finish>,
        },
        Boxed { future: Boxed<M::Body<ResBody>, S::Error> },
        Done,
    }
}

impl<S, ReqBody, ResBody, M> ResponseFuture<S, ReqBody, ResBody, M>
where
    M: BodyMode,
    M::Body<ResBody>: LayerBody<ResBody> + Send + 'static,
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: 'static,
    ReqBody: http_body::Body + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    ResBody: Send + 'static,
{
    /// `call` of [`RateLimit`](super::RateLimit): filters, keys and the decision when none of
    /// them waits, on the request's head in place (on the request itself for the layer's
    /// quickest configuration, see `quick.rs`); then the inner service, called on `ready`
    /// (the instance polled ready) at once, or the layer's answer. A hit that must wait goes
    /// to the async flow with `ready`, a clone taking its place.
    pub(crate) fn start(
        config: &Arc<Config>,
        ready: &mut S,
        mut request: Request<ReqBody>,
    ) -> Self {
        if config.quick {
            match quick::quick(config, &mut request) {
                Quick::Admit(decision) => {
                    let finish = finish::needed(config, Some(&decision), None)
                        .then(|| (config.clone(), Some(decision), None));
                    return Self::inner(ready.call(request), finish);
                }
                Quick::Pass => return Self::inner(ready.call(request), None),
                Quick::Judge(client_ip, key, checked) => {
                    let (mut head, body) = request.into_parts();
                    let step = quick::judged(config, &mut head, client_ip, &key, checked);
                    return Self::step(config, ready, step, head, body);
                }
                Quick::Slow => {
                    let (head, body) = request.into_parts();
                    return Self::step(config, ready, Step::Slow, head, body);
                }
                Quick::Prepare => {}
            }
        }
        let (mut head, body) = request.into_parts();
        let step = flow::prepare(config, &mut head);
        Self::step(config, ready, step, head, body)
    }

    /// What [`flow::prepare`]'s step says to do with the request (`head` and `body`).
    fn step(config: &Arc<Config>, ready: &mut S, step: Step, head: Parts, body: ReqBody) -> Self {
        match step {
            Step::Answer(response) => ResponseFuture {
                state: State::Answered {
                    response: Some(response.map(M::Body::<ResBody>::full)),
                },
            },
            Step::Slow => {
                let clone = ready.clone();
                let inner = std::mem::replace(ready, clone);
                let request = Request::from_parts(head, body);
                ResponseFuture {
                    state: State::Boxed {
                        future: Box::pin(flow::slow(config.clone(), inner, request)),
                    },
                }
            }
            Step::Pass => Self::inner(ready.call(Request::from_parts(head, body)), None),
            Step::Admit { decision, kept } => {
                let finish = finish::needed(config, decision.as_ref(), kept.as_deref())
                    .then(|| (config.clone(), decision, kept));
                Self::inner(ready.call(Request::from_parts(head, body)), finish)
            }
        }
    }

    /// The inner service answering; `finish` when its response needs the layer's fields.
    fn inner(future: S::Future, finish: Option<Finish>) -> Self {
        ResponseFuture {
            state: State::Inner { future, finish },
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
    ResBody: Send + 'static,
{
    type Output = Result<Response<M::Body<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Answered { response } => {
                    let response = response.take().expect("answered once");
                    state.set(State::Done);
                    return Poll::Ready(Ok(response));
                }
                StateProj::Inner { future, finish } => {
                    let response = match future.poll(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Err(error)) => {
                            state.set(State::Done);
                            return Poll::Ready(Err(error));
                        }
                        Poll::Ready(Ok(response)) => response,
                    };
                    let Some((config, decision, kept)) = finish.take() else {
                        state.set(State::Done);
                        return Poll::Ready(Ok(response.map(M::Body::<ResBody>::inner)));
                    };
                    match finish::finish_now(&config, decision, kept, response) {
                        Ok(response) => {
                            state.set(State::Done);
                            return Poll::Ready(Ok(response));
                        }
                        Err(unfinished) => {
                            let later = finish::finish_later(config, unfinished);
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
