//! Beyond HTTP and waiting: `run`, `admit_within` and the layer's waiting mode, on tokio's
//! paused clock (the limiter reads the same virtual time, so waits are exact and instant).
//! Also what the layer does when the limiter cannot decide.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{START, app, clock, get_request, limiter, send};
use sluice_limiter::{Clock, Limiter, MemoryStore, Policy};
use sluice_tower::{Key, LimiterExt, RateLimitLayer, Refused};
use tokio::time::Instant;

/// The limiter's time is tokio's (paused) time.
#[derive(Clone)]
struct TokioClock(Instant);

impl Clock for TokioClock {
    fn now(&self) -> u64 {
        START + self.0.elapsed().as_nanos() as u64
    }
}

fn tokio_limiter(rule: &str) -> Arc<Limiter<MemoryStore>> {
    let clock = TokioClock(Instant::now());
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let limiter = Limiter::builder(store)
        .clock(clock)
        .policy(Policy::new("jobs", rule).unwrap())
        .build()
        .unwrap();
    Arc::new(limiter)
}

const QUEUE: &[(&str, &str)] = &[("queue", "mail")];

#[tokio::test(start_paused = true)]
async fn run_limits_a_block_of_code() {
    let limiter = tokio_limiter("queue:2/s");
    let ran = AtomicU32::new(0);
    for _ in 0..3 {
        let _ = limiter
            .run("jobs", QUEUE, async { ran.fetch_add(1, Ordering::SeqCst) })
            .await;
    }
    assert_eq!(ran.load(Ordering::SeqCst), 2, "the third block never ran");
    let refused = limiter.run("jobs", QUEUE, async {}).await.unwrap_err();
    assert_eq!(refused.retry_after(), Some(Duration::from_millis(500)));
    assert!(refused.is_transient());
    assert!(matches!(refused, Refused::Limited(_)));
}

#[tokio::test(start_paused = true)]
async fn waiting_mode_sleeps_until_admitted() {
    let limiter = tokio_limiter("queue:2/s");
    let started = Instant::now();
    for _ in 0..2 {
        let permit = limiter.admit("jobs", QUEUE, 1).await.unwrap();
        assert_eq!(permit.waited, Duration::ZERO);
    }
    let permit = limiter
        .admit_within("jobs", QUEUE, 1, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(permit.waited, Duration::from_millis(500));
    assert_eq!(started.elapsed(), Duration::from_millis(500));

    let result = limiter
        .run_within("jobs", QUEUE, Duration::from_secs(2), async { "sent" })
        .await;
    assert_eq!(result, Ok("sent"));
    assert_eq!(started.elapsed(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_wait_past_the_bound_is_not_started() {
    let limiter = tokio_limiter("queue:1/m");
    limiter.admit("jobs", QUEUE, 1).await.unwrap();
    let started = Instant::now();
    let refused = limiter
        .admit_within("jobs", QUEUE, 1, Duration::from_secs(59))
        .await
        .unwrap_err();
    assert_eq!(refused.retry_after(), Some(Duration::from_secs(60)));
    assert_eq!(started.elapsed(), Duration::ZERO, "refused at once");
    // A cost the limit can never admit is refused at once, and says retrying cannot help.
    let refused = limiter
        .admit_within("jobs", QUEUE, 5, Duration::from_secs(3600))
        .await
        .unwrap_err();
    assert_eq!(refused.retry_after(), None);
    assert!(!refused.is_transient());
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
