//! Batching: concurrent single-leaf GCRA decisions go to Redis in shared script calls, and
//! still each decide exactly as one call each would.

use std::collections::BTreeMap;

use sluice_core::{Leaf, Quota, Rate, Span, Unit};
use sluice_limiter::{Identifier, Store};
use sluice_redis::RedisStore;
use sluice_testkit::bench::BenchRule;
use sluice_testkit::{RedisCluster, RedisServer};

/// `count` per hour, a bucket of `count`: nothing refills during a test.
fn per_hour(count: u64) -> Quota {
    let rate = Rate::new(count, Span::new(1, Unit::Hour).unwrap()).unwrap();
    Quota::from_leaf(&Leaf::new(rate), sluice_core::Algorithm::Gcra).unwrap()
}

/// Decides `hits` hits on each of `keys` at once (all spawned before any is awaited); per key,
/// the `remaining` of each admitted hit and the number denied.
async fn decide_all_at_once(
    store: &RedisStore,
    quota: Quota,
    keys: &[Identifier],
    hits: usize,
) -> BTreeMap<usize, (Vec<u64>, usize)> {
    let mut tasks = Vec::new();
    for round in 0..hits {
        for (k, identifier) in keys.iter().enumerate() {
            let (store, identifier) = (store.clone(), [identifier.clone()]);
            tasks.push(tokio::spawn(async move {
                let rule = BenchRule::one_leaf(quota);
                let decision = store.decide(&rule.hit(&identifier)).await;
                (k, round, decision)
            }));
        }
    }
    let mut by_key: BTreeMap<usize, (Vec<u64>, usize)> = BTreeMap::new();
    for task in tasks {
        let (k, _, decision) = task.await.unwrap();
        let decision = decision.expect("a decision");
        let entry = by_key.entry(k).or_default();
        if decision.allowed() {
            entry.0.push(decision.remaining);
        } else {
            assert!(decision.retry_after().is_some(), "{decision:?}");
            entry.1 += 1;
        }
    }
    by_key
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_hits_on_one_key_admit_exactly_the_limit() {
    let server = RedisServer::start().expect("redis-server");
    let store = RedisStore::builder(&server.url())
        .timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .expect("connect");
    let limit = 50;
    let key = [Identifier::new("batch:one-key:50/h")];
    let by_key = decide_all_at_once(&store, per_hour(limit), &key, 400).await;
    let (mut remaining, denied) = by_key[&0].clone();
    remaining.sort_unstable();
    // Each admitted hit saw the hits before it in the same batch: 49, 48, ... 0, once each.
    assert_eq!(remaining, (0..limit).collect::<Vec<_>>());
    assert_eq!(denied, 400 - limit as usize);
    let calls = server.script_calls();
    assert!(
        calls < 400,
        "400 decisions in {calls} script calls: nothing was batched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_batch_mixing_slots_decides_each_hit() {
    let cluster = RedisCluster::start(3).expect("cluster");
    let store = RedisStore::builder(&cluster.url())
        .timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .expect("connect");
    // 40 keys over many slots (and so all three masters), 12 hits each on a limit of 5.
    let keys: Vec<Identifier> = (0..40)
        .map(|i| Identifier::grouped("batch:mixed:user:", &format!("u{i}"), ":5/h"))
        .collect();
    let slots: std::collections::BTreeSet<u16> =
        keys.iter().map(sluice_redis::script::slot_of).collect();
    assert!(slots.len() > 30, "the keys share slots: {slots:?}");
    let by_key = decide_all_at_once(&store, per_hour(5), &keys, 12).await;
    assert_eq!(by_key.len(), keys.len());
    for (k, (mut remaining, denied)) in by_key {
        remaining.sort_unstable();
        assert_eq!(remaining, vec![0, 1, 2, 3, 4], "key {k}");
        assert_eq!(denied, 7, "key {k}");
    }
    // Two stores of one cluster share the counts: the keys are spent for the second too.
    let other = RedisStore::connect(&cluster.url()).await.expect("connect");
    let rule = BenchRule::one_leaf(per_hour(5));
    for key in &keys {
        let decision = other.decide(&rule.hit(std::slice::from_ref(key))).await;
        assert!(!decision.expect("a decision").allowed());
    }
}
