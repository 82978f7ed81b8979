//! [`Slots`]: one key of a concurrency policy, named once, for code that takes leases on the
//! same key again and again (a fleet-wide semaphore in front of one upstream).

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use sluice_core::{Algorithm, Decision};

use super::acquire::{identifiers, lease_names};
use super::decide::{finish, hit};
use super::{Error, Limiter, PolicyArg, PolicyRef, Selectors, counting};
use crate::identifier::Identifier;
use crate::lease::{Acquired, Lease, LeaseId, LeaseParts, Released, TokenSelectors};
use crate::memory::{MemoryStore, SetHandle};
use crate::store::{DynStore, Store};

/// The slots of one key of a policy with a concurrency leaf (`upstream:50 concurrent`): the
/// policy resolved and the key's identifiers written once, when it is made, instead of on
/// every acquire. Cheap to clone and to share between tasks and threads; every clone, and
/// every [`Limiter::acquire`] with the same selectors, counts on the same slots.
///
/// On the memory store an acquire then goes straight to the key's lease set, and its
/// [`Lease`] shares the slots' parts: nothing is looked up, written or allocated.
///
/// Like a [`PolicyRef`], slots keep the policy as it stood when they were made: take new
/// ones to follow a reload.
///
/// ```
/// use sluice_limiter::{Limiter, MemoryStore, Policy};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let limiter = Limiter::builder(MemoryStore::new())
///     .policy(Policy::new("billing", "upstream:2 concurrent lease=30s").unwrap())
///     .build()
///     .unwrap();
/// let billing = limiter.slots("billing", &[("upstream", "billing")]).unwrap();
/// let first = billing.acquire().await.unwrap().lease.unwrap();
/// let second = billing.acquire().await.unwrap().lease.unwrap();
/// assert!(billing.acquire().await.unwrap().lease.is_none()); // both slots held
/// // The same slots, by name and selectors:
/// assert!(limiter.acquire("billing", &[("upstream", "billing")]).await.unwrap().lease.is_none());
/// drop(first);
/// assert!(billing.acquire().await.unwrap().lease.is_some());
/// # drop(second);
/// # });
/// ```
#[derive(Clone)]
pub struct Slots {
    inner: Arc<SlotsInner>,
}

/// What [`Slots`] and the leases taken through them share.
pub(crate) struct SlotsInner {
    store: DynStore,
    policy: PolicyRef,
    /// One per leaf, then the penalty record's when the policy has one: the hit's.
    identifiers: Vec<Identifier>,
    /// The concurrency leaves' identifiers and quotas, and the token's selector values:
    /// what a lease releases, renews and is written as.
    pub(crate) parts: LeaseParts,
    /// On the memory store, for a rule of one concurrency leaf, the key's lease set, pinned
    /// in the table while these slots live (see [`MemoryStore::pin_set`]): an acquire or a
    /// release takes the set's lock and no other.
    pinned: Option<SetHandle>,
    /// Once the pinned set has gone (a reset of the key, or an eviction), the handle to
    /// the key's set that the table holds then (see [`MemoryStore::acquire_held`]), left
    /// by an acquire and replaced when the table let go of its set. The lock is held
    /// around a step on the set, whose own lock it takes.
    set: Mutex<Option<SetHandle>>,
}

impl Drop for SlotsInner {
    fn drop(&mut self) {
        if let Some(pinned) = &self.pinned {
            MemoryStore::unpin_set(pinned);
        }
    }
}

impl fmt::Debug for Slots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slots")
            .field("policy", &self.inner.policy.name())
            .field("identifiers", &self.inner.parts.identifiers)
            .finish()
    }
}

