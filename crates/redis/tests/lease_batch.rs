//! Batching of lease steps: concurrent acquires, releases and renews of a rule of one
//! concurrency leaf go to Redis in shared script calls, and still each answer exactly as one
//! call each would, on one server and across the slots of a Cluster; a call whose connection
//! fails answers none of its steps; and the store counts the leases that expired unreleased.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_core::{Algorithm, Leaf, Quota, Span, Unit};
use sluice_limiter::{Identifier, LeaseKeys, Released, Store, StoreError};
use sluice_redis::RedisStore;
use sluice_testkit::bench::BenchRule;
use sluice_testkit::proxy::{Fault, FaultProxy};
use sluice_testkit::{RedisCluster, RedisServer};

/// `limit` concurrent, leases of `seconds`.
fn concurrent(limit: u64, seconds: u64) -> Quota {
    let lease = Span::new(seconds, Unit::Second).unwrap();
    Quota::from_leaf(
        &Leaf::concurrent(limit, Some(lease)).unwrap(),
        Algorithm::Gcra,
    )
    .unwrap()
}

async fn connect(url: &str) -> RedisStore {
    // A generous timeout: a loaded test machine's slow answer must not fail a step.
    RedisStore::builder(url)
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect")
}

/// Acquires lease `first + i` for each `i < count` on each key at once (all spawned before
/// any is awaited); per key, the `remaining` of each admitted acquire and its lease ids.
async fn acquire_all_at_once(
    store: &RedisStore,
    quota: Quota,
    keys: &[Identifier],
    first: u64,
    count: u64,
) -> BTreeMap<usize, (Vec<u64>, Vec<u64>)> {
    let mut tasks = Vec::new();
    for lease in first..first + count {
        for (k, identifier) in keys.iter().enumerate() {
            let (store, identifier) = (store.clone(), [identifier.clone()]);
            tasks.push(tokio::spawn(async move {
                let rule = BenchRule::one_leaf(quota);
                (k, lease, store.acquire(&rule.hit(&identifier), lease).await)
            }));
        }
    }
    let mut by_key: BTreeMap<usize, (Vec<u64>, Vec<u64>)> = BTreeMap::new();
    for task in tasks {
        let (k, lease, decision) = task.await.unwrap();
        let decision = decision.expect("a decision");
        let entry = by_key.entry(k).or_default();
        if decision.allowed() {
            entry.0.push(decision.remaining);
            entry.1.push(lease);
        } else {
            assert_eq!(decision.remaining, 0, "{decision:?}");
        }
    }
    by_key
}

/// Releases (or renews) leases `first..first + count` on each key at once; per key, the
/// leases whose release found them held (renewed, with `renew`).
async fn release_all_at_once(
    store: &RedisStore,
    quota: Quota,
    keys: &[Identifier],
    first: u64,
    count: u64,
    renew: bool,
) -> BTreeMap<usize, Vec<u64>> {
    let mut tasks = Vec::new();
    for lease in first..first + count {
        for (k, identifier) in keys.iter().enumerate() {
            let (store, identifier) = (store.clone(), [identifier.clone()]);
            tasks.push(tokio::spawn(async move {
                let quotas = [quota];
                let leases = LeaseKeys {
                    identifiers: &identifier,
                    quotas: &quotas,
                    held_for: None,
                };
                let held = if renew {
                    store.renew(&leases, lease).await.map(|left| left.is_some())
                } else {
                    let found = store.release(&leases, lease).await;
                    found.map(|found| {
                        assert_ne!(found, Released::Expired, "lease {lease}");
                        found == Released::Released
                    })
                };
                (k, lease, held.expect("an answer"))
            }));
        }
    }
    let mut by_key: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for task in tasks {
        let (k, lease, held) = task.await.unwrap();
        let entry = by_key.entry(k).or_default();
        if held {
            entry.push(lease);
        }
    }
    for held in by_key.values_mut() {
        held.sort_unstable();
    }
    by_key
}

