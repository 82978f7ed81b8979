//! First contact with a real Redis: one policy of each algorithm, decided by the script.

use sluice_limiter::{Denial, Limiter, Policy};
use sluice_redis::RedisStore;
use sluice_testkit::{RedisCluster, RedisServer};

async fn exercise(url: &str, namespace: &str) {
    let store = RedisStore::connect(url).await.expect("connect");
    for algorithm in ["gcra", "sliding-window", "sliding-log", "fixed-window"] {
        let rule = format!("user:5/h algorithm={algorithm}; 8/h algorithm={algorithm}");
        let limiter = Limiter::builder(store.clone())
            .policy(Policy::new("p", &rule).unwrap().namespace(namespace))
            .build()
            .unwrap();
        for expected in (0..5).rev() {
            let d = limiter
                .check("p", &[("user", "ann")], 1)
                .await
                .unwrap()
                .decision;
            assert!(d.allowed(), "{algorithm}: {d:?}");
            assert_eq!(d.remaining, expected, "{algorithm}");
        }
        let d = limiter
            .check("p", &[("user", "ann")], 1)
            .await
            .unwrap()
            .decision;
        assert!(!d.allowed(), "{algorithm}");
        assert!(
            matches!(d.denial, Some(Denial::Limited { .. })),
            "{algorithm}"
        );
        assert!(d.retry_after().is_some(), "{algorithm}");
        // The global 8/h leaf has 3 left for others.
        for _ in 0..3 {
            assert!(
                limiter
                    .check("p", &[("user", "bob")], 1)
                    .await
                    .unwrap()
                    .decision
                    .allowed()
            );
        }
        let d = limiter
            .check("p", &[("user", "cat")], 1)
            .await
            .unwrap()
            .decision;
        assert!(!d.allowed(), "{algorithm}: the global leaf is spent");
        let d = limiter
            .check("p", &[("user", "cat")], 9)
            .await
            .unwrap()
            .decision;
        assert_eq!(d.denial, Some(Denial::CostExceedsCapacity));
    }
}

#[tokio::test]
async fn standalone_decides() {
    let server = RedisServer::start().expect("redis-server");
    exercise(&server.url(), "smoke").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cluster_decides_across_slots() {
    let cluster = RedisCluster::start(3).expect("cluster");
    exercise(&cluster.url(), "smoke").await;
}
