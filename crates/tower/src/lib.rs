//! Rate limiting inside the app: a tower `Layer` that applies a sluice policy to the
//! requests of any HTTP service (axum, hyper, tonic), with the login-form protections.
//!
//! ```
//! use std::sync::Arc;
//! use axum::{Router, body::Body, routing::post};
//! use http::Request;
//! use sluice_limiter::{Limiter, MemoryStore, Policy};
//! use sluice_tower::{Key, RateLimitLayer};
//! use tower::ServiceExt;
//!
//! # #[cfg(feature = "axum")] // a form field read from axum's `Body`
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let limiter = Limiter::builder(MemoryStore::new())
//!     .policy(Policy::new("login", "user:2/m").unwrap())
//!     .build()
//!     .unwrap();
//! let layer = RateLimitLayer::builder(Arc::new(limiter), "login")
//!     .selector("user", Key::form_field("username")) // hashed before it is stored
//!     .build()
//!     .unwrap();
//! let app = Router::new()
//!     .route("/login", post(|| async { "welcome" }))
//!     .layer(layer);
//!
//! for expected in [200, 200, 429] {
//!     let request = Request::post("/login")
//!         .header("content-type", "application/x-www-form-urlencoded")
//!         .body(Body::from("username=alice&password=hunter2"))
//!         .unwrap();
//!     let response = app.clone().oneshot(request).await.unwrap();
//!     assert_eq!(response.status(), expected);
//! }
//! # });
//! ```
//!
//! The pieces: [`Key`]s say where each selector's value comes from (client IP done right
//! by [`ClientIpResolver`], headers, routes, users, hashed form and JSON fields); filters
//! pick methods, paths and networks; [`Outcomes`] counts only some responses (failed
//! logins); [`Headers`] switches the header fields; hooks render denials and feed an audit
//! log; a [`Challenge`](challenge::Challenge) such as [`ProofOfWork`] lets a refused client
//! prove good faith. (To limit any block of code, see `Limiter::run` in `sluice-limiter`.)
//!
//! **How many at once, and costs known afterwards.** A policy whose rule has a concurrency
//! leaf (`user:3 concurrent lease=30s`) makes the layer take a lease (`Limiter::acquire`)
//! instead of checking: the lease lives in the [`ResponseBody`] and is released when the
//! body ends or is dropped, so a streaming download keeps its slot while it streams. A
//! refusal is 429 with reason `occupied` and a `Retry-After` that is a bound (when the
//! earliest lease expires; a holder that finishes frees its slot sooner). With
//! [`RateLimitLayerBuilder::reserve`] the layer reserves instead: each request is admitted
//! on an estimate and settled at the actual cost its response reports ([`Reserve`],
//! [`ActualCost`]).
//!
//! ```
//! use std::sync::Arc;
//! use axum::{Router, body::Body, routing::get};
//! use http::Request;
//! use http_body_util::BodyExt;
//! use sluice_limiter::{Limiter, MemoryStore, Policy};
//! use sluice_tower::{Key, RateLimitLayer};
//! use tower::ServiceExt;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let limiter = Limiter::builder(MemoryStore::new())
//!     .policy(Policy::new("exports", "user:1 concurrent lease=10m").unwrap())
//!     .build()
//!     .unwrap();
//! let layer = RateLimitLayer::builder(Arc::new(limiter), "exports")
//!     .selector("user", Key::header(http::HeaderName::from_static("x-user")))
//!     .build()
//!     .unwrap();
//! let app = Router::new()
//!     .route("/export", get(|| async { "a large file, streamed" }))
//!     .layer(layer);
//! let export = || Request::get("/export").header("x-user", "alice").body(Body::empty()).unwrap();
//!
//! let first = app.clone().oneshot(export()).await.unwrap();
//! assert_eq!(first.status(), 200); // its body holds the slot
//! let second = app.clone().oneshot(export()).await.unwrap();
//! assert_eq!(second.status(), 429);
//! assert_eq!(second.headers()["retry-after"], "600"); // at the latest
//! first.into_body().collect().await.unwrap(); // the body is sent: the slot is free
//! assert_eq!(app.oneshot(export()).await.unwrap().status(), 200);
//! # });
//! ```

#![forbid(unsafe_code)]

// The README's examples compile as doc tests (axum apps: with the `axum` feature).
#[cfg(all(doctest, feature = "axum"))]
#[doc = include_str!("../README.md")]
mod readme {}

mod base64;
pub mod challenge;
mod denied;
mod error;
mod filter;
mod grpc;
mod headers;
mod key;
mod outcome;
mod rate_limit;
mod reserve;

#[cfg(feature = "pow")]
pub use challenge::ProofOfWork;
pub use denied::{Denied, Reason, problem, refusal};
pub use error::Error;
pub use headers::{
    Headers, RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING,
    X_RATELIMIT_RESET, fields as header_fields,
};
pub use key::{ClientIp, ClientIpResolver, ForwardedHeader, Key, PeerAddr, hashed};
pub use outcome::Outcomes;
#[cfg(feature = "axum")]
pub use rate_limit::Axum;
pub use rate_limit::{
    BodyMode, LayerBody, LayerStats, RateLimit, RateLimitLayer, RateLimitLayerBuilder,
    ResponseBody, ResponseFuture, WhenMissing, Wrapped,
};
pub use reserve::{ActualCost, Reserve};
