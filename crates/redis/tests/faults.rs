//! Faults on real servers: Redis killed mid-load, scripts flushed mid-load, and a slot
//! migrating between cluster nodes mid-load.

use std::sync::Arc;
use std::time::Duration;

use sluice_limiter::{Denial, FailureMode, Limiter, Policy};
use sluice_redis::RedisStore;
use sluice_testkit::load::{
    assert_failure_modes, checks, failure_policies, sockets_settle, sockets_to, until_all_answer,
    until_the_store_answers,
};
use sluice_testkit::proxy::{Fault, FaultProxy};
use sluice_testkit::{ProxiedCluster, RedisCluster, RedisServer};

const TIMEOUT: Duration = Duration::from_millis(200);

async fn limiter(url: &str, policies: Vec<Policy>) -> Arc<Limiter> {
    let store = RedisStore::builder(url)
        .timeout(TIMEOUT)
        .connect()
        .await
        .expect("connect");
    Arc::new(Limiter::builder(store).policies(policies).build().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_redis_follows_the_failure_mode_then_recovers() {
    let mut redis = RedisServer::start().expect("redis-server");
    let policies = failure_policies("");
    let limiter = limiter(&redis.url(), policies).await;
    assert!(
        checks(&limiter, "open", "a", 8, 10)
            .await
            .iter()
            .all(|(c, _)| c.without_store.is_none())
    );

    redis.kill();
    // No hang: at most the store timeout (plus scheduling) per decision.
    assert_failure_modes(&limiter, TIMEOUT + Duration::from_millis(800)).await;
    let stats = limiter.stats();
    assert!(
        stats.failed_open >= 80 && stats.failed_closed >= 80 && stats.failed_local >= 120,
        "{stats:?}"
    );

    redis.restart().expect("restart redis");
    until_the_store_answers(&limiter, Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn script_flush_mid_load_loses_no_decision() {
    let redis = RedisServer::start().expect("redis-server");
    let policies = vec![Policy::new("log", "user:500/h algorithm=sliding-log").unwrap()];
    let limiter = limiter(&redis.url(), policies).await;
    let flusher = {
        let port = redis.port().to_string();
        tokio::task::spawn_blocking(move || {
            for _ in 0..20 {
                let status = std::process::Command::new("redis-cli")
                    .args(["-p", &port, "SCRIPT", "FLUSH"])
                    .output()
                    .expect("redis-cli");
                assert!(status.status.success());
            }
        })
    };
    let answers = checks(&limiter, "log", "flushed", 16, 50).await;
    flusher.await.unwrap();
    assert!(
        answers.iter().all(|(c, _)| c.without_store.is_none()),
        "every decision by redis"
    );
    let admitted = answers.iter().filter(|(c, _)| c.decision.allowed()).count();
    assert_eq!(
        admitted, 500,
        "exactly the limit, with scripts reloaded as needed"
    );
}

fn node_id(node: &RedisServer) -> String {
    node.cli(&["CLUSTER", "MYID"]).unwrap().trim().to_owned()
}

/// Moves `slot` from `from` to `to` while clients keep using it: IMPORTING/MIGRATING, key
/// by key MIGRATE, then the new owner announced to every node.
fn migrate_slot(cluster: &RedisCluster, slot: u16, from: usize, to: usize) {
    let (source, target) = (&cluster.nodes[from], &cluster.nodes[to]);
    let slot = slot.to_string();
    let (source_id, target_id) = (node_id(source), node_id(target));
    assert!(
        target
            .cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id])
            .unwrap()
            .contains("OK")
    );
    assert!(
        source
            .cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id])
            .unwrap()
            .contains("OK")
    );
    for _ in 0..50 {
        let keys = source
            .cli(&["CLUSTER", "GETKEYSINSLOT", &slot, "100"])
            .unwrap();
        let keys: Vec<&str> = keys.lines().filter(|k| !k.is_empty()).collect();
        if keys.is_empty() {
            break;
        }
        let port = target.port().to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys);
        source.cli(&args).unwrap();
        std::thread::sleep(Duration::from_millis(20)); // let the load touch the slot mid-move
    }
    for node in &cluster.nodes {
        node.cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &target_id])
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_migrating_under_load_changes_nothing() {
    let cluster = RedisCluster::start(3).expect("cluster");
    let policies = vec![Policy::new("log", "user:300/h algorithm=sliding-log").unwrap()];
    let limiter = limiter(&cluster.url(), policies).await;
    // Warm the identifier so its key exists on its owner before the move.
    assert!(
        limiter
            .check("log", &[("user", "hot")], 1)
            .await
            .unwrap()
            .decision
            .allowed()
    );
    let slot: u16 = cluster.nodes[0]
        .cli(&["CLUSTER", "KEYSLOT", "{hot}"])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let owner = cluster
        .nodes
        .iter()
        .position(|n| {
            n.cli(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
                .unwrap()
                .trim()
                != "0"
        })
        .expect("one node owns the key");
    let to = (owner + 1) % cluster.nodes.len();

    let loader = {
        let limiter = limiter.clone();
        tokio::spawn(async move { checks(&limiter, "log", "hot", 8, 60).await })
    };
    tokio::task::block_in_place(|| migrate_slot(&cluster, slot, owner, to));
    let answers = loader.await.expect("no panic");
    assert!(
        answers.iter().all(|(c, _)| c.without_store.is_none()),
        "no error reached the caller"
    );
    let admitted = answers.iter().filter(|(c, _)| c.decision.allowed()).count();
    assert_eq!(
        admitted, 299,
        "exactly the limit across the move (1 admitted before it)"
    );
    let now_on = cluster.nodes[to]
        .cli(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
        .unwrap();
    assert_ne!(now_on.trim(), "0", "the key now lives on the new owner");
}

/// Redis behind a fault proxy: black-holed, each policy answers by its failure mode within
/// the store's timeout (no decision hangs); reset, the same; once the fault clears, decisions
/// come from Redis again within 2 s, on a limiter that was idle through the reset too;
/// latency under the timeout changes only the time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_on_the_wire_follow_the_failure_mode_and_heal() {
    let redis = RedisServer::start().expect("redis-server");
    let upstream = format!("127.0.0.1:{}", redis.port()).parse().unwrap();
    let proxy = FaultProxy::start(upstream).expect("proxy");
    let url = format!("redis://{}", proxy.address());
    let limiter = limiter(&url, failure_policies("")).await;
    let bound = TIMEOUT + Duration::from_millis(800);
    let from_store = |c: &sluice_limiter::Checked| c.without_store.is_none();
    assert!(
        checks(&limiter, "closed", "a", 4, 5)
            .await
            .iter()
            .all(|(c, _)| from_store(c))
    );

    for fault in [Fault::BlackHole, Fault::Reset] {
        // A limiter of its own per fault: the local failure mode keeps its own counts.
        let limiter = self::limiter(&url, failure_policies("")).await;
        proxy.set(fault);
        assert_failure_modes(&limiter, bound).await;
        proxy.set(Fault::None);
        until_the_store_answers(&limiter, Duration::from_secs(2)).await;
    }
    // The first limiter's connection, idle all along, was reset too: it heals as well.
    until_the_store_answers(&limiter, Duration::from_secs(2)).await;
    // Latency under the timeout changes nothing but the time.
    proxy.set(Fault::Latency(Duration::from_millis(20)));
    for (checked, took) in checks(&limiter, "closed", "d", 4, 5).await {
        assert!(from_store(&checked), "{checked:?}");
        assert!(
            took >= Duration::from_millis(20) && took < bound,
            "{took:?}"
        );
    }
}

/// A Redis Cluster behind a fault proxy per node (each node announces its proxy, so the
/// client's slot map points through them): black-holed, then reset, each policy answers by
/// its failure mode within the bound; once the fault clears, decisions come from the
/// cluster again within 2 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_behind_the_fault_proxy_follows_the_failure_mode_and_heals() {
    let cluster = ProxiedCluster::start(3).expect("a cluster behind proxies");
    let bound = TIMEOUT + Duration::from_millis(800);
    for fault in [Fault::BlackHole, Fault::Reset] {
        // A limiter of its own per fault: the local failure mode keeps its own counts.
        let limiter = limiter(&cluster.url(), failure_policies("")).await;
        assert!(
            checks(&limiter, "closed", "a", 4, 5)
                .await
                .iter()
                .all(|(c, _)| c.without_store.is_none())
        );
        cluster.set(fault);
        assert_failure_modes(&limiter, bound).await;
        cluster.set(Fault::None);
        until_the_store_answers(&limiter, Duration::from_secs(2)).await;
    }
}

