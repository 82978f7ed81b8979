//! Concurrency leases on real memcached, on a manual clock: the shared vectors
//! (`crates/core/tests/concurrency_vectors.json`) replayed through the store, and rules that
//! mix rate and concurrency leaves answering exactly as the memory store does, step by step.

use std::time::Duration;

use sluice_core::{Algorithm, Denial, Leaf, Quota, Span, Unit};
use sluice_limiter::{
    Acquired, Identifier, LeaseKeys, Limiter, ManualClock, MemoryStore, Policy, Released, Store,
};
use sluice_memcached::MemcachedStore;
use sluice_testkit::MemcachedServer;
use sluice_testkit::bench::BenchRule;
use sluice_testkit::vectors::u;

const VECTORS: &str = include_str!("../../core/tests/concurrency_vectors.json");
const ALICE: &[(&str, &str)] = &[("user", "alice")];
const MINUTE: Duration = Duration::from_secs(60);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

async fn store(server: &MemcachedServer, clock: &ManualClock) -> MemcachedStore {
    let store = MemcachedStore::builder(&server.url())
        .clock(clock.clone())
        .timeout(Duration::from_secs(5))
        .connect()
        .await;
    store.expect("connect to memcached")
}

fn released(name: &str) -> Released {
    match name {
        "released" => Released::Released,
        "expired" => Released::Expired,
        _ => Released::NotHeld,
    }
}

/// Every step of every shared vector, through the store's `acquire`, `release` and `renew`,
/// answers what the core computed (times in the vectors are microseconds; the store keeps
/// nanoseconds).
#[test]
fn replays_the_shared_concurrency_vectors() {
    let server = MemcachedServer::start().expect("memcached");
    runtime().block_on(async {
        let clock = ManualClock::new(0);
        let store = store(&server, &clock).await;
        let us = |n: u64| n * 1_000;
        let mut steps = 0;
        let vectors: serde_json::Value = serde_json::from_str(VECTORS).expect("JSON");
        for (case, vector) in vectors.as_array().expect("cases").iter().enumerate() {
            let lease_s = u(&vector["lease_us"]) / 1_000_000;
            let leaf = Leaf::concurrent(u(&vector["limit"]), Span::new(lease_s, Unit::Second).ok())
                .expect("a concurrency leaf");
            let quota = Quota::from_leaf(&leaf, Algorithm::Gcra).expect("a quota");
            let rule = BenchRule::one_leaf(quota);
            let id = [Identifier::new(format!("vectors:case{case}:concurrent"))];
            let quotas = [quota];
            let keys = LeaseKeys {
                identifiers: &id,
                quotas: &quotas,
                held_for: None,
            };
            for step in vector["steps"].as_array().expect("steps") {
                let (lease, now) = (u(&step["id"]), us(u(&step["now"])));
                clock.set(now);
                let at = format!("case {case}, {step}");
                match step["op"].as_str().expect("an op") {
                    "acquire" => {
                        let d = store.acquire(&rule.hit(&id), lease).await.expect(&at);
                        assert_eq!(d.allowed(), step["allowed"].as_bool().unwrap(), "{at}");
                        assert_eq!(d.remaining, u(&step["remaining"]), "{at}");
                        let reset = Duration::from_nanos(us(u(&step["reset_us"])));
                        assert_eq!(d.reset_after, reset, "{at}");
                        let denial = match step["retry_us"].as_i64() {
                            None => None,
                            Some(-1) => Some(Denial::CostExceedsCapacity),
                            Some(n) => Some(Denial::Occupied {
                                retry_after: Duration::from_nanos(us(n as u64)),
                            }),
                        };
                        assert_eq!(d.denial, denial, "{at}");
                    }
                    "release" => {
                        let found = store.release(&keys, lease).await.expect(&at);
                        let name = step["released"].as_str().unwrap();
                        assert_eq!(found, released(name), "{at}");
                    }
                    _ => {
                        let left = store.renew(&keys, lease).await.expect(&at);
                        let expected = step["expires_at"]
                            .as_u64()
                            .map(|e| Duration::from_nanos(us(e) - now));
                        assert_eq!(left, expected, "{at}");
                    }
                }
                steps += 1;
            }
        }
        assert!(steps >= 100, "only {steps} steps replayed");
    });
}

/// One step's answer, comparable across stores.
#[derive(Debug, PartialEq)]
enum Answer {
    Acquired(sluice_core::Decision, bool),
    Released(Released),
    Renewed(Option<Duration>),
}

async fn acquire(limiter: &Limiter) -> Acquired {
    limiter.acquire("p", ALICE).await.expect("acquire")
}

/// Runs one script of acquires, releases, renews and clock moves on `limiter`, answering
/// what each step said.
async fn script(limiter: &Limiter, clock: &ManualClock) -> Vec<Answer> {
    let mut answers = Vec::new();
    let mut held = Vec::new();
    for round in 0..4 {
        let a = acquire(limiter).await;
        answers.push(Answer::Acquired(a.checked.decision, a.lease.is_some()));
        held.extend(a.lease);
        if round == 2
            && let Some(first) = held.first()
        {
            answers.push(Answer::Renewed(first.renew().await.expect("renew")));
        }
        clock.advance(MINUTE);
    }
    if !held.is_empty() {
        let first = held.remove(0);
        answers.push(Answer::Released(first.release().await.expect("release")));
    }
    let a = acquire(limiter).await;
    answers.push(Answer::Acquired(a.checked.decision, a.lease.is_some()));
    held.extend(a.lease);
    // Past every lease time: the leases not renewed have expired.
    clock.advance(Duration::from_secs(3_600) - 3 * MINUTE);
    // Released, not renewed first: the memory store forgets a set whose every lease expired
    // when a renew touches it (a release then finds nothing), where memcached, as the core's
    // vectors, keeps it until an acquire drops it (a release then finds it expired).
    for lease in held.drain(..) {
        answers.push(Answer::Released(lease.release().await.expect("release")));
    }
    let a = acquire(limiter).await;
    answers.push(Answer::Acquired(a.checked.decision, a.lease.is_some()));
    if let Some(lease) = a.lease {
        lease.forget();
    }
    answers
}

