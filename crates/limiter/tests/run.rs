//! `Limiter::run`, `admit` and `admit_within` on tokio's paused clock (the limiter reads the
//! same virtual time, so waits are exact and instant).

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sluice_limiter::{Clock, Limiter, MemoryStore, Policy, Refused};
use tokio::time::Instant;

/// Nanoseconds since the epoch at the test's start.
const START: u64 = 1_700_000_000_000_000_000;

/// The limiter's time is tokio's (paused) time.
#[derive(Clone)]
struct TokioClock(Instant);

impl Clock for TokioClock {
    fn now(&self) -> u64 {
        START + self.0.elapsed().as_nanos() as u64
    }
}

fn tokio_limiter(rule: &str) -> Limiter {
    let clock = TokioClock(Instant::now());
    let store = MemoryStore::builder().clock(clock.clone()).build();
    Limiter::builder(store)
        .clock(clock)
        .policy(Policy::new("jobs", rule).unwrap())
        .build()
        .unwrap()
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
