//! A concurrency policy on the layer: each admitted request holds a lease until its
//! response body ends or is dropped, so a streaming download keeps its slot while it streams.

mod common;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderName, Request};
use axum::routing::get;
use bytes::Bytes;
use common::{clock, from, limiter};
use http_body::Frame;
use http_body_util::BodyExt;
use sluice_limiter::{Limiter, ManualClock, Policy};
use sluice_tower::{Error, Key, Outcomes, RateLimitLayer, ResponseBody};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tower::{Layer, ServiceExt};

/// A body that streams whatever the test sends, and ends when the test drops the sender.
struct Streamed(UnboundedReceiver<Bytes>);

impl http_body::Body for Streamed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|b| Ok(Frame::data(b))))
    }
}

/// The senders of the bodies being streamed, in the order the requests arrived.
type Streams = Arc<Mutex<Vec<UnboundedSender<Bytes>>>>;

/// `GET /download`: a body that streams until the test ends it.
fn downloads() -> (Router<()>, Streams) {
    let streams = Streams::default();
    let router = Router::new()
        .route(
            "/download",
            get(|State(streams): State<Streams>| async move {
                let (tx, rx) = unbounded_channel();
                streams.lock().unwrap().push(tx);
                Body::new(Streamed(rx))
            }),
        )
        .with_state(streams.clone());
    (router, streams)
}

fn layer(limiter: Arc<Limiter>, policy: &str) -> RateLimitLayer {
    RateLimitLayer::builder(limiter, policy)
        .selector("x", Key::header(HeaderName::from_static("x-user")))
        .build()
        .unwrap()
}

fn download(user: &str) -> Request<Body> {
    from("192.0.2.1:1000", "GET", "/download")
        .header("x-user", user)
        .body(Body::empty())
        .unwrap()
}

type Answer = axum::http::Response<Body>;

async fn call(app: &Router, user: &str) -> Answer {
    app.clone().oneshot(download(user)).await.unwrap()
}

async fn json(response: Answer) -> serde_json::Value {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

fn one_policy(clock: &ManualClock, rule: &str) -> Arc<Limiter> {
    limiter(clock, vec![Policy::new("downloads", rule).unwrap()])
}

#[tokio::test]
async fn a_streaming_body_keeps_its_slot_until_it_ends() {
    let clock = clock();
    let layer = layer(one_policy(&clock, "x:3 concurrent lease=30s"), "downloads");
    let (router, streams) = downloads();
    let app = router.layer(layer.clone());

    let mut held = Vec::new();
    for left in ["2", "1", "0"] {
        let response = call(&app, "alice").await;
        assert_eq!(response.status(), 200);
        let ratelimit = response.headers()["ratelimit"].to_str().unwrap();
        assert_eq!(ratelimit, format!("\"downloads\";r={left};t=30"));
        held.push(response);
    }

    // Three bodies are streaming: the fourth is refused, with the bound on the wait.
    let refused = call(&app, "alice").await;
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "30");
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    let problem = json(refused).await;
    assert_eq!(problem["reason"], "occupied");
    assert_eq!(problem["retry_after"], 30);
    assert_eq!(layer.stats().denied, 1);
    // Another user has slots of their own.
    assert_eq!(call(&app, "bob").await.status(), 200);

    // The bound shrinks as the leases age.
    clock.advance(std::time::Duration::from_secs(12));
    assert_eq!(call(&app, "alice").await.headers()["retry-after"], "18");

    // The first body streams a chunk and ends: its slot is free once the end is seen,
    // while the response itself is still alive.
    let first = held.remove(0);
    let sender = streams.lock().unwrap().remove(0);
    sender.send(Bytes::from_static(b"chunk")).unwrap();
    drop(sender);
    let mut body = first.into_body();
    let chunk = body.frame().await.unwrap().unwrap();
    assert_eq!(chunk.into_data().unwrap(), "chunk");
    assert_eq!(call(&app, "alice").await.status(), 429, "still streaming");
    assert!(body.frame().await.is_none(), "the body ends");
    let admitted = call(&app, "alice").await;
    assert_eq!(admitted.status(), 200, "the ended body freed its slot");
    held.push(admitted);
    assert_eq!(
        call(&app, "alice").await.status(),
        429,
        "and it is taken again"
    );

    // A body dropped before its end (the client went away) frees its slot too.
    drop(held.remove(0));
    assert_eq!(call(&app, "alice").await.status(), 200);
}

