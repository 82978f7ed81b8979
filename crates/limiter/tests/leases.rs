//! Concurrency leases and reservations on the memory store, on a manual clock: expiry,
//! renew, double release, release of an expired lease, rules mixing rates and leases, and
//! reservations settled with random actual costs.

use std::time::Duration;

use sluice_limiter::{
    Denial, Error, LeaseId, Limiter, ManualClock, MemoryStore, Policy, Released, StoreError,
};

const ALICE: &[(&str, &str)] = &[("user", "alice")];
const START: u64 = 1_700_000_000_000_000_000;

fn limiter(clock: &ManualClock, policies: &[(&str, &str)]) -> Limiter {
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let policies = policies
        .iter()
        .map(|(name, rule)| Policy::new(*name, rule).unwrap());
    Limiter::builder(store)
        .clock(clock.clone())
        .policies(policies)
        .build()
        .unwrap()
}

fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(future)
}

#[test]
fn a_lease_expires_after_its_lease_time_and_not_before() {
    let clock = ManualClock::new(START);
    let limiter = limiter(&clock, &[("job", "user:1 concurrent lease=30s")]);
    block_on(async {
        let lease = limiter.acquire("job", ALICE).await.unwrap().lease.unwrap();
        clock.advance(Duration::from_secs(29));
        let denied = limiter.acquire("job", ALICE).await.unwrap();
        assert_eq!(
            denied.checked.decision.denial,
            Some(Denial::Occupied {
                retry_after: Duration::from_secs(1)
            })
        );
        clock.advance(Duration::from_secs(1));
        let next = limiter.acquire("job", ALICE).await.unwrap();
        assert!(next.lease.is_some(), "expired at exactly 30 s");
        // The first holder comes back late: its lease is gone, harmlessly.
        assert_eq!(lease.renew().await.unwrap(), None);
        assert_eq!(lease.release().await.unwrap(), Released::NotHeld);
        let stats = limiter.store().as_memory().unwrap().leases_expired();
        assert_eq!(stats, 1, "the expired lease was counted");
    });
}

#[test]
fn renew_extends_a_lease_by_one_lease_time_from_now() {
    let clock = ManualClock::new(START);
    let limiter = limiter(&clock, &[("job", "user:1 concurrent lease=10s")]);
    block_on(async {
        let lease = limiter.acquire("job", ALICE).await.unwrap().lease.unwrap();
        clock.advance(Duration::from_secs(8));
        assert_eq!(lease.renew().await.unwrap(), Some(Duration::from_secs(10)));
        clock.advance(Duration::from_secs(9)); // 17 s: past the first expiry
        assert!(limiter.acquire("job", ALICE).await.unwrap().lease.is_none());
        clock.advance(Duration::from_secs(1)); // 18 s: the renewed expiry
        assert!(limiter.acquire("job", ALICE).await.unwrap().lease.is_some());
    });
}

#[test]
fn double_release_and_release_of_an_expired_lease_are_reported() {
    let clock = ManualClock::new(START);
    let limiter = limiter(&clock, &[("job", "user:2 concurrent lease=10s")]);
    block_on(async {
        let a = limiter.acquire("job", ALICE).await.unwrap().lease.unwrap();
        let b = limiter.acquire("job", ALICE).await.unwrap().lease.unwrap();
        let id = a.id();
        assert_eq!(a.release().await.unwrap(), Released::Released);
        // A second release by id (as a remote client may send) finds nothing.
        let store = limiter.store().as_memory().unwrap().clone();
        let policy = limiter.policy("job").unwrap();
        let ids = [sluice_limiter::Identifier::new(
            "sluice:job:user:alice:concurrent",
        )];
        let keys = sluice_limiter::LeaseKeys {
            identifiers: &ids,
            quotas: &policy.quotas,
            held_for: None,
        };
        assert_eq!(store.release_now(&keys, id.0), Released::NotHeld);
        // b is still held under that identifier: releasing someone else's id frees nothing.
        assert_eq!(store.release_now(&keys, id.0 ^ 1), Released::NotHeld);
        assert_eq!(
            limiter
                .acquire("job", ALICE)
                .await
                .unwrap()
                .checked
                .decision
                .remaining,
            0
        );
        clock.advance(Duration::from_secs(10));
        // b expired but is still in the set until something drops it.
        let b_id = b.forget();
        assert_eq!(store.release_now(&keys, b_id.0), Released::Expired);
    });
}

#[test]
fn rate_and_concurrency_leaves_decide_together() {
    let clock = ManualClock::new(START);
    let limiter = limiter(&clock, &[("export", "user:3/h; user:2 concurrent")]);
    block_on(async {
        let a = limiter.acquire("export", ALICE).await.unwrap();
        let b = limiter.acquire("export", ALICE).await.unwrap();
        // Both slots held: denied by the concurrency leaf, and the rate is not charged.
        let c = limiter.acquire("export", ALICE).await.unwrap();
        assert!(matches!(
            c.checked.decision.denial,
            Some(Denial::Occupied { .. })
        ));
        drop(a);
        drop(b);
        let d = limiter.acquire("export", ALICE).await.unwrap();
        assert!(d.lease.is_some(), "third of three per hour");
        drop(d);
        // A slot is free, but the rate is spent: a rate denial, with a real retry time.
        let e = limiter.acquire("export", ALICE).await.unwrap();
        assert!(e.lease.is_none());
        assert!(matches!(
            e.checked.decision.denial,
            Some(Denial::Limited { .. })
        ));
        assert_eq!(e.checked.leaf().leaf.to_string(), "user:3/h");
    });
}

