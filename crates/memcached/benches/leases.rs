//! The cost of a concurrency lease on memcached: acquire + release per second on one key,
//! beside the rate check (GCRA) on one key of the same memcached, in the same run. Run:
//! `cargo bench -p sluice-memcached --bench leases`.
//!
//! 50 callers on a 2-worker runtime, rounds of 2 s alternating between the scenarios, 3
//! rounds each; the medians are printed. One operation of `acquire_release` is an admitted
//! acquire (the leaf has 64 slots, so every one finds a free slot) followed by its release:
//! two compare-and-swap steps on the lease set. `acquire_release_2_clients` splits the
//! callers over two clients of the store (two connections, as two app servers), whose
//! steps on the one set race each other (lost races are tried again); within one client
//! they are combined (see `src/cas.rs`). `rate_check` is one admitted GCRA decision.

use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Algorithm, Leaf, Quota, Rate, Span, Unit};
use sluice_limiter::{Identifier, LeaseKeys, Released, Store};
use sluice_memcached::MemcachedStore;
use sluice_testkit::MemcachedServer;
use sluice_testkit::bench::{BenchRule, calls_per_second, decisions_per_second, median};

const CALLERS: usize = 50;
const ROUND: Duration = Duration::from_secs(2);
const ROUNDS: usize = 3;
const SLOTS: u64 = 64;

/// Acquire + release pairs per second from `CALLERS` tasks on `stores` (in turn) and `id`.
async fn pairs_per_second(
    stores: &[MemcachedStore],
    quota: Quota,
    id: Arc<[Identifier; 1]>,
) -> f64 {
    calls_per_second(CALLERS, ROUND, |caller, round| {
        let (store, id) = (stores[caller % stores.len()].clone(), id.clone());
        async move {
            let rule = BenchRule::one_leaf(quota);
            let quotas = [quota];
            let keys = LeaseKeys {
                identifiers: &id[..],
                quotas: &quotas,
                held_for: None,
            };
            let mut lease = (caller as u64) << 40;
            while round.running() {
                lease += 1;
                let decision = store.acquire(&rule.hit(&id[..]), lease).await;
                assert!(decision.expect("an acquire").allowed(), "a free slot");
                let released = store.release(&keys, lease).await.expect("a release");
                assert_eq!(released, Released::Released);
                round.count();
            }
        }
    })
    .await
}

fn main() {
    let memcached = MemcachedServer::start_with(&["-t", "4"]).expect("memcached");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let connect = || {
        let builder = MemcachedStore::builder(&memcached.url()).timeout(Duration::from_secs(5));
        runtime
            .block_on(builder.connect())
            .expect("connect to memcached")
    };
    let one = [connect()];
    let two = [connect(), connect()];

    let lease = Span::new(1, Unit::Minute).unwrap();
    let leaf = Leaf::concurrent(SLOTS, Some(lease)).unwrap();
    let concurrent = Quota::from_leaf(&leaf, Algorithm::Gcra).unwrap();
    let rate = Rate::new(3_600_000_000, Span::new(1, Unit::Hour).unwrap()).unwrap();
    let gcra = Quota::from_leaf(&Leaf::new(rate), Algorithm::Gcra).unwrap();
    let lease_key = Arc::new([Identifier::new("bench:leases:queue:one:64c")]);
    let rate_key = Arc::new(vec![[Identifier::new(
        "bench:leases:user:one:3600000000/h",
    )]]);

    let (mut pairs, mut pairs_two, mut checks) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        pairs.push(runtime.block_on(pairs_per_second(&one, concurrent, lease_key.clone())));
        pairs_two.push(runtime.block_on(pairs_per_second(&two, concurrent, lease_key.clone())));
        let check = decisions_per_second(&one[0], gcra, rate_key.clone(), CALLERS, ROUND);
        checks.push(runtime.block_on(check));
    }
    let (pairs, pairs_two, checks) = (median(pairs), median(pairs_two), median(checks));
    println!(
        "scenario=keys_1_callers_{CALLERS} memcached_acquire_release_per_s={pairs:.0} \
         memcached_acquire_release_2_clients_per_s={pairs_two:.0} \
         memcached_rate_check_per_s={checks:.0} rate_checks_per_pair={:.2}",
        checks / pairs
    );
    let stats: Vec<_> = one.iter().chain(&two).map(MemcachedStore::stats).collect();
    let sum = |f: fn(&sluice_memcached::MemcachedStats) -> u64| stats.iter().map(f).sum::<u64>();
    println!(
        "memcached_store_stats contention_retries={} contention_exhausted={} leases_expired={}",
        sum(|s| s.contention_retries),
        sum(|s| s.contention_exhausted),
        sum(|s| s.leases_expired)
    );
}
