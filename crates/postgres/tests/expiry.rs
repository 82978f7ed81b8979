//! PostgreSQL has no expiry: the cleaner deletes expired rows in the background, and the
//! table shrinks back after a flood of distinct identifiers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::{Algorithm, Leaf, Quota, Rate, Span, Unit};
use sluice_limiter::{Identifier, Store};
use sluice_postgres::PostgresStore;
use sluice_testkit::PostgresServer;
use sluice_testkit::bench::BenchRule;

fn rows(server: &PostgresServer) -> usize {
    server
        .psql("SELECT count(*) FROM sluice.counters")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// Polls the row count until it is `at_most`, for up to `within`.
fn wait_for_rows(server: &PostgresServer, at_most: usize, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let n = rows(server);
        if n <= at_most {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{n} rows left after {within:?}, expected at most {at_most}"
        );
        std::thread::sleep(Duration::from_millis(100)); // polling the cleaner's progress
    }
}

/// Decides one hit of `quota` for each of `count` new identifiers, 32 at a time.
async fn flood(store: &PostgresStore, quota: Quota, prefix: &str, count: usize) {
    let ids: Arc<Vec<[Identifier; 1]>> = Arc::new(
        (0..count)
            .map(|i| [Identifier::new(format!("{prefix}:{i}"))])
            .collect(),
    );
    let mut tasks = Vec::new();
    for t in 0..32 {
        let (store, ids) = (store.clone(), ids.clone());
        tasks.push(tokio::spawn(async move {
            let rule = BenchRule::one_leaf(quota);
            for i in (t..ids.len()).step_by(32) {
                let d = store.decide(&rule.hit(&ids[i])).await.expect("a decision");
                assert!(d.allowed());
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

fn quota(algorithm: Algorithm) -> Quota {
    let rate = Rate::new(10, Span::new(1, Unit::Second).unwrap()).unwrap();
    Quota::from_leaf(&Leaf::new(rate), algorithm).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cleaner_shrinks_the_table_back_after_a_flood() {
    let server = PostgresServer::start().expect("postgres");
    let url = format!("{}?cleanup_interval_ms=100&cleanup_pages=256", server.url());
    let store = PostgresStore::builder(&url)
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect");
    // 1-second windows: every row has expired a second after its hit.
    let mut written = 0;
    for algorithm in Algorithm::ALL {
        flood(&store, quota(algorithm), algorithm.name(), 5_000).await;
        written += 5_000;
    }
    // The flood took a while; most rows may be gone already, but not all were written last.
    let peak = rows(&server);
    println!("{peak} of {written} rows left when the flood ended");
    assert!(peak > 0, "no row was written");
    let took = wait_for_rows(&server, 0, Duration::from_secs(30));
    println!("the table was empty {took:?} later");

    // A row that has not expired stays.
    let long = Quota::from_leaf(
        &Leaf::new(Rate::new(10, Span::new(1, Unit::Hour).unwrap()).unwrap()),
        Algorithm::Gcra,
    )
    .unwrap();
    flood(&store, long, "long", 100).await;
    let swept = store.clean_expired(u32::MAX).await.expect("a sweep");
    assert_eq!(swept, 0, "live rows deleted");
    assert_eq!(rows(&server), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_on_demand_deletes_only_expired_rows() {
    let server = PostgresServer::start().expect("postgres");
    // A cleaner that never runs during the test: the sweep is called by hand.
    let url = format!("{}?cleanup_interval_ms=3600000", server.url());
    let store = PostgresStore::connect(&url).await.expect("connect");
    // Rows that expired an hour ago, and live ones, written under the store.
    server
        .psql(
            "INSERT INTO sluice.counters (id, v, expires_at)
             SELECT 'old:' || n, ARRAY[1::bigint], 1 FROM generate_series(1, 20000) n;
             INSERT INTO sluice.counters (id, v, expires_at)
             SELECT 'live:' || n, ARRAY[1::bigint], 9000000000000000 FROM generate_series(1, 500) n",
        )
        .unwrap();
    let mut deleted = 0;
    for _ in 0..100 {
        let n = store.clean_expired(64).await.expect("a sweep");
        assert!(n <= 64 * 200, "one sweep of 64 pages deleted {n} rows");
        deleted += n;
        if deleted == 20_000 {
            break;
        }
    }
    assert_eq!(deleted, 20_000);
    assert_eq!(rows(&server), 500);
}

/// A million rows whose windows ended an hour ago (written as the store lays them out, as
/// if the server had been away for an hour) are all deleted by the background cleaner, in
/// bounded steps, while the live rows stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_expired_rows_are_swept_away() {
    let server = PostgresServer::start().expect("postgres");
    let url = format!("{}?cleanup_interval_ms=50&cleanup_pages=2048", server.url());
    let store = PostgresStore::connect(&url).await.expect("connect");
    let an_hour_ago = "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint - 3600000000";
    server
        .psql(&format!(
            "INSERT INTO sluice.counters (id, v, expires_at)
             SELECT 'app:login:user:' || n || ':5/m', ARRAY[{an_hour_ago}], {an_hour_ago}
             FROM generate_series(1, 1000000) n;
             INSERT INTO sluice.counters (id, v, expires_at)
             SELECT 'live:' || n, ARRAY[1::bigint], 9000000000000000
             FROM generate_series(1, 1000) n"
        ))
        .unwrap();
    let took = wait_for_rows(&server, 1_000, Duration::from_secs(120));
    println!("1,000,000 expired rows deleted in {took:?}");
    assert_eq!(rows(&server), 1_000, "live rows deleted");
    drop(store);
}
