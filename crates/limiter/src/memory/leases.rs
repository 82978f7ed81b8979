//! Concurrency leases and reservations in the memory store.
//!
//! A lease set is a cell of its shard's table with a lock of its own
//! ([`CellValue::Leases`]), dropped by a sweep once its last lease has expired. Every step
//! on a set holds the set's lock, and reaches the set one of three ways:
//!
//! - A rule of one concurrency leaf, from a [`Lease`](crate::Lease) holder or through
//!   [`Slots`](crate::Slots): through a handle to the set, with no hash, table lookup or
//!   shard lock (see `handles.rs`).
//! - A rule of one concurrency leaf otherwise (the erased store's calls, a lease rebuilt
//!   from its token, a renew): the shard's shared lock, then the set's.
//! - Every other step (compound rules, penalties, reservations, a set's first acquire): the
//!   exclusive locks of the shards involved, in shard order, then the sets' locks, held
//!   for the whole step, around the core's pure functions (see `locked.rs`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use sluice_core::algorithm::concurrency::{self, Released};
use sluice_core::{Algorithm, Decision, Quota, State, Verdict, evaluate};

use super::table::{Cell, CellValue, SetState, SharedSet, TableSet};
use super::{MemoryStore, put_cell};
use crate::identifier::Identifier;
use crate::store::{Hit, LeaseKeys, Settlement};

impl MemoryStore {
    /// Leases that expired instead of being released, so far: each is a holder that vanished
    /// (or forgot to release), worth a look in the client that took it.
    pub fn leases_expired(&self) -> u64 {
        self.inner.leases_expired.load(Ordering::Relaxed)
    }

    /// [`Store::acquire`](crate::Store::acquire), synchronously: the rule's rate leaves are
    /// checked and recorded and lease `lease` is taken in its concurrency leaves, in one step.
    pub fn acquire_now(&self, hit: &Hit<'_>, lease: u64) -> Decision {
        let ev = &hit.evaluation;
        if let ([id], [quota], None) = (hit.identifiers, ev.quotas, ev.penalty)
            && quota.algorithm() == Algorithm::Concurrency
        {
            return self.acquire_one(id, quota, lease, |_| {});
        }
        let now = self.inner.clock.now();
        let penalty = hit.penalty_identifier.zip(ev.penalty);
        self.locked(hit.identifiers, ev.quotas, penalty, now, |step| {
            let mut expired = 0;
            for state in step.states.iter_mut() {
                if let State::Concurrency(leases) = state {
                    expired += leases.drop_expired(now);
                }
            }
            self.inner
                .leases_expired
                .fetch_add(expired, Ordering::Relaxed);
            let outcome = evaluate(ev, &mut step.states, step.penalty.as_mut(), now);
            let decision = outcome.decision;
            if decision.allowed() {
                for (quota, state) in ev.quotas.iter().zip(step.states.iter_mut()) {
                    if let State::Concurrency(leases) = state {
                        concurrency::hold(quota, leases, now, lease);
                    }
                }
            }
            if ev.quotas[decision.leaf].algorithm() == Algorithm::Concurrency {
                decision.occupied()
            } else {
                decision
            }
        })
    }

    /// Runs `step` on the lease set of `id` under the shard's shared lock and the set's own
    /// lock: `None`, having done nothing, when the shard holds no lease set for `id`.
    pub(super) fn in_place<R>(
        &self,
        id: &Identifier,
        hash: u64,
        step: impl FnOnce(&SharedSet, &mut SetState) -> R,
    ) -> Option<R> {
        let table = self.inner.shards[self.shard_of(hash)].read();
        match table.cells.find(hash, |(k, _)| k == id.as_str()) {
            Some((_, cell)) => match &cell.value {
                // The shared lock is held: the table cannot let go of the set (`gone`).
                CellValue::Leases(set) => Some(step(&set.0, &mut set.0.lock())),
                _ => None,
            },
            None => None,
        }
    }

