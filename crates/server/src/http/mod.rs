//! The HTTP listener: the policy API (`/v1/...`, `/health`), leases and reservations
//! (`/v1/acquire`, `/v1/release`, `/v1/renew`, `/v1/reserve`, `/v1/settle`),
//! envoyproxy/ratelimit's `POST /json`, Prometheus `/metrics`, `/live` and `/ready`, the
//! live page (`/ui`, off by default), over HTTP/1.1 and HTTP/2.
//!
//! Slow and silent clients are cut off: a new connection must send its first byte within
//! the listener's deadline and its request headers within [`HEADER_TIMEOUT`]; a request,
//! body included, is answered within [`REQUEST_TIMEOUT`]; a body announced larger than
//! [`MAX_BODY`] is refused with 413 before it is read.

mod access;
mod api;
mod decision;
pub(crate) mod leases;
mod ops;
mod top;
mod ui;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde_json::json;

pub use access::UiAccess;
pub use decision::decision_json;
pub(crate) use ui::{History, spawn_history};

use crate::listener::Listener;
use crate::service::Service;

/// Largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;
/// A client must send a request's headers within this time (slowloris).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// A request, body included, must be read and answered within this time.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// After shutdown begins, open requests get this long to finish.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Server pings on an idle HTTP/2 connection, so a live peer keeps sending (its acks) and is
/// not taken for a silent one.
const HTTP2_PING: Duration = Duration::from_secs(20);

/// Every route the service answers over HTTP.
pub fn router(service: Arc<Service>) -> Router {
    api::router(service.clone())
        .merge(leases::router(service.clone()))
        .merge(top::router(service.clone()))
        .merge(ops::router(service.clone()))
        .merge(ui::router(service))
        .fallback(|| async { problem(StatusCode::NOT_FOUND, "no such endpoint".into()) })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::from_fn(guard))
}

/// Refuses a body announced too large at once (not after waiting for it), and answers 408
/// when a request (a slowly sent body included) takes too long.
async fn guard(request: Request, next: Next) -> Response {
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_BODY as u64) {
        let mut response = problem(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request bodies are at most {MAX_BODY} bytes"),
        );
        // The unread body would otherwise have to be drained before the next request.
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
        return response;
    }
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => problem(StatusCode::REQUEST_TIMEOUT, "request took too long".into()),
    }
}

/// An error answer: a status and one clear message, as `{"error": "..."}`.
pub(crate) fn problem(status: StatusCode, message: String) -> Response {
    (status, Json(json!({ "error": message }))).into_response()
}

/// Serves `router` on `listener` until `shutdown` completes, then finishes open requests.
pub(crate) async fn serve(
    listener: Listener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_BODY + 16 * 1024);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(HTTP2_PING)
        .keep_alive_timeout(Duration::from_secs(10))
        .max_concurrent_streams(256)
        .max_header_list_size(16 * 1024);
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let connection = tokio::select! {
            () = &mut shutdown => break,
            connection = listener.accept() => connection,
        };
        let service = TowerToHyperService::new(router.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            // Until the first byte, the connection is nobody's: hyper would wait as long as
            // the peer likes to learn which HTTP version it speaks.
            if !connection.first_byte().await {
                return;
            }
            let served = builder
                .serve_connection_with_upgrades(TokioIo::new(connection), service)
                .into_owned();
            let _ = watcher.watch(served).await;
        });
    }
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(DRAIN_TIMEOUT) => {
            tracing::warn!("open connections did not finish in time");
        }
    }
}
