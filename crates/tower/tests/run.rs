//! The layer's waiting mode, on tokio's paused clock (the limiter reads the same virtual
//! time, so waits are exact and instant), and what the layer does when the limiter cannot
//! decide.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{START, app, clock, get_request, limiter, send};
use sluice_limiter::{Clock, Limiter, MemoryStore, Policy};
use sluice_tower::{Key, RateLimitLayer};
use tokio::time::Instant;

/// The limiter's time is tokio's (paused) time.
#[derive(Clone)]
struct TokioClock(Instant);

impl Clock for TokioClock {
    fn now(&self) -> u64 {
        START + self.0.elapsed().as_nanos() as u64
    }
}

fn tokio_limiter(rule: &str) -> Arc<Limiter> {
    let clock = TokioClock(Instant::now());
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let limiter = Limiter::builder(store)
        .clock(clock)
        .policy(Policy::new("jobs", rule).unwrap())
        .build()
        .unwrap();
    Arc::new(limiter)
}

#[tokio::test(start_paused = true)]
async fn the_layer_can_wait_instead_of_refusing() {
    let limiter = tokio_limiter("queue:2/s");
    let layer = RateLimitLayer::builder(limiter, "jobs")
        .selector("queue", Key::constant("outgoing"))
        .wait_up_to(Duration::from_secs(1))
        .build()
        .unwrap();
    let app = app(layer);
    let started = Instant::now();
    for _ in 0..4 {
        assert_eq!(
            send(&app, get_request("192.0.2.1:1", "/other"))
                .await
                .status,
            200
        );
    }
    assert_eq!(started.elapsed(), Duration::from_secs(1));
}

#[tokio::test]
async fn the_layer_answers_503_when_the_limiter_cannot_decide() {
    let limiter = limiter(&clock(), vec![Policy::new("web", "ip:1/m").unwrap()]);
    let closed = RateLimitLayer::builder(limiter.clone(), "web")
        .selector("ip", Key::client_ip())
        .build()
        .unwrap();
    let open = RateLimitLayer::builder(limiter.clone(), "web")
        .selector("ip", Key::client_ip())
        .fail_open(true)
        .build()
        .unwrap();
    // The policy disappears under the layers (a reload that dropped it).
    limiter.replace_policies(Vec::new()).unwrap();

    let a = send(&app(closed.clone()), get_request("192.0.2.1:1", "/other")).await;
    assert_eq!(a.status, 503);
    assert_eq!(a.header("content-type"), Some("application/problem+json"));
    assert_eq!(closed.stats().failed_closed, 1);

    let a = send(&app(open.clone()), get_request("192.0.2.1:1", "/other")).await;
    assert_eq!(a.status, 200, "fail open admits");
    assert_eq!(a.header("ratelimit"), None);
    assert_eq!(open.stats().failed_open, 1, "and counts it");
}
