//! The store conformance suite on the memory store, on the real clock: every case gets
//! clones of one shared store, as app servers share one Redis.

use std::sync::LazyLock;

use sluice_limiter::MemoryStore;
use sluice_limiter::conformance::StoreFactory;

static SHARED: LazyLock<MemoryStore> = LazyLock::new(MemoryStore::new);

struct MemoryFactory;

impl StoreFactory for MemoryFactory {
    type Store = MemoryStore;

    fn store(&self) -> MemoryStore {
        SHARED.clone()
    }
}

sluice_limiter::conformance_tests!(MemoryFactory);

/// Leases: the memory store is the only one that takes them in this phase.
mod leases {
    sluice_limiter::concurrency_conformance_tests!(super::MemoryFactory);
}

/// The whole suite in one test, through a closure factory on a store of its own.
#[test]
fn run_all_with_a_closure_factory() {
    let own = MemoryStore::new();
    sluice_limiter::conformance::block_on("run_all", async move {
        sluice_limiter::conformance::run_all(&move || own.clone()).await;
    });
}
