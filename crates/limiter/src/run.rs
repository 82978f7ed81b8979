//! Limiting any block of code (jobs, queue consumers, outgoing API calls), with an optional
//! waiting mode that sleeps until the hit would be admitted, up to a bound.
//!
//! ```
//! use std::time::Duration;
//! use sluice_limiter::{Limiter, MemoryStore, Policy};
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let limiter = Limiter::builder(MemoryStore::new())
//!     .policy(Policy::new("mail", "queue:100/s").unwrap())
//!     .build()
//!     .unwrap();
//! let sent = limiter
//!     .run_within("mail", &[("queue", "welcome")], Duration::from_secs(1), async {
//!         "sent" // the rate-limited work
//!     })
//!     .await
//!     .unwrap();
//! assert_eq!(sent, "sent");
//! # });
//! ```

use std::future::Future;
use std::time::Duration;

use sluice_core::Decision;

use crate::limiter::{Limiter, PolicyArg, Selectors};

/// Leave to go ahead: the decision that admitted the hit, and how long it waited for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permit {
    pub decision: Decision,
    pub waited: Duration,
}

/// Why the block did not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refused {
    /// The policy refused (and waiting, if asked for, could not help within the bound).
    #[error("rate limited ({})", .0.denial.map_or("limited", |d| d.name()))]
    Limited(Decision),
    /// The limiter could not decide.
    #[error("the rate limiter could not decide: {0}")]
    Unavailable(#[from] crate::Error),
}

impl Refused {
    /// When the same hit would be admitted, if it ever can and that is known.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Refused::Limited(decision) => decision.retry_after(),
            Refused::Unavailable(_) => None,
        }
    }

    /// Whether trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Refused::Limited(decision) => decision.retry_after().is_some(),
            Refused::Unavailable(error) => error.is_transient(),
        }
    }
}

impl Limiter {
    /// Decides one hit of `cost` now: a [`Permit`] or [`Refused::Limited`].
    pub async fn admit<'p>(
        &self,
        policy: impl Into<PolicyArg<'p>>,
        selectors: &Selectors<'_>,
        cost: u64,
    ) -> Result<Permit, Refused> {
        let decision = self.check(policy, selectors, cost).await?.decision;
        if decision.allowed() {
            Ok(Permit {
                decision,
                waited: Duration::ZERO,
            })
        } else {
            Err(Refused::Limited(decision))
        }
    }

    /// Runs `work` if one hit is admitted now.
    pub async fn run<'p, F: Future>(
        &self,
        policy: impl Into<PolicyArg<'p>>,
        selectors: &Selectors<'_>,
        work: F,
    ) -> Result<F::Output, Refused> {
        self.admit(policy, selectors, 1).await?;
        Ok(work.await)
    }

    /// Like [`admit`](Self::admit), but when refused, sleeps (tokio's timer) until the hit
    /// would pass and tries again, as long as the total wait stays within `max_wait`. A
    /// wait that would overrun the bound is not started: the refusal comes at once.
    #[cfg(feature = "tokio")]
    pub async fn admit_within<'p>(
        &self,
        policy: impl Into<PolicyArg<'p>>,
        selectors: &Selectors<'_>,
        cost: u64,
        max_wait: Duration,
    ) -> Result<Permit, Refused> {
        let policy = policy.into();
        let mut waited = Duration::ZERO;
        loop {
            let decision = self.check(policy, selectors, cost).await?.decision;
            if decision.allowed() {
                return Ok(Permit { decision, waited });
            }
            match decision.retry_after() {
                Some(wait) if waited + wait <= max_wait => {
                    tokio::time::sleep(wait).await;
                    waited += wait;
                }
                _ => return Err(Refused::Limited(decision)),
            }
        }
    }

    /// Runs `work` once one hit is admitted, waiting at most `max_wait`.
    #[cfg(feature = "tokio")]
    pub async fn run_within<'p, F: Future>(
        &self,
        policy: impl Into<PolicyArg<'p>>,
        selectors: &Selectors<'_>,
        max_wait: Duration,
        work: F,
    ) -> Result<F::Output, Refused> {
        self.admit_within(policy, selectors, 1, max_wait).await?;
        Ok(work.await)
    }
}
