//! Hot identifiers (`prefetch=N`): several limiters, as several servers, share one store
//! that counts the calls it gets. The store is the memory store, told to count as remote
//! (prefetch only takes blocks from a store outside the process); Redis runs the same
//! through real `sluice serve` processes in the CLI's tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_core::Decision;
use sluice_limiter::{
    Hit, Identifier, Limiter, ManualClock, MemoryStore, Penalty, Policy, PolicyError, Store,
    StoreError,
};

/// The memory store, seen as remote, counting the decisions it is asked for.
#[derive(Clone)]
struct Remote {
    inner: MemoryStore,
    calls: Arc<AtomicU64>,
}

impl Store for Remote {
    async fn decide(&self, hit: &Hit<'_>) -> Result<Decision, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.decide(hit).await
    }

    async fn reset(&self, identifiers: &[Identifier]) -> Result<(), StoreError> {
        self.inner.reset(identifiers).await
    }
}

/// `servers` limiters deciding `rule` on one store, and the store's call counter.
fn servers(rule: &str, servers: usize, clock: &ManualClock) -> (Vec<Limiter>, Arc<AtomicU64>) {
    let store = Remote {
        inner: MemoryStore::builder().clock(clock.clone()).build(),
        calls: Arc::new(AtomicU64::new(0)),
    };
    let limiters = (0..servers)
        .map(|_| {
            Limiter::builder(store.clone())
                .clock(clock.clone())
                .policy(Policy::new("api", rule).unwrap())
                .build()
                .unwrap()
        })
        .collect();
    (limiters, store.calls)
}

#[tokio::test]
async fn a_global_limit_over_four_servers_costs_the_store_a_fiftieth_of_its_decisions() {
    let clock = ManualClock::new(1_000_000_000_000);
    let (limiters, calls) = servers("10000/s prefetch=400", 4, &clock);
    let (mut decisions, mut admitted, mut here) = (0u64, 0u64, 0u64);
    // Ten seconds of 12,000 hits a second, spread round-robin over the servers, one every
    // 1/12,000 s: more than the limit, so the limit is what admits.
    let step = Duration::from_nanos(1_000_000_000 / 12_000);
    let seconds = 10;
    for i in 0..12_000 * seconds {
        let checked = limiters[i % 4].check("api", &[], 1).await.unwrap();
        decisions += 1;
        admitted += u64::from(checked.decision.allowed());
        here += u64::from(checked.cached);
        clock.advance(step);
    }
    let calls = calls.load(Ordering::Relaxed);
    // From a full bucket: the burst (10,000) plus 10,000 a second, never more.
    let most = 10_000 + 10_000 * seconds as u64;
    assert!(admitted <= most, "{admitted} admitted, at most {most}");
    // Unspent admissions expire unused: at most 4 × 399 per block lifetime (1 s).
    let least = most - 4 * 399 * (seconds as u64 + 1);
    assert!(admitted >= least, "{admitted} admitted, at least {least}");
    assert!(
        calls * 50 <= decisions,
        "{calls} store calls for {decisions} decisions"
    );
    eprintln!(
        "prefetch: {decisions} decisions, {admitted} admitted (at most {most}), {calls} store calls"
    );
    // A GCRA decision is answered here (from a block, or a standing refusal) or by one call.
    assert_eq!(here + calls, decisions);
    let spent: u64 = limiters.iter().map(|l| l.stats().prefetch_spent).sum();
    let blocks: u64 = limiters.iter().map(|l| l.stats().prefetch_blocks).sum();
    assert_eq!(
        spent + blocks,
        admitted,
        "each admission spent a block or took one"
    );
}

#[tokio::test]
async fn a_fixed_window_stays_exact_per_window() {
    let clock = ManualClock::new(1_000_000_000_000);
    let (limiters, calls) = servers("100/m algorithm=fixed-window prefetch=10", 3, &clock);
    for window in 0..3 {
        let mut admitted = 0;
        for i in 0..300 {
            let checked = limiters[i % 3].check("api", &[], 1).await.unwrap();
            admitted += u64::from(checked.decision.allowed());
            clock.advance(Duration::from_millis(50));
        }
        // 300 hits over 15 s of the minute: the window's 100 and not one more; blocks
        // that no longer fit give out the last ones singly, so none is lost here.
        assert_eq!(admitted, 100, "window {window}");
        clock.advance(Duration::from_secs(45));
    }
    assert!(calls.load(Ordering::Relaxed) < 3 * 300 / 2);
}

#[tokio::test]
async fn a_refused_block_stands_until_it_fits() {
    let clock = ManualClock::new(1_000_000_000_000);
    let (limiters, calls) = servers("10/h prefetch=4", 1, &clock);
    let check = || async { limiters[0].check("api", &[], 1).await.unwrap() };
    let mut admitted = 0;
    for _ in 0..20 {
        admitted += u64::from(check().await.decision.allowed());
    }
    // Blocks of 4 and 4, then a refused block of 4 (2 are left): the 11 hits after it are
    // refused here, without a call, and the 2 left stay in the bucket.
    assert_eq!(admitted, 8);
    assert_eq!(calls.load(Ordering::Relaxed), 3);
    let refused = check().await;
    assert!(refused.cached);
    // 4 fit again once 2 more have dripped in: 12 minutes at one per 6.
    let wait = refused.decision.retry_after().unwrap();
    assert_eq!(wait, Duration::from_secs(12 * 60));
    clock.advance(wait - Duration::from_secs(1));
    assert!(!check().await.decision.allowed());
    assert_eq!(calls.load(Ordering::Relaxed), 3);
    clock.advance(Duration::from_secs(1));
    assert!(check().await.decision.allowed());
    assert_eq!(calls.load(Ordering::Relaxed), 4);
}

