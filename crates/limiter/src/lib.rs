//! The sluice limiter: named policies over a [`Store`] (the in-memory one here; Redis and
//! memcached in their own crates, any of them held as one [`DynStore`]), with penalties, a
//! near cache of denials, failure modes and clocks.
//!
//! ```
//! use sluice_limiter::{Limiter, MemoryStore, Policy};
//!
//! # tokio_test_block(async {
//! let limiter = Limiter::builder(MemoryStore::new())
//!     .policy(Policy::new("login", "ip:5/m; 100/m").unwrap())
//!     .build()
//!     .unwrap();
//! let checked = limiter.check("login", &[("ip", "203.0.113.9")], 1).await.unwrap();
//! assert!(checked.decision.allowed());
//! assert_eq!(checked.decision.remaining, 4);
//! # });
//! # fn tokio_test_block(f: impl std::future::Future<Output = ()>) {
//! #     tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
//! # }
//! ```
//!
//! A store in this process decides without waiting, so code without a runtime (or a hot path
//! that would rather not make a future) can ask [`Limiter::try_check_now`]; it answers `None`
//! only when the store must be awaited:
//!
//! ```
//! use sluice_limiter::{Limiter, MemoryStore, Policy};
//!
//! let limiter = Limiter::builder(MemoryStore::new())
//!     .policy(Policy::new("jobs", "queue:2/s").unwrap())
//!     .build()
//!     .unwrap();
//! let selectors = &[("queue", "mail")];
//! let first = limiter.try_check_now("jobs", selectors, 1).unwrap().unwrap();
//! assert!(first.decision.allowed());
//! ```

//!
//! Limits on how many at once, and costs known only afterwards: [`Limiter::acquire`] takes a
//! [`Lease`] on a rule with a concurrency leaf (`user:3 concurrent lease=30s`), released when
//! dropped; [`Limiter::reserve`] admits an estimated cost and returns a [`Reservation`] to
//! [`settle`](Reservation::settle) at the actual one. Every store of the workspace supports
//! them (memory, Redis, memcached, PostgreSQL; see [`lease`]). Code that takes leases on one
//! key again and again names it once, as [`Slots`], whose [`SlotPermit`]s hold a slot as a
//! semaphore's permit does, with nothing cloned per permit.

#![forbid(unsafe_code)]

pub mod clock;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod failure;
mod identifier;
pub mod lease;
mod limiter;
pub mod memory;
mod near_cache;
pub mod policy;
mod run;
pub mod store;

pub use clock::{Clock, ManualClock, SystemClock};
pub use failure::{FailureMode, LimiterStats};
pub use identifier::selector_value;
pub use lease::{Acquired, Lease, LeaseId, Released, Reservation, Reserved};
pub use limiter::{
    Checked, Decided, Error, Limiter, LimiterBuilder, PolicyArg, PolicyRef, PolicyWatch, Selectors,
    SlotPermit, Slots,
};
pub use memory::{MemoryStats, MemoryStore};
pub use policy::{CompiledLeaf, CompiledPolicy, Policy, PolicyError};
pub use run::{Permit, Refused};
pub use sluice_core::{Algorithm, Decision, Denial, Penalty};
pub use store::{DynStore, Hit, Identifier, LeaseKeys, Settlement, Store, StoreError};
