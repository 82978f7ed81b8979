//! What the Redis store logs when Redis goes away and comes back. A test binary of its own:
//! the log capture is per thread, and tracing caches which events are wanted per process,
//! so tests logging on other threads of the same process could hide these lines.

use std::time::Duration;

use sluice_limiter::Limiter;
use sluice_redis::RedisStore;
use sluice_testkit::RedisServer;
use sluice_testkit::load::{failure_policies, until_the_store_answers};
use sluice_testkit::logs::Captured;

/// Redis going away is logged once however many calls fail, and its return once.
#[tokio::test(flavor = "current_thread")]
async fn losing_and_regaining_redis_is_logged_once_each() {
    let (captured, _guard) = Captured::start();
    let mut redis = RedisServer::start().expect("redis-server");
    let store = RedisStore::builder(&redis.url())
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let limiter = Limiter::builder(store)
        .policies(failure_policies(""))
        .build()
        .unwrap();
    let check = || limiter.check("closed", &[("user", "a")], 1);
    assert!(check().await.unwrap().without_store.is_none());

    redis.kill();
    for _ in 0..30 {
        assert!(check().await.unwrap().without_store.is_some());
    }
    assert_eq!(captured.lines_with("redis does not answer"), 1);
    assert_eq!(captured.lines_with("redis answers again"), 0);

    redis.restart().expect("restart redis");
    until_the_store_answers(&limiter, Duration::from_secs(10)).await;
    for _ in 0..10 {
        assert!(check().await.unwrap().without_store.is_none());
    }
    assert_eq!(captured.lines_with("redis answers again"), 1);
    assert_eq!(captured.lines_with("redis does not answer"), 1);
}
