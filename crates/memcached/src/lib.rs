//! The sluice [`Store`](sluice_limiter::Store) on a pool of memcached servers: sliding-window
//! counters with `add`/`incr`, compare-and-swap for the other algorithms, consistent hashing.
//!
//! ```no_run
//! use sluice_limiter::{Limiter, Policy};
//! use sluice_memcached::MemcachedStore;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MemcachedStore::connect("memcached://10.0.0.1:11211,10.0.0.2:11211").await?;
//! let limiter = Limiter::builder(store)
//!     .policy(Policy::new("api", "apikey:100/m algorithm=sliding-window")?)
//!     .build()?;
//! let checked = limiter.check("api", &[("apikey", "k-123")], 1).await?;
//! assert!(checked.decision.allowed());
//! # Ok(()) }
//! ```
//!
//! # How each algorithm is kept
//!
//! - **Sliding window counter** (native): one counter per sub-window, `<id>|w<n>`, created
//!   with `add` and counted with `incr`, both atomic on the server, summed with one multi-key
//!   `get`, each expiring by itself one sub-window after the window slid past it. Exact: a
//!   hit is admitted from the total `incr` returns, so no read-then-write race can admit more
//!   than the limit (see `src/leaf.rs`). Hits on one counter within a process are combined:
//!   one `get` of all the sub-windows, one `incr` and at most one `decr` per batch of hits,
//!   with the decisions of the hits run one at a time (`src/combine.rs`).
//! - **GCRA, fixed window, sliding log**: the state as short text under `<id>|s`, updated
//!   with `gets` then `cas` (`add` when absent; the first try sends the `add` of the state a
//!   fresh key would take behind the `gets`, so a key not yet stored, or expired, is decided
//!   in one round trip), tried again on a lost race up to 64 times
//!   ([`MemcachedStoreBuilder::cas_tries`]), then an honest
//!   [`Contention`](MemcachedError::Contention) error (transient: the failure policy
//!   decides). A sliding log must fit one item: limits above
//!   [`MAX_LOG_LIMIT`] are refused at decision time with
//!   [`Unsupported`](MemcachedError::Unsupported) (use sliding-window or GCRA instead).
//! - **Concurrency leaves** (`user:3 concurrent`, [`Store::acquire`](sluice_limiter::Store::acquire),
//!   `release`, `renew`): the leases held, `(id, expires at)` pairs, as one small set under
//!   `<id>|s`, changed by `gets`/`cas` like the states above: each step drops the expired
//!   leases, counts and adds (or releases, or renews) on the whole set, so it is exact, as
//!   the memory store is. It costs two round trips per acquire and per release, and
//!   rewrites about 42 bytes per lease held; a leaf has at most [`MAX_LEASES`] slots.
//!   Details, and what memcached can lose, in `src/concurrency.rs`.
//! - **Reservations** ([`Store::reserve`](sluice_limiter::Store::reserve), `settle`): decided
//!   and recorded as a hit; settling charges each leaf the difference with a
//!   compare-and-swap (GCRA, fixed window, sliding log) or an `incr`/`decr` of the counter
//!   of the reservation's sub-window (sliding window), never refused (`src/reservation.rs`).
//! - **Compound rules and penalties**: decided leaf by leaf; what an early leaf took is given
//!   back when a later one denies, so a rule never over-admits; rules with `and` take turns
//!   under a short lease per operation (`src/lease.rs`). The bound on
//!   under-admission, and what steps cost, are in `src/decide.rs`. A rule that mixes rate
//!   and concurrency leaves is decided the same way: a concurrency leaf takes its lease
//!   only if it has a free slot (or, inside an `and`, if the rule admits the hit), and
//!   gives it back when a later leaf denies, so a lease can hold a slot for a round trip
//!   for a hit that is then denied (under-admission, never over-admission).
//!
//! Key layouts and value formats: `src/key.rs` and `src/value.rs`. Identifiers
//! that memcached cannot take as keys (over 200 bytes, whitespace, control or non-ASCII
//! characters) are hashed (SHA-256).
//!
//! # A pool of servers
//!
//! `memcached://a:11211,b:11211,c:11211`: keys are spread by a ketama-style consistent-hash
//! ring (`src/ring.rs`), all keys of one identifier on one server. Each server gets one
//! pipelined connection by default (`connections=N` for more): the requests of concurrent
//! decisions are written back to back, as many in one `write` as have gathered, and
//! memcached answers them in order, so under load many decisions share each system call on
//! both sides (`src/connection.rs`); at most 1,024 requests wait for replies per connection,
//! and a connection that dies fails each of them at once (none is admitted unanswered). A
//! server that
//! refuses connections, drops them or keeps timing out is marked down for a while (2 s by
//! default): its keys go to the next server on the ring and start afresh there (clients of
//! those keys may get up to one more limit's worth), the other servers' keys do not move;
//! then it is tried again, and its keys return to it (afresh again if it restarted). Every
//! decision is bounded by the store's timeout (250 ms by default); a failure is a transient
//! [`StoreError`](sluice_limiter::StoreError), and the policy's failure mode (open, closed,
//! local) decides, as with every store.
//!
//! # Evictions and wrap
//!
//! memcached may evict any key when its memory is full. An evicted counter or state restarts
//! from zero: a client can get slightly over its limit (at most one more limit's worth per
//! eviction), never blocked for good, since every key expires. Evictions the store notices
//! (a counter or state gone while it should have lived) are counted in
//! [`MemcachedStats::evictions`]; memcached's own count is in
//! [`MemcachedStore::server_stats`]. Counters cannot wrap: a limit is at most 10^12
//! ([`MAX_COUNT`](sluice_core::rate::MAX_COUNT)), a cost above it is never added, and a
//! counter holds at most twice its limit plus the cost of the hits in flight, far below
//! 2^64; a counter found below what was just added to it (a foreign value) denies that hit
//! and is counted in [`MemcachedStats::wrapped`].
//!
//! # Clocks
//!
//! memcached has no clock to share, so decisions use the caller's clock
//! ([`MemcachedStoreBuilder::clock`], the system clock by default). Keep app servers on NTP:
//! with clocks `d` apart, a sliding-window sub-window starts `d` earlier on one server than on
//! another, so for `d` around each boundary the two count into different sub-windows. Hits
//! within the allowed skew of a boundary ([`MemcachedStoreBuilder::skew`], 250 ms by
//! default) read the next sub-window too and re-read the neighbouring ones after counting,
//! so the limit holds across the boundary (two hits racing there may both step back: one
//! unit left unused for a round trip, never one too many; such a refusal says `retry_after`
//! zero, so no near cache keeps it); beyond that skew, the limit may be off by the
//! hits of the excess. Otherwise
//! skew moves the window by `d`: a hit leaves it up to `d` sooner or later. A GCRA bucket
//! refills `d` sooner for the server ahead, which can admit up to `d / interval` more hits,
//! and later for the one behind, which denies that many sooner (every update is still a
//! compare-and-swap, so no hit is lost). A fixed window turns over `d` apart, and a hit
//! from the server behind never turns a window back. Skew far below the sub-window (or the
//! GCRA interval) changes nothing in practice. A lease expires on the clock of whoever
//! looks: with clocks `d` apart, an abandoned lease frees its slot `d` sooner for the app
//! server ahead (a lease released or renewed in time is not affected).

#![forbid(unsafe_code)]

mod cas;
mod combine;
mod commands;
mod concurrency;
mod connection;
mod decide;
mod error;
mod expiry;
mod key;
mod leaf;
mod lease;
mod pool;
mod protocol;
mod reply;
mod reservation;
mod ring;
mod stats;
mod store;
mod url;
mod value;
mod window;

pub use error::MemcachedError;
pub use stats::{MemcachedStats, ServerStats};
pub use store::{
    DEFAULT_CONNECTIONS, DEFAULT_DOWN_FOR, DEFAULT_SKEW, DEFAULT_TIMEOUT, MemcachedStore,
    MemcachedStoreBuilder,
};
pub use value::{MAX_LEASES, MAX_LOG_LIMIT};

/// The readers of what a memcached server and a user send, for the fuzz targets in `fuzz/`
/// only: not an API, no stability promised.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::protocol::{Expect, Reply, parse as reply};
    pub use crate::url::parse as url;
    pub use crate::value::{Stored, decode as value, encode_penalty, encode_state};
}
