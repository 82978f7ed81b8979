//! The store conformance suite, unchanged, on a real PostgreSQL: one server per case, and
//! the whole suite once more on an `UNLOGGED` table in a schema of its own; then the
//! concurrency and reservation cases.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sluice_limiter::conformance::{StoreFactory, block_on, run_all};
use sluice_postgres::PostgresStore;
use sluice_testkit::PostgresServer;

/// Long enough that a slow answer on a loaded machine (64 tasks queueing for one row's
/// lock) is not mistaken for a decision taken without PostgreSQL.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Two clients (two pools) of one server, handed out in turn: the "app servers" of a case.
struct Clients {
    _server: PostgresServer,
    stores: Vec<PostgresStore>,
    next: AtomicUsize,
}

impl Clients {
    async fn on(server: PostgresServer, options: &str) -> Clients {
        let url = format!("{}?pool_size=8{options}", server.url());
        let mut stores = Vec::new();
        for _ in 0..2 {
            let store = PostgresStore::builder(&url)
                .timeout(TIMEOUT)
                .connect()
                .await;
            stores.push(store.expect("connect to postgres"));
        }
        Clients {
            _server: server,
            stores,
            next: AtomicUsize::new(0),
        }
    }

    async fn one() -> Clients {
        Clients::on(PostgresServer::start().expect("postgres"), "").await
    }
}

impl StoreFactory for Clients {
    type Store = PostgresStore;

    fn store(&self) -> PostgresStore {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        self.stores[i % self.stores.len()].clone()
    }
}

mod one_server {
    use super::Clients;

    sluice_limiter::conformance_tests!(Clients::one().await);
}

/// Concurrency leases and reservations: the cases every store that has them runs.
mod leases {
    use super::Clients;

    sluice_limiter::concurrency_conformance_tests!(Clients::one().await);
}

#[test]
fn an_unlogged_table_in_its_own_schema_runs_the_whole_suite() {
    block_on("unlogged", async {
        let server = PostgresServer::start().expect("postgres");
        let clients = Clients::on(server, "&schema=rl_unlogged&unlogged=true").await;
        let persistence = clients._server.psql(
            "SELECT relpersistence FROM pg_class WHERE oid = 'rl_unlogged.counters'::regclass",
        );
        assert_eq!(persistence.unwrap().trim(), "u");
        run_all(&clients).await;
    });
}