#[tokio::test]
async fn the_body_holds_the_lease_until_its_last_frame() {
    let clock = clock();
    let limiter = one_policy(&clock, "x:1 concurrent");
    let (router, streams) = downloads();
    // The layer around the router, so the test sees the layer's own body type.
    let service = layer(limiter, "downloads").layer(router);
    let response = service.clone().oneshot(download("alice")).await.unwrap();
    let mut body: ResponseBody<Body> = response.into_body();
    assert!(body.holds_lease());
    let sender = streams.lock().unwrap().remove(0);
    sender.send(Bytes::from_static(b"a")).unwrap();
    body.frame().await.unwrap().unwrap();
    assert!(body.holds_lease(), "a frame that is not the last keeps it");
    drop(sender);
    assert!(body.frame().await.is_none());
    assert!(!body.holds_lease(), "released at the end of the stream");
    let next = service.oneshot(download("alice")).await.unwrap();
    assert_eq!(next.status(), 200);
}

#[cfg(feature = "axum")]
#[tokio::test]
async fn with_axum_body_the_lease_rides_in_axums_body_to_its_end() {
    let clock = clock();
    let limiter = one_policy(&clock, "x:1 concurrent");
    let (router, streams) = downloads();
    let service = layer(limiter, "downloads").axum_body().layer(router);
    let response = service.clone().oneshot(download("alice")).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body: Body = response.into_body();
    let sender = streams.lock().unwrap().remove(0);
    sender.send(Bytes::from_static(b"a")).unwrap();
    body.frame().await.unwrap().unwrap();
    let busy = service.clone().oneshot(download("alice")).await.unwrap();
    assert_eq!(busy.status(), 429, "held while the body streams");
    drop(sender);
    assert!(body.frame().await.is_none());
    let next = service.oneshot(download("alice")).await.unwrap();
    assert_eq!(next.status(), 200, "released at the end of the stream");
}

#[tokio::test]
async fn rate_and_concurrency_policies_stack_and_mix() {
    let clock = clock();
    let limiter = limiter(
        &clock,
        vec![
            Policy::new("rate", "x:4/m").unwrap(),
            Policy::new("slots", "x:2 concurrent").unwrap(),
            Policy::new("both", "x:3/m; x:1 concurrent").unwrap(),
        ],
    );
    // A rate layer outside a concurrency layer: checked first, then the lease is taken.
    let (router, _streams) = downloads();
    let app = router
        .layer(layer(limiter.clone(), "slots"))
        .layer(layer(limiter.clone(), "rate"));
    let first = call(&app, "alice").await;
    let second = call(&app, "alice").await;
    assert_eq!(
        (first.status().as_u16(), second.status().as_u16()),
        (200, 200)
    );
    let occupied = call(&app, "alice").await;
    assert_eq!(occupied.status(), 429);
    assert_eq!(json(occupied).await["reason"], "occupied");
    drop(first);
    let third = call(&app, "alice").await;
    assert_eq!(third.status(), 200, "a slot came back; 4 of 4 checks used");
    drop((second, third));
    let limited = call(&app, "alice").await;
    assert_eq!(limited.status(), 429);
    assert_eq!(
        json(limited).await["reason"],
        "limited",
        "the rate layer refused"
    );

    // One rule with both kinds of leaf: acquire checks the rate leaf in the same step.
    let (router, _streams) = downloads();
    let app = router.layer(layer(limiter, "both"));
    let held = call(&app, "carol").await;
    assert_eq!(held.status(), 200);
    assert_eq!(json(call(&app, "carol").await).await["reason"], "occupied");
    drop(held);
    assert_eq!(call(&app, "carol").await.status(), 200);
    assert_eq!(call(&app, "carol").await.status(), 200, "released at once");
    let limited = call(&app, "carol").await;
    assert_eq!(json(limited).await["reason"], "limited", "3 a minute used");
}

