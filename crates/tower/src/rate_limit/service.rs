//! `RateLimit<S>`: the service a [`RateLimitLayer`](super::RateLimitLayer) wraps around `S`.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use tower_service::Service;

use super::config::Config;
use super::future::ResponseFuture;
use super::mode::{BodyMode, LayerBody, Wrapped};

/// Limits the requests of `S`. Readiness is `S`'s own: the hit is decided in `call` (or in
/// the response future, when it must wait), never in `poll_ready`, so a limited client never
/// holds up `poll_ready` for everyone else. `M` says
/// which body its responses carry (see [`BodyMode`]).
pub struct RateLimit<S, M = Wrapped> {
    inner: S,
    config: Arc<Config>,
    mode: PhantomData<fn() -> M>,
}

impl<S: Clone, M> Clone for RateLimit<S, M> {
    fn clone(&self) -> Self {
        RateLimit {
            inner: self.inner.clone(),
            config: self.config.clone(),
            mode: PhantomData,
        }
    }
}

impl<S, M> RateLimit<S, M> {
    pub(crate) fn new(inner: S, config: Arc<Config>) -> RateLimit<S, M> {
        RateLimit {
            inner,
            config,
            mode: PhantomData,
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: fmt::Debug, M> fmt::Debug for RateLimit<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("policy", &self.config.policy)
            .finish()
    }
}

impl<S, M, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, M>
where
    M: BodyMode,
    M::Body<ResBody>: LayerBody<ResBody> + Send + 'static,
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    ReqBody: http_body::Body + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<M::Body<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, ResBody, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        ResponseFuture::start(&self.config, &mut self.inner, request)
    }
}
