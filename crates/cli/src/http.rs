//! The HTTP/JSON service: `POST /v1/check`, `/v1/peek`, `/v1/reset`, `GET /v1/policies`,
//! `GET /health`. Malformed requests get 400 with a message and never reach the store.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use sluice_limiter::Error;
use sluice_server::Service;

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

/// The router over `service`'s configured policies (checks are counted in its metrics).
pub fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/check", post(check))
        .route("/v1/peek", post(peek))
        .route("/v1/reset", post(reset))
        .route("/v1/policies", get(policies))
        .fallback(|| async { problem(StatusCode::NOT_FOUND, "no such endpoint".into()) })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(service)
}

/// A client must send a request's headers within this time (slowloris).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// A request, body included, must be read and answered within this time.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// After shutdown begins, open requests get this long to finish.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `router` on `listener` until `shutdown` completes, then finishes open requests.
/// HTTP/1.1 and HTTP/2; slow clients are cut off (see [`HEADER_TIMEOUT`],
/// [`REQUEST_TIMEOUT`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = router.layer(axum::middleware::from_fn(deadline));
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_BODY + 16 * 1024);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(256)
        .max_header_list_size(16 * 1024);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            let _ = connection.await;
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(DRAIN_TIMEOUT) => {
            tracing::warn!("open connections did not finish in time");
        }
    }
    Ok(())
}

/// Answers 408 when a request (a slowly sent body included) takes too long.
async fn deadline(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(request)).await {
        Ok(response) => response,
        Err(_) => problem(StatusCode::REQUEST_TIMEOUT, "request took too long".into()),
    }
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

/// Parses a request body and checks the selectors it carries.
fn read<T: DeserializeOwned>(
    body: &Bytes,
    selectors: impl Fn(&T) -> &BTreeMap<String, String>,
) -> Result<T, Problem> {
    let request: T = parse(body)?;
    check_selectors(selectors(&request))?;
    Ok(request)
}

/// Selectors as the limiter takes them.
fn pairs(selectors: &BTreeMap<String, String>) -> Vec<(&str, &str)> {
    selectors
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

async fn decide(service: &Service, body: Bytes, peek: bool) -> Response {
    let limiter = &service.limiter;
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
    match service.limiter.reset(&request.policy, &selectors).await {
        Ok(()) => Json(json!({ "reset": true })).into_response(),
        Err(e) => error_response(e),
    }
}

async fn policies(State(service): State<Arc<Service>>) -> Json<Value> {
    let list: Vec<Value> = service
        .limiter
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
