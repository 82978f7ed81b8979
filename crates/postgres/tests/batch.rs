//! Lean decisions batched into one `gcra_many` call: many more concurrent callers than
//! connections, so decisions queue and leave together. Each keeps its own exact answer (as if
//! decided one after another), and a batch that cannot reach the database fails every
//! decision in it, admitting none.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::{Algorithm, Leaf, Quota, Rate, Span, Unit};
use sluice_limiter::{Identifier, Store, StoreError};
use sluice_postgres::PostgresStore;
use sluice_testkit::PostgresServer;
use sluice_testkit::bench::BenchRule;
use sluice_testkit::proxy::{Fault, FaultProxy};

const KEYS: usize = 5;
const LIMIT: u64 = 20;
const HITS_PER_KEY: usize = 100;

fn quota() -> Quota {
    let rate = Rate::new(LIMIT, Span::new(1, Unit::Hour).unwrap()).unwrap();
    Quota::from_leaf(&Leaf::new(rate), Algorithm::Gcra).unwrap()
}

/// The calls of `gcra_many` the server counted; a backend's counts arrive when it exits, so
/// this waits (polling, up to 30 s) until they show.
fn batch_calls(server: &PostgresServer) -> u64 {
    let started = Instant::now();
    loop {
        let calls: u64 = server
            .psql(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions \
                 WHERE funcname = 'gcra_many'",
            )
            .expect("psql")
            .trim()
            .parse()
            .expect("a count");
        if calls > 0 || started.elapsed() > Duration::from_secs(30) {
            return calls;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_decisions_admit_exactly_the_limit_each_seeing_the_ones_before() {
    let server = PostgresServer::start_with(&["track_functions=pl"]).expect("postgres");
    let url = format!("{}?pool_size=2&timeout_ms=20000", server.url());
    let store = PostgresStore::connect(&url).await.expect("connect");
    let keys: Arc<Vec<[Identifier; 1]>> = Arc::new(
        (0..KEYS)
            .map(|k| [Identifier::new(format!("batch:key-{k}"))])
            .collect(),
    );
    let mut tasks = Vec::new();
    for i in 0..KEYS * HITS_PER_KEY {
        let (store, keys) = (store.clone(), keys.clone());
        tasks.push(tokio::spawn(async move {
            let rule = BenchRule::one_leaf(quota());
            let key = i % KEYS;
            (key, store.decide(&rule.hit(&keys[key])).await)
        }));
    }
    let mut remaining: Vec<Vec<u64>> = vec![Vec::new(); KEYS];
    for task in tasks {
        let (key, decision) = task.await.unwrap();
        let decision = decision.expect("a decision");
        if decision.allowed() {
            remaining[key].push(decision.remaining);
        }
    }
    for (key, mut seen) in remaining.into_iter().enumerate() {
        seen.sort_unstable();
        // Exactly the limit admitted per key, each admission seeing all the earlier ones.
        assert_eq!(
            seen,
            (0..LIMIT).collect::<Vec<_>>(),
            "key {key}: the remaining counts of its admitted hits"
        );
    }
    drop(store);
    // The decisions did queue and leave together.
    assert!(batch_calls(&server) > 0, "no batch was sent");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_connection_dies_fails_every_decision_in_it() {
    let server = PostgresServer::start().expect("postgres");
    let proxy = FaultProxy::start(([127, 0, 0, 1], server.port()).into()).expect("proxy");
    let url = format!(
        "postgres://postgres@{}/postgres?pool_size=2&timeout_ms=2000&connect_timeout_ms=200",
        proxy.address()
    );
    let store = PostgresStore::connect(&url).await.expect("connect");
    let key = [Identifier::new("batch:cut")];
    let rule = BenchRule::one_leaf(quota());
    assert!(store.decide(&rule.hit(&key)).await.expect("up").allowed());
    // Every connection, open or new, is closed from now on: no call reaches PostgreSQL.
    proxy.set(Fault::Reset);
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let key = [Identifier::new("batch:cut")];
            let rule = BenchRule::one_leaf(quota());
            store.decide(&rule.hit(&key)).await
        }));
    }
    for task in tasks {
        match task.await.unwrap() {
            Err(StoreError::Unavailable(_) | StoreError::Timeout(_)) => {}
            other => panic!("expected a transient failure, got {other:?}"),
        }
    }
    proxy.set(Fault::None);
    // Nothing was counted meanwhile: the next decision is the second admission. (The pool
    // may still hold a connection the proxy closed: its call fails, counting nothing.)
    let mut tries = 0;
    let next = loop {
        tries += 1;
        match store.decide(&rule.hit(&key)).await {
            Ok(decision) => break decision,
            Err(e) if tries < 10 && e.is_transient() => {}
            Err(e) => panic!("postgres does not answer again: {e}"),
        }
    };
    assert_eq!(next.remaining, LIMIT - 2);
}
