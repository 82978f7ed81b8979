//! The sluice [`Store`](sluice_limiter::Store) on PostgreSQL (13 or newer): one PL/pgSQL
//! function evaluates a whole rule under row locks, with the database's clock.
//!
//! ```no_run
//! use sluice_limiter::{Limiter, Policy};
//! use sluice_postgres::PostgresStore;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PostgresStore::connect("postgres://app:secret@127.0.0.1:5432/app").await?;
//! let limiter = Limiter::builder(store)
//!     .policy(Policy::new("api", "apikey:100/m")?)
//!     .build()?;
//! let checked = limiter.check("api", &[("apikey", "k-123")], 1).await?;
//! assert!(checked.decision.allowed());
//! # Ok(()) }
//! ```
//!
//! # The URL
//!
//! `postgres://user:pass@host:port/db?options` (or `postgresql://`). sluice's options:
//!
//! | option | default | meaning |
//! |---|---|---|
//! | `pool_size` | 16 | connections in the pool |
//! | `batch_senders` | 4 | tasks sending batches of lean decisions, each on one connection (at most `pool_size`) |
//! | `timeout_ms` | 250 | time allowed for one decision; past it the policy's failure mode decides |
//! | `connect_timeout_ms` | 2000 | time allowed to open one connection |
//! | `schema` | `sluice` | the schema holding the table and functions (lower-case identifier) |
//! | `unlogged` | false | an `UNLOGGED` table: faster writes, emptied by a crash |
//! | `cleanup_interval_ms` | 1000 | how often expired rows are deleted |
//! | `cleanup_pages` | 1024 | table pages (8 KiB) the cleaner examines per run |
//! | `sslmode` | `prefer` | `disable`, `prefer`, `require` (`verify-ca`, `verify-full` mean `require`) |
//! | `sslrootcert` | none | a PEM file of CA certificates trusted besides the Mozilla roots |
//!
//! With TLS the server's certificate is always verified (rustls). Other options
//! (`application_name`, `options`, `target_session_attrs`, ...) go to the client as they
//! are. Errors never show the password.
//!
//! # How it decides
//!
//! Each decision is one call of `SCHEMA.decide(...)` (or `SCHEMA.gcra_one(...)`, a lean
//! translation for one GCRA leaf without a penalty, the common hit) in its own transaction:
//! it creates missing rows and locks all of the hit's rows in the order of their
//! identifiers (one `INSERT ... ON CONFLICT DO UPDATE ... WHERE false`, which inserts or
//! locks row by row in that order), so two rules sharing identifiers never deadlock; reads
//! `clock_timestamp()` once the locks are held; and runs the algorithms, the rule tree and the
//! penalty, translated line by line from `sluice-core` (`src/sql/*.sql`, checked against the
//! shared vectors). Times are microseconds. Row layouts are in `src/sql/algorithms.sql`.
//!
//! Lean hits are batched: they queue, and `batch_senders` sender tasks each take a
//! connection, then up to 64 queued hits, and send them in one call of
//! `SCHEMA.gcra_many(...)` (one round trip, one transaction). It locks every row of the
//! batch with one `INSERT` in the order of their identifiers (the same order `decide` locks
//! in), reads them with one `SELECT`, decides each hit as `gcra_one` would (a repeated
//! identifier's hits in arrival order, each seeing the state the previous one left) on one
//! clock reading, and writes the final states back with one `UPDATE`: statements per batch,
//! arithmetic per hit. So every hit gets the answer it would get alone, one after the
//! other. Fewer senders make larger batches, and a large batch costs the database a fraction
//! of a lone call per hit: the default of 4 senders on a pool of 16 leaves the other
//! connections to full decisions, resets and peeks. A
//! hit alone goes at once, through `gcra_one`, without a timer: batches form only from what
//! queued while the connections were busy. A batch that fails (a lost connection, past
//! `timeout_ms`) fails every hit in it with that error, for the failure mode to answer; a hit
//! whose caller gave up before its batch left is never sent.

