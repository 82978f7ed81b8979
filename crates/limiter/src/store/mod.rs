//! The `Store` trait: where counters live, and the one atomic step that decides a hit. Its
//! erased form, [`DynStore`], is what a [`Limiter`](crate::Limiter) holds, so code above the
//! limiter never names a store type.

mod dynamic;
pub mod url;

use std::future::Future;

use sluice_core::{Decision, Evaluation};

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

/// Where state lives. `decide` checks and records a whole rule in one atomic step: no
/// interleaving of concurrent hits may admit more than the rule allows.
///
/// A store is written against this trait, with `async fn`; the limiter holds it as a
/// [`DynStore`].
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
}

impl StoreError {
    /// Whether the same call may succeed later.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Timeout(_) | StoreError::Unavailable(_))
    }
}
