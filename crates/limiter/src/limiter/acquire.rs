//! Concurrency leases and reservations on a [`Limiter`].

use super::decide::{finish, hit};
use super::identify::{write_leaf, write_leaf_again, write_penalty};
use super::{Error, Limiter, PolicyArg, PolicyRef, Selectors, counting};
use crate::identifier::{Identifier, Identifiers};
use crate::lease::{
    Acquired, Lease, LeaseId, LeaseParts, Reservation, Reserved, TokenError, TokenSelectors,
    parse_lease_token, parse_reservation_token, token_selectors,
};
use crate::policy::CompiledPolicy;
use crate::store::Store;
use sluice_core::Decision;

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
        let policy = self.resolve_concurrent(policy.into())?;
        if policy.leaves.len() == 1 && policy.policy.penalty.is_none() {
            // One concurrency leaf (the policy is concurrent). A remote store's call is
            // boxed: this future stays small, and moves cheaply, for the memory store's
            // acquire, which waits for nothing.
            return match self.store.as_memory() {
                Some(memory) => self.acquire_one_now(memory, policy, selectors),
                None => Box::pin(self.acquire_one_remote(policy, selectors)).await,
            };
        }
        // Written into this thread's reused buffers, as a check's are: only the concurrency
        // leaves' identifiers are copied, into the lease, and only when it is admitted.
        let mut written = Identifiers::take();
        for leaf in &policy.leaves {
            write_leaf(written.next(), &policy, leaf, selectors)?;
        }
        if policy.policy.penalty.is_some() {
            write_penalty(written.next(), &policy, selectors)?;
        }
        let hit = hit(&policy, written.as_slice(), 1, counting(&policy));
        let id = LeaseId::random();
        let taken = self.sent_at();
        let decision = self.store.acquire(&hit, id.0).await?;
        let lease = decision.allowed().then(|| {
            let mut parts = LeaseParts::spare();
            (parts.leaf, parts.set) = (0, None);
            let concurrent = policy
                .leaves
                .iter()
                .enumerate()
                .filter(|(_, leaf)| leaf.leaf.is_concurrency());
            let mut held = 0;
            for (i, leaf) in concurrent {
                if parts.identifiers.len() == held {
                    parts.identifiers.push(Identifier::default());
                }
                // The lease takes the written identifier; the thread's buffers take the
                // room a dropped lease left.
                written.swap(i, &mut parts.identifiers[held]);
                parts.quotas.push(leaf.quota);
                held += 1;
            }
            parts.identifiers.truncate(held);
            parts.selectors.write(lease_names(&policy), selectors);
            Lease::new(id, self.store.clone(), parts, taken)
        });
        Ok(Acquired {
            checked: finish(policy, decision, false),
            lease,
        })
    }

    /// For a remote store, the time before an acquire leaves: the lease's age counts from
    /// here (see [`LeaseKeys::held_for`](crate::LeaseKeys::held_for)). The memory store's
    /// release is exact and cheap, so it gets none.
    #[inline]
    fn sent_at(&self) -> Option<u64> {
        self.store.is_remote().then(crate::clock::real_nanos)
    }

    /// [`Limiter::acquire`] for a rule of one concurrency leaf and no penalty (the usual
    /// lease) on the memory store, which waits for nothing: the answer is made here and
    /// returned as it is (an answer wrapped for the caller to unwrap was one more move of
    /// it, about 40 instructions an acquire).
    #[inline]
    fn acquire_one_now(
        &self,
        memory: &crate::MemoryStore,
        policy: PolicyRef,
        selectors: &Selectors<'_>,
    ) -> Result<Acquired, Error> {
        let (mut parts, id) = one_leaf_parts(&policy, selectors)?;
        // In process: no age to keep (see `sent_at`). The lease set is reached through the
        // parts' handle when they have one for this identifier, and they keep one for the
        // release.
        let hit = hit(&policy, &parts.identifiers, 1, counting(&policy));
        let decision = memory.acquire_held(&hit, id.0, &mut parts.set);
        Ok(self.leased(policy, parts, id, decision, None))
    }

    /// [`Limiter::acquire`] for a rule of one concurrency leaf and no penalty on a remote
    /// store: its call.
    async fn acquire_one_remote(
        &self,
        policy: PolicyRef,
        selectors: &Selectors<'_>,
    ) -> Result<Acquired, Error> {
        let (parts, id) = one_leaf_parts(&policy, selectors)?;
        let taken = self.sent_at();
        let hit = hit(&policy, &parts.identifiers, 1, counting(&policy));
        match self.store.acquire(&hit, id.0).await {
            Ok(decision) => Ok(self.leased(policy, parts, id, decision, taken)),
            Err(error) => {
                parts.keep_spare();
                Err(error.into())
            }
        }
    }

    /// A one-leaf acquire's answer: the lease when `decision` admits; otherwise the parts
    /// go back for the next acquire.
    #[inline]
    fn leased(
        &self,
        policy: PolicyRef,
        mut parts: Box<LeaseParts>,
        id: LeaseId,
        decision: Decision,
        taken: Option<u64>,
    ) -> Acquired {
        let lease = if decision.allowed() {
            parts.quotas.push(policy.leaves[0].quota);
            Some(Lease::new(id, self.store.clone(), parts, taken))
        } else {
            parts.keep_spare();
            None
        };
        Acquired {
            checked: finish(policy, decision, false),
            lease,
        }
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
                TokenSelectors::new(policy.penalty_names.iter().map(String::as_str), selectors),
            )
        });
        Ok(Reserved {
            checked: finish(policy, decision, false),
            reservation,
        })
    }
}

