//! The gRPC listener: Envoy's rate limit service, with bounds against slow or greedy clients.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tonic::transport::server::TcpIncoming;

use crate::service::Service;

/// Longest a request may take before it is answered with DEADLINE_EXCEEDED.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves Envoy's `RateLimitService` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    service: Arc<Service>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .timeout(REQUEST_TIMEOUT)
        .tcp_nodelay(true)
        .max_concurrent_streams(1_024)
        .http2_max_header_list_size(16 * 1024)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(crate::envoy::grpc::server(service))
        .serve_with_incoming_shutdown(
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            shutdown,
        )
        .await
}
