//! The `Store` trait: where counters live, and the one atomic step that decides a hit. Its
//! erased form, [`DynStore`], is what a [`Limiter`](crate::Limiter) holds, so code above the
//! limiter never names a store type.

mod dynamic;
pub mod url;

use std::future::Future;

use sluice_core::algorithm::concurrency::Released;
use sluice_core::{Decision, Evaluation, Quota};

pub use crate::identifier::Identifier;
pub use dynamic::DynStore;

/// One hit as a store sees it: the identifiers of the rule's leaves (in leaf order), the
/// rule and its quotas, and where the policy's penalty record lives.
///
/// Identifiers whose [routing groups](Identifier::group) are equal must be decided in one
/// place when the rule needs it (one Redis Cluster slot, one database row lock order): the
/// limiter gives every identifier of a rule with `and` the same group unless its leaves share
/// a selector, and each store maps groups to its own placement.
#[derive(Debug, Clone, Copy)]
pub struct Hit<'a> {
    pub identifiers: &'a [Identifier],
    pub evaluation: Evaluation<'a>,
    /// The penalty record's identifier; `Some` exactly when `evaluation.penalty` is.
    pub penalty_identifier: Option<&'a Identifier>,
}

/// The leases of one holder as a store sees them: the identifiers of a rule's concurrency
/// leaves (in leaf order) and their quotas (which carry the lease time).
#[derive(Debug, Clone, Copy)]
pub struct LeaseKeys<'a> {
    pub identifiers: &'a [Identifier],
    pub quotas: &'a [Quota],
    /// How long the holder has held the lease by its own monotonic clock, counted from
    /// before its acquire left; `None` when it does not know (a lease rebuilt from its
    /// token). A release may use it: while the lease time is far from over, the lease cannot
    /// have expired, so the removal alone answers ([`Released::Released`] or
    /// [`Released::NotHeld`]). The Redis store does so when this plus twice its timeout is
    /// under the lease time, and saves a command per release.
    pub held_for: Option<std::time::Duration>,
}

/// A reservation being settled: the rule's identifiers and quotas (concurrency leaves left
/// out), when the reservation was recorded (the store's time, as its
/// [`Store::reserve`] answered), its estimate and its actual cost.
#[derive(Debug, Clone, Copy)]
pub struct Settlement<'a> {
    pub identifiers: &'a [Identifier],
    pub quotas: &'a [Quota],
    pub taken_at: u64,
    pub reserved: u64,
    pub actual: u64,
}

/// Where state lives. `decide` checks and records a whole rule in one atomic step: no
/// interleaving of concurrent hits may admit more than the rule allows.
///
/// A store is written against this trait, with `async fn`; the limiter holds it as a
/// [`DynStore`].
///
/// Concurrency leases ([`Store::acquire`], [`Store::release`], [`Store::renew`]) and
/// reservations ([`Store::reserve`], [`Store::settle`]) have default implementations that
/// answer [`StoreError::Unsupported`], so a store of one's own may leave them out; every
/// store of the workspace (memory, Redis, memcached, PostgreSQL) implements them.
pub trait Store: Send + Sync + 'static {
    /// Decides `hit` and records it as its evaluation asks. Time is the store's own.
    fn decide(&self, hit: &Hit<'_>) -> impl Future<Output = Result<Decision, StoreError>> + Send;

    /// Decides `hit` as [`Store::decide`] does, if this store can do it without waiting
    /// (its state is in this process). `None`, having done nothing, otherwise: the default.
    fn try_decide_now(&self, hit: &Hit<'_>) -> Option<Result<Decision, StoreError>> {
        let _ = hit;
        None
    }

    /// Forgets the state of these identifiers (counters and penalty records alike).
    fn reset(
        &self,
        identifiers: &[Identifier],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Whether decisions leave this process (so a near cache of denials saves round trips).
    fn is_remote(&self) -> bool {
        true
    }

    /// Decides `hit` as [`Store::decide`] does, in the same atomic step, and when it is
    /// admitted takes lease `lease` in every concurrency leaf of the rule (those whose quota's
    /// algorithm is [`Algorithm::Concurrency`](sluice_core::Algorithm::Concurrency)). A
    /// denial by a concurrency leaf is [`Denial::Occupied`](sluice_core::Denial::Occupied).
    fn acquire(
        &self,
        hit: &Hit<'_>,
        lease: u64,
    ) -> impl Future<Output = Result<Decision, StoreError>> + Send {
        let _ = (hit, lease);
        std::future::ready(Err(StoreError::unsupported("concurrency leases")))
    }

    /// Releases lease `lease` in every leaf of `leases`: [`Released::Released`] if any held
    /// it, [`Released::Expired`] if it had expired there, [`Released::NotHeld`] otherwise.
    /// Releasing twice, or a lease of another holder that is not held, changes nothing.
    fn release(
        &self,
        leases: &LeaseKeys<'_>,
        lease: u64,
    ) -> impl Future<Output = Result<Released, StoreError>> + Send {
        let _ = (leases, lease);
        std::future::ready(Err(StoreError::unsupported("concurrency leases")))
    }

    /// Extends lease `lease` to one lease time from now in every leaf of `leases` that holds
    /// it: the time it has left then (the shortest over the leaves), or `None` if no leaf
    /// holds it any more (an expired lease cannot come back).
    fn renew(
        &self,
        leases: &LeaseKeys<'_>,
        lease: u64,
    ) -> impl Future<Output = Result<Option<std::time::Duration>, StoreError>> + Send {
        let _ = (leases, lease);
        std::future::ready(Err(StoreError::unsupported("concurrency leases")))
    }

    /// Decides `hit` (its cost is the estimate) and records it as [`Store::decide`] does;
    /// also answers the store's time of the step, which [`Store::settle`] needs.
    fn reserve(
        &self,
        hit: &Hit<'_>,
    ) -> impl Future<Output = Result<(Decision, u64), StoreError>> + Send {
        let _ = hit;
        std::future::ready(Err(StoreError::unsupported("reservations")))
    }

    /// Charges a reservation its actual cost (see
    /// [`sluice_core::algorithm::settle`]): never refused, whatever the cost.
    fn settle(
        &self,
        settlement: &Settlement<'_>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = settlement;
        std::future::ready(Err(StoreError::unsupported("reservations")))
    }
}

/// A store could not decide. Says whether trying again may help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store did not answer in time.
    #[error("store timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The store could not be reached or dropped the connection.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store answered something we cannot use; retrying will not help.
    #[error("store protocol error: {0}")]
    Protocol(String),
    /// The store does not do this: concurrency leases and reservations on a store that
    /// left them out. Retrying will not help.
    #[error("{0} are not supported by this store")]
    Unsupported(String),
}

impl StoreError {
    /// This store does not do `what` ("concurrency leases", "reservations").
    pub fn unsupported(what: &str) -> StoreError {
        StoreError::Unsupported(what.to_owned())
    }

    /// Whether the same call may succeed later.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Timeout(_) | StoreError::Unavailable(_))
    }
}
