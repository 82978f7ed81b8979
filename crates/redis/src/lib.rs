//! The sluice [`Store`](sluice_limiter::Store) on Redis 7, standalone or Cluster: one Lua
//! script evaluates a whole rule atomically, with Redis's clock.
//!
//! ```no_run
//! use sluice_limiter::{Limiter, Policy};
//! use sluice_redis::RedisStore;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = RedisStore::connect("redis://127.0.0.1:6379").await?;
//! let limiter = Limiter::builder(store)
//!     .policy(Policy::new("api", "apikey:100/m")?)
//!     .build()?;
//! let checked = limiter.check("api", &[("apikey", "k-123")], 1).await?;
//! assert!(checked.decision.allowed());
//! # Ok(()) }
//! ```
//!
//! Every key written has an expiry, so nothing outlives its window; key layouts are in
//! `src/lua/algorithms.lua`. Times are microseconds (the resolution of Redis `TIME`): a rate
//! faster than one hit per microsecond per identifier is held to one per microsecond.
//!
//! How decisions reach Redis:
//! - The most common hit, one GCRA leaf without a penalty, goes through a lean script
//!   (`src/lua/gcra_batch.lua`) that answers one integer, the key's debt before the hit;
//!   the core's GCRA turns it into the decision, so the caller sees what the full script
//!   would say (the shared vectors check it). Such hits waiting at once are **batched**:
//!   one writer task per store sends what is queued (at most 64 hits) as one script call
//!   that decides each in order and writes each key once, with its final state, while at
//!   most two calls are out. There is no timer: a hit that finds nothing waiting and a call
//!   free is sent at once, alone, by its caller's own task. On a Cluster a batch is split by slot
//!   (a script's keys share one), its per-slot calls sent together. A call that fails fails
//!   every hit in it (`Unavailable` or `Timeout`): none is ever reported admitted without
//!   Redis's answer, though a call whose reply was lost may have counted.
//! - One fixed-window leaf without a penalty (the default algorithm of Envoy-style
//!   configurations) goes the same way through its own lean script and queue
//!   (`src/lua/fixed_batch.lua`, `src/lean_batch.rs`): two integers a hit, the count its
//!   window held before it and the time to the window's end, which the core's fixed window
//!   turns into the decision. A decision costs Redis about a tenth of the full script's
//!   instructions on one key and a quarter on 1,000,000 keys (`benches/lua_instructions.sh`).
//! - One sliding-window leaf without a penalty likewise (`src/lua/sliding_batch.lua`): its
//!   verdict depends on every counted sub-window, so the script answers the verdict itself,
//!   three integers a hit (remaining, reset, retry), translated line for line from the
//!   core's sliding window and checked by the same vectors.
//! - One sliding-log leaf without a penalty likewise (`src/lua/log_batch.lua`): the log stays
//!   in Redis, a sorted set as the full script keeps it, and the script answers the verdict
//!   as the sliding window's does; a batch reads each key's count and newest time once,
//!   drops its expired members once, sets its expiry once, and asks a flood of denials'
//!   wait once. Its members are named by a token unique to the call, so no two ever match.
//! - A rule of up to 8 GCRA, fixed-window, sliding-window or sliding-log leaves joined by
//!   `;` (an `or`: `user:10/s; user:1000/h`, the usual way to state several limits) or in
//!   any tree of `or` and `and`, or one such leaf with a penalty (a login form's), likewise
//!   (`src/lua/rule_batch.lua`, `src/rule_batch.rs`): Redis's `now`, one debt (GCRA), count
//!   in the current window (fixed window) or what a decision reads of the sub-windows or the
//!   log (sliding window, sliding log: the units counted and where the ones a decision can
//!   wait for lie) per leaf and the penalty record each hit found, which the core's rule
//!   evaluation turns into the decision.
//! - Every other rule runs the full script (algorithms.lua with `run`), as a Redis 7
//!   Function (`FUNCTION LOAD` once, then `FCALL`), which defines the library of algorithms
//!   once instead of on every call; the library is loaded again when a server has lost it
//!   (restart, failover, `FUNCTION FLUSH`), and a server without Functions (before Redis 7)
//!   or that refuses them is sent the same script by EVALSHA.
//!
//! Concurrency leases and reservations (see `src/leases.rs`), each one script call with
//! Redis's clock:
//! - **acquire** (`src/lua/leases.lua`): drops the expired leases of each concurrency leaf,
//!   decides the rule's rate leaves exactly as a check, and when the rule admits adds the
//!   lease to every concurrency leaf, all in one script. A lease set is a sorted set per
//!   concurrency identifier, keyed like any leaf (`ns:export:user:{alice}:...concurrent`):
//!   member the lease id, score its expiry in microseconds; a set of one lease taken by the
//!   batched path may instead be the string `<id>:<expiry>` (one `SET NX` to acquire, one
//!   `GETDEL` to release), turned into the sorted set by any other step. The key's expiry
//!   is its latest lease's, so the set of holders that all vanished goes by itself; a
//!   release removes its member and leaves the expiry, so a set outlives its last lease by
//!   at most one lease time. A denial by a concurrency leaf is `Denial::Occupied`, `retry_after` the
//!   time until enough leases expire.
//! - **release** and **renew**: one call per Cluster slot of the lease's sets (one call for
//!   any rule whose concurrency leaves share a selector, and always on a standalone server).
//!   A release answers `Expired` for a lease past its expiry while its set still holds it;
//!   once every lease of a set has expired Redis has dropped the key, and it answers
//!   `NotHeld`.
//! - A rule of **one concurrency leaf** without a penalty, the common case, has its
//!   acquires, releases and renews **batched** as lean GCRA hits are (`src/lease_batch.rs`,
//!   `src/lua/lease_batch.lua`): the steps waiting at once (at most 64, in their order of
//!   arrival, split by slot on a Cluster) go as one script call that reads `TIME` once and
//!   takes each step as the single-step scripts would, with the same answer and the same
//!   writes (the shared vectors and a step-by-step comparison with the core check it). A
//!   lone step goes at once; a call that fails fails every step in it. What a call learns
//!   of a busy set (its size, its latest lease, that its expired leases are gone) spares
//!   asking Redis again, so a step there costs about one write. A call names each set's
//!   key once and packs its steps in one argument.
//! - [`RedisStore::leases_expired`] counts the leases that expired unreleased: dropped by a
//!   batched acquire, or found expired by a release. A set whose every lease expired is
//!   deleted by Redis with its key's expiry, and those leases are not counted.
//! - **reserve** runs the decision script and answers Redis's time too; **settle** charges
//!   the difference (`src/lua/reservations.lua`, the core's `settle`), one call per slot,
//!   never refused.
//!
//! On a Cluster the slot rules are those of rates: a rule whose leaves share a selector, and
//! every `and` rule, is one script in one slot; an `or` whose leaves name different
//! selectors (`ip:10/m; user:3 concurrent`) takes its lease slot by slot, as `src/split.rs`
//! decides rates (each concurrency leaf holds the lease where it admits; a denial gives it
//! back). A reservation across slots is refused with an error: its settlement needs one
//! time. Costs (`cargo bench -p sluice-redis --bench leases`) are in the README's "Leases
//! on Redis".

#![forbid(unsafe_code)]

mod batch;
mod error;
mod lean;
mod lean_batch;
mod lease_batch;
mod leases;
mod rule_batch;
// Public only for this crate's tests, which run the Lua algorithms against the shared
// vectors; not part of the API.
#[doc(hidden)]
pub mod script;
mod sentinel;
mod slot;
mod split;
mod store;
mod url;

pub use error::RedisError;
pub use store::{DEFAULT_TIMEOUT, RedisStore, RedisStoreBuilder, one_slot};
pub use url::redact as redact_url;

/// The store URL reader, for the fuzz targets in `fuzz/` only: not an API, no stability
/// promised.
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::url::parse_url as url;
}
