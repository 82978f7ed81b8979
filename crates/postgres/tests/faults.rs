//! PostgreSQL killed with SIGKILL under load and restarted: each policy's failure mode
//! answers within the timeout, decisions come back from the database within 10 s of the
//! restart, and nothing is admitted twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sluice_limiter::{Denial, FailureMode, Limiter, Policy};
use sluice_postgres::PostgresStore;
use sluice_testkit::PostgresServer;
use sluice_testkit::load::{
    assert_failure_modes, checks, failure_policies, until_the_store_answers,
};

const TIMEOUT: Duration = Duration::from_millis(250);
/// The limit of the policy whose count must survive the crash.
const EXACT: usize = 400;

/// Counts of the `exact` policy's answers while the load runs.
#[derive(Default)]
struct Tally {
    /// Admitted by the database.
    admitted: AtomicUsize,
    /// Denied by the database for the limit.
    limited: AtomicUsize,
    /// Answered by the failure mode (closed: denied) while the database was away.
    without_store: AtomicUsize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_postgres_follows_the_failure_mode_then_recovers_counting_nothing_twice() {
    let mut postgres = PostgresServer::start().expect("postgres");
    let url = format!(
        "{}?pool_size=8&timeout_ms={}&connect_timeout_ms=200",
        postgres.url(),
        TIMEOUT.as_millis()
    );
    let store = PostgresStore::connect(&url).await.expect("connect");
    let mut policies = failure_policies("");
    policies.push(
        Policy::new("exact", &format!("user:{EXACT}/10y algorithm=fixed-window"))
            .unwrap()
            .failure(FailureMode::Closed),
    );
    let limiter = Arc::new(Limiter::builder(store).policies(policies).build().unwrap());
    assert!(
        checks(&limiter, "open", "a", 8, 10)
            .await
            .iter()
            .all(|(c, _)| c.without_store.is_none())
    );

    // Load on `exact` from 16 tasks for the whole test.
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for _ in 0..16 {
        let (limiter, tally, stop) = (limiter.clone(), tally.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let checked = limiter.check("exact", &[("user", "x")], 1).await.unwrap();
                let counter = match (checked.without_store.is_some(), checked.decision.denial) {
                    (true, _) => &tally.without_store,
                    (false, None) => &tally.admitted,
                    (false, Some(Denial::Limited { .. })) => &tally.limited,
                    (false, other) => panic!("unexpected denial {other:?}"),
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if tally.limited.load(Ordering::Relaxed) > 0 {
                    return;
                }
                // Keep the count from reaching the limit before the restart.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while tally.admitted.load(Ordering::Relaxed) < 50 {
        assert!(Instant::now() < deadline, "the load made no progress");
        tokio::time::sleep(Duration::from_millis(10)).await; // polling the load's progress
    }

    postgres.kill();
    // No hang: at most the store timeout (plus scheduling) per decision.
    assert_failure_modes(&limiter, TIMEOUT + Duration::from_millis(800)).await;
    let admitted_before_restart = tally.admitted.load(Ordering::Relaxed);
    assert!(
        admitted_before_restart < EXACT / 2,
        "the load was meant to stay far from the limit"
    );

    postgres.restart().expect("restart postgres");
    let restarted = Instant::now();
    until_the_store_answers(&limiter, Duration::from_secs(10)).await;
    println!("decisions back {:?} after the restart", restarted.elapsed());

    // Let the load run into the limit, then count.
    let deadline = Instant::now() + Duration::from_secs(60);
    while tally.limited.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "the limit was never reached");
        tokio::time::sleep(Duration::from_millis(10)).await; // polling the load's progress
    }
    stop.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    let admitted = tally.admitted.load(Ordering::Relaxed);
    let in_doubt = tally.without_store.load(Ordering::Relaxed);
    println!("admitted {admitted}, answered without the store {in_doubt}");
    assert!(in_doubt > 0, "the kill was never noticed by the load");
    // Nothing admitted twice: every admission counted once, across the crash. An answer
    // lost with the server may have counted without being admitted, never the reverse.
    assert!(admitted <= EXACT, "admitted {admitted} of {EXACT}");
    assert!(
        admitted + in_doubt >= EXACT,
        "admitted {admitted}, {in_doubt} in doubt: counts were lost"
    );
}
