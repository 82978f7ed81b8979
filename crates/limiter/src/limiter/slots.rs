//! [`Slots`]: one key of a concurrency policy, named once, for code that takes leases on the
//! same key again and again (a fleet-wide semaphore in front of one upstream).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use parking_lot::Mutex;
use sluice_core::{Algorithm, Decision};

use super::acquire::{identifiers, lease_names};
use super::decide::{finish, hit, shadowed};
use super::{Error, Limiter, PolicyArg, PolicyRef, Selectors, counting};
use crate::identifier::Identifier;
use crate::lease::{
    Acquired, Lease, LeaseId, LeaseParts, Released, TokenSelectors, UNKNOWN, join_token, known,
};
use crate::memory::{ClockRead, MemoryStore, SetHandle};
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
    /// Once the pinned set has gone (an eviction from a shard full of pinned sets), the
    /// handle to the key's set that the table holds then (see
    /// [`MemoryStore::acquire_held`]), left by an acquire and replaced when the table let
    /// go of its set, and pinned in its turn ([`MemoryStore::acquire_held_pinned`]). The
    /// lock is held around a step on the set, whose own lock it takes.
    set: Mutex<Option<SetHandle>>,
}

impl Drop for SlotsInner {
    fn drop(&mut self) {
        let fallback = self.set.get_mut().as_ref();
        for pinned in self.pinned.iter().chain(fallback) {
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
        let policy = self.resolve_concurrent(policy.into())?;
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
        let id = LeaseId::random();
        let (decision, taken) = self.take(id).await?;
        Ok(self.acquired(id, decision, taken))
    }

    /// Takes a slot as [`Slots::acquire`] does, with a leaner answer: the slot as a
    /// [`SlotPermit`] borrowed from these slots when admitted, as tokio's `SemaphorePermit`
    /// is from its semaphore, or the decision that denied it. Nothing is cloned or counted
    /// per permit (no policy handle, no store handle): the way to hold a slot where every
    /// nanosecond counts. Where the slot must outlive the borrow (moved into a spawned task),
    /// take a [`Lease`] with [`Slots::acquire`].
    ///
    /// ```
    /// use sluice_limiter::{Limiter, MemoryStore, Policy};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Limiter::builder(MemoryStore::new())
    ///     .policy(Policy::new("billing", "upstream:1 concurrent lease=30s").unwrap())
    ///     .build()
    ///     .unwrap();
    /// let billing = limiter.slots("billing", &[("upstream", "billing")]).unwrap();
    /// let slot = billing.permit().await.unwrap().expect("a free slot");
    /// // ... call the upstream ...
    /// let occupied = billing.permit().await.unwrap().unwrap_err();
    /// assert!(occupied.retry_after().is_some()); // when the held lease expires at the latest
    /// drop(slot); // released
    /// assert!(billing.permit().await.unwrap().is_ok());
    /// # });
    /// ```
    pub async fn permit(&self) -> Result<Result<SlotPermit<'_>, Decision>, Error> {
        let id = LeaseId::random();
        // In process, on the pinned set: the decision is made only when refused.
        let inner = &self.inner;
        if let (Some(memory), Some(pinned), Some(quota)) = (
            inner.store.as_memory(),
            inner.pinned.as_ref(),
            inner.policy.quotas.first(),
        ) && let Some(refused) =
            memory.acquire_pinned_as(pinned, quota, id.0, ClockRead::UnderLock, |verdict| {
                (!verdict.allowed)
                    .then(|| Decision::from_verdict(verdict, 0, quota.tick()).occupied())
            })
        {
            return Ok(self.permitted(id, refused.map_or(Ok(()), Err), None));
        }
        let (decision, taken) = self.take(id).await?;
        let store = if decision.allowed() {
            Ok(())
        } else {
            Err(decision)
        };
        Ok(self.permitted(id, store, taken))
    }