/// On `keys` of `limit` slots: `count` acquires at once per key admit exactly `limit`
/// (remaining `limit - 1` down to 0, once each); renews and releases of all `count` find
/// exactly those; and the slots freed take exactly `limit` again.
async fn exactly_the_limit(store: &RedisStore, keys: &[Identifier], limit: u64, count: u64) {
    let quota = concurrent(limit, 3_600);
    let first = acquire_all_at_once(store, quota, keys, 0, count).await;
    assert_eq!(first.len(), keys.len());
    let mut holders = BTreeMap::new();
    for (k, (mut remaining, mut leases)) in first {
        remaining.sort_unstable();
        assert_eq!(remaining, (0..limit).collect::<Vec<_>>(), "key {k}");
        leases.sort_unstable();
        holders.insert(k, leases);
    }
    let renewed = release_all_at_once(store, quota, keys, 0, count, true).await;
    assert_eq!(
        renewed, holders,
        "renews found other leases than the holders"
    );
    let released = release_all_at_once(store, quota, keys, 0, count, false).await;
    assert_eq!(
        released, holders,
        "releases found other leases than the holders"
    );
    let again = acquire_all_at_once(store, quota, keys, count, count).await;
    for (k, (remaining, _)) in again {
        assert_eq!(remaining.len() as u64, limit, "key {k} after the releases");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_steps_on_one_key_hold_exactly_the_limit() {
    let server = RedisServer::start().expect("redis-server");
    let store = connect(&server.url()).await;
    let key = [Identifier::grouped("batch:x:", "one", ":5 concurrent")];
    exactly_the_limit(&store, &key, 5, 200).await;
    // 200 acquires, renews and releases, then 200 acquires.
    let calls = server.script_calls();
    assert!(
        calls < 400,
        "800 lease steps in {calls} script calls: nothing was batched"
    );
    assert_eq!(store.leases_expired(), 0);
}

/// Acquires and releases mixed in the same calls: 40 holders each taking and giving back
/// leases on 5 slots; the holders' own count never passes 5, every admitted lease releases
/// as held, and the slots all come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acquires_and_releases_mixed_never_hold_more_than_the_limit() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    let server = RedisServer::start().expect("redis-server");
    let store = connect(&server.url()).await;
    let quota = concurrent(5, 3_600);
    let key = [Identifier::grouped("batch:churn:", "one", ":5 concurrent")];
    let holding = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for holder in 0..40u64 {
        let (store, key) = (store.clone(), key.clone());
        let (holding, most) = (holding.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let (rule, quotas) = (BenchRule::one_leaf(quota), [quota]);
            let leases = LeaseKeys {
                identifiers: &key,
                quotas: &quotas,
                held_for: None,
            };
            let mut admitted = 0;
            for n in 0..30 {
                let lease = holder << 32 | n;
                if !store
                    .acquire(&rule.hit(&key), lease)
                    .await
                    .unwrap()
                    .allowed()
                {
                    continue;
                }
                admitted += 1;
                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                holding.fetch_sub(1, Ordering::SeqCst);
                let found = store.release(&leases, lease).await.unwrap();
                assert_eq!(found, Released::Released, "lease {lease}");
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 5, "{most} held at once");
    assert!(admitted >= 40, "only {admitted} admitted");
    let again = acquire_all_at_once(&store, quota, &key, 1 << 40, 50).await;
    assert_eq!(again[&0].0.len(), 5, "the slots did not all come back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_batch_mixing_slots_holds_exactly_the_limit_on_each() {
    let cluster = RedisCluster::start(3).expect("cluster");
    let store = connect(&cluster.url()).await;
    // 24 keys over many slots (and so all three masters), 12 acquires each on 5 slots.
    let keys: Vec<Identifier> = (0..24)
        .map(|i| Identifier::grouped("batch:x:user:", &format!("u{i}"), ":5 concurrent"))
        .collect();
    let slots: std::collections::BTreeSet<u16> =
        keys.iter().map(sluice_redis::script::slot_of).collect();
    assert!(slots.len() > 20, "the keys share slots: {slots:?}");
    exactly_the_limit(&store, &keys, 5, 12).await;
    let calls: u64 = cluster.nodes.iter().map(RedisServer::script_calls).sum();
    let steps = 4 * 12 * keys.len() as u64;
    assert!(
        calls < steps,
        "{steps} lease steps in {calls} script calls: nothing was batched"
    );
}

/// Lease steps whose connection fails: every step of a call that got no reply fails with
/// `Unavailable` or `Timeout`, never an answer; and no lease is reported taken that Redis
/// does not hold (a failed call may have taken its leases, never the other way round).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_batch_whose_connection_fails_answers_nothing() {
    let redis = RedisServer::start().expect("redis-server");
    let upstream = format!("127.0.0.1:{}", redis.port()).parse().unwrap();
    let proxy = FaultProxy::start(upstream).expect("proxy");
    let store = RedisStore::builder(&format!("redis://{}", proxy.address()))
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .expect("connect");
    let quota = concurrent(1_000, 3_600);
    let key = Identifier::grouped("faults:leases:", "one", ":1000 concurrent");
    let mut next_lease = 0;
    let mut at_once = |n: u64| {
        let tasks: Vec<_> = (next_lease..next_lease + n)
            .map(|lease| {
                let (store, key) = (store.clone(), [key.clone()]);
                tokio::spawn(async move {
                    store
                        .acquire(&BenchRule::one_leaf(quota).hit(&key), lease)
                        .await
                })
            })
            .collect();
        next_lease += n;
        async move {
            let mut results = Vec::new();
            for task in tasks {
                results.push(task.await.unwrap());
            }
            results
        }
    };
    let failed = |result: &Result<sluice_core::Decision, StoreError>| match result {
        Ok(_) => false,
        Err(StoreError::Unavailable(_) | StoreError::Timeout(_)) => true,
        Err(other) => panic!("a batch that lost its connection failed with {other:?}"),
    };
    let held = || {
        let key = "faults:leases:{one}:1000 concurrent";
        // A set of one lease is kept as a string.
        if redis.cli(&["TYPE", key]).expect("TYPE").trim() == "string" {
            return 1;
        }
        let count = redis.cli(&["ZCARD", key]).expect("ZCARD");
        count.trim().parse::<u64>().expect("a count")
    };

    for fault in [Fault::BlackHole, Fault::Reset] {
        proxy.set(fault);
        let results = at_once(50).await;
        assert!(results.iter().all(failed), "{fault:?}: {results:?}");
        proxy.set(Fault::None);
    }
    // A reply cut mid-way: the calls it held fail; others may be answered, truly.
    proxy.set(Fault::HalfClose);
    let results = at_once(50).await;
    proxy.set(Fault::None);
    assert!(results.iter().any(failed), "the half-close failed no call");
    let taken = results.iter().filter(|result| !failed(result)).count() as u64;
    assert!(
        results
            .iter()
            .filter(|r| !failed(r))
            .all(|r| r.as_ref().unwrap().allowed()),
        "{results:?}"
    );
    let held = held();
    assert!(
        taken <= held,
        "{taken} leases reported taken, {held} held by Redis"
    );
}

/// Redis's clock, in microseconds.
fn redis_now(server: &RedisServer) -> u64 {
    let time = server.cli(&["TIME"]).expect("TIME");
    let mut parts = time.split_whitespace().map(|n| n.parse::<u64>().unwrap());
    parts.next().unwrap() * 1_000_000 + parts.next().unwrap()
}

/// Waits until Redis's clock has passed `at` (microseconds): real time must pass for a
/// lease on Redis to expire.
async fn until(server: &RedisServer, at: u64) {
    while redis_now(server) <= at {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Leases that expired unreleased are counted: dropped by an acquire, or found expired by
/// their release; not those of a set whose key Redis deleted when its last lease expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_leases_are_counted() {
    let server = RedisServer::start().expect("redis-server");
    let store = connect(&server.url()).await;
    let quota = concurrent(3, 1);
    let key = [Identifier::grouped(
        "expired:",
        "one",
        ":3 concurrent lease=1s",
    )];
    let rule = BenchRule::one_leaf(quota);
    let quotas = [quota];
    // Held for no time by the holder's word: still, a lease of 1 s is within twice the
    // store's timeout of its expiry, so each release asks the lease's expiry and can
    // answer `Expired` (a release by `ZREM` alone could not).
    let leases = LeaseKeys {
        identifiers: &key,
        quotas: &quotas,
        held_for: Some(Duration::ZERO),
    };
    let acquire = |lease| {
        let (store, hit) = (store.clone(), rule.hit(&key));
        async move {
            let decision = store.acquire(&hit, lease).await.expect("acquire");
            assert!(decision.allowed(), "lease {lease}: {decision:?}");
        }
    };
    const SECOND: u64 = 1_000_000;

    // Lease 1 expires by `taken_1 + 1 s`; lease 2, taken half a second later, keeps the key.
    acquire(1).await;
    let taken_1 = redis_now(&server);
    until(&server, taken_1 + SECOND / 2).await;
    let before_2 = redis_now(&server);
    acquire(2).await;
    let taken_2 = redis_now(&server);
    // Lease 1 has expired, lease 2 (from `before_2 + 1 s` on) not yet: the acquire of 3
    // drops 1.
    until(&server, taken_1 + SECOND).await;
    assert!(
        redis_now(&server) < before_2 + SECOND,
        "the machine is too slow"
    );
    let before_3 = redis_now(&server);
    acquire(3).await;
    assert_eq!(store.leases_expired(), 1, "lease 1, dropped by an acquire");
    assert_eq!(
        store.release(&leases, 1).await.unwrap(),
        Released::NotHeld,
        "lease 1 went when it was dropped"
    );
    assert_eq!(store.leases_expired(), 1);
    // Lease 2 expired, lease 3 keeps the key: the release finds 2 expired.
    until(&server, taken_2 + SECOND).await;
    assert!(
        redis_now(&server) < before_3 + SECOND,
        "the machine is too slow"
    );
    assert_eq!(store.release(&leases, 2).await.unwrap(), Released::Expired);
    assert_eq!(
        store.leases_expired(),
        2,
        "lease 2, found expired by its release"
    );
    // Lease 3 expired with its key: Redis deleted the set, and no step counts it.
    until(&server, redis_now(&server) + SECOND + SECOND / 10).await;
    acquire(4).await;
    assert_eq!(
        store.release(&leases, 3).await.unwrap(),
        Released::NotHeld,
        "lease 3 went with its key"
    );
    assert_eq!(store.leases_expired(), 2, "lease 3 is not counted");
}

/// On a set of several leases (a sorted set), a release whose holder has held the lease for
/// much less than its lease time is one `ZREM`; one near the end of its lease time (within
/// twice the store's timeout), or whose age is unknown, asks the lease's expiry first
/// (`ZSCORE`), as it could have expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_far_from_expiry_does_not_ask_the_expiry() {
    let server = RedisServer::start().expect("redis-server");
    let store = connect(&server.url()).await; // a timeout of 5 s
    let quota = concurrent(3, 60);
    let key = [Identifier::grouped("far:", "one", ":3 concurrent")];
    let (rule, quotas) = (BenchRule::one_leaf(quota), [quota]);
    // A lease held throughout: the set always holds two or one, never a set of one lease
    // kept as a string (see the next test).
    let mut lease = 100;
    assert!(
        store
            .acquire(&rule.hit(&key), lease)
            .await
            .unwrap()
            .allowed()
    );
    for (held_for, asks) in [
        (Some(Duration::ZERO), false),
        (Some(Duration::from_secs(49)), false),
        (Some(Duration::from_secs(50)), true),
        (None, true),
    ] {
        lease += 1;
        assert!(
            store
                .acquire(&rule.hit(&key), lease)
                .await
                .unwrap()
                .allowed()
        );
        let before = server.calls("zscore");
        let leases = LeaseKeys {
            identifiers: &key,
            quotas: &quotas,
            held_for,
        };
        assert_eq!(
            store.release(&leases, lease).await.unwrap(),
            Released::Released
        );
        assert_eq!(
            server.calls("zscore") - before,
            u64::from(asks),
            "held for {held_for:?}"
        );
        // Released once, the lease is not held: both kinds of release say so.
        assert_eq!(
            store.release(&leases, lease).await.unwrap(),
            Released::NotHeld
        );
    }
}

/// A set of one lease is kept as a string: its acquire is one `SET NX` and its release one
/// `GETDEL`, whatever the holder knows of the lease's age, and the release answers as on a
/// sorted set: released once, then not held; another holder's lease stays where it was,
/// with its key's expiry; a lease its set outlived answers `Expired`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_of_one_lease_is_one_set_and_one_getdel() {
    let server = RedisServer::start().expect("redis-server");
    let store = connect(&server.url()).await;
    let quota = concurrent(3, 60);
    let key = [Identifier::grouped("one:", "alone", ":3 concurrent")];
    let (rule, quotas) = (BenchRule::one_leaf(quota), [quota]);
    let name = || {
        let keys = server.cli(&["KEYS", "one:*"]).expect("KEYS");
        keys.trim().to_owned()
    };
    for held_for in [Some(Duration::ZERO), None] {
        let leases = LeaseKeys {
            identifiers: &key,
            quotas: &quotas,
            held_for,
        };
        let (set_before, getdel_before) = (server.calls("set"), server.calls("getdel"));
        assert!(store.acquire(&rule.hit(&key), 7).await.unwrap().allowed());
        assert_eq!(server.calls("set") - set_before, 1);
        assert_eq!(server.cli(&["TYPE", &name()]).unwrap().trim(), "string");
        // Another holder's lease: not released, and its set kept with its expiry.
        assert_eq!(store.release(&leases, 8).await.unwrap(), Released::NotHeld);
        assert_eq!(server.cli(&["TYPE", &name()]).unwrap().trim(), "string");
        let ttl: i64 = server
            .cli(&["PTTL", &name()])
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(ttl > 55_000 && ttl <= 60_000, "{ttl} ms left");
        assert_eq!(store.release(&leases, 7).await.unwrap(), Released::Released);
        assert_eq!(server.calls("getdel") - getdel_before, 2);
        assert_eq!(name(), "", "the set went with its lease");
        assert_eq!(store.release(&leases, 7).await.unwrap(), Released::NotHeld);
    }
    assert_eq!(server.calls("zscore"), 0);
    assert_eq!(server.calls("zadd"), 0);

    // A second lease turns the set into a sorted set of both, the first's expiry kept.
    assert!(store.acquire(&rule.hit(&key), 1).await.unwrap().allowed());
    let decision = store.acquire(&rule.hit(&key), 2).await.unwrap();
    assert!(decision.allowed());
    assert_eq!(decision.remaining, 1);
    assert_eq!(server.cli(&["TYPE", &name()]).unwrap().trim(), "zset");
    assert_eq!(server.cli(&["ZCARD", &name()]).unwrap().trim(), "2");

    // A lease of 1 s on a set of its own, released after its expiry by the holder's word
    // unknown: `Expired` while the key lives (it outlives the lease by under 1 ms, so the
    // key's expiry is moved on by hand here).
    let short = concurrent(3, 1);
    let key = [Identifier::grouped("one:", "short", ":3 concurrent")];
    assert!(
        store
            .acquire(&BenchRule::one_leaf(short).hit(&key), 9)
            .await
            .unwrap()
            .allowed()
    );
    let short_name = server
        .cli(&["KEYS", "one:{short}*"])
        .unwrap()
        .trim()
        .to_owned();
    server.cli(&["PEXPIRE", &short_name, "60000"]).unwrap();
    let until = redis_now(&server) + 1_100_000;
    self::until(&server, until).await;
    let leases = LeaseKeys {
        identifiers: &key,
        quotas: &[short],
        held_for: None,
    };
    assert_eq!(store.release(&leases, 9).await.unwrap(), Released::Expired);
}