#[test]
fn checks_on_concurrency_rules_and_leases_on_other_stores_are_clear_errors() {
    let clock = ManualClock::new(START);
    let limiter = limiter(&clock, &[("job", "user:1 concurrent")]);
    block_on(async {
        let err = limiter.check("job", ALICE, 1).await.unwrap_err();
        assert!(err.to_string().contains("acquire"), "{err}");
        assert!(matches!(
            limiter.peek("job", ALICE, 1).await,
            Err(Error::NeedsAcquire(_))
        ));
        assert!(matches!(
            limiter.try_check_now("job", ALICE, 1),
            Some(Err(Error::NeedsAcquire(_)))
        ));
        assert!(matches!(
            limiter.reserve("job", ALICE, 5).await,
            Err(Error::ReserveConcurrency(_))
        ));
        assert!(matches!(
            limiter.acquire("job", &[]).await,
            Err(Error::MissingSelector { .. })
        ));
        // Nothing was held by the refused calls.
        assert!(limiter.acquire("job", ALICE).await.unwrap().lease.is_some());
    });
    // A store that does not implement leases says so.
    let other = Limiter::builder(NoLeases(MemoryStore::new()))
        .policy(Policy::new("job", "user:1 concurrent").unwrap())
        .policy(Policy::new("tokens", "user:100/m").unwrap())
        .build()
        .unwrap();
    block_on(async {
        let err = other.acquire("job", ALICE).await.unwrap_err();
        assert!(
            matches!(err, Error::Store(StoreError::Unsupported(_))),
            "{err}"
        );
        assert!(!err.is_transient());
        assert!(err.to_string().contains("not supported"), "{err}");
        // A remote store's acquire writes the identifier before its call, and a missing
        // selector stops it there, as on the memory store.
        assert!(matches!(
            other.acquire("job", &[]).await,
            Err(Error::MissingSelector { .. })
        ));
        let err = other.reserve("tokens", ALICE, 5).await.unwrap_err();
        assert!(
            matches!(err, Error::Store(StoreError::Unsupported(_))),
            "{err}"
        );
    });
}

/// A store that only decides rates, as every store but memory in this phase.
struct NoLeases(MemoryStore);

impl sluice_limiter::Store for NoLeases {
    async fn decide(
        &self,
        hit: &sluice_limiter::Hit<'_>,
    ) -> Result<sluice_limiter::Decision, StoreError> {
        Ok(self.0.decide_now(hit))
    }

    async fn reset(&self, identifiers: &[sluice_limiter::Identifier]) -> Result<(), StoreError> {
        sluice_limiter::Store::reset(&self.0, identifiers).await
    }
}

#[test]
fn policy_text_reports_bad_concurrency_leaves() {
    for (rule, expected) in [
        ("user:3 concurrent lease=0s", "column 25"),
        ("user:3 concurrent lease=-1s", "column 25"),
        ("user:3 concurrent burst=2", "column 19"),
    ] {
        let err = Policy::new("p", rule).unwrap_err();
        assert!(err.to_string().contains(expected), "{rule}: {err}");
    }
}

/// A store in "another process": the memory store behind the generic, boxed path, so a
/// dropped lease is released by a spawned task rather than at once.
struct Remote(MemoryStore);

impl sluice_limiter::Store for Remote {
    async fn decide(
        &self,
        hit: &sluice_limiter::Hit<'_>,
    ) -> Result<sluice_limiter::Decision, StoreError> {
        Ok(self.0.decide_now(hit))
    }

    async fn reset(&self, identifiers: &[sluice_limiter::Identifier]) -> Result<(), StoreError> {
        sluice_limiter::Store::reset(&self.0, identifiers).await
    }

    async fn acquire(
        &self,
        hit: &sluice_limiter::Hit<'_>,
        lease: u64,
    ) -> Result<sluice_limiter::Decision, StoreError> {
        Ok(self.0.acquire_now(hit, lease))
    }

    async fn release(
        &self,
        leases: &sluice_limiter::LeaseKeys<'_>,
        lease: u64,
    ) -> Result<Released, StoreError> {
        tokio::task::yield_now().await; // a round trip
        Ok(self.0.release_now(leases, lease))
    }
}

#[test]
fn a_lease_dropped_on_a_remote_store_is_released_by_a_task() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let limiter = Limiter::builder(Remote(MemoryStore::new()))
        .policy(Policy::new("job", "user:1 concurrent lease=1h").unwrap())
        .build()
        .unwrap();
    runtime.block_on(async {
        let lease = limiter.acquire("job", ALICE).await.unwrap().lease.unwrap();
        assert!(limiter.acquire("job", ALICE).await.unwrap().lease.is_none());
        drop(lease);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if limiter.acquire("job", ALICE).await.unwrap().lease.is_some() {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "never released");
            tokio::task::yield_now().await;
        }
    });
}

/// Lease ids taken on many threads at once never repeat: each thread draws from a block of
/// numbers of its own, and the blocks never overlap.
#[test]
fn lease_ids_from_many_threads_are_distinct() {
    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(|| (0..20_000).map(|_| LeaseId::random().0).collect::<Vec<_>>())
        })
        .collect();
    let mut ids: Vec<u64> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let taken = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), taken, "a lease id was given twice");
}