#[tokio::test]
async fn a_fixed_window_gives_out_its_last_admissions() {
    let clock = ManualClock::new(1_000_000_000_000);
    let (limiters, calls) = servers("10/h algorithm=fixed-window prefetch=4", 1, &clock);
    let mut admitted = 0;
    for _ in 0..20 {
        admitted += u64::from(
            limiters[0]
                .check("api", &[], 1)
                .await
                .unwrap()
                .decision
                .allowed(),
        );
    }
    // Blocks of 4 and 4, then a refused block of 4 and the 2 left taken instead; then one
    // refused block, standing until the window's end.
    assert_eq!(admitted, 10);
    assert_eq!(calls.load(Ordering::Relaxed), 2 + 2 + 1);
}

#[tokio::test]
async fn a_block_expires_after_its_lifetime() {
    let clock = ManualClock::new(1_000_000_000_000);
    let (limiters, calls) = servers("1000/h prefetch=10", 1, &clock);
    limiters[0].check("api", &[], 1).await.unwrap();
    assert_eq!(calls.load(Ordering::Relaxed), 1);
    clock.advance(Duration::from_millis(999));
    limiters[0].check("api", &[], 1).await.unwrap();
    assert_eq!(calls.load(Ordering::Relaxed), 1, "spent from the block");
    clock.advance(Duration::from_millis(1));
    limiters[0].check("api", &[], 1).await.unwrap();
    assert_eq!(
        calls.load(Ordering::Relaxed),
        2,
        "a GCRA block lives at most 1 s"
    );
}

#[tokio::test]
async fn concurrent_servers_never_admit_more_than_the_limit() {
    // Real time, many tasks on four limiters: an hour's 1,000 can only be given once.
    let store = Remote {
        inner: MemoryStore::new(),
        calls: Arc::new(AtomicU64::new(0)),
    };
    let limiters: Vec<Arc<Limiter>> = (0..4)
        .map(|_| {
            Arc::new(
                Limiter::builder(store.clone())
                    .policy(Policy::new("api", "user:1000/h prefetch=25").unwrap())
                    .build()
                    .unwrap(),
            )
        })
        .collect();
    let admitted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..64 {
        let limiter = limiters[t % 4].clone();
        let admitted = admitted.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..40 {
                let checked = limiter.check("api", &[("user", "u")], 1).await.unwrap();
                if checked.decision.allowed() {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let admitted = admitted.load(Ordering::Relaxed);
    assert!(admitted <= 1_000, "{admitted}");
    // Blocks no longer fitting are asked for singly, so the hour's limit is reached.
    assert_eq!(admitted, 1_000);
}

#[tokio::test]
async fn prefetch_on_the_memory_store_changes_nothing() {
    let limiter = Limiter::builder(MemoryStore::new())
        .policy(Policy::new("api", "10/h prefetch=5").unwrap())
        .build()
        .unwrap();
    let mut admitted = 0;
    for _ in 0..12 {
        let checked = limiter.check("api", &[], 1).await.unwrap();
        admitted += u64::from(checked.decision.allowed());
    }
    assert_eq!(admitted, 10);
    assert_eq!(limiter.stats().prefetch_blocks, 0);
}

#[test]
fn policies_prefetch_cannot_honour_are_refused_with_the_reason() {
    let refused = |policy: Policy| match Limiter::builder(MemoryStore::new()).policy(policy).build()
    {
        Err(PolicyError::Prefetch { reason, .. }) => reason,
        Err(other) => panic!("another error: {other}"),
        Ok(_) => panic!("accepted"),
    };
    let policy = |rule| Policy::new("p", rule).unwrap();
    assert!(refused(policy("10/s prefetch=5; user:5/s")).contains("whole rule"));
    assert!(refused(policy("10/s algorithm=sliding-log prefetch=5")).contains("gcra"));
    assert!(refused(policy("10/s algorithm=sliding-window prefetch=5")).contains("gcra"));
    assert!(refused(policy("10/s prefetch=11")).contains("capacity"));
    assert!(refused(policy("10/s burst=20 prefetch=21")).contains("capacity"));
    assert!(refused(policy("10/s prefetch=5").count_denied(true)).contains("denials"));
    let penalty = Penalty::new(
        Duration::from_secs(1),
        2,
        Duration::from_secs(60),
        Duration::from_secs(60),
    );
    assert!(refused(policy("10/s prefetch=5").penalty(penalty.unwrap())).contains("penalty"));
    // Within the capacity, it loads.
    Limiter::builder(MemoryStore::new())
        .policy(policy("10/s burst=20 prefetch=20"))
        .build()
        .unwrap();
}