impl Limiter {
    /// Rebuilds a lease from its [`Lease::token`], in this process or another on the same
    /// store: to release or renew a lease taken elsewhere (the service hands tokens to its
    /// clients). Unlike the guard [`Limiter::acquire`] returns, the rebuilt lease releases
    /// nothing when dropped; call [`Lease::release`].
    ///
    /// A token that is not one, or that was taken under another policy, is an error; a
    /// token of this policy whose lease is gone rebuilds, and its release answers
    /// [`Released::NotHeld`](crate::lease::Released::NotHeld).
    ///
    /// ```
    /// use sluice_limiter::{Limiter, MemoryStore, Policy};
    ///
    /// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
    /// let limiter = Limiter::builder(MemoryStore::new())
    ///     .policy(Policy::new("export", "user:1 concurrent").unwrap())
    ///     .build()
    ///     .unwrap();
    /// let lease = limiter.acquire("export", &[("user", "alice")]).await.unwrap().lease.unwrap();
    /// let token = lease.token();
    /// lease.forget(); // handed on as text
    /// let lease = limiter.lease("export", &token).unwrap();
    /// assert_eq!(lease.release().await.unwrap().name(), "released");
    /// assert!(limiter.lease("export", "not a token").is_err());
    /// # });
    /// ```
    pub fn lease<'p>(
        &self,
        policy: impl Into<PolicyArg<'p>>,
        token: &str,
    ) -> Result<Lease, TokenError> {
        let (id, pairs) = parse_lease_token(token)?;
        let policy = self.resolve_concurrent(policy.into())?;
        let names: Vec<&str> = lease_names(&policy).collect();
        let selectors = token_selectors("lease", policy.name(), &names, &pairs)?;
        let (mut identifiers, mut quotas) = (Vec::new(), Vec::new());
        for leaf in policy.leaves.iter().filter(|l| l.leaf.is_concurrency()) {
            let mut identifier = Identifier::default();
            write_leaf(&mut identifier, &policy, leaf, &selectors)?;
            identifiers.push(identifier);
            quotas.push(leaf.quota);
        }
        let parts = LeaseParts {
            identifiers,
            quotas,
            selectors: TokenSelectors::new(names, &selectors),
            leaf: 0,
            set: None,
        };
        Ok(Lease::rebuilt(id, self.store.clone(), parts))
    }

    /// Rebuilds a reservation from its [`Reservation::token`], in this process or another
    /// on the same store, to [`settle`](Reservation::settle) it there. Errors as
    /// [`Limiter::lease`]. Tokens are not signed: whoever may call the limiter may settle.
    pub fn reservation<'p>(
        &self,
        policy: impl Into<PolicyArg<'p>>,
        token: &str,
    ) -> Result<Reservation, TokenError> {
        let (taken_at, estimate, pairs) = parse_reservation_token(token)?;
        let policy = self.resolve(policy.into())?;
        if policy.concurrent {
            return Err(Error::ReserveConcurrency(policy.name().to_owned()).into());
        }
        let names: Vec<&str> = policy.penalty_names.iter().map(String::as_str).collect();
        let selectors = token_selectors("reservation", policy.name(), &names, &pairs)?;
        let mut identifiers = Vec::with_capacity(policy.leaves.len());
        for leaf in &policy.leaves {
            let mut identifier = Identifier::default();
            write_leaf(&mut identifier, &policy, leaf, &selectors)?;
            identifiers.push(identifier);
        }
        Ok(Reservation::new(
            self.store.clone(),
            identifiers,
            policy.quotas.clone(),
            taken_at,
            estimate,
            TokenSelectors::new(names, &selectors),
        ))
    }
}

