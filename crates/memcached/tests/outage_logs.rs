//! What the memcached store logs when a server goes down and comes back. A test binary of
//! its own: the log capture is per thread, and tracing caches which events are wanted per
//! process, so tests logging on other threads of the same process could hide these lines.

use std::time::{Duration, Instant};

use sluice_core::{Algorithm, Leaf, Quota, Rate, Span, Unit};
use sluice_limiter::{Identifier, Store};
use sluice_memcached::MemcachedStore;
use sluice_testkit::MemcachedServer;
use sluice_testkit::bench::BenchRule;
use sluice_testkit::logs::Captured;

/// A server that goes down is logged once, however many calls find it down (and however
/// often it is tried again and still fails), and its return once.
#[tokio::test(flavor = "current_thread")]
async fn a_server_down_and_back_is_logged_once_each() {
    let (captured, _guard) = Captured::start();
    let mut memcached = MemcachedServer::start().expect("memcached");
    let store = MemcachedStore::builder(&memcached.url())
        .timeout(Duration::from_millis(200))
        .down_for(Duration::from_millis(20))
        .connect()
        .await
        .expect("connect");
    let rate = Rate::new(100, Span::new(1, Unit::Hour).unwrap()).unwrap();
    let rule =
        BenchRule::one_leaf(Quota::from_leaf(&Leaf::new(rate), Algorithm::SlidingWindow).unwrap());
    let id = [Identifier::new("user:a")];
    let hit = || async { store.decide(&rule.hit(&id)).await };
    assert!(hit().await.is_ok());

    memcached.kill();
    for _ in 0..50 {
        assert!(hit().await.is_err());
        // Past the skip time, so the dead server is tried (and marked down) again.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        store.stats().servers_marked_down >= 2,
        "tried again and again"
    );
    assert_eq!(captured.lines_with("memcached server marked down"), 1);
    assert_eq!(captured.lines_with("answers again"), 0);

    memcached.restart().expect("restart memcached");
    let deadline = Instant::now() + Duration::from_secs(10);
    while hit().await.is_err() {
        assert!(Instant::now() < deadline, "memcached did not come back");
        tokio::time::sleep(Duration::from_millis(20)).await; // waiting on a real restart
    }
    for _ in 0..20 {
        assert!(hit().await.is_ok());
    }
    assert_eq!(captured.lines_with("answers again"), 1);
    assert_eq!(captured.lines_with("memcached server marked down"), 1);
}
