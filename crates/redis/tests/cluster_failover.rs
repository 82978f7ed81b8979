//! A Redis Cluster with a replica per master: one master is killed (SIGKILL) under load,
//! the cluster promotes its replica, and every key is decided by Redis again within 5 s.
//! Meanwhile the failure mode answers; after a store error the limiter skips the whole store
//! for 500 ms, so keys on the healthy masters fall to it too for a while.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_limiter::{FailureMode, Limiter, Policy};
use sluice_redis::RedisStore;
use sluice_testkit::RedisCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_replaced_by_its_replica_within_five_seconds() {
    let mut cluster = RedisCluster::start_with_replicas(3, 1, Duration::from_secs(1))
        .expect("a cluster of three masters and three replicas");
    let store = RedisStore::builder(&cluster.url())
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .expect("connect");
    let policy = Policy::new("closed", "user:1000000/h")
        .unwrap()
        .failure(FailureMode::Closed);
    let limiter = Arc::new(Limiter::builder(store).policies([policy]).build().unwrap());
    let users: Vec<String> = (0..30).map(|i| format!("user-{i}")).collect();
    for user in &users {
        let checked = limiter.check("closed", &[("user", user)], 1).await.unwrap();
        assert!(checked.without_store.is_none(), "{user}: {checked:?}");
    }
    assert!(
        cluster.nodes[0]
            .cli(&["ROLE"])
            .unwrap()
            .starts_with("master"),
        "the first node is a master"
    );

    cluster.nodes[0].kill();
    let killed = Instant::now();
    let mut pending: Vec<&String> = users.iter().collect();
    let mut unaffected = 0;
    let mut first_round = true;
    while !pending.is_empty() {
        let mut still = Vec::new();
        for user in pending {
            let checked = limiter.check("closed", &[("user", user)], 1).await.unwrap();
            if checked.without_store.is_some() {
                still.push(user);
            } else if first_round {
                unaffected += 1;
            }
        }
        first_round = false;
        pending = still;
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "{} keys still without Redis 20 s after a master died",
            pending.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await; // the pace of the load
    }
    let back = killed.elapsed();
    eprintln!(
        "every key decided by Redis again {:.2} s after a master was killed ({unaffected} of \
         {} keys on the other masters never left it)",
        back.as_secs_f64(),
        users.len()
    );
    assert!(back < Duration::from_secs(5), "{back:?}");
}
