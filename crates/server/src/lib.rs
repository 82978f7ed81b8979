//! The sluice service, whole: the policy config, the store URL, the HTTP policy API, Envoy's
//! rate limit service (gRPC and `POST /json`) over envoyproxy/ratelimit's YAML config, the
//! Redis protocol (`CL.THROTTLE`), Prometheus metrics, heavy hitters ([`top`]), the audit
//! trail of denials ([`audit`]), readiness and config reload, all sharing one [`Service`]. `sluice serve` is [`Server`]; a program
//! can embed the same.
//!
//! ```no_run
//! # async fn run() -> Result<(), sluice_server::ServeError> {
//! let server = sluice_server::Server::builder()
//!     .policies_file("sluice.toml")
//!     .store_url("redis://127.0.0.1:6379")
//!     .http("127.0.0.1:8080".parse().unwrap())
//!     .grpc("127.0.0.1:8081".parse().unwrap())
//!     .bind()
//!     .await?;
//! server.run(async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```
//!
//! The pieces answer on their own too: an Envoy request decided on a [`Service`]:
//!
//! ```
//! use std::sync::Arc;
//! use sluice_limiter::{Limiter, MemoryStore};
//! use sluice_server::envoy::config;
//! use sluice_server::envoy::decide::{Code, EnvoyDescriptor, EnvoyRequest};
//! use sluice_server::Service;
//!
//! let yaml = "domain: web\ndescriptors:\n  - key: ip\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n";
//! let envoy = config::parse([(std::path::Path::new("web.yaml"), yaml)]).unwrap();
//! let limiter = Arc::new(Limiter::builder(MemoryStore::new()).policies(envoy.policies.clone()).build().unwrap());
//! let service = Service::builder(limiter).envoy(envoy).build();
//! let request = EnvoyRequest {
//!     domain: "web".into(),
//!     descriptors: vec![EnvoyDescriptor { entries: vec![("ip".into(), "10.0.0.1".into())], ..Default::default() }],
//!     hits_addend: 1,
//! };
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! assert_eq!(service.should_rate_limit(&request).await.unwrap().overall_code, Code::Ok);
//! assert_eq!(service.should_rate_limit(&request).await.unwrap().overall_code, Code::OverLimit);
//! # });
//! ```

#![forbid(unsafe_code)]

// The workspace README's Rust examples compile as doc tests here, where every crate they use
// is a dependency.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
mod readme {}

pub mod audit;
mod coalesce;
pub mod config;
pub mod envoy;
mod grpc;
mod http;
mod listener;
mod metrics;
pub mod reload;
mod resp;
mod serve;
mod service;
mod store_url;
pub mod top;

pub use http::{UiAccess, decision_json};
pub use listener::Limits;
pub use metrics::Metrics;
pub use serve::{ServeError, Server, ServerBuilder};
pub use service::{Dynamic, EnvoyModes, MAX_DYNAMIC_POLICIES, Service, ServiceBuilder};
pub use store_url::open as open_store;

/// The parsers behind the listeners, for the fuzz targets in `fuzz/` only: not an API, no
/// stability promised.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::http::router as http_router;
    pub use crate::resp::command::{After, run as resp_command};
    pub use crate::resp::frame::{MAX_ARGS, MAX_BULK, Parsed, parse as resp_frame};
}
