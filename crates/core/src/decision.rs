//! Decisions: what the caller learns about one hit.

use std::time::Duration;

use crate::algorithm::{Retry, Verdict};

/// The answer to one hit: allowed or denied, with the numbers clients need.
/// Being limited is a value, not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// The deciding leaf's capacity (burst for GCRA, count otherwise).
    pub limit: u64,
    /// Hits of cost 1 still admissible: after this hit if admitted, now if denied.
    pub remaining: u64,
    /// Time until the deciding leaf is back to its full capacity.
    pub reset_after: Duration,
    /// When allowed: `None`. When denied: the exact earliest time the same hit would be
    /// admitted if nothing else arrived, or `None` when it never can (see `denial`).
    pub retry_after: Option<Duration>,
    /// Why the hit was denied; `None` when allowed.
    pub denial: Option<Denial>,
    /// Index (in the rule's leaf order) of the leaf whose numbers are reported.
    pub leaf: usize,
}

/// Why a hit was denied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Denial {
    /// The rule is reached; `retry_after` says when the hit would pass.
    Limited,
    /// The cost is above what the deciding leaf can ever admit: retrying cannot help.
    CostExceedsCapacity,
    /// The key is serving a penalty timeout.
    Penalized,
    /// The store could not decide and the policy fails closed.
    StoreUnavailable,
}

impl Denial {
    pub const fn name(self) -> &'static str {
        match self {
            Denial::Limited => "limited",
            Denial::CostExceedsCapacity => "cost_exceeds_capacity",
            Denial::Penalized => "penalized",
            Denial::StoreUnavailable => "store_unavailable",
        }
    }
}

impl Decision {
    /// The decision one leaf's verdict makes on its own; `tick` is nanoseconds per tick of
    /// the verdict's times (see [`crate::Quota::tick`]).
    pub fn from_verdict(verdict: &Verdict, leaf: usize, tick: u64) -> Decision {
        let (retry_after, denial) = match verdict.retry {
            _ if verdict.allowed => (None, None),
            Retry::Now => (None, None),
            Retry::After(n) => (Some(ticks(n, tick)), Some(Denial::Limited)),
            Retry::Never => (None, Some(Denial::CostExceedsCapacity)),
        };
        Decision {
            allowed: verdict.allowed,
            limit: verdict.limit,
            remaining: verdict.remaining,
            reset_after: ticks(verdict.reset_after, tick),
            retry_after,
            denial,
            leaf,
        }
    }
}

/// `n` ticks of `tick` nanoseconds as a duration (saturating, never overflowing).
pub fn ticks(n: u64, tick: u64) -> Duration {
    if tick == 1 {
        return Duration::from_nanos(n); // the common case, without a runtime division
    }
    let per_second = (1_000_000_000 / tick.max(1)).max(1);
    Duration::new(n / per_second, ((n % per_second) * tick) as u32)
}
