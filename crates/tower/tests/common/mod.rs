//! Shared test scaffolding: a limiter on a manual clock, a small axum app, requests from a
//! chosen peer address, and answers read whole.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::routing::{get, post};
use axum::{Extension, Form, Router};
use http_body_util::BodyExt;
use serde_json::Value;
use sluice_limiter::{Limiter, ManualClock, MemoryStore, Policy};
use sluice_tower::{ClientIp, RateLimitLayer};
use tower::ServiceExt;

/// 2023-11-14T22:13:20Z, in nanoseconds: any fixed start will do.
pub const START: u64 = 1_700_000_000_000_000_000;

pub fn clock() -> ManualClock {
    ManualClock::new(START)
}

pub fn limiter(clock: &ManualClock, policies: Vec<Policy>) -> Arc<Limiter> {
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let limiter = Limiter::builder(store)
        .clock(clock.clone())
        .policies(policies)
        .build()
        .expect("valid policies");
    Arc::new(limiter)
}

/// `POST /login` (password `correct` is 200, else 401), `GET /api/items`, `GET /other`,
/// `POST /echo` (answers the body it got), `GET /whoami` (the resolved client IP), all
/// behind `layer`.
pub fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route("/login", post(login))
        .route("/api/items", get(|| async { "[]" }))
        .route("/other", get(|| async { "other" }))
        .route("/echo", post(|body: String| async move { body }))
        .route(
            "/whoami",
            get(|Extension(ClientIp(ip)): Extension<ClientIp>| async move { ip.to_string() }),
        )
        .layer(layer)
}

async fn login(Form(form): Form<HashMap<String, String>>) -> (StatusCode, &'static str) {
    if form.get("password").map(String::as_str) == Some("correct") {
        (StatusCode::OK, "welcome")
    } else {
        (StatusCode::UNAUTHORIZED, "wrong password")
    }
}

/// A request from `peer` (`"203.0.113.9:5000"`), as axum's `ConnectInfo` would give it.
pub fn from(peer: &str, method: &str, uri: &str) -> http::request::Builder {
    let peer: SocketAddr = peer.parse().expect("peer address");
    Request::builder()
        .method(method)
        .uri(uri)
        .extension(ConnectInfo(peer))
}

pub fn login_request(peer: &str, user: &str, password: &str) -> Request<Body> {
    from(peer, "POST", "/login")
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Body::from(format!("username={user}&password={password}")))
        .unwrap()
}

pub fn get_request(peer: &str, uri: &str) -> Request<Body> {
    from(peer, "GET", uri).body(Body::empty()).unwrap()
}

/// A response read whole.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: String,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    pub fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    /// The rate limit fields, in a fixed order, for exact comparisons.
    pub fn limit_fields(&self) -> Vec<(&'static str, Option<&str>)> {
        [
            "retry-after",
            "ratelimit-policy",
            "ratelimit",
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ]
        .into_iter()
        .map(|name| (name, self.header(name)))
        .collect()
    }
}

pub async fn send(app: &Router, request: Request<Body>) -> Answer {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8(bytes.to_vec()).unwrap(),
    }
}

/// Sends `request` and returns only the status.
pub async fn status(app: &Router, request: Request<Body>) -> u16 {
    send(app, request).await.status
}
