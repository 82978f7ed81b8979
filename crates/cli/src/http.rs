//! The HTTP/JSON service: `POST /v1/check`, `/v1/peek`, `/v1/reset`, `GET /v1/policies`,
//! `GET /health`. Malformed requests get 400 with a message and never reach the store.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sluice_limiter::{Error, Limiter, Store};

use crate::output::decision_json;

/// Largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;
/// Most selectors one request may carry, and the longest name or value.
pub const MAX_SELECTORS: usize = 32;
pub const MAX_SELECTOR_LEN: usize = 4096;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckRequest {
    policy: String,
    #[serde(default)]
    selectors: BTreeMap<String, String>,
    #[serde(default = "one")]
    cost: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetRequest {
    policy: String,
    #[serde(default)]
    selectors: BTreeMap<String, String>,
}

fn one() -> u64 {
    1
}

/// The router over `limiter`.
pub fn router<S: Store>(limiter: Arc<Limiter<S>>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/check", post(check::<S>))
        .route("/v1/peek", post(peek::<S>))
        .route("/v1/reset", post(reset::<S>))
        .route("/v1/policies", get(policies::<S>))
        .fallback(|| async { problem(StatusCode::NOT_FOUND, "no such endpoint".into()) })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(limiter)
}

/// Serves `router` on `listener` until `shutdown` completes, then finishes open requests.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

async fn health() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// An error answer: a status and one clear message, as `{"error": "..."}`.
struct Problem {
    status: StatusCode,
    message: String,
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "error": self.message }))).into_response()
    }
}

fn problem(status: StatusCode, message: String) -> Response {
    Problem { status, message }.into_response()
}

fn bad_request(message: String) -> Problem {
    Problem {
        status: StatusCode::BAD_REQUEST,
        message,
    }
}

fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, Problem> {
    serde_json::from_slice(body).map_err(|e| bad_request(format!("invalid request: {e}")))
}

fn check_selectors(selectors: &BTreeMap<String, String>) -> Result<(), Problem> {
    if selectors.len() > MAX_SELECTORS {
        return Err(bad_request(format!(
            "at most {MAX_SELECTORS} selectors per request"
        )));
    }
    if let Some((name, _)) = selectors
        .iter()
        .find(|(n, v)| n.len() > MAX_SELECTOR_LEN || v.len() > MAX_SELECTOR_LEN)
    {
        let name: String = name.chars().take(64).collect();
        return Err(bad_request(format!(
            "selector `{name}` is longer than {MAX_SELECTOR_LEN} bytes"
        )));
    }
    Ok(())
}

fn error_response(error: Error) -> Response {
    let status = match &error {
        Error::UnknownPolicy(_) => StatusCode::NOT_FOUND,
        Error::MissingSelector { .. } => StatusCode::BAD_REQUEST,
        e if e.is_transient() => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    problem(status, error.to_string())
}

async fn decide<S: Store>(limiter: &Limiter<S>, body: Bytes, peek: bool) -> Response {
    let request: CheckRequest = match parse(&body) {
        Ok(r) => r,
        Err(problem) => return problem.into_response(),
    };
    if let Err(problem) = check_selectors(&request.selectors) {
        return problem.into_response();
    }
    let selectors: Vec<(&str, &str)> = request
        .selectors
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let result = if peek {
        limiter
            .peek(&request.policy, &selectors, request.cost)
            .await
    } else {
        limiter
            .check(&request.policy, &selectors, request.cost)
            .await
    };
    match result {
        Ok(checked) => {
            let policy = limiter.policy(&request.policy).expect("decided on it");
            Json(decision_json(&policy, &checked)).into_response()
        }
        Err(e) => error_response(e),
    }
}

async fn check<S: Store>(State(limiter): State<Arc<Limiter<S>>>, body: Bytes) -> Response {
    decide(&limiter, body, false).await
}

async fn peek<S: Store>(State(limiter): State<Arc<Limiter<S>>>, body: Bytes) -> Response {
    decide(&limiter, body, true).await
}

async fn reset<S: Store>(State(limiter): State<Arc<Limiter<S>>>, body: Bytes) -> Response {
    let request: ResetRequest = match parse(&body) {
        Ok(r) => r,
        Err(problem) => return problem.into_response(),
    };
    if let Err(problem) = check_selectors(&request.selectors) {
        return problem.into_response();
    }
    let selectors: Vec<(&str, &str)> = request
        .selectors
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    match limiter.reset(&request.policy, &selectors).await {
        Ok(()) => Json(json!({ "reset": true })).into_response(),
        Err(e) => error_response(e),
    }
}

async fn policies<S: Store>(State(limiter): State<Arc<Limiter<S>>>) -> Json<Value> {
    let list: Vec<Value> = limiter
        .policies()
        .iter()
        .map(|p| {
            let policy = &p.policy;
            json!({
                "name": policy.name,
                "rule": policy.rule.to_string(),
                "key": policy.key.clone().unwrap_or_else(|| policy.name.clone()),
                "namespace": policy.namespace.clone().unwrap_or_else(|| sluice_limiter::policy::DEFAULT_NAMESPACE.to_owned()),
                "algorithm": policy.algorithm.name(),
                "shadow": policy.shadow,
                "count_denied": policy.count_denied,
                "penalty": policy.penalty.map(|pen| json!({
                    "base": pen.base().as_secs_f64(),
                    "factor": pen.factor(),
                    "max": pen.max().as_secs_f64(),
                    "forget_after": pen.forget_after().as_secs_f64(),
                })),
            })
        })
        .collect();
    Json(json!({ "policies": list }))
}
