//! Routes beside the policy API: envoyproxy/ratelimit's `POST /json`, Prometheus
//! `GET /metrics`, liveness `GET /live` and readiness `GET /ready` (503 until every listener
//! is bound and the config is loaded, and again while shutting down).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::service::Service;

/// The routes over `service`, to merge into the main router.
pub(super) fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/json", post(crate::envoy::json::handler))
        .route("/metrics", get(metrics))
        .route("/live", get(|| async { "ok\n" }))
        .route("/ready", get(ready))
        .with_state(service)
}

async fn metrics(State(service): State<Arc<Service>>) -> Response {
    let memory = service.limiter().store().as_memory().map(|m| m.stats());
    let now = service.limiter().clock().now();
    let mut body = service
        .metrics()
        .render(service.limiter_stats(), memory, now);
    let now = service.limiter().clock().now();
    service.heavy_hitters().render_metrics(now, &mut body);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn ready(State(service): State<Arc<Service>>) -> Response {
    if service.is_ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}
