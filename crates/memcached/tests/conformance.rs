//! The store conformance suite, unchanged, on real memcached: one server per case, and a
//! pool of three for the whole suite; the rate cases, then the concurrency cases (leases and
//! reservations).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sluice_limiter::conformance::{StoreFactory, block_on, run_all, run_all_concurrency};
use sluice_memcached::MemcachedStore;
use sluice_testkit::MemcachedServer;

/// Long enough that a slow answer on a loaded machine (64 tasks on one `and` rule wait
/// their turn for its lease) is not mistaken for a decision taken without memcached.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Two clients of one memcached pool, handed out in turn: the "app servers" of a case.
struct Clients {
    _servers: Vec<MemcachedServer>,
    stores: Vec<MemcachedStore>,
    next: AtomicUsize,
}

impl Clients {
    async fn on(servers: Vec<MemcachedServer>) -> Clients {
        let url = MemcachedServer::pool_url(&servers);
        let mut stores = Vec::new();
        for _ in 0..2 {
            let store = MemcachedStore::builder(&url)
                .timeout(TIMEOUT)
                .connect()
                .await;
            stores.push(store.expect("connect to memcached"));
        }
        Clients {
            _servers: servers,
            stores,
            next: AtomicUsize::new(0),
        }
    }

    async fn one() -> Clients {
        Clients::on(vec![MemcachedServer::start().expect("memcached")]).await
    }
}

impl StoreFactory for Clients {
    type Store = MemcachedStore;

    fn store(&self) -> MemcachedStore {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.stores[i % self.stores.len()].clone()
    }
}

mod one_server {
    use super::Clients;

    sluice_limiter::conformance_tests!(Clients::one().await);
}

mod one_server_concurrency {
    use super::Clients;

    sluice_limiter::concurrency_conformance_tests!(Clients::one().await);
}

#[test]
fn a_pool_of_three_runs_the_whole_suite() {
    block_on("pool of three", async {
        let servers = MemcachedServer::start_many(3).expect("memcached");
        let clients = Clients::on(servers).await;
        run_all(&clients).await;
    });
}

#[test]
fn a_pool_of_three_runs_the_concurrency_suite() {
    block_on("pool of three, concurrency", async {
        let servers = MemcachedServer::start_many(3).expect("memcached");
        let clients = Clients::on(servers).await;
        run_all_concurrency(&clients).await;
    });
}
