//! `wait_replicas`: each decision waits (`WAIT`) until a replica holds it. With the replica
//! up, every decision comes from Redis; what the wait costs is measured; with the replica
//! gone, no decision counts unreplicated: each is answered by the failure mode within the
//! store's timeout.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_limiter::{Denial, FailureMode, Limiter, Policy};
use sluice_redis::RedisStore;
use sluice_testkit::RedisServer;

const TIMEOUT: Duration = Duration::from_millis(200);

async fn limiter(url: &str, wait: u32) -> Arc<Limiter> {
    let store = RedisStore::builder(url)
        .timeout(TIMEOUT)
        .wait_replicas(wait)
        .connect()
        .await
        .expect("connect");
    let policy = Policy::new("closed", "user:1000000/h")
        .unwrap()
        .failure(FailureMode::Closed);
    Arc::new(Limiter::builder(store).policies([policy]).build().unwrap())
}

/// Microseconds per decision, `n` in a row.
async fn per_decision(limiter: &Limiter, n: u32) -> f64 {
    let started = Instant::now();
    for _ in 0..n {
        let checked = limiter.check("closed", &[("user", "w")], 1).await.unwrap();
        assert!(checked.without_store.is_none(), "{checked:?}");
    }
    started.elapsed().as_secs_f64() * 1e6 / f64::from(n)
}

/// Decisions per second from `callers` concurrent callers, 250 each.
async fn throughput(limiter: &Arc<Limiter>, callers: usize) -> f64 {
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..callers {
        let limiter = limiter.clone();
        tasks.spawn(async move { per_decision(&limiter, 250).await });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    (callers * 250) as f64 / started.elapsed().as_secs_f64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_a_replica_costs_a_round_trip_and_never_counts_unreplicated() {
    let master = RedisServer::start().expect("master");
    let mut replica =
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port().to_string()])
            .expect("replica");
    let synced = Instant::now();
    while !replica
        .cli(&["INFO", "replication"])
        .unwrap()
        .contains("master_link_status:up")
    {
        assert!(synced.elapsed() < Duration::from_secs(10), "no sync");
        tokio::time::sleep(Duration::from_millis(20)).await; // polling a real server
    }
    let plain = limiter(&master.url(), 0).await;
    let waiting = limiter(&master.url(), 1).await;
    per_decision(&plain, 200).await;
    per_decision(&waiting, 200).await;
    let (without, with) = (
        per_decision(&plain, 2_000).await,
        per_decision(&waiting, 2_000).await,
    );
    eprintln!(
        "one caller: {without:.0} µs per decision, {with:.0} µs waiting for one replica \
         ({:.2}x)",
        with / without
    );

    let (without, with) = (throughput(&plain, 8).await, throughput(&waiting, 8).await);
    eprintln!(
        "8 callers: {without:.0} decisions/s, {with:.0} waiting for one replica ({:.2}x)",
        with / without
    );

    replica.kill();
    for _ in 0..5 {
        let started = Instant::now();
        let checked = waiting.check("closed", &[("user", "w")], 1).await.unwrap();
        assert_eq!(
            checked.decision.denial,
            Some(Denial::StoreUnavailable),
            "{checked:?}"
        );
        assert!(started.elapsed() < TIMEOUT + Duration::from_millis(800));
    }
    // The store without the wait goes on deciding.
    assert!(per_decision(&plain, 10).await > 0.0);
}
