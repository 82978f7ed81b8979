//! The sluice service: Envoy's rate limit service (gRPC and `POST /json`) over
//! envoyproxy/ratelimit's YAML config, the Redis protocol (`CL.THROTTLE`), Prometheus
//! metrics, readiness, and config reload, all sharing one [`Service`].
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
//! let service = Service::new(limiter, envoy);
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

pub mod envoy;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod reload;
pub mod resp;
mod service;

pub use service::{MAX_DYNAMIC_POLICIES, Service};