/// Rules that mix rate and concurrency leaves (alone, in a list, under `and`, counting
/// denials) answer on memcached exactly as on the memory store, step by step: which leaf
/// decided, the denial and its wait, what remains, and what releases and renewals found.
#[test]
fn mixed_rules_answer_as_the_memory_store_does() {
    let rules = [
        ("user:2 concurrent lease=1h", false),
        ("user:3/h; user:1 concurrent lease=1h", false),
        ("user:1 concurrent lease=1h; user:2/h", false),
        ("user:2 concurrent lease=1h; user:1/h", false),
        ("and(user:1 concurrent lease=1h, user:3/h)", false),
        ("user:3/h; user:2 concurrent lease=1h", true),
        ("user:2 concurrent lease=1h", true),
    ];
    runtime().block_on(async {
        for (rule, count_denied) in rules {
            let start = 1_800_000_000_000_000_000;
            let policy = || Policy::new("p", rule).unwrap().count_denied(count_denied);
            let memory_clock = ManualClock::new(start);
            let memory = MemoryStore::builder().clock(memory_clock.clone()).build();
            let expected = Limiter::builder(memory.clone())
                .policy(policy())
                .build()
                .unwrap();
            let expected = script(&expected, &memory_clock).await;

            let server = MemcachedServer::start().expect("memcached");
            let clock = ManualClock::new(start);
            let store = store(&server, &clock).await;
            let on_memcached = Limiter::builder(store.clone())
                .policy(policy())
                .build()
                .unwrap();
            let answers = script(&on_memcached, &clock).await;
            assert_eq!(answers, expected, "{rule} (count denied: {count_denied})");
            let denied = expected
                .iter()
                .any(|a| matches!(a, Answer::Acquired(_, false)));
            assert!(denied, "{rule}: the script never filled the rule");
            assert_eq!(
                store.stats().leases_expired,
                memory.leases_expired(),
                "{rule}: leases expired"
            );
        }
    });
}

/// A concurrency leaf with more slots than one memcached item can hold is refused with a
/// clear error; one at the bound works.
#[test]
fn refuses_what_it_cannot_hold() {
    let server = MemcachedServer::start().expect("memcached");
    runtime().block_on(async {
        let clock = ManualClock::new(1_800_000_000_000_000_000);
        let store = store(&server, &clock).await;
        let big = Limiter::builder(store.clone())
            .policy(Policy::new("big", "user:10001 concurrent").unwrap())
            .build()
            .unwrap();
        let refused = big.acquire("big", ALICE).await;
        let message = refused.expect_err("too many slots").to_string();
        assert!(message.contains("10000"), "{message}");
        let fits = Limiter::builder(store.clone())
            .policy(Policy::new("fits", "user:10000 concurrent").unwrap())
            .build()
            .unwrap();
        assert!(fits.acquire("fits", ALICE).await.unwrap().lease.is_some());
    });
}

/// A lease whose holder vanished is dropped by the next acquire that finds it expired, and
/// counted; releasing it afterwards finds nothing. Before its expiry it holds its slot.
#[test]
fn abandoned_leases_are_dropped_and_counted() {
    let server = MemcachedServer::start().expect("memcached");
    runtime().block_on(async {
        let clock = ManualClock::new(1_800_000_000_000_000_000);
        let store = store(&server, &clock).await;
        let leaf = Leaf::concurrent(1, Span::new(60, Unit::Second).ok()).unwrap();
        let quota = Quota::from_leaf(&leaf, Algorithm::Gcra).unwrap();
        let rule = BenchRule::one_leaf(quota);
        let id = [Identifier::new("abandoned:job:user:alice:1c")];
        let quotas = [quota];
        let keys = LeaseKeys {
            identifiers: &id,
            quotas: &quotas,
            held_for: None,
        };
        assert!(store.acquire(&rule.hit(&id), 1).await.unwrap().allowed());
        clock.advance(Duration::from_secs(59));
        let denied = store.acquire(&rule.hit(&id), 2).await.unwrap();
        let wait = Some(Denial::Occupied {
            retry_after: Duration::from_secs(1),
        });
        assert_eq!(denied.denial, wait, "held until its lease time passes");
        clock.advance(Duration::from_secs(1));
        assert!(store.acquire(&rule.hit(&id), 3).await.unwrap().allowed());
        assert_eq!(store.stats().leases_expired, 1);
        assert_eq!(store.release(&keys, 1).await.unwrap(), Released::NotHeld);
        assert_eq!(store.renew(&keys, 1).await.unwrap(), None);
        assert_eq!(store.release(&keys, 3).await.unwrap(), Released::Released);
        assert_eq!(store.release(&keys, 3).await.unwrap(), Released::NotHeld);
        assert_eq!(store.stats().leases_expired, 1);
    });
}
