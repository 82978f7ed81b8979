//! The store conformance suite: the same cases, run against every [`Store`] (memory, Redis,
//! Redis Cluster, memcached), so that a limit means the same thing whatever holds it.
//!
//! A store's crate enables the `conformance` feature of `sluice-limiter` in its
//! dev-dependencies and, in one integration test file, names a [`StoreFactory`]:
//!
//! ```no_run
//! // tests/conformance.rs of a store crate (here with the memory store).
//! use std::sync::LazyLock;
//!
//! use sluice_limiter::MemoryStore;
//! use sluice_limiter::conformance::StoreFactory;
//!
//! /// One store shared by every case, as a Redis server is shared by app servers.
//! static SHARED: LazyLock<MemoryStore> = LazyLock::new(MemoryStore::new);
//!
//! struct Shared;
//!
//! impl StoreFactory for Shared {
//!     type Store = MemoryStore;
//!     fn store(&self) -> MemoryStore {
//!         SHARED.clone()
//!     }
//! }
//!
//! sluice_limiter::conformance_tests!(Shared);
//! # fn main() {}
//! ```
//!
//! The macro writes one `#[test]` per case, named after it, each on its own multi-threaded
//! tokio runtime (4 workers). The factory expression is evaluated inside that runtime, once
//! per case, and may `.await` (to connect, say):
//! `conformance_tests!(RedisFactory::connect(url).await)`. A case asks the factory for at
//! most two stores, so a factory may hand out clients round-robin from a pool of two. To run
//! the suite twice in one file (standalone and Cluster), call the macro in two modules.
//! [`run_all`] runs every case in one test instead, and each case is a public `async fn`
//! taking `&impl StoreFactory`, for a store that must skip or wrap one.
//!
//! Every case works in a namespace of its own (counters persist in a shared store between
//! tests and runs) and on real time: stores keep their own clocks, so no case can move time.
//! Rates are long (100 per hour: a GCRA bucket refills one unit every 36 s; fixed windows
//! span ten years so they cannot roll over mid-case), so the seconds a case may take on a
//! loaded machine change no count, and durations are checked within bounds measured by the
//! case itself. No case sleeps.
//!
//! What is checked: exact decision numbers for each algorithm; exact counts under 64
//! concurrent tasks for every algorithm, compound `or`/`and` rules and costs above one, also
//! across two limiters on two stores from the factory (two app servers); peeks and cost 0
//! record nothing; a cost above capacity never passes; resets pardon one key only; counted
//! denials lengthen the wait within a bound; penalties box, grow and are pardoned; shadow
//! policies admit and count; odd selector values get their own counters; the near cache
//! answers known denials. Concurrency leases have cases of their own
//! ([`concurrency_conformance_tests!`](crate::concurrency_conformance_tests)): never more
//! than N held under 64 racing tasks on two limiters (half of them through
//! [`Slots`](crate::Slots)), release frees at once, renew keeps a lease, an abandoned lease
//! expires after its lease time and not before, slots share their key's count; and
//! reservations (100 racing tasks reserving estimates and settling actual costs on two
//! limiters) keep the books on every algorithm.

use std::future::Future;
use std::time::Duration;

use crate::store::Store;

mod answers;
mod denials;
mod exact;
mod harness;
mod leases;
mod requests;
mod reservations;
mod servers;

pub use answers::{near_cache_answers_denied, shadow_admits_and_counts};
pub use denials::{count_denied_counts_denials, penalties_box_and_grow};
pub use exact::{
    costs_above_one, exact_compound_rules, exact_numbers, exact_under_concurrency_each_algorithm,
};
pub use leases::{
    abandoned_leases_expire, leases_never_exceed_the_limit, release_frees_at_once,
    renew_keeps_a_lease, slot_permits_hold_the_keys_slots, slots_are_the_keys_own,
};
pub use requests::{
    cost_above_capacity_is_never, peek_and_cost_zero_record_nothing, reset_pardons_one_key_only,
    special_selector_values,
};
pub use reservations::reservations_keep_the_books;
pub use servers::two_servers_share_one_limit;

