//! The gRPC listener: Envoy's rate limit service, with bounds against slow or greedy clients;
//! each connection's answers are coalesced into few writes ([`crate::coalesce`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::coalesce::Coalesce;
use crate::listener::{Connection, Listener};
use crate::service::Service;

/// Longest a request may take before it is answered with DEADLINE_EXCEEDED.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Server pings on an idle connection (see [`crate::Server::grpc_limits`]).
const PING: Duration = Duration::from_secs(20);

/// Serves Envoy's `RateLimitService` on `listener` until `shutdown` completes.
pub(crate) async fn serve(
    listener: Listener,
    service: Arc<Service>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), crate::ServeError> {
    // Connections reach tonic once they have sent a first byte; the wait for it happens on
    // a task of each connection's own, so one silent peer delays nobody.
    let (ready, mut incoming) = tokio::sync::mpsc::channel::<Connection>(1_024);
    let accepting = tokio::spawn(async move {
        loop {
            let connection = listener.accept().await;
            let ready = ready.clone();
            tokio::spawn(async move {
                if connection.first_byte().await {
                    let _ = ready.send(connection).await;
                }
            });
        }
    });
    let incoming = futures_util::stream::poll_fn(move |cx| {
        incoming
            .poll_recv(cx)
            .map(|c| c.map(|c| Ok::<_, std::io::Error>(Coalesce::new(c))))
    });
    let served = tonic::transport::Server::builder()
        .timeout(REQUEST_TIMEOUT)
        .max_concurrent_streams(1_024)
        .http2_max_header_list_size(16 * 1024)
        .http2_keepalive_interval(Some(PING))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(crate::envoy::grpc::server(service))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    accepting.abort();
    Ok(served?)
}

impl tonic::transport::server::Connected for Coalesce<Connection> {
    type ConnectInfo = std::net::SocketAddr;

    fn connect_info(&self) -> std::net::SocketAddr {
        tonic::transport::server::Connected::connect_info(self.get_ref())
    }
}