//! # Concurrency leases and reservations
//!
//! [`Store::acquire`](sluice_limiter::Store::acquire), `release`, `renew`, `reserve` and
//! `settle` are one call each of a function in `src/sql/leases.sql`, in its own
//! transaction, under the same row locks in identifier order as a decision, with the clock
//! read once they are held. `acquire` decides the rule's rate leaves as `decide` does and, in
//! each concurrency leaf, drops the expired leases, counts the others and adds the new one:
//! no interleaving of acquires, from any number of servers, holds more than N. Its answers are
//! the memory store's (checked step by step against it, and against the shared
//! concurrency vectors). A concurrency leaf's leases live in its row as `{id, expires_at, ...}`
//! pairs with the latest expiry as the row's `expires_at`, so the cleaner deletes the row
//! once every lease in it has expired: an abandoned lease needs nothing but time. Each step
//! reads and rewrites the whole set, 16 bytes a lease: cheap for counts in the tens or
//! hundreds, a large array rewritten per step for counts in the thousands.
//!
//! `reserve` is `decide` plus the database's time of the step (in nanoseconds since the Unix
//! epoch, as the memory store's clock counts; microseconds underneath), which `settle` takes
//! back to charge the difference between the estimate and the actual cost
//! (`sluice_core::algorithm::settle`, translated): never refused.
//!
//! Measured (`cargo bench -p sluice-postgres --bench leases`, 50 callers, pool of 16, a
//! 2-core machine shared with the server): 1,904 acquire + release pairs a second on one key
//! and 3,708 on 10,000 keys, beside 27,853 and 23,146 batched GCRA checks in the same run.
//! Each lease step is a transaction of its own (no batching), about what an unbatched
//! decision costs, so a pair costs 6 to 15 batched checks.

//! # Schema, expiry, failures
//!
//! At start the store creates or upgrades its schema in one transaction under
//! `pg_advisory_xact_lock`, so servers starting together take turns: versioned table
//! migrations, and the functions when their text changed. PostgreSQL has no expiry: a row
//! whose state has expired reads as fresh, and a background task deletes such rows, sweeping
//! `cleanup_pages` pages per `cleanup_interval_ms` in short transactions that skip rows a
//! decision holds ([`PostgresStore::clean_expired`] runs one sweep on demand).
//!
//! A decision past `timeout_ms` is [`StoreError::Timeout`](sluice_limiter::StoreError), a
//! lost or refused connection [`StoreError::Unavailable`](sluice_limiter::StoreError): the
//! policy's failure mode answers. The pool replaces dead connections by itself, so decisions
//! come back once the database does.
//!
//! What failover and restore do to the counters: a decision counts once its transaction
//! commits. After a crash, a logged table comes back with every committed decision (with
//! `synchronous_commit = off` on the server, the last few hundred milliseconds of them may
//! be lost, letting those clients in again). An `UNLOGGED` table comes back empty: every
//! client starts with a full allowance, and penalties are forgotten. A streaming replica
//! promoted by a failover holds what was replicated: with asynchronous replication the last
//! decisions before the failover may be missing (admitted again); unlogged tables are not
//! replicated at all (empty on the new primary). Restoring a backup rolls the counters back
//! to the backup's time, which only ever lets clients in early: nothing is counted twice.
//! The counters are keyed by the database's clock, so a server whose own clock is wrong
//! changes nothing.

#![forbid(unsafe_code)]

// Public only for this crate's tests, which run the functions against the shared vectors;
// not part of the API.
mod batch;
#[doc(hidden)]
pub mod call;
mod cleaner;
mod client;
mod error;
#[doc(hidden)]
pub mod leases;
#[doc(hidden)]
pub mod migrate;
mod store;
mod tls;
mod url;

pub use client::ClientUrl;
pub use error::PostgresError;
pub use store::{PostgresStore, PostgresStoreBuilder};
pub use url::{DEFAULT_SCHEMA, DEFAULT_TIMEOUT, redact as redact_url};