/// Makes the stores a case runs on. Every store it returns must share one state (clients of
/// one server, clones of one memory store): cases use several at once as several app servers.
pub trait StoreFactory: Send + Sync + 'static {
    type Store: Store + Clone;

    /// A store on the shared state: for a networked store, a new client or connection.
    fn store(&self) -> Self::Store;
}

/// A closure works as a factory: `conformance_tests!(|| MY_STORE.clone())`.
impl<S, F> StoreFactory for F
where
    S: Store + Clone,
    F: Fn() -> S + Send + Sync + 'static,
{
    type Store = S;

    fn store(&self) -> S {
        self()
    }
}

/// Longest a case may run before it fails (a store that stopped answering, say).
pub const CASE_TIMEOUT: Duration = Duration::from_secs(120);

/// Every case, in order, in one test.
pub async fn run_all<F: StoreFactory>(factory: &F) {
    exact_numbers(factory).await;
    exact_under_concurrency_each_algorithm(factory).await;
    exact_compound_rules(factory).await;
    costs_above_one(factory).await;
    peek_and_cost_zero_record_nothing(factory).await;
    cost_above_capacity_is_never(factory).await;
    reset_pardons_one_key_only(factory).await;
    count_denied_counts_denials(factory).await;
    penalties_box_and_grow(factory).await;
    shadow_admits_and_counts(factory).await;
    special_selector_values(factory).await;
    two_servers_share_one_limit(factory).await;
    near_cache_answers_denied(factory).await;
}

/// Every concurrency case, in order, in one test (stores that support leases and
/// reservations).
pub async fn run_all_concurrency<F: StoreFactory>(factory: &F) {
    leases_never_exceed_the_limit(factory).await;
    release_frees_at_once(factory).await;
    renew_keeps_a_lease(factory).await;
    abandoned_leases_expire(factory).await;
    slots_are_the_keys_own(factory).await;
    slot_permits_hold_the_keys_slots(factory).await;
    reservations_keep_the_books(factory).await;
}

/// Runs `future` (one case, or [`run_all`]) on a new 4-worker tokio runtime, failing it
/// after [`CASE_TIMEOUT`]: what [`conformance_tests!`](crate::conformance_tests) writes in
/// each test, for hand-written ones.
pub fn block_on(case: &str, future: impl Future<Output = ()>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a tokio runtime for the conformance suite");
    let timed = runtime.block_on(async { tokio::time::timeout(CASE_TIMEOUT, future).await });
    if timed.is_err() {
        panic!("conformance case `{case}` took longer than {CASE_TIMEOUT:?}");
    }
}

/// One `#[test]` per conformance case, each running it on the store factory `$factory` (an
/// expression, evaluated inside the case's runtime). See [`conformance`](crate::conformance).
#[macro_export]
macro_rules! conformance_tests {
    (@cases ($factory:expr) $($case:ident)*) => {
        $(
            #[test]
            fn $case() {
                $crate::conformance::block_on(stringify!($case), async {
                    let factory = $factory;
                    $crate::conformance::$case(&factory).await;
                });
            }
        )*
    };
    ($factory:expr $(,)?) => {
        $crate::conformance_tests! {
            @cases ($factory)
            exact_numbers
            exact_under_concurrency_each_algorithm
            exact_compound_rules
            costs_above_one
            peek_and_cost_zero_record_nothing
            cost_above_capacity_is_never
            reset_pardons_one_key_only
            count_denied_counts_denials
            penalties_box_and_grow
            shadow_admits_and_counts
            special_selector_values
            two_servers_share_one_limit
            near_cache_answers_denied
        }
    };
}

/// One `#[test]` per concurrency case (leases), as [`conformance_tests!`] does for rates.
/// Kept apart so that a store of one's own without leases and reservations (they have
/// default implementations answering [`StoreError::Unsupported`](crate::StoreError)) can run
/// the rate cases alone.
#[macro_export]
macro_rules! concurrency_conformance_tests {
    ($factory:expr $(,)?) => {
        $crate::conformance_tests! {
            @cases ($factory)
            leases_never_exceed_the_limit
            release_frees_at_once
            renew_keeps_a_lease
            abandoned_leases_expire
            slots_are_the_keys_own
            slot_permits_hold_the_keys_slots
            reservations_keep_the_books
        }
    };
}
