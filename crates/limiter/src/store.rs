//! The `Store` trait: where counters live, and the one atomic step that decides a hit.

use std::future::Future;

use sluice_core::{Decision, Evaluation};

/// One hit as a store sees it: the identifiers of the rule's leaves (in leaf order), the
/// rule and its quotas, and where the policy's penalty record lives.
#[derive(Debug, Clone, Copy)]
pub struct Hit<'a> {
    pub identifiers: &'a [String],
    pub evaluation: Evaluation<'a>,
    /// Identifier of the penalty record; `Some` exactly when `evaluation.penalty` is.
    pub penalty_identifier: Option<&'a str>,
}

/// Where state lives. `decide` checks and records a whole rule in one atomic step: no
/// interleaving of concurrent hits may admit more than the rule allows.
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
    fn reset(&self, identifiers: &[String]) -> impl Future<Output = Result<(), StoreError>> + Send;
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
