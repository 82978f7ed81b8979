//! The login example's application, shared with the test that drives it with curl.
//!
//! - `POST /login` (form fields `username`, `password`; password `correct` succeeds, others
//!   get 401) is limited per client IP + username: 5 failures a minute, successes not
//!   counted, then timeouts of 60 s that double with each new round of abuse (at most an
//!   hour, forgotten after a quiet hour). A refused client is offered a proof-of-work
//!   challenge; at most 20 solved requests an hour per IP.
//! - `GET /api/items` is limited per `X-Api-Key`: 10 a minute.
//! - Browsers (`Accept: text/html`) get a custom page when refused; every denial is written
//!   to stderr as an audit line.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{Method, Response, StatusCode, header};
use axum::routing::{get, post};
use axum::{Form, Router};
use bytes::Bytes;
use serde_json::json;
use sluice_core::Penalty;
use sluice_core::whole_seconds;
use sluice_limiter::{Limiter, MemoryStore, Policy};
use sluice_tower::{Denied, Headers, Key, Outcomes, ProofOfWork, RateLimitLayer};

/// The example's policies.
pub fn limiter() -> Arc<Limiter> {
    let penalty = Penalty::new(
        Duration::from_secs(60),
        2,
        Duration::from_secs(3600),
        Duration::from_secs(3600),
    )
    .expect("a valid penalty");
    let policies = vec![
        Policy::new("login", "ip+user:5/m")
            .expect("rule")
            .penalty(penalty),
        Policy::new("login-ceiling", "ip:20/h").expect("rule"),
        Policy::new("api", "apikey:10/m").expect("rule"),
    ];
    let limiter = Limiter::builder(MemoryStore::new())
        .policies(policies)
        .build()
        .expect("valid policies");
    Arc::new(limiter)
}

pub fn router(limiter: Arc<Limiter>) -> Router {
    let login_limit = RateLimitLayer::builder(limiter.clone(), "login")
        .selector("ip", Key::client_ip())
        .selector(
            "user",
            Key::form_field("username").map(|u| u.trim().to_lowercase()),
        )
        .methods([Method::POST])
        .count_only(Outcomes::statuses([401]))
        .challenge(ProofOfWork::new(), "login-ceiling")
        .headers(Headers::ALL)
        .on_denied(audit)
        .render(page)
        .build()
        .expect("login layer");
    let api_limit = RateLimitLayer::builder(limiter, "api")
        .selector(
            "apikey",
            Key::header(header::HeaderName::from_static("x-api-key")),
        )
        .headers(Headers::ALL)
        .on_denied(audit)
        .render(page)
        .build()
        .expect("api layer");
    Router::new()
        .route("/login", post(login).layer(login_limit))
        .route("/api/items", get(items).layer(api_limit))
}

/// Serves the example on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener) -> std::io::Result<()> {
    let app = router(limiter()).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).await
}

#[derive(serde::Deserialize)]
struct Credentials {
    username: String,
    password: String,
}

async fn login(Form(form): Form<Credentials>) -> (StatusCode, String) {
    if form.password == "correct" {
        (StatusCode::OK, format!("welcome, {}\n", form.username))
    } else {
        (
            StatusCode::UNAUTHORIZED,
            "wrong username or password\n".into(),
        )
    }
}

async fn items() -> axum::Json<serde_json::Value> {
    axum::Json(json!([{"id": 1, "name": "sluice gate"}]))
}

/// One line per denial, for an audit log.
fn audit(denied: &Denied<'_>) {
    let ip = denied
        .client_ip
        .map(|ip| ip.to_string())
        .unwrap_or_default();
    let retry = denied
        .decision
        .and_then(|d| d.retry_after())
        .map(|r| format!("{:.1}", r.as_secs_f64()))
        .unwrap_or_default();
    eprintln!(
        "audit: denied policy={} reason={} ip={ip} path={} retry_after={retry}",
        denied.policy,
        denied.reason.name(),
        denied.request.uri.path(),
    );
}

/// Browsers get a page; API clients the default problem+json.
fn page(denied: &Denied<'_>) -> Option<Response<Bytes>> {
    let accept = denied.request.headers.get(header::ACCEPT)?.to_str().ok()?;
    if !accept.contains("text/html") {
        return None;
    }
    let wait = denied
        .decision
        .and_then(|d| d.retry_after())
        .map(|r| format!("Please try again in {} seconds.", whole_seconds(r)))
        .unwrap_or_default();
    let html = format!(
        "<!doctype html>\n<title>Slow down</title>\n<h1>Too many attempts</h1>\n<p>{wait}</p>\n"
    );
    let mut response = Response::new(Bytes::from(html));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/html; charset=utf-8"),
    );
    Some(response)
}