/// The parts a one-leaf lease will keep, with its identifier written (a dropped lease's
/// parts, reused), and the new lease's id.
///
/// The identifier is written straight into the parts the lease will keep, not into the
/// thread's check buffers and then swapped over. When those parts were this leaf's, with
/// the same value, they are kept as they are: the identifier, the token bytes it was
/// written with, and the handle to its lease set.
#[inline]
fn one_leaf_parts(
    policy: &CompiledPolicy,
    selectors: &Selectors<'_>,
) -> Result<(Box<LeaseParts>, LeaseId), Error> {
    let mut parts = LeaseParts::spare();
    let leaf = &policy.leaves[0];
    let written = parts.leaf == leaf.uid && parts.identifiers.len() == 1;
    // Whatever happens below, these parts are this leaf's only once both are written.
    parts.leaf = 0;
    if parts.identifiers.is_empty() {
        parts.identifiers.push(Identifier::default());
    }
    parts.identifiers.truncate(1);
    match write_leaf_again(&mut parts.identifiers[0], written, policy, leaf, selectors) {
        Ok(true) => {}
        Ok(false) => {
            // A new identifier: new token bytes, and no handle to its set yet.
            parts.set = None;
            parts.selectors.write(lease_names(policy), selectors);
        }
        Err(error) => {
            parts.keep_spare();
            return Err(error);
        }
    }
    parts.leaf = leaf.uid;
    Ok((parts, LeaseId::random()))
}

/// The selector names of a policy's concurrency leaves, sorted, each once: what a lease
/// token carries.
pub(super) fn lease_names(policy: &CompiledPolicy) -> impl Iterator<Item = &str> {
    policy.lease_names.iter().map(String::as_str)
}

/// One identifier per leaf, then the penalty record's when the policy has one.
pub(super) fn identifiers(
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Leases of rules with two concurrency leaves and with one, taken in turn on one
    /// thread, reuse each other's dropped parts: each still releases exactly its own slots.
    #[test]
    fn reused_lease_parts_name_their_own_leaves() {
        use crate::{MemoryStore, Policy, Released};

        let limiter = Limiter::builder(MemoryStore::new())
            .policy(Policy::new("two", "user:1 concurrent; team:1 concurrent").unwrap())
            .policy(Policy::new("one", "team:1 concurrent").unwrap())
            .build()
            .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            let alice = &[("user", "alice"), ("team", "red")];
            let blue = &[("team", "blue")];
            for _ in 0..3 {
                let two = limiter.acquire("two", alice).await.unwrap().lease.unwrap();
                assert_eq!(two.release().await.unwrap(), Released::Released);
                let one = limiter.acquire("one", blue).await.unwrap().lease.unwrap();
                assert!(limiter.acquire("one", blue).await.unwrap().lease.is_none());
                assert_eq!(one.release().await.unwrap(), Released::Released);
                let again = limiter.acquire("one", blue).await.unwrap();
                assert!(again.lease.is_some(), "the one-leaf lease freed its slot");
            }
            // Every slot of the two-leaf rule is free again.
            assert!(limiter.acquire("two", alice).await.unwrap().lease.is_some());
        });
    }

    /// A one-leaf lease keeps a dropped lease's identifier and token bytes only for the
    /// same leaf and value: each token, rebuilt, releases its own slot, through values that
    /// repeat, values that differ by a byte, hashed values, and two policies whose leaves
    /// have the same rule (not the same identifier).
    #[test]
    fn kept_lease_parts_name_their_own_value() {
        use crate::{MemoryStore, Policy, Released};

        let limiter = Limiter::builder(MemoryStore::new())
            .policy(Policy::new("one", "user:1 concurrent").unwrap())
            .policy(Policy::new("two", "user:1 concurrent").unwrap())
            .build()
            .unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let long = "v".repeat(300);
        let steps = [
            ("one", "alice"),
            ("one", "alice"),
            ("two", "alice"),
            ("one", "alice"),
            ("one", "alicf"),
            ("one", "#x"),
            ("one", "#x"),
            ("two", &long),
            ("two", &long),
            ("two", "a b"),
            ("two", "a b"),
            ("one", "alice"),
        ];
        runtime.block_on(async {
            for (policy, value) in steps {
                let user = &[("user", value)];
                let lease = limiter.acquire(policy, user).await.unwrap().lease.unwrap();
                let token = lease.token();
                lease.forget();
                assert!(limiter.acquire(policy, user).await.unwrap().lease.is_none());
                let rebuilt = limiter.lease(policy, &token).unwrap();
                assert_eq!(
                    rebuilt.release().await.unwrap(),
                    Released::Released,
                    "{policy} {value:?}: the token names the lease's own value"
                );
                let again = limiter.acquire(policy, user).await.unwrap().lease;
                assert!(again.is_some(), "{policy} {value:?}: its slot is free");
            }
        });
    }
}
