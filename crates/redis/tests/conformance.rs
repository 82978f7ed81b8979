//! The store conformance suite, unchanged, on real Redis: a standalone server (one per case)
//! and a 3-master Cluster (one for the whole suite); the rate cases, then the concurrency
//! cases (leases and reservations).

use std::sync::atomic::{AtomicUsize, Ordering};

use sluice_limiter::conformance::{StoreFactory, block_on, run_all, run_all_concurrency};
use sluice_redis::RedisStore;
use sluice_testkit::{RedisCluster, RedisServer};

/// Two clients of one Redis, handed out in turn: the "app servers" of a case.
struct Clients {
    _server: Option<RedisServer>,
    stores: Vec<RedisStore>,
    next: AtomicUsize,
}

impl Clients {
    async fn on(url: &str, server: Option<RedisServer>) -> Clients {
        let mut stores = Vec::new();
        for _ in 0..2 {
            // A generous timeout: on a loaded test machine a slow answer must not turn into a
            // decision taken without Redis, which the suite would rightly reject.
            let store = RedisStore::builder(url).timeout(std::time::Duration::from_secs(5));
            stores.push(store.connect().await.expect("connect to redis"));
        }
        Clients {
            _server: server,
            stores,
            next: AtomicUsize::new(0),
        }
    }

    async fn standalone() -> Clients {
        let server = RedisServer::start().expect("redis-server");
        let url = server.url();
        Clients::on(&url, Some(server)).await
    }
}

impl StoreFactory for Clients {
    type Store = RedisStore;

    fn store(&self) -> RedisStore {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.stores[i % self.stores.len()].clone()
    }
}

mod standalone {
    use super::Clients;

    sluice_limiter::conformance_tests!(Clients::standalone().await);
}

mod standalone_concurrency {
    use super::Clients;

    sluice_limiter::concurrency_conformance_tests!(Clients::standalone().await);
}

#[test]
fn cluster_runs_the_whole_suite() {
    let cluster = RedisCluster::start(3).expect("redis cluster");
    let url = cluster.url();
    block_on("cluster", async move {
        let clients = Clients::on(&url, None).await;
        run_all(&clients).await;
    });
    drop(cluster);
}

#[test]
fn cluster_runs_the_concurrency_suite() {
    let cluster = RedisCluster::start(3).expect("redis cluster");
    let url = cluster.url();
    block_on("cluster concurrency", async move {
        let clients = Clients::on(&url, None).await;
        run_all_concurrency(&clients).await;
    });
    drop(cluster);
}
