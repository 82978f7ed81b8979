//! Reservations on the layer: admitted on the request's estimate, settled at the actual cost
//! the response reports (a header or an `ActualCost` extension), refunds and debts checked
//! with `limiter.peek`.

mod common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, Request};
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Extension, Router};
use common::{clock, from, limiter};
use sluice_limiter::{Limiter, Policy};
use sluice_tower::{ActualCost, Error, Key, RateLimitLayer, Reserve};
use tower::ServiceExt;

/// `POST /complete`: reports the cost the test asks for, in `x-tokens-used` (from the
/// request's `x-report-header`) or as an `ActualCost` extension (from `x-report-extension`).
fn app(layer: RateLimitLayer) -> Router {
    Router::new()
        .route(
            "/complete",
            post(|headers: HeaderMap| async move {
                let get = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
                let mut response = "done".into_response();
                if let Some(used) = get("x-report-header") {
                    response
                        .headers_mut()
                        .insert("x-tokens-used", used.parse().unwrap());
                }
                if let Some(used) = get("x-report-extension") {
                    let cost = ActualCost(used.parse().unwrap());
                    return (Extension(cost), response).into_response();
                }
                response
            }),
        )
        .layer(layer)
}

fn token_layer(limiter: Arc<Limiter>) -> RateLimitLayer {
    let reserve = Reserve::estimate(|request| {
        request
            .headers
            .get("x-max-tokens")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(100)
    })
    .actual_header("x-tokens-used");
    RateLimitLayer::builder(limiter, "tokens")
        .selector("user", Key::header(HeaderName::from_static("x-user")))
        .reserve(reserve)
        .build()
        .unwrap()
}

fn complete(estimate: u64, report: Option<(&str, &str)>) -> Request<Body> {
    let mut request = from("192.0.2.1:1000", "POST", "/complete")
        .header("x-user", "alice")
        .header("x-max-tokens", estimate.to_string());
    if let Some((how, used)) = report {
        request = request.header(how, used);
    }
    request.body(Body::empty()).unwrap()
}

/// What a hit of cost 1 would leave for alice (nothing is recorded).
async fn remaining(limiter: &Limiter) -> u64 {
    let peek = limiter
        .peek("tokens", &[("user", "alice")], 1)
        .await
        .unwrap();
    peek.decision.remaining
}

