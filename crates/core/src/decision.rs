//! Decisions: what the caller learns about one hit.

use std::time::Duration;

use crate::algorithm::{Retry, Verdict};

/// The answer to one hit: admitted, or denied for a reason, with the numbers clients need.
/// Being limited is a value, not an error.
///
/// Whether the hit was admitted and when a denied one may come back are both read from
/// [`Decision::denial`], so no decision can say "allowed" and "denied because" at once, nor
/// be limited without saying when the limit clears.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Why the hit was denied; `None` when it was admitted.
    pub denial: Option<Denial>,
    /// The deciding leaf's capacity (burst for GCRA, count otherwise).
    pub limit: u64,
    /// Hits of cost 1 still admissible: after this hit if admitted, now if denied.
    pub remaining: u64,
    /// Time until the deciding leaf is back to its full capacity.
    pub reset_after: Duration,
    /// Index (in the rule's leaf order) of the leaf whose numbers are reported.
    pub leaf: usize,
}

/// Why a hit was denied, with when it may pass where that is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Denial {
    /// The rule is reached; the same hit would be admitted after `retry_after` if nothing
    /// else arrived.
    Limited { retry_after: Duration },
    /// The key is serving a penalty timeout, for `retry_after` more.
    Penalized { retry_after: Duration },
    /// The cost is above what the deciding leaf can ever admit: retrying cannot help.
    CostExceedsCapacity,
    /// The store could not decide and the policy fails closed.
    StoreUnavailable,
    /// Every slot of a concurrency leaf is held. A slot frees when a holder releases, which
    /// nobody can know in advance, or when a lease expires: `retry_after` is the time until
    /// the earliest held lease expires, a bound that holds unless its holder renews it. A
    /// client may retry sooner (a release frees a slot at once).
    Occupied { retry_after: Duration },
}

impl Denial {
    /// The reason's name in answers and metrics: `limited`, `penalized`,
    /// `cost_exceeds_capacity`, `store_unavailable`, `occupied`.
    pub const fn name(self) -> &'static str {
        match self {
            Denial::Limited { .. } => "limited",
            Denial::CostExceedsCapacity => "cost_exceeds_capacity",
            Denial::Penalized { .. } => "penalized",
            Denial::StoreUnavailable => "store_unavailable",
            Denial::Occupied { .. } => "occupied",
        }
    }

    /// When the same hit would pass, if that is known and it ever can. For
    /// [`Denial::Occupied`] it is the latest such time if no holder renews (see there).
    #[inline]
    pub const fn retry_after(self) -> Option<Duration> {
        match self {
            Denial::Limited { retry_after }
            | Denial::Penalized { retry_after }
            | Denial::Occupied { retry_after } => Some(retry_after),
            Denial::CostExceedsCapacity | Denial::StoreUnavailable => None,
        }
    }
}

impl Decision {
    /// An admitted hit's decision.
    #[inline]
    pub const fn admitted(limit: u64, remaining: u64, reset_after: Duration, leaf: usize) -> Self {
        Decision {
            denial: None,
            limit,
            remaining,
            reset_after,
            leaf,
        }
    }

    /// Whether the hit was admitted.
    #[inline]
    pub const fn allowed(&self) -> bool {
        self.denial.is_none()
    }

    /// When a denied hit would pass if nothing else arrived; `None` when admitted, or when
    /// waiting cannot help or is not known (see [`Denial`]).
    #[inline]
    pub const fn retry_after(&self) -> Option<Duration> {
        match self.denial {
            Some(denial) => denial.retry_after(),
            None => None,
        }
    }

    /// The same decision `elapsed` later, had nothing else arrived: every wait shorter by
    /// `elapsed` (never below zero).
    pub fn aged(&self, elapsed: Duration) -> Decision {
        let mut aged = self.clone();
        aged.reset_after = aged.reset_after.saturating_sub(elapsed);
        aged.denial = aged.denial.map(|denial| match denial {
            Denial::Limited { retry_after } => Denial::Limited {
                retry_after: retry_after.saturating_sub(elapsed),
            },
            Denial::Penalized { retry_after } => Denial::Penalized {
                retry_after: retry_after.saturating_sub(elapsed),
            },
            Denial::Occupied { retry_after } => Denial::Occupied {
                retry_after: retry_after.saturating_sub(elapsed),
            },
            other => other,
        });
        aged
    }

    /// The same decision where a concurrency leaf decided it: a `Limited` denial becomes
    /// [`Denial::Occupied`], whose wait is a bound rather than a promise.
    pub fn occupied(mut self) -> Decision {
        if let Some(Denial::Limited { retry_after }) = self.denial {
            self.denial = Some(Denial::Occupied { retry_after });
        }
        self
    }

    /// The decision one leaf's verdict makes on its own; `tick` is nanoseconds per tick of
    /// the verdict's times (see [`crate::Quota::tick`]).
    #[inline]
    pub fn from_verdict(verdict: &Verdict, leaf: usize, tick: u64) -> Decision {
        Decision {
            denial: if verdict.allowed {
                None
            } else {
                denial_of(verdict.retry, tick)
            },
            limit: verdict.limit,
            remaining: verdict.remaining,
            reset_after: ticks(verdict.reset_after, tick),
            leaf,
        }
    }
}

/// The denial a leaf's `retry` makes (`None` for [`Retry::Now`]: nothing to wait for).
#[inline]
pub fn denial_of(retry: Retry, tick: u64) -> Option<Denial> {
    match retry {
        Retry::Now => None,
        Retry::After(n) => Some(Denial::Limited {
            retry_after: ticks(n, tick),
        }),
        Retry::Never => Some(Denial::CostExceedsCapacity),
    }
}

/// `n` ticks of `tick` nanoseconds as a duration (saturating, never overflowing).
#[inline]
pub fn ticks(n: u64, tick: u64) -> Duration {
    if tick == 1 {
        return Duration::from_nanos(n); // the common case, without a runtime division
    }
    let per_second = (1_000_000_000 / tick.max(1)).max(1);
    Duration::new(n / per_second, ((n % per_second) * tick) as u32)
}

/// `d` in whole seconds, rounded up: how protocols that count in seconds (HTTP
/// `Retry-After`, redis-cell, envoyproxy/ratelimit) report a wait, so no client comes back
/// early.
pub const fn whole_seconds(d: Duration) -> u64 {
    d.as_secs() + (d.subsec_nanos() > 0) as u64
}
