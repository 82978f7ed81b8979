//! Concurrency cases: leases never exceed the limit, release frees a slot at once, renew
//! keeps a lease, an abandoned lease expires by itself, and a check cannot take a lease.
//!
//! Run by [`concurrency_conformance_tests!`](crate::concurrency_conformance_tests), apart
//! from the rate cases, so that a store without leases can run the rate cases alone.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sluice_core::Denial;

use super::StoreFactory;
use super::harness::{ALICE, BOB, HOUR, Namespace, TASKS, limiter};
use crate::{Acquired, Error, Lease, Limiter, Released, Selectors, SlotPermit};

async fn acquire(limiter: &Limiter, policy: &str, selectors: &Selectors<'_>) -> Acquired {
    let acquired = limiter.acquire(policy, selectors).await;
    acquired.unwrap_or_else(|e| panic!("acquire {policy} {selectors:?}: {e}"))
}

/// 64 tasks over two limiters (two app servers) take leases on `x:3 concurrent`, half by
/// policy name and selectors, a quarter through each server's [`Slots`](crate::Slots) of
/// the key and a quarter as their [`SlotPermit`](crate::SlotPermit)s, each holding a few
/// milliseconds, retrying until admitted: the holders' own count never exceeds 3, and
/// every task is served before the deadline.
pub async fn leases_never_exceed_the_limit<F: StoreFactory>(factory: &F) {
    const LIMIT: usize = 3;
    let ns = Namespace::new("leases-race");
    let policies = || [ns.policy("x", "x:3 concurrent lease=1h")];
    let servers = [limiter(factory, policies()), limiter(factory, policies())];
    let slots = servers
        .each_ref()
        .map(|server| server.slots("x", &[("x", "one")]).expect("slots"));
    let holding = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs(60);
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let limiter = servers[task % 2].clone();
            let slots = (task % 4 >= 2).then(|| slots[task % 2].clone());
            let (holding, most) = (holding.clone(), most.clone());
            tokio::spawn(async move {
                let mut attempts = 0u32;
                loop {
                    attempts += 1;
                    let (held, denial) = match &slots {
                        Some(slots) if task % 4 == 3 => {
                            match slots.permit().await.expect("a permit of slots") {
                                Ok(permit) => (Some(Holding::Permit(permit)), None),
                                Err(decision) => (None, decision.denial),
                            }
                        }
                        Some(slots) => {
                            Holding::of(slots.acquire().await.expect("acquire through slots"))
                        }
                        None => Holding::of(acquire(&limiter, "x", &[("x", "one")]).await),
                    };
                    if let Some(held) = held {
                        let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        // Hold a few ms (1 to 4, by task), as real work would.
                        tokio::time::sleep(Duration::from_millis(1 + task as u64 % 4)).await;
                        holding.fetch_sub(1, Ordering::SeqCst);
                        let released = held.release().await.expect("release");
                        assert_eq!(released, Released::Released, "task {task}");
                        return attempts;
                    }
                    assert!(
                        matches!(denial, Some(Denial::Occupied { .. })),
                        "task {task}: {denial:?}"
                    );
                    assert!(Instant::now() < deadline, "task {task} was never served");
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a task panicked");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= LIMIT, "{most} holders at once, limit {LIMIT}");
    assert!(most >= 2, "the race never overlapped holders ({most})");
    // Every lease was released: all three slots are free again.
    let d = acquire(&servers[0], "x", &[("x", "one")]).await;
    assert_eq!(d.checked.decision.remaining, 2);
}

/// What a task of the race holds while it works: a lease, or a permit of its slots.
enum Holding<'a> {
    Lease(Lease),
    Permit(SlotPermit<'a>),
}

impl Holding<'_> {
    /// The lease an acquire took, if any, and the denial that refused it.
    fn of(acquired: Acquired) -> (Option<Holding<'static>>, Option<Denial>) {
        let denial = acquired.checked.decision.denial;
        (acquired.lease.map(Holding::Lease), denial)
    }

    async fn release(self) -> Result<Released, Error> {
        match self {
            Holding::Lease(lease) => lease.release().await,
            Holding::Permit(permit) => permit.release().await,
        }
    }
}

/// Releasing frees a slot at once; releasing twice is harmless and reported; a lease of one
/// key does not free another's.
pub async fn release_frees_at_once<F: StoreFactory>(factory: &F) {
    let ns = Namespace::new("leases-release");
    let limiter = limiter(factory, [ns.policy("export", "user:2 concurrent lease=1h")]);
    let first = acquire(&limiter, "export", ALICE).await;
    assert_eq!(first.checked.decision.remaining, 1);
    assert_eq!(first.checked.decision.limit, 2);
    let second = acquire(&limiter, "export", ALICE).await;
    let denied = acquire(&limiter, "export", ALICE).await;
    assert!(denied.lease.is_none());
    match denied.checked.decision.denial {
        Some(Denial::Occupied { retry_after }) => {
            assert!(retry_after <= HOUR && retry_after > HOUR - Duration::from_secs(60));
        }
        other => panic!("expected occupied, got {other:?}"),
    }
    // Bob's slots are his own.
    assert!(acquire(&limiter, "export", BOB).await.lease.is_some());
    let first = first.lease.expect("admitted");
    assert_eq!(first.release().await.unwrap(), Released::Released);
    let third = acquire(&limiter, "export", ALICE).await;
    assert!(third.lease.is_some(), "a released slot is free at once");
    // Dropping releases too: at once in process, on a background task for a remote store
    // (a drop never waits on the network), so a remote store's slot frees soon after.
    drop(third);
    let fourth = freed_after_drop(factory, async || {
        acquire(&limiter, "export", ALICE).await.lease
    })
    .await;
    let id = fourth.id();
    assert_eq!(fourth.release().await.unwrap(), Released::Released);
    drop(second);
    assert_ne!(id.to_string(), "");
}

/// The lease (or permit) `take` gets once the slot a lease dropped just now is free again: at once in
/// process; on a remote store once the drop's background release has reached it, which
/// this polls for (there is nothing to wait on but the store's answer), within 10 s.
async fn freed_after_drop<F: StoreFactory, T>(
    factory: &F,
    mut take: impl AsyncFnMut() -> Option<T>,
) -> T {
    let remote = crate::store::Store::is_remote(&factory.store());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(lease) = take().await {
            return lease;
        }
        assert!(remote, "a dropped lease frees its slot at once in process");
        assert!(
            Instant::now() < deadline,
            "a dropped lease never freed its slot"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Renewing keeps a lease for one more lease time; a check on a concurrency rule is a clear
/// error, and acquire on a rule without one too.
pub async fn renew_keeps_a_lease<F: StoreFactory>(factory: &F) {
    let ns = Namespace::new("leases-renew");
    let limiter = limiter(
        factory,
        [
            ns.policy("one", "user:1 concurrent lease=1h"),
            ns.policy("rate", "user:5/m"),
        ],
    );
    let held = acquire(&limiter, "one", ALICE).await.lease.expect("free");
    let left = held.renew().await.unwrap().expect("still held");
    assert!(
        left <= HOUR && left > HOUR - Duration::from_secs(60),
        "{left:?}"
    );
    assert!(acquire(&limiter, "one", ALICE).await.lease.is_none());
    assert!(matches!(
        limiter.check("one", ALICE, 1).await,
        Err(Error::NeedsAcquire(_))
    ));
    assert!(matches!(
        limiter.acquire("rate", ALICE).await,
        Err(Error::NoConcurrencyLeaf(_))
    ));
    assert_eq!(held.release().await.unwrap(), Released::Released);
}

/// A lease whose holder vanished (never released) frees its slot when it expires, not
/// before: with `lease=1s`, no sooner than a second after it was taken.
pub async fn abandoned_leases_expire<F: StoreFactory>(factory: &F) {
    let ns = Namespace::new("leases-expire");
    let limiter = limiter(factory, [ns.policy("job", "user:1 concurrent lease=1s")]);
    let taken = Instant::now();
    let lease = acquire(&limiter, "job", ALICE).await.lease.expect("free");
    lease.forget();
    let deadline = taken + Duration::from_secs(10);
    loop {
        let acquired = acquire(&limiter, "job", ALICE).await;
        if acquired.lease.is_some() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the abandoned lease never expired"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = taken.elapsed();
    // A store with a coarser clock may free it up to one of its ticks early.
    assert!(
        elapsed >= Duration::from_millis(990),
        "freed after {elapsed:?}"
    );
}

/// [`Slots`](crate::Slots) of a key count on the same slots as acquires by name, and
/// their leases release, renew and hand on tokens as any lease; a compound rule's rate
/// leaf is checked through them too; and slots of a policy without a concurrency leaf, of
/// an unknown policy or with a selector missing are clear errors.
pub async fn slots_are_the_keys_own<F: StoreFactory>(factory: &F) {
    let ns = Namespace::new("leases-slots");
    let limiter = limiter(
        factory,
        [
            ns.policy("export", "user:2 concurrent lease=1h"),
            ns.policy("both", "user:2/h; user:5 concurrent lease=1h"),
            ns.policy("rate", "user:5/m"),
        ],
    );
    let slots = limiter.slots("export", ALICE).expect("slots");
    let first = slots.acquire().await.unwrap();
    assert_eq!(first.checked.decision.remaining, 1);
    let second = acquire(&limiter, "export", ALICE).await;
    assert!(second.lease.is_some());
    let denied = slots.acquire().await.unwrap();
    assert!(denied.lease.is_none(), "both slots held, one each way");
    assert!(matches!(
        denied.checked.decision.denial,
        Some(Denial::Occupied { .. })
    ));
    let first = first.lease.expect("admitted");
    assert_eq!(first.release().await.unwrap(), Released::Released);
    // A token of a lease taken through slots rebuilds and releases it.
    let handed = slots.acquire().await.unwrap().lease.expect("freed at once");
    let token = handed.token();
    handed.forget();
    assert!(slots.acquire().await.unwrap().lease.is_none());
    let rebuilt = limiter.lease("export", &token).unwrap();
    assert_eq!(rebuilt.release().await.unwrap(), Released::Released);
    let renewed = slots
        .acquire()
        .await
        .unwrap()
        .lease
        .expect("freed by the token");
    let left = renewed.renew().await.unwrap().expect("still held");
    assert!(
        left <= HOUR && left > HOUR - Duration::from_secs(60),
        "{left:?}"
    );
    assert_eq!(renewed.release().await.unwrap(), Released::Released);
    assert_eq!(
        second.lease.expect("admitted").release().await.unwrap(),
        Released::Released
    );
    // Dropped, a lease of slots releases as any lease does: at once in process, on a
    // background task for a remote store.
    let [one, two] = [slots.acquire().await, slots.acquire().await]
        .map(|a| a.unwrap().lease.expect("both slots free"));
    drop(one);
    let three = freed_after_drop(factory, async || slots.acquire().await.unwrap().lease).await;
    assert_eq!(two.release().await.unwrap(), Released::Released);
    assert_eq!(three.release().await.unwrap(), Released::Released);

    // A compound rule: its rate leaf is recorded through slots as through `acquire`.
    let both = limiter.slots("both", BOB).expect("slots");
    let a = both.acquire().await.unwrap().lease.expect("first");
    let b = acquire(&limiter, "both", BOB).await.lease.expect("second");
    let third = both.acquire().await.unwrap();
    assert!(third.lease.is_none());
    assert!(
        !matches!(third.checked.decision.denial, Some(Denial::Occupied { .. })),
        "refused by the rate: {:?}",
        third.checked.decision.denial
    );
    assert_eq!(a.release().await.unwrap(), Released::Released);
    assert_eq!(b.release().await.unwrap(), Released::Released);

    assert!(matches!(
        limiter.slots("rate", ALICE),
        Err(Error::NoConcurrencyLeaf(_))
    ));
    assert!(matches!(
        limiter.slots("nowhere", ALICE),
        Err(Error::UnknownPolicy(_))
    ));
    assert!(matches!(
        limiter.slots("export", &[]),
        Err(Error::MissingSelector { .. })
    ));
}

/// [`SlotPermit`]s hold the key's slots as leases do: they count with acquires by name,
/// are refused with the decision, release, renew and hand on tokens, free their slot when
/// dropped, check a compound rule's rate leaf, and under a shadow policy admit without a
/// slot.
pub async fn slot_permits_hold_the_keys_slots<F: StoreFactory>(factory: &F) {
    let ns = Namespace::new("leases-permits");
    let limiter = limiter(
        factory,
        [
            ns.policy("export", "user:2 concurrent lease=1h"),
            ns.policy("both", "user:2/h; user:5 concurrent lease=1h"),
            ns.policy("watch", "user:1 concurrent lease=1h")
                .shadow(true),
        ],
    );
    let slots = limiter.slots("export", ALICE).expect("slots");
    let first = slots.permit().await.unwrap().expect("free");
    assert!(first.holds_slot());
    let second = acquire(&limiter, "export", ALICE)
        .await
        .lease
        .expect("free");
    let denied = slots.permit().await.unwrap().expect_err("both slots held");
    match denied.denial {
        Some(Denial::Occupied { retry_after }) => {
            assert!(retry_after <= HOUR && retry_after > HOUR - Duration::from_secs(60));
        }
        other => panic!("expected occupied, got {other:?}"),
    }
    assert_eq!(denied.limit, 2);
    assert_eq!(first.release().await.unwrap(), Released::Released);
    // A token of a permit rebuilds its lease, and releases it.
    let handed = slots.permit().await.unwrap().expect("freed at once");
    let token = handed.token();
    assert_eq!(handed.forget().to_string(), token[..16]);
    assert!(
        slots.permit().await.unwrap().is_err(),
        "a forgotten permit holds its slot"
    );
    let rebuilt = limiter.lease("export", &token).unwrap();
    assert_eq!(rebuilt.release().await.unwrap(), Released::Released);
    let renewed = slots.permit().await.unwrap().expect("freed by the token");
    let left = renewed.renew().await.unwrap().expect("still held");
    assert!(
        left <= HOUR && left > HOUR - Duration::from_secs(60),
        "{left:?}"
    );
    // Dropped, a permit releases as a lease does: at once in process, on a background
    // task for a remote store.
    drop(renewed);
    let third = freed_after_drop(factory, async || slots.permit().await.unwrap().ok()).await;
    assert_eq!(second.release().await.unwrap(), Released::Released);
    assert_eq!(third.release().await.unwrap(), Released::Released);

    // A compound rule: its rate leaf is recorded and checked through permits too.
    let both = limiter.slots("both", BOB).expect("slots");
    let a = both.permit().await.unwrap().expect("first");
    let b = acquire(&limiter, "both", BOB).await.lease.expect("second");
    let refused = both.permit().await.unwrap().expect_err("the rate is spent");
    assert!(
        !matches!(refused.denial, Some(Denial::Occupied { .. })),
        "refused by the rate: {:?}",
        refused.denial
    );
    assert_eq!(a.release().await.unwrap(), Released::Released);
    assert_eq!(b.release().await.unwrap(), Released::Released);

    // A shadow policy admits what it would deny, without a slot: nothing to release.
    let watch = limiter.slots("watch", ALICE).expect("slots");
    let held = watch.permit().await.unwrap().expect("free");
    assert!(held.holds_slot());
    let shadowed = watch
        .permit()
        .await
        .unwrap()
        .expect("a shadow policy admits");
    assert!(!shadowed.holds_slot());
    assert_eq!(shadowed.renew().await.unwrap(), None);
    assert_eq!(shadowed.release().await.unwrap(), Released::NotHeld);
    assert_eq!(held.release().await.unwrap(), Released::Released);
    assert!(watch.permit().await.unwrap().expect("free").holds_slot());
}
