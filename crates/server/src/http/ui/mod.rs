//! The live page (`GET /ui`) and the state it polls (`GET /v1/ui/state`): policies with their
//! rules and counts, the store's health, near-cache answers, heavy hitters and recent
//! refusals. Off unless [`UiAccess`] turns it on; it shows client identifiers, so on a public
//! listener it takes a token.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

mod history;

pub use history::History;

use super::access::{TokenQuery, UiAccess};
use super::problem;
use crate::service::Service;
use sluice_limiter::Store;

/// The page: one file, no external assets.
const PAGE: &str = include_str!("page.html");
/// Heavy hitters shown per policy and kind, and refusals listed.
const TOP_SHOWN: usize = 5;
const REFUSALS_SHOWN: usize = 20;

/// Samples the counters for the page's chart while the server runs.
pub(crate) use history::spawn as spawn_history;

/// The page's routes over `service`.
pub(super) fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/ui", get(page))
        .route("/v1/ui/state", get(state))
        .with_state(service)
}

/// 404 when the page is off (it does not exist), 401 without the right token.
fn refused(service: &Service) -> Response {
    match service.ui_access() {
        UiAccess::Off => problem(StatusCode::NOT_FOUND, "no such endpoint".into()),
        _ => problem(
            StatusCode::UNAUTHORIZED,
            "the live page needs its token (?token=... or Authorization: Bearer ...)".into(),
        ),
    }
}

async fn page(
    State(service): State<Arc<Service>>,
    Query(query): Query<TokenQuery>,
    headers: HeaderMap,
) -> Response {
    if !service.ui_access().allows(&query, &headers) {
        return refused(&service);
    }
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // Inline script and style only; nothing may be loaded from elsewhere.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:",
            ),
            (header::CACHE_CONTROL, "no-store"),
        ],
        PAGE,
    )
        .into_response()
}

async fn state(
    State(service): State<Arc<Service>>,
    Query(query): Query<TokenQuery>,
    headers: HeaderMap,
) -> Response {
    if !service.ui_access().allows(&query, &headers) {
        return refused(&service);
    }
    let mut response = axum::Json(snapshot(&service)).into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, "no-store".parse().expect("ASCII"));
    response
}

/// Everything the page shows, read at one moment.
pub(crate) fn snapshot(service: &Service) -> Value {
    let time = history::unix_seconds();
    let stats = service.limiter_stats();
    let counts = service.metrics().policy_counts();
    let all = service.limiter().policies();
    let policies: Vec<Value> = all
        .iter()
        .map(|policy| {
            let name = policy.name();
            let c = counts.get(name).copied().unwrap_or_default();
            json!({
                "name": name,
                "rule": policy.policy.rule.to_string(),
                "allowed": c.allowed,
                "denied": c.denied,
                "shadow_denied": c.shadow_denied,
                "errors": c.errors,
            })
        })
        .collect();
    let mut top = serde_json::Map::new();
    for policy in &all {
        if let Some(hitters) = service.top(policy.name(), TOP_SHOWN) {
            top.insert(
                policy.name().to_owned(),
                json!({ "active": hitters.active, "refused": hitters.refused }),
            );
        }
    }
    let memory = service.limiter().store().as_memory().map(|m| m.stats());
    json!({
        "time": time,
        "ready": service.is_ready(),
        "store": {
            "remote": service.limiter().store().is_remote(),
            "store_errors": stats.store_errors,
            "failed_open": stats.failed_open,
            "failed_closed": stats.failed_closed,
            "failed_local": stats.failed_local,
            "identifiers": memory.map(|m| m.identifiers),
        },
        "near_cache_hits": stats.near_cache_hits,
        "policies": policies,
        "top": top,
        "refusals": service.recent_refusals(REFUSALS_SHOWN),
        "history": service.history().samples(),
    })
}