/// Jitter and a bandwidth cap under the timeout change only the time: every decision still
/// comes from Redis, and a limit shared by eight concurrent callers admits exactly its
/// count. A reply cut in half by a half-close fails the call, the policy's failure mode
/// answers within the bound, and decisions return to Redis once the fault clears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jitter_throttling_and_half_closed_replies() {
    let redis = RedisServer::start().expect("redis-server");
    let upstream = format!("127.0.0.1:{}", redis.port()).parse().unwrap();
    let proxy = FaultProxy::start(upstream).expect("proxy");
    let mut policies = failure_policies("");
    policies.push(
        Policy::new("exact", "user:25/h")
            .unwrap()
            .failure(FailureMode::Closed),
    );
    let limiter = limiter(&format!("redis://{}", proxy.address()), policies).await;
    let bound = TIMEOUT + Duration::from_millis(800);
    for (fault, user) in [
        (Fault::Jitter(Duration::from_millis(10)), "jittered"),
        (Fault::Throttle(64 * 1024), "throttled"),
    ] {
        proxy.set(fault);
        let answers = checks(&limiter, "exact", user, 8, 5).await;
        assert!(
            answers.iter().all(|(c, _)| c.without_store.is_none()),
            "{fault:?}: a decision without the store"
        );
        let admitted = answers.iter().filter(|(c, _)| c.decision.allowed()).count();
        assert_eq!(admitted, 25, "{fault:?}: 40 hits on a limit of 25");
    }
    proxy.set(Fault::HalfClose);
    // One caller at a time: concurrent calls' replies can share a chunk, and half of such a
    // chunk may hold a whole reply, a true answer from Redis.
    for (checked, took) in checks(&limiter, "closed", "h", 1, 5).await {
        assert_eq!(
            checked.decision.denial,
            Some(Denial::StoreUnavailable),
            "{checked:?}"
        );
        assert!(took < bound, "{took:?}");
    }
    proxy.set(Fault::None);
    until_the_store_answers(&limiter, Duration::from_secs(2)).await;
}