    /// The common case, a rule of one concurrency leaf: the lease set is changed in place
    /// under the shard's shared lock and the set's own, so acquires and releases on other
    /// identifiers of the shard do not wait, and none of a compound rule's bookkeeping is
    /// done. An emptied set stays in the table (expired, so a sweep may drop it), and the
    /// next acquire does not allocate it again. Only the first acquire of an identifier
    /// takes the shard's exclusive lock, to add the set. `keep` is shown the set the lease
    /// is taken in (see [`MemoryStore::acquire_held`]); generic, so that `acquire_now`'s
    /// copy, which keeps nothing, costs nothing for it.
    pub(super) fn acquire_one(
        &self,
        id: &Identifier,
        quota: &Quota,
        lease: u64,
        mut keep: impl FnMut(&SharedSet),
    ) -> Decision {
        let hash = self.hash(id);
        let now = self.inner.clock.now();
        let mut step = |set: &SharedSet, state: &mut SetState| {
            keep(set);
            let expired = state.leases.drop_expired(now);
            (
                expired,
                concurrency::acquire(quota, &mut state.leases, now, lease),
            )
        };
        let (expired, verdict) = match self.in_place(id, hash, &mut step) {
            Some(done) => done,
            None => {
                let mut table = self.inner.shards[self.shard_of(hash)].write();
                match table.cells.find_mut(hash, |(k, _)| k == id.as_str()) {
                    // Added by another acquire since the shared lock was let go.
                    Some((
                        _,
                        Cell {
                            value: CellValue::Leases(set),
                            ..
                        },
                    )) => step(&set.0, &mut set.0.lock()),
                    _ => {
                        let set = TableSet::new(concurrency::Leases::default());
                        let done = step(&set.0, &mut set.0.lock());
                        let value = CellValue::Leases(set);
                        let swept = put_cell(&mut table, hash, id, value, 0, self, now);
                        drop(table);
                        self.count_swept(swept);
                        done
                    }
                }
            }
        };
        self.acquired(expired, &verdict, quota)
    }

    /// An acquire's decision, the leases it found expired counted.
    #[inline]
    fn acquired(&self, expired: u64, verdict: &Verdict, quota: &Quota) -> Decision {
        if expired > 0 {
            self.inner
                .leases_expired
                .fetch_add(expired, Ordering::Relaxed);
        }
        Decision::from_verdict(verdict, 0, quota.tick()).occupied()
    }

    /// [`Store::release`](crate::Store::release), synchronously.
    pub fn release_now(&self, leases: &LeaseKeys<'_>, lease: u64) -> Released {
        let now = self.inner.clock.now();
        if let [id] = leases.identifiers {
            // One leaf: release in place (an emptied set stays, expired, for the next acquire).
            let found = self
                .in_place(id, self.hash(id), |_, held| {
                    concurrency::release(&mut held.leases, now, lease)
                })
                .unwrap_or(Released::NotHeld);
            if found == Released::Expired {
                self.inner.leases_expired.fetch_add(1, Ordering::Relaxed);
            }
            return found;
        }
        self.locked(leases.identifiers, leases.quotas, None, now, |step| {
            let mut found = Released::NotHeld;
            for state in step.states.iter_mut() {
                if let State::Concurrency(held) = state {
                    match concurrency::release(held, now, lease) {
                        Released::Released => found = Released::Released,
                        Released::Expired if found == Released::NotHeld => {
                            found = Released::Expired;
                        }
                        _ => {}
                    }
                }
            }
            if found == Released::Expired {
                self.inner.leases_expired.fetch_add(1, Ordering::Relaxed);
            }
            found
        })
    }