impl Limiter {
    /// The slots of the key `selectors` name in `policy`, whose rule holds a concurrency
    /// leaf: see [`Slots`]. Errors as [`Limiter::acquire`] would on these arguments (an
    /// unknown policy, one without a concurrency leaf, a selector the rule needs missing).
    pub fn slots<'p>(
        &self,
        policy: impl Into<PolicyArg<'p>>,
        selectors: &Selectors<'_>,
    ) -> Result<Slots, Error> {
        let policy = self.resolve(policy.into())?;
        if !policy.concurrent {
            return Err(Error::NoConcurrencyLeaf(policy.name().to_owned()));
        }
        let identifiers = identifiers(&policy, selectors)?;
        let pinned = self.store.as_memory().and_then(|memory| {
            let hit = hit(&policy, &identifiers, 1, counting(&policy));
            match (
                hit.identifiers,
                hit.evaluation.quotas,
                hit.evaluation.penalty,
            ) {
                ([id], [quota], None) if quota.algorithm() == Algorithm::Concurrency => {
                    Some(memory.pin_set(id))
                }
                _ => None,
            }
        });
        let (held, quotas) = policy
            .leaves
            .iter()
            .zip(&identifiers)
            .filter(|(leaf, _)| leaf.leaf.is_concurrency())
            .map(|(leaf, id)| (id.clone(), leaf.quota))
            .unzip();
        let parts = LeaseParts {
            identifiers: held,
            quotas,
            selectors: TokenSelectors::new(lease_names(&policy), selectors),
            leaf: 0,
            set: None,
        };
        Ok(Slots {
            inner: Arc::new(SlotsInner {
                store: self.store.clone(),
                policy,
                identifiers,
                parts,
                pinned,
                set: Mutex::new(None),
            }),
        })
    }
}

impl Slots {
    /// Takes a lease on these slots: [`Limiter::acquire`] on the policy and selectors they
    /// were made with, and the same answer.
    pub async fn acquire(&self) -> Result<Acquired, Error> {
        let inner = &self.inner;
        let id = LeaseId::random();
        let pinned = |memory: &MemoryStore| {
            let quota = inner.policy.quotas.first()?;
            memory.acquire_pinned(inner.pinned.as_ref()?, quota, id.0)
        };
        let hit = || {
            hit(
                &inner.policy,
                &inner.identifiers,
                1,
                counting(&inner.policy),
            )
        };
        let (decision, taken) = match inner.store.as_memory() {
            // In process: no age to keep (see `Limiter::sent_at`).
            Some(memory) => match pinned(memory) {
                Some(decision) => (decision, None),
                None => (
                    memory.acquire_held(&hit(), id.0, &mut inner.set.lock()),
                    None,
                ),
            },
            None => {
                let hit = hit();
                // See `Limiter::sent_at`.
                let taken = inner.store.is_remote().then(crate::clock::real_nanos);
                (Box::pin(inner.store.acquire(&hit, id.0)).await?, taken)
            }
        };
        Ok(self.acquired(id, decision, taken))
    }

    /// The answer to an acquire of lease `id` that `decision` answered.
    #[inline]
    fn acquired(&self, id: LeaseId, decision: Decision, taken: Option<u64>) -> Acquired {
        let inner = &self.inner;
        let lease = decision
            .allowed()
            .then(|| Lease::in_slots(id, inner.store.clone(), self.inner.clone(), taken));
        Acquired {
            checked: finish(inner.policy.clone(), decision, false),
            lease,
        }
    }

    /// The policy these slots decide under.
    pub fn policy(&self) -> &PolicyRef {
        &self.inner.policy
    }
}

impl SlotsInner {
    /// Releases lease `id`, taken through these slots, on the memory store: through their
    /// handle to the lease set when they have one. A handle replaced since the lease was
    /// taken was replaced because the table let go of the lease's set, which it does only
    /// once every lease there has expired: the lease is then held nowhere, as the table
    /// would answer.
    pub(crate) fn release_in(&self, memory: &MemoryStore, id: u64) -> Released {
        // While the pinned set is the table's, every lease of these slots was taken there:
        // the fallback's set is used only once the pinned one has gone, for good.
        if let Some(found) = self
            .pinned
            .as_ref()
            .and_then(|pinned| memory.release_pinned(pinned, id))
        {
            return found;
        }
        let found = self
            .set
            .lock()
            .as_ref()
            .and_then(|set| memory.release_held(set, id));
        found.unwrap_or_else(|| memory.release_now(&self.parts.keys(None), id))
    }
}
