//! The native algorithm on a real memcached with manual clocks: exact under 64 concurrent
//! tasks on two app servers, sliding sub-window by sub-window, cleared by a reset, and never
//! over across a boundary when the two servers' clocks are 100 ms apart.

use std::sync::Arc;
use std::time::Duration;

use sluice_limiter::{Limiter, ManualClock, Policy};
use sluice_memcached::MemcachedStore;
use sluice_testkit::MemcachedServer;
use tokio::task::JoinSet;

/// Admitted hits of `tasks` tasks making `per_task` checks each, over `limiters` in turn.
async fn race(limiters: &[Arc<Limiter>], tasks: usize, per_task: usize) -> usize {
    let start = Arc::new(tokio::sync::Barrier::new(tasks));
    let mut set = JoinSet::new();
    for t in 0..tasks {
        let (limiter, start) = (limiters[t % limiters.len()].clone(), start.clone());
        set.spawn(async move {
            start.wait().await;
            let mut admitted = 0;
            for _ in 0..per_task {
                let checked = limiter.check("p", &[("user", "u")], 1).await.unwrap();
                assert!(checked.without_store.is_none(), "{checked:?}");
                admitted += usize::from(checked.decision.allowed());
            }
            admitted
        });
    }
    let mut admitted = 0;
    while let Some(n) = set.join_next().await {
        admitted += n.unwrap();
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exact_under_concurrency_sub_window_by_sub_window() {
    let memcached = MemcachedServer::start().expect("memcached");
    // Four sub-windows of 15 s; the clock starts at the start of one.
    let sub = Duration::from_secs(15);
    let clock = ManualClock::new(1_700_000_100 * 1_000_000_000);
    let policy = Policy::new("p", "user:100/m algorithm=sliding-window windows=4").unwrap();
    let mut limiters = Vec::new();
    for _ in 0..2 {
        let store = MemcachedStore::builder(&memcached.url())
            .clock(clock.clone())
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .unwrap();
        let limiter = Limiter::builder(store).policy(policy.clone()).build();
        limiters.push(Arc::new(limiter.unwrap()));
    }

    assert_eq!(race(&limiters, 64, 4).await, 100, "the first sub-window");
    for step in 1..4 {
        clock.advance(sub);
        assert_eq!(
            race(&limiters, 64, 2).await,
            0,
            "sub-window {step}: still full"
        );
    }
    // The first sub-window slides out: its 100 are free again, exactly.
    clock.advance(sub);
    assert_eq!(race(&limiters, 64, 4).await, 100, "after the window slid");

    limiters[0].reset("p", &[("user", "u")]).await.unwrap();
    assert_eq!(race(&limiters, 64, 4).await, 100, "after a reset");
    let stats = limiters[1]
        .store()
        .downcast_ref::<MemcachedStore>()
        .unwrap()
        .stats();
    assert_eq!((stats.evictions, stats.wrapped), (0, 0), "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exact_across_a_boundary_with_clocks_apart() {
    let memcached = MemcachedServer::start().expect("memcached");
    let sub = 15_000_000_000u64;
    let boundary = 1_700_000_100 * 1_000_000_000 + 4 * sub;
    let policy = Policy::new("p", "user:100/m algorithm=sliding-window windows=4").unwrap();
    // Two app servers whose clocks are 100 ms apart.
    let (ahead, behind) = (ManualClock::new(0), ManualClock::new(0));
    let mut limiters = Vec::new();
    for clock in [&ahead, &behind] {
        let store = MemcachedStore::builder(&memcached.url())
            .clock(clock.clone())
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .unwrap();
        let limiter = Limiter::builder(store).policy(policy.clone()).build();
        limiters.push(Arc::new(limiter.unwrap()));
    }
    ahead.set(boundary - 5_000_000_000);
    behind.set(boundary - 5_100_000_000);
    assert_eq!(race(&limiters, 60, 1).await, 60, "mid sub-window");
    // Across the boundary: one counts into the new sub-window, the other still into the old.
    ahead.set(boundary + 50_000_000);
    behind.set(boundary - 50_000_000);
    // Never over. Hits racing for the last units across the boundary may each see the
    // other and both step back (documented under-admission), so a few may stay unused.
    let admitted = race(&limiters, 64, 4).await;
    assert!(
        (36..=40).contains(&admitted),
        "across the boundary: {admitted}"
    );
}