/// Waits until the layer has settled `n` reservations: settling runs on a spawned task.
async fn settled(layer: &RateLimitLayer, n: u64) {
    for _ in 0..10_000 {
        if layer.stats().reservations_settled >= n {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("{n} settlements expected, {:?}", layer.stats());
}

#[tokio::test]
async fn the_actual_cost_refunds_or_charges_the_estimate() {
    let clock = clock();
    let limiter = limiter(&clock, vec![Policy::new("tokens", "user:1000/m").unwrap()]);
    let layer = token_layer(limiter.clone());
    let app = app(layer.clone());

    // 400 reserved, 100 used (a header): 300 refunded.
    let response = app
        .clone()
        .oneshot(complete(400, Some(("x-report-header", "100"))))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["ratelimit"], "\"tokens\";r=600;t=24");
    settled(&layer, 1).await;
    assert_eq!(remaining(&limiter).await, 900 - 1);

    // 200 reserved, 50 used (an extension): 150 refunded.
    let request = complete(200, Some(("x-report-extension", "50")));
    assert_eq!(app.clone().oneshot(request).await.unwrap().status(), 200);
    settled(&layer, 2).await;
    assert_eq!(remaining(&limiter).await, 850 - 1);

    // 100 reserved, 700 used: the excess is charged (debt), never refused after the fact.
    let request = complete(100, Some(("x-report-header", "700")));
    assert_eq!(app.clone().oneshot(request).await.unwrap().status(), 200);
    settled(&layer, 3).await;
    assert_eq!(remaining(&limiter).await, 150 - 1);

    // The next estimate no longer fits: refused before the handler runs.
    let refused = app.clone().oneshot(complete(400, None)).await.unwrap();
    assert_eq!(refused.status(), 429);
    assert!(refused.headers().contains_key("retry-after"));
    assert_eq!(layer.stats().denied, 1);
    assert_eq!(
        remaining(&limiter).await,
        150 - 1,
        "a refusal charges nothing"
    );
    assert_eq!(layer.stats().reservations_unsettled, 0);
}

#[tokio::test]
async fn without_a_readable_actual_cost_the_estimate_stands() {
    let clock = clock();
    let limiter = limiter(&clock, vec![Policy::new("tokens", "user:1000/m").unwrap()]);
    let layer = token_layer(limiter.clone());
    let app = app(layer.clone());

    let response = app.clone().oneshot(complete(300, None)).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(layer.stats().reservations_unsettled, 1);
    assert_eq!(remaining(&limiter).await, 700 - 1);

    let request = complete(200, Some(("x-report-header", "lots")));
    assert_eq!(app.clone().oneshot(request).await.unwrap().status(), 200);
    assert_eq!(layer.stats().reservations_unsettled, 2);
    assert_eq!(remaining(&limiter).await, 500 - 1);

    // An actual cost equal to the estimate needs no call to the store.
    let request = complete(100, Some(("x-report-header", "100")));
    assert_eq!(app.clone().oneshot(request).await.unwrap().status(), 200);
    assert_eq!(layer.stats().reservations_settled, 1);
    assert_eq!(remaining(&limiter).await, 400 - 1);
}

#[tokio::test]
async fn a_fixed_estimate_and_the_extension_alone() {
    let clock = clock();
    let limiter = limiter(&clock, vec![Policy::new("tokens", "user:10/m").unwrap()]);
    let layer = RateLimitLayer::builder(limiter.clone(), "tokens")
        .selector("user", Key::header(HeaderName::from_static("x-user")))
        .reserve(Reserve::fixed(5))
        .build()
        .unwrap();
    let app = app(layer.clone());
    // No header is configured: a header alone is not read.
    let request = complete(0, Some(("x-report-header", "1")));
    assert_eq!(app.clone().oneshot(request).await.unwrap().status(), 200);
    assert_eq!(layer.stats().reservations_unsettled, 1);
    assert_eq!(remaining(&limiter).await, 5 - 1);
    let request = complete(0, Some(("x-report-extension", "2")));
    assert_eq!(app.clone().oneshot(request).await.unwrap().status(), 200);
    settled(&layer, 1).await;
    assert_eq!(remaining(&limiter).await, 3 - 1);
}

#[test]
fn bad_reservations_are_refused_when_the_layer_is_built() {
    let clock = clock();
    let limiter = limiter(
        &clock,
        vec![
            Policy::new("tokens", "user:1000/m").unwrap(),
            Policy::new("slots", "user:2 concurrent").unwrap(),
        ],
    );
    let builder = |policy: &str| {
        RateLimitLayer::builder(limiter.clone(), policy)
            .selector("user", Key::header(HeaderName::from_static("x-user")))
    };
    let error = builder("tokens")
        .reserve(Reserve::fixed(1).actual_header("x tokens"))
        .build()
        .unwrap_err();
    assert_eq!(error, Error::BadHeaderName("x tokens".into()));
    assert_eq!(
        error.to_string(),
        "`x tokens` is not a valid header name (for the reservation's actual cost)"
    );
    let error = builder("slots")
        .reserve(Reserve::fixed(1))
        .build()
        .unwrap_err();
    assert_eq!(error, Error::ReserveConcurrency("slots".into()));
    let error = builder("tokens")
        .reserve(Reserve::fixed(1))
        .wait_up_to(std::time::Duration::from_secs(1))
        .build()
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "policy `tokens` reserves: the layer option `wait_up_to` does not apply to it"
    );
}
