//! Concurrency leases through the PostgreSQL store beside the rate check on the same server
//! and pool, in one run: 50 concurrent callers, each taking a lease and releasing it (one
//! `acquire` and one `release` call) or deciding one GCRA hit, on 1 key and on 10,000 keys.
//! Every acquire is admitted (64 slots a key, more than the callers), so each takes the write
//! path. Rounds alternate; medians of 3.
//! Run: `cargo bench -p sluice-postgres --bench leases`.
//!
//! The yardstick for remote stores: acquire + release costs at most 2 rate checks,
//! so `pairs/s` should be at least half of `checks/s`.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Algorithm, Leaf, Quota, Rate, Span, Unit};
use sluice_limiter::{Identifier, LeaseKeys, Released, Store};
use sluice_postgres::PostgresStore;
use sluice_testkit::PostgresServer;
use sluice_testkit::bench::{BenchRule, calls_per_second, decisions_per_second, median};

const CALLERS: usize = 50;
const ROUND: Duration = Duration::from_secs(3);
const ROUNDS: usize = 3;

/// Acquire + release pairs per second from `CALLERS` tasks walking `keys`.
async fn pairs_per_second(
    store: &PostgresStore,
    quota: Quota,
    keys: Arc<Vec<[Identifier; 1]>>,
) -> f64 {
    calls_per_second(CALLERS, ROUND, |caller, round| {
        let (store, keys) = (store.clone(), keys.clone());
        async move {
            let rule = BenchRule::one_leaf(quota);
            let quotas = [quota];
            let mut i = caller;
            let mut lease = (caller as u64) << 40;
            while round.running() {
                let id = &keys[i % keys.len()];
                lease += 1;
                let decision = store.acquire(&rule.hit(id), lease).await.expect("acquire");
                assert!(decision.allowed(), "64 slots a key admit every caller");
                let held = LeaseKeys {
                    identifiers: id,
                    quotas: &quotas,
                    held_for: None,
                };
                let released = store.release(&held, lease).await.expect("release");
                assert_eq!(released, Released::Released);
                round.count();
                i += 7919;
            }
        }
    })
    .await
}

fn keys(prefix: &str, n: usize, suffix: &str) -> Arc<Vec<[Identifier; 1]>> {
    Arc::new(
        (0..n)
            .map(|i| [Identifier::new(format!("{prefix}:{i:08}{suffix}"))])
            .collect(),
    )
}

fn main() {
    let postgres = PostgresServer::start().expect("postgres (apt-get install postgresql)");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let url = format!("{}?pool_size=16&timeout_ms=5000", postgres.url());
    let store = runtime
        .block_on(PostgresStore::connect(&url))
        .expect("connect");
    println!("postgres pool_size=16 callers={CALLERS} round={ROUND:?} rounds={ROUNDS}");
    let hour = Span::new(1, Unit::Hour).unwrap();
    let slots = Quota::from_leaf(&Leaf::concurrent(64, Some(hour)).unwrap(), Algorithm::Gcra);
    let slots = slots.unwrap();
    let rate = Rate::new(1_000_000, Span::new(1, Unit::Second).unwrap()).unwrap();
    let gcra = Quota::from_leaf(&Leaf::new(rate), Algorithm::Gcra).unwrap();
    for n in [1, 10_000] {
        let lease_keys = keys("lease", n, ":concurrent");
        let rate_keys = keys("rate", n, ":1000000/s");
        let (mut pairs, mut checks) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            pairs.push(runtime.block_on(pairs_per_second(&store, slots, lease_keys.clone())));
            checks.push(runtime.block_on(decisions_per_second(
                &store,
                gcra,
                rate_keys.clone(),
                CALLERS,
                ROUND,
            )));
        }
        let (p, c) = (median(pairs.clone()), median(checks.clone()));
        println!(
            "keys={n:<6} acquire+release pairs/s={p:>9.0} gcra checks/s={c:>9.0} \
             pair = {:.2} checks  (rounds: pairs {pairs:.0?}, checks {checks:.0?})",
            c / p
        );
    }
}
