//! What the store counts about itself, and what the servers say about themselves.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counts one [`MemcachedStore`](crate::MemcachedStore) (and its clones) keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemcachedStats {
    /// Counters or states found gone while they should have lived: evicted by memcached
    /// (memory full), or deleted by a reset in the middle of a decision. Each one restarted
    /// a count from zero, which can only let a client slightly over, never block it.
    pub evictions: u64,
    /// Compare-and-swap writes (and `add`s) that lost a race and were tried again.
    pub contention_retries: u64,
    /// Decisions that failed because contention used up every try.
    pub contention_exhausted: u64,
    /// Times a server was marked down (refused, dropped, or timed out repeatedly).
    pub servers_marked_down: u64,
    /// Calls sent to another server than the key's owner, because the owner was down.
    pub rerouted: u64,
    /// Counters found below the cost just added to them (a 64-bit wrap, or a value some
    /// other client wrote): the hit was denied and the counter left to expire.
    pub wrapped: u64,
    /// Steps after a decision was known (giving back a reservation, recording an admitted
    /// hit in a leaf that denied it, striking a penalty) that failed: the decision stands,
    /// the counters are off by that hit until they expire.
    pub unfinished: u64,
    /// Concurrency leases that expired instead of being released (dropped from their set, or
    /// found expired by their release): each is a holder that vanished or forgot to release.
    pub leases_expired: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) evictions: AtomicU64,
    pub(crate) contention_retries: AtomicU64,
    pub(crate) contention_exhausted: AtomicU64,
    pub(crate) servers_marked_down: AtomicU64,
    pub(crate) rerouted: AtomicU64,
    pub(crate) wrapped: AtomicU64,
    pub(crate) unfinished: AtomicU64,
    pub(crate) leases_expired: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> MemcachedStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MemcachedStats {
            evictions: get(&self.evictions),
            contention_retries: get(&self.contention_retries),
            contention_exhausted: get(&self.contention_exhausted),
            servers_marked_down: get(&self.servers_marked_down),
            rerouted: get(&self.rerouted),
            wrapped: get(&self.wrapped),
            unfinished: get(&self.unfinished),
            leases_expired: get(&self.leases_expired),
        }
    }
}

/// One server's own numbers, from `stats`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerStats {
    pub address: String,
    /// Items memcached evicted to make room (all clients' items, not only sluice's).
    pub evictions: u64,
    pub curr_items: u64,
    pub uptime_seconds: u64,
    pub version: String,
}
