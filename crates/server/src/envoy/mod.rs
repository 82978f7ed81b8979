//! Envoy's rate limit service: envoyproxy/ratelimit's configuration, the decision, and the
//! two wire formats (gRPC `ShouldRateLimit`, `POST /json`).

pub mod config;
pub mod decide;
pub mod grpc;
pub mod json;