/// A thousand connection resets leak nothing: fifty limiters, each with its own
/// connection, are reset together 22 times over, each time until every one answers from
/// Redis again (each waits out its client's reconnect backoff, about 0.5 s); afterwards this
/// process holds no more sockets to the proxy than before (counted by port and inode: a
/// count of every file descriptor also counted what the tests beside it opened, and failed
/// CI once) and the proxy no more connections than the limiters need.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_resets_leak_no_connection() {
    const LIMITERS: usize = 50;
    const ROUNDS: usize = 22;
    let redis = RedisServer::start().expect("redis-server");
    let upstream = format!("127.0.0.1:{}", redis.port()).parse().unwrap();
    let proxy = FaultProxy::start(upstream).expect("proxy");
    let url = format!("redis://{}", proxy.address());
    let mut limiters = Vec::new();
    for _ in 0..LIMITERS {
        limiters.push(limiter(&url, failure_policies("")).await);
    }
    until_all_answer(&limiters, Duration::from_secs(5)).await;
    let port = proxy.address().port();
    let before = sockets_to(port);
    assert!(
        before >= LIMITERS,
        "{before} sockets to the proxy for {LIMITERS} limiters"
    );
    let mut resets = 0;
    for _ in 0..ROUNDS {
        resets += proxy.connections();
        proxy.set(Fault::Reset);
        for limiter in &limiters {
            let checked = limiter.check("closed", &[("user", "r")], 1).await.unwrap();
            assert!(checked.without_store.is_some() || checked.decision.allowed());
        }
        proxy.set(Fault::None);
        until_all_answer(&limiters, Duration::from_secs(5)).await;
        // Every limiter's probe counts on one key: clear it so its limit is never reached.
        redis.cli(&["FLUSHALL"]).unwrap();
    }
    let after = sockets_settle(port, before, Duration::from_secs(2)).await;
    assert!(resets >= 1_000, "only {resets} connections were reset");
    assert!(
        after <= before,
        "{before} sockets to the proxy before {resets} resets, {after} after"
    );
    assert!(
        proxy.connections() <= 2 * LIMITERS,
        "{} connections for {LIMITERS} limiters",
        proxy.connections()
    );
}

