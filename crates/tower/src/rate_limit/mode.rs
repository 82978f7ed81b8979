//! What the layer's responses carry as their body: its own [`ResponseBody`] around the inner
//! service's body (the default, for any service), or, for axum, axum's own `Body`
//! ([`RateLimitLayer::axum_body`](super::RateLimitLayer::axum_body)): an axum app then gets
//! back the type it serves, with no `map` around the layer and no box per request under
//! `Router::layer`.

use bytes::Bytes;
use sluice_limiter::Lease;

use super::body::ResponseBody;

/// Which body a layer's responses carry: [`Wrapped`] (a [`ResponseBody`]) or, with the
/// `axum` feature, [`Axum`] (`axum::body::Body`).
pub trait BodyMode: sealed::Sealed + Send + Sync + 'static {
    /// The response body around an inner service's body `B`.
    type Body<B>;
}

/// The layer's own [`ResponseBody`] around the inner service's body: for any service.
#[derive(Debug, Clone, Copy, Default)]
pub struct Wrapped;

impl BodyMode for Wrapped {
    type Body<B> = ResponseBody<B>;
}

/// axum's own `Body`: the inner service's body as it is when it is one already (an axum
/// `Router`'s), the layer's answers as bytes, a lease carried by a body that holds it.
#[cfg(feature = "axum")]
#[derive(Debug, Clone, Copy, Default)]
pub struct Axum;

#[cfg(feature = "axum")]
impl BodyMode for Axum {
    type Body<B> = axum::body::Body;
}

/// How the layer makes a response body of its mode around an inner body `B`.
pub trait LayerBody<B>: sealed::Sealed + Sized {
    #[doc(hidden)]
    fn inner(body: B) -> Self;
    #[doc(hidden)]
    fn full(bytes: Bytes) -> Self;
    /// This body, holding `lease` until it ends or is dropped.
    #[doc(hidden)]
    fn holding(self, lease: Lease) -> Self;
}

impl<B> LayerBody<B> for ResponseBody<B> {
    fn inner(body: B) -> Self {
        ResponseBody::inner(body)
    }

    fn full(bytes: Bytes) -> Self {
        ResponseBody::full(bytes)
    }

    fn holding(self, lease: Lease) -> Self {
        ResponseBody::holding(self, lease)
    }
}

#[cfg(feature = "axum")]
impl<B> LayerBody<B> for axum::body::Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn inner(body: B) -> Self {
        // No box when `B` is axum's `Body` already (axum checks the type).
        axum::body::Body::new(body)
    }

    fn full(bytes: Bytes) -> Self {
        axum::body::Body::from(bytes)
    }

    fn holding(self, lease: Lease) -> Self {
        // Boxed once more, for leases only: the lease goes with the body that streams.
        axum::body::Body::new(ResponseBody::inner(self).holding(lease))
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Wrapped {}
    impl<B> Sealed for super::ResponseBody<B> {}
    #[cfg(feature = "axum")]
    impl Sealed for super::Axum {}
    #[cfg(feature = "axum")]
    impl Sealed for axum::body::Body {}
}