    /// The answer to a permit of lease `id` that the store admitted (`Ok`) or refused with
    /// a decision: a refusal under a shadow policy is a permit that holds no slot.
    #[inline]
    fn permitted(
        &self,
        id: LeaseId,
        store: Result<(), Decision>,
        taken: Option<u64>,
    ) -> Result<SlotPermit<'_>, Decision> {
        let held = match store {
            Ok(()) => true,
            Err(decision) => match shadowed(&self.inner.policy, decision) {
                (_, true) => false,
                (decision, false) => return Err(decision),
            },
        };
        Ok(SlotPermit {
            slots: self,
            id,
            taken: AtomicU64::new(taken.unwrap_or(UNKNOWN)),
            held,
        })
    }

    /// The store's decision on lease `id` in these slots, and when it was sent to a remote
    /// store (see `Limiter::sent_at`).
    #[inline]
    async fn take(&self, id: LeaseId) -> Result<(Decision, Option<u64>), Error> {
        let inner = &self.inner;
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
                    memory.acquire_held_pinned(&hit(), id.0, &mut inner.set.lock()),
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
        Ok((decision, taken))
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
    pub(crate) fn release_in(&self, memory: &MemoryStore, id: u64, read: ClockRead) -> Released {
        // While the pinned set is the table's, every lease of these slots was taken there:
        // the fallback's set is used only once the pinned one has gone, for good.
        if let Some(found) = self
            .pinned
            .as_ref()
            .and_then(|pinned| memory.release_pinned(pinned, id, read))
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

/// A slot held through [`Slots::permit`], borrowed from its slots. Dropping it releases the
/// slot as dropping a [`Lease`] does: at once on the memory store, by a task on the current
/// tokio runtime on a remote store. Under a shadow policy that would have denied, it holds
/// no slot ([`SlotPermit::holds_slot`]) and releases nothing.
pub struct SlotPermit<'a> {
    slots: &'a Slots,
    id: LeaseId,
    /// As a [`Lease`]'s: when the acquire or the latest renew that found the lease left for
    /// a remote store, or `UNKNOWN`.
    taken: AtomicU64,
    /// Whether the permit holds its slot still: not once released or forgotten, nor
    /// under a shadow policy's denial.
    held: bool,
}

impl fmt::Debug for SlotPermit<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotPermit")
            .field("id", &self.id)
            .field("slots", self.slots)
            .field("held", &self.held)
            .finish()
    }
}

impl SlotPermit<'_> {
    /// The id of the slot's lease, as [`Lease::id`].
    pub fn id(&self) -> LeaseId {
        self.id
    }

    /// Whether the permit holds a slot: `false` only under a shadow policy that would have
    /// denied (admitted, without a slot).
    pub fn holds_slot(&self) -> bool {
        self.held
    }

    /// The slot's lease as text, as [`Lease::token`] writes it: another process on the same
    /// store and policy can release or renew it (see [`Limiter::lease`]).
    pub fn token(&self) -> String {
        join_token(&[&self.id.to_string()], &self.slots.inner.parts.selectors)
    }

    /// Releases the slot now, and reports what the store found, as [`Lease::release`] does.
    pub async fn release(mut self) -> Result<Released, Error> {
        if !std::mem::take(&mut self.held) {
            return Ok(Released::NotHeld);
        }
        let inner = &self.slots.inner;
        match inner.store.as_memory() {
            Some(memory) => Ok(inner.release_in(memory, self.id.0, ClockRead::UnderLock)),
            None => Box::pin(self.lease().release()).await,
        }
    }

    /// Extends the lease to one lease time from now, as [`Lease::renew`] does.
    pub async fn renew(&self) -> Result<Option<Duration>, Error> {
        if !self.held {
            return Ok(None);
        }
        let inner = &self.slots.inner;
        crate::lease::renew(&inner.store, &inner.parts, self.id, &self.taken).await
    }

    /// Lets go of the permit without releasing, as [`Lease::forget`] does.
    pub fn forget(mut self) -> LeaseId {
        self.held = false;
        self.id
    }

    /// The slot as an owned [`Lease`] of the same slots, which releases it when dropped.
    fn lease(&self) -> Lease {
        let inner = &self.slots.inner;
        Lease::in_slots(
            self.id,
            inner.store.clone(),
            inner.clone(),
            known(&self.taken),
        )
    }
}

impl Drop for SlotPermit<'_> {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let inner = &self.slots.inner;
        match inner.store.as_memory() {
            Some(memory) => {
                inner.release_in(memory, self.id.0, ClockRead::UnderLock);
            }
            // Released as a dropped lease is, in the background.
            None => drop(self.lease()),
        }
    }
}