    /// [`Store::renew`](crate::Store::renew), synchronously.
    pub fn renew_now(&self, leases: &LeaseKeys<'_>, lease: u64) -> Option<Duration> {
        let now = self.inner.clock.now();
        if let ([id], [quota]) = (leases.identifiers, leases.quotas) {
            // One leaf: renew in place; no set, no lease to renew.
            let renewed = self.in_place(id, self.hash(id), |_, held| {
                concurrency::renew(quota, &mut held.leases, now, lease)
            });
            return renewed.flatten().map(|at| Duration::from_nanos(at - now));
        }
        self.locked(leases.identifiers, leases.quotas, None, now, |step| {
            let mut left: Option<u64> = None;
            for (quota, state) in leases.quotas.iter().zip(step.states.iter_mut()) {
                if let State::Concurrency(held) = state
                    && let Some(expires_at) = concurrency::renew(quota, held, now, lease)
                {
                    let this = expires_at - now;
                    left = Some(left.map_or(this, |l| l.min(this)));
                }
            }
            left.map(Duration::from_nanos)
        })
    }

    /// [`Store::reserve`](crate::Store::reserve), synchronously: the decision and the
    /// store's time it was taken at.
    pub fn reserve_now(&self, hit: &Hit<'_>) -> (Decision, u64) {
        let now = self.inner.clock.now();
        let ev = &hit.evaluation;
        let penalty = hit.penalty_identifier.zip(ev.penalty);
        let decision = self.locked(hit.identifiers, ev.quotas, penalty, now, |step| {
            evaluate(ev, &mut step.states, step.penalty.as_mut(), now).decision
        });
        (decision, now)
    }

    /// [`Store::settle`](crate::Store::settle), synchronously.
    pub fn settle_now(&self, settlement: &Settlement<'_>) {
        let now = self.inner.clock.now();
        let Settlement {
            identifiers,
            quotas,
            taken_at,
            reserved,
            actual,
        } = *settlement;
        self.locked(identifiers, quotas, None, now, |step| {
            for (quota, state) in quotas.iter().zip(step.states.iter_mut()) {
                quota.settle(state, now, taken_at, reserved, actual);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::super::handles::tests::{one_leaf_and_compound, runtime};
    use crate::MemoryStore;

    /// Threads take leases on one identifier, half through a one-leaf rule (the shard's
    /// shared lock and the set's own) and half through a compound rule (the shard's
    /// exclusive lock): both paths see one set, and never more than 3 are held.
    #[test]
    fn one_leaf_and_compound_acquires_share_one_exact_set() {
        let limiter = one_leaf_and_compound(&MemoryStore::new(), "x:3 concurrent", "x:1000000/s");
        let x = &[("x", "a")];
        runtime().block_on(async {
            let held: Vec<_> = [
                limiter.acquire("one", x).await,
                limiter.acquire("two", x).await,
            ]
            .into_iter()
            .map(|a| a.unwrap().lease.expect("a free slot"))
            .collect();
            let third = limiter.acquire("one", x).await.unwrap();
            assert_eq!(
                third.checked.decision.remaining, 0,
                "both paths hold in one set"
            );
            assert!(
                !limiter
                    .acquire("two", x)
                    .await
                    .unwrap()
                    .checked
                    .decision
                    .allowed()
            );
            drop((held, third));
        });

        let (holding, most, admitted) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let threads: Vec<_> = (0..4)
            .map(|thread| {
                let (limiter, holding, most, admitted) = (
                    limiter.clone(),
                    holding.clone(),
                    most.clone(),
                    admitted.clone(),
                );
                std::thread::spawn(move || {
                    runtime().block_on(async {
                        for i in 0..3_000 {
                            let policy = ["one", "two"][(thread + i) % 2];
                            let acquired = limiter.acquire(policy, x).await.unwrap();
                            if let Some(lease) = acquired.lease {
                                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                                most.fetch_max(now, Ordering::SeqCst);
                                admitted.fetch_add(1, Ordering::SeqCst);
                                std::thread::yield_now();
                                holding.fetch_sub(1, Ordering::SeqCst);
                                lease.release().await.unwrap();
                            }
                        }
                    })
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert!(most.load(Ordering::SeqCst) <= 3);
        assert!(admitted.load(Ordering::SeqCst) > 0);
        let free = runtime().block_on(limiter.acquire("one", x)).unwrap();
        assert_eq!(
            free.checked.decision.remaining, 2,
            "every lease was released"
        );
    }
}