#[tokio::test]
async fn a_shadow_concurrency_layer_admits_without_a_slot() {
    let clock = clock();
    let limiter = one_policy(&clock, "x:1 concurrent");
    let shadow = RateLimitLayer::builder(limiter, "downloads")
        .selector("x", Key::header(HeaderName::from_static("x-user")))
        .shadow(true)
        .build()
        .unwrap();
    let (router, _streams) = downloads();
    let app = router.layer(shadow.clone());
    let _held = call(&app, "alice").await;
    let over = call(&app, "alice").await;
    assert_eq!(over.status(), 200);
    assert_eq!(shadow.stats().shadow_denied, 1);
}

#[test]
fn options_that_do_not_fit_a_concurrency_policy_are_refused() {
    let clock = clock();
    let limiter = limiter(
        &clock,
        vec![
            Policy::new("slots", "x:2 concurrent").unwrap(),
            Policy::new("rate", "x:2/m").unwrap(),
        ],
    );
    let builder = || {
        RateLimitLayer::builder(limiter.clone(), "slots")
            .selector("x", Key::header(HeaderName::from_static("x-user")))
    };
    let error = builder()
        .count_only(Outcomes::statuses([401]))
        .build()
        .unwrap_err();
    assert_eq!(
        error,
        Error::Incompatible {
            policy: "slots".into(),
            kind: "takes leases",
            option: "count_only",
        }
    );
    assert_eq!(
        error.to_string(),
        "policy `slots` takes leases: the layer option `count_only` does not apply to it"
    );
    let error = builder()
        .wait_up_to(std::time::Duration::from_secs(1))
        .build()
        .unwrap_err();
    assert!(matches!(
        error,
        Error::Incompatible {
            option: "wait_up_to",
            ..
        }
    ));
    let error = builder()
        .reserve(sluice_tower::Reserve::fixed(10))
        .build()
        .unwrap_err();
    assert_eq!(error, Error::ReserveConcurrency("slots".into()));
    // A challenge's ceiling is checked, so it cannot be a concurrency policy.
    #[cfg(feature = "pow")]
    {
        let error = RateLimitLayer::builder(limiter.clone(), "rate")
            .selector("x", Key::header(HeaderName::from_static("x-user")))
            .challenge(sluice_tower::ProofOfWork::new(), "slots")
            .build()
            .unwrap_err();
        assert_eq!(error, Error::ConcurrentCeiling("slots".into()));
        let error = builder()
            .challenge(sluice_tower::ProofOfWork::new(), "rate")
            .build()
            .unwrap_err();
        assert!(matches!(
            error,
            Error::Incompatible {
                option: "challenge",
                ..
            }
        ));
    }
}

#[tokio::test]
async fn a_failed_inner_service_gives_its_slot_back() {
    let clock = clock();
    let limiter = one_policy(&clock, "x:1 concurrent");
    let failing = tower::service_fn(|_: Request<Body>| async {
        Err::<axum::http::Response<Body>, _>(std::io::Error::other("the handler failed"))
    });
    let service = layer(limiter.clone(), "downloads").layer(failing);
    let error = service
        .clone()
        .oneshot(download("alice"))
        .await
        .unwrap_err();
    assert_eq!(error.to_string(), "the handler failed");
    // The lease went with the failed call: the one slot is free.
    let acquired = limiter
        .acquire("downloads", &[("x", "alice")])
        .await
        .unwrap();
    assert!(acquired.lease.is_some());
}
