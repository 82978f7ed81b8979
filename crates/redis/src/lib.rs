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

#![forbid(unsafe_code)]

mod error;
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
