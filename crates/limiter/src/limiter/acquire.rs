//! Concurrency leases and reservations on a [`Limiter`].

use sluice_core::{Evaluation, Recording};

use super::decide::{finish, write_leaf, write_penalty};
use super::{Error, Limiter, PolicyArg, Selectors, counting};
use crate::identifier::Identifier;
use crate::lease::{Acquired, Lease, LeaseId, LeaseParts, Reservation, Reserved};
use crate::policy::CompiledPolicy;
use crate::store::{Hit, Store};

impl Limiter {
    /// Takes a lease on `policy`, whose rule holds a concurrency leaf (`user:3 concurrent`):
    /// admitted when every leaf allows (rate leaves are checked and recorded as by a check,
    /// in the same atomic step), and then the returned [`Lease`] holds a slot in each
    /// concurrency leaf until it is released or dropped, or its lease time passes.
    ///
    /// A denial by a concurrency leaf is [`Denial::Occupied`](crate::Denial::Occupied): its
    /// `retry_after` is when the earliest lease expires, a bound (a release frees a slot
    /// sooner). Store errors are returned as errors: failure modes apply to checks only.
    ///
    /// ```
    /// use sluice_limiter::{Limiter, MemoryStore, Policy};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Limiter::builder(MemoryStore::new())
    ///     .policy(Policy::new("export", "user:100/h; user:2 concurrent lease=10m").unwrap())
    ///     .build()
    ///     .unwrap();
    /// let alice = &[("user", "alice")];
    /// let first = limiter.acquire("export", alice).await.unwrap();
    /// let second = limiter.acquire("export", alice).await.unwrap();
    /// assert!(first.lease.is_some() && second.lease.is_some());
    /// let third = limiter.acquire("export", alice).await.unwrap();
    /// assert!(!third.checked.decision.allowed()); // both slots held
    /// drop(first); // releases its slot
    /// assert!(limiter.acquire("export", alice).await.unwrap().lease.is_some());
    /// # });
    /// ```
    pub async fn acquire<'p>(
        &self,
        policy: impl Into<PolicyArg<'p>>,
        selectors: &Selectors<'_>,
    ) -> Result<Acquired, Error> {
        let policy = self.resolve(policy.into())?;
        if !policy.concurrent {
            return Err(Error::NoConcurrencyLeaf(policy.name().to_owned()));
        }
        let identifiers = identifiers(&policy, selectors)?;
        let hit = hit(&policy, &identifiers, 1, counting(&policy));
        let id = LeaseId::random();
        let decision = self.store.acquire(&hit, id.0).await?;
        let lease = decision.allowed().then(|| {
            let (identifiers, quotas) = policy
                .leaves
                .iter()
                .zip(identifiers)
                .filter(|(leaf, _)| leaf.leaf.is_concurrency())
                .map(|(leaf, id)| (id, leaf.quota))
                .unzip();
            let parts = LeaseParts {
                identifiers,
                quotas,
            };
            Lease::new(id, self.store.clone(), parts)
        });
        Ok(Acquired {
            checked: finish(policy, decision, false),
            lease,
        })
    }

    /// Admits or refuses a hit of cost `estimate` on `policy`, as a check would, and when it
    /// is admitted returns a [`Reservation`] to [`settle`](Reservation::settle) once the
    /// actual cost is known (a token budget for a language model: the tokens a response
    /// used are known at its end). Settling charges the difference: a refund when less, a
    /// debt that delays the next admissions when more, never refused after the fact.
    ///
    /// ```
    /// use sluice_limiter::{Limiter, MemoryStore, Policy};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Limiter::builder(MemoryStore::new())
    ///     .policy(Policy::new("tokens", "user:100000/m").unwrap())
    ///     .build()
    ///     .unwrap();
    /// let bob = &[("user", "bob")];
    /// let reserved = limiter.reserve("tokens", bob, 4_000).await.unwrap();
    /// assert_eq!(reserved.checked.decision.remaining, 96_000);
    /// reserved.reservation.unwrap().settle(1_500).await.unwrap(); // 2,500 refunded
    /// let peek = limiter.peek("tokens", bob, 1).await.unwrap();
    /// assert_eq!(peek.decision.remaining, 98_499);
    /// # });
    /// ```
    pub async fn reserve<'p>(
        &self,
        policy: impl Into<PolicyArg<'p>>,
        selectors: &Selectors<'_>,
        estimate: u64,
    ) -> Result<Reserved, Error> {
        let policy = self.resolve(policy.into())?;
        if policy.concurrent {
            return Err(Error::ReserveConcurrency(policy.name().to_owned()));
        }
        let identifiers = identifiers(&policy, selectors)?;
        let hit = hit(&policy, &identifiers, estimate, counting(&policy));
        let (decision, taken_at) = self.store.reserve(&hit).await?;
        if let Some(cache) = &self.near_cache {
            // The counters moved outside the check path: forget what the cache knew.
            cache.clear();
        }
        let reservation = decision.allowed().then(|| {
            let leaves = policy.leaves.len();
            Reservation::new(
                self.store.clone(),
                identifiers[..leaves].to_vec(),
                policy.quotas.clone(),
                taken_at,
                estimate,
            )
        });
        Ok(Reserved {
            checked: finish(policy, decision, false),
            reservation,
        })
    }
}

/// One identifier per leaf, then the penalty record's when the policy has one.
fn identifiers(
    policy: &CompiledPolicy,
    selectors: &Selectors<'_>,
) -> Result<Vec<Identifier>, Error> {
    let mut out = Vec::with_capacity(policy.leaves.len() + 1);
    for leaf in &policy.leaves {
        let mut id = Identifier::default();
        write_leaf(&mut id, policy, leaf, selectors)?;
        out.push(id);
    }
    if policy.policy.penalty.is_some() {
        let mut id = Identifier::default();
        write_penalty(&mut id, policy, selectors)?;
        out.push(id);
    }
    Ok(out)
}

fn hit<'a>(
    policy: &'a CompiledPolicy,
    identifiers: &'a [Identifier],
    cost: u64,
    recording: Recording,
) -> Hit<'a> {
    let leaves = policy.leaves.len();
    Hit {
        identifiers: &identifiers[..leaves],
        evaluation: Evaluation {
            shape: &policy.shape,
            quotas: &policy.quotas,
            cost,
            recording,
            penalty: policy.policy.penalty.as_ref(),
        },
        penalty_identifier: identifiers.get(leaves),
    }
}