/// Batched decisions whose connection fails: every decision of a batch that got no reply
/// fails with `Unavailable` or `Timeout`, never a decision; and no hit is reported admitted
/// that Redis did not record (a failed batch may have counted, never the other way round).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_connection_fails_decides_nothing() {
    use sluice_core::{Leaf, Quota, Rate, Span, Unit};
    use sluice_limiter::{Identifier, Store, StoreError};
    use sluice_testkit::bench::BenchRule;

    let redis = RedisServer::start().expect("redis-server");
    let upstream = format!("127.0.0.1:{}", redis.port()).parse().unwrap();
    let proxy = FaultProxy::start(upstream).expect("proxy");
    let store = RedisStore::builder(&format!("redis://{}", proxy.address()))
        .timeout(TIMEOUT)
        .connect()
        .await
        .expect("connect");
    // 1000 a day: nothing refills within the test.
    let rate = Rate::new(1_000, Span::new(1, Unit::Day).unwrap()).unwrap();
    let quota = Quota::from_leaf(&Leaf::new(rate), sluice_core::Algorithm::Gcra).unwrap();
    let key = [Identifier::new("faults:batch:1000/d")];
    let at_once = |n: usize| {
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let (store, key) = (store.clone(), key.clone());
                tokio::spawn(
                    async move { store.decide(&BenchRule::one_leaf(quota).hit(&key)).await },
                )
            })
            .collect();
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

    // What Redis recorded, read by a peek (cost 0) once the connection is back (waiting on
    // the client's real reconnection, within 5 s).
    let rule = BenchRule::one_leaf(quota);
    let mut peek = rule.hit(&key);
    peek.evaluation.cost = 0;
    let recorded = || async {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            if let Ok(decision) = store.decide(&peek).await {
                return 1_000 - decision.remaining;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "redis did not answer again"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };

    for fault in [Fault::BlackHole, Fault::Reset] {
        proxy.set(fault);
        let results = at_once(50).await;
        assert!(results.iter().all(failed), "{fault:?}: {results:?}");
        proxy.set(Fault::None);
        recorded().await;
    }
    // A reply cut mid-way: the batches it held fail; others may be answered, truly.
    proxy.set(Fault::HalfClose);
    let results = at_once(50).await;
    proxy.set(Fault::None);
    assert!(results.iter().any(failed), "the half-close failed no call");
    let mut admitted = 0;
    for result in &results {
        if !failed(result) {
            admitted += 1;
            assert!(result.as_ref().unwrap().allowed());
        }
    }
    let recorded = recorded().await;
    assert!(
        admitted <= recorded,
        "{admitted} hits reported admitted, {recorded} recorded by Redis"
    );
}
