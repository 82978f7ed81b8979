//! The policy API: `POST /v1/check`, `/v1/peek`, `/v1/reset`, `GET /v1/policies`,
//! `GET /health`. Malformed requests get 400 with a message and never reach the store.
//! Leases and reservations (`/v1/acquire`, ...) are in [`super::leases`].

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sluice_limiter::Error;

use super::decision::decision_json;
use super::problem;
use crate::service::Service;

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

/// The policy API's routes over `service` (checks are counted in its metrics).
pub(super) fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/check", post(check))
        .route("/v1/peek", post(peek))
        .route("/v1/reset", post(reset))
        .route("/v1/policies", get(policies))
        .with_state(service)
}

async fn health() -> Json<Value> {
    Json(json!({ "status": "ok" }))
}

/// A request refused before it reaches the limiter.
pub(super) struct Problem {
    status: StatusCode,
    message: String,
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        problem(self.status, self.message)
    }
}

pub(super) fn bad_request(message: String) -> Problem {
    Problem {
        status: StatusCode::BAD_REQUEST,
        message,
    }
}

/// A request body: a JSON object of the endpoint's fields. Any other JSON value gets its own
/// message (serde would read an array as the fields in order and complain of the first).
pub(super) fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, Problem> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|&b| b != b'{') {
        return Err(bad_request(
            "invalid request: the body must be a JSON object".to_owned(),
        ));
    }
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

pub(super) fn error_response(error: Error) -> Response {
    let status = match &error {
        Error::UnknownPolicy(_) => StatusCode::NOT_FOUND,
        Error::MissingSelector { .. }
        | Error::NeedsAcquire(_)
        | Error::NoConcurrencyLeaf(_)
        | Error::ReserveConcurrency(_) => StatusCode::BAD_REQUEST,
        e if e.is_transient() => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    problem(status, error.to_string())
}

/// Parses a request body and checks the selectors it carries.
pub(super) fn read<T: DeserializeOwned>(
    body: &Bytes,
    selectors: impl Fn(&T) -> &BTreeMap<String, String>,
) -> Result<T, Problem> {
    let request: T = parse(body)?;
    check_selectors(selectors(&request))?;
    Ok(request)
}

/// Selectors as the limiter takes them.
pub(super) fn pairs(selectors: &BTreeMap<String, String>) -> Vec<(&str, &str)> {
    selectors
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

async fn decide(service: &Service, body: Bytes, peek: bool) -> Response {
    let limiter = service.limiter();
    let request: CheckRequest = match read(&body, |r: &CheckRequest| &r.selectors) {
        Ok(r) => r,
        Err(problem) => return problem.into_response(),
    };
    let selectors = pairs(&request.selectors);
    let result = if peek {
        limiter
            .peek(&request.policy, &selectors, request.cost)
            .await
    } else {
        service
            .check(&request.policy, &selectors, request.cost)
            .await
    };
    match result {
        Ok(checked) => Json(decision_json(&checked)).into_response(),
        Err(e) => error_response(e),
    }
}

async fn check(State(service): State<Arc<Service>>, body: Bytes) -> Response {
    decide(&service, body, false).await
}

async fn peek(State(service): State<Arc<Service>>, body: Bytes) -> Response {
    decide(&service, body, true).await
}

async fn reset(State(service): State<Arc<Service>>, body: Bytes) -> Response {
    let request: ResetRequest = match read(&body, |r: &ResetRequest| &r.selectors) {
        Ok(r) => r,
        Err(problem) => return problem.into_response(),
    };
    let selectors = pairs(&request.selectors);
    match service.limiter().reset(&request.policy, &selectors).await {
        Ok(()) => Json(json!({ "reset": true })).into_response(),
        Err(e) => error_response(e),
    }
}

async fn policies(State(service): State<Arc<Service>>) -> Json<Value> {
    let list: Vec<Value> = service
        .limiter()
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
