//! Lease sets reached without the table: the handle a holder keeps to its set, and the
//! sets [`Slots`](crate::Slots) pin.
//!
//! A rule of one concurrency leaf, from a [`Lease`](crate::Lease) holder, takes its steps
//! through the [`SetHandle`] its acquire left, with no hash, table lookup or shard lock. The
//! thread keeps the handle with a dropped lease's identifier (see `one_leaf_parts` in
//! `limiter/acquire.rs`), so the next acquire of that identifier on the thread takes it too.
//!
//! A handle must never reach a set the table no longer holds, or a lease taken there would
//! be invisible to every other path. The table's reference ([`TableSet`]) marks its set
//! gone under the set's lock when it is dropped, and a sweep or eviction decides and marks
//! in one hold of that lock (`Cell::retained`); a handle that finds its set gone goes to
//! the table instead, and a release through it answers `NotHeld`, as the table would.
//!
//! [`Slots`](crate::Slots) pin their key's set when they are made
//! ([`MemoryStore::pin_set`]): a sweep keeps a pinned set even empty, so the slots' handle
//! to it stays good, and their acquires and releases take the set's lock and no other. A
//! reset of the key empties a pinned set in place (`Table::reset`). Only an eviction from a
//! shard full of pinned sets lets go of it; the slots then reach the table's set as a
//! thread does, through a handle they replace, and pin that one in its turn.
//!
//! Measured (`cargo bench -p sluice-limiter --bench leases`, one key, one thread; see the
//! README), acquire + release through the `Limiter`: 967 instructions; 654 through
//! `Slots` (692 before they pinned their set); 333 through a
//! [`SlotPermit`](crate::SlotPermit), against 246 for `tokio::sync::Semaphore`; 1,481
//! through the `Limiter` before the handle and the boxed lease parts (with the kept
//! identifier and token bytes already), 1,800 before those too.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use sluice_core::algorithm::concurrency::{self, Released};
use sluice_core::{Algorithm, Decision, Quota, Verdict};

use super::table::{Cell, CellValue, SetState, SharedSet, TableSet};
use super::{MemoryStore, put_cell};
use crate::identifier::Identifier;
use crate::store::Hit;

/// Where a step on a lease set through a handle reads the store's clock.
///
/// Under the set's lock, a thread cannot lose the lock between its read and its lock, as
/// it did on nearly every step when two threads took and gave back permits on one key,
/// each step then passing the lock's line between cores: `SlotPermit`s read it there (two
/// threads, `benches/leases.rs`: 50-108 ns an acquire + release, from 56-305). Before the
/// lock, the read overlaps the lock's atomic: a lease's steps read it there, which a lone
/// thread measured 3-12% faster (`Limiter::acquire` and `Slots::acquire`, the same
/// bench), and on a contended key a lease's time goes to the reference counts its answer
/// moves anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClockRead {
    BeforeLock,
    UnderLock,
}

/// A holder's way to the lease set its lease was taken in, without the table: kept with
/// the lease for its release, and by the thread for the next acquire of the same
/// identifier (see [`MemoryStore::acquire_held`]).
#[derive(Debug, Clone)]
pub(crate) struct SetHandle {
    /// [`MemoryStore`]'s number: a handle works only on the store that made it.
    store: u64,
    set: SharedSet,
}

impl MemoryStore {
    /// [`MemoryStore::acquire_now`] for a holder that keeps a handle to its lease set. A
    /// rule of one concurrency leaf takes the lease through `handle` when it is this
    /// store's and the table still holds its set: neither the identifier's hash nor the
    /// shard's lock, only the set's. Otherwise as `acquire_now`, and `handle` is left on
    /// the set the lease was taken in (or `None` for other rules).
    ///
    /// The caller keeps `handle` with the identifier it was taken for: it names that
    /// identifier's set, and no other.
    pub(crate) fn acquire_held(
        &self,
        hit: &Hit<'_>,
        lease: u64,
        handle: &mut Option<SetHandle>,
    ) -> Decision {
        let ev = &hit.evaluation;
        if let ([id], [quota], None) = (hit.identifiers, ev.quotas, ev.penalty)
            && quota.algorithm() == Algorithm::Concurrency
        {
            if let Some(decision) = handle
                .as_ref()
                .and_then(|held| self.acquire_pinned(held, quota, lease))
            {
                return decision;
            }
            let store = self.inner.id;
            return self.acquire_one(id, quota, lease, |set| {
                *handle = Some(SetHandle {
                    store,
                    set: set.clone(),
                });
            });
        }
        *handle = None;
        self.acquire_now(hit, lease)
    }

    /// Releases `lease` through a handle [`MemoryStore::acquire_held`] left on the set it
    /// was taken in: `None` when the handle is another store's (release by the table). A
    /// set the table let go of holds no lease: [`Released::NotHeld`], as the table would
    /// answer.
    pub(crate) fn release_held(&self, handle: &SetHandle, lease: u64) -> Option<Released> {
        if handle.store != self.inner.id {
            return None;
        }
        Some(
            self.release_pinned(handle, lease, ClockRead::BeforeLock)
                .unwrap_or(Released::NotHeld),
        )
    }

    /// The lease set of `id`, a concurrency leaf's identifier, pinned for [`Slots`]: made
    /// empty when the table holds none, and kept in the table, even empty, until
    /// [`MemoryStore::unpin_set`] (see [`SetState::expires_at`]); a reset empties it in
    /// place. A pinned set may still go (an eviction from a shard full of pinned sets):
    /// then [`MemoryStore::acquire_pinned`] and [`MemoryStore::release_pinned`] answer
    /// `None`.
    ///
    /// [`Slots`]: crate::Slots
    pub(crate) fn pin_set(&self, id: &Identifier) -> SetHandle {
        let store = self.inner.id;
        let pin = |set: &SharedSet, state: &mut SetState| {
            state.pins += 1;
            SetHandle {
                store,
                set: set.clone(),
            }
        };
        let hash = self.hash(id);
        if let Some(handle) = self.in_place(id, hash, pin) {
            return handle;
        }
        let now = self.inner.clock.now();
        let mut table = self.inner.shards[self.shard_of(hash)].write();
        if let Some((
            _,
            Cell {
                value: CellValue::Leases(set),
                ..
            },
        )) = table.cells.find_mut(hash, |(k, _)| k == id.as_str())
        {
            // Added by another acquire since the shared lock was let go.
            return pin(&set.0, &mut set.0.lock());
        }
        let set = TableSet::new(concurrency::Leases::default());
        let handle = pin(&set.0, &mut set.0.lock());
        let swept = put_cell(&mut table, hash, id, CellValue::Leases(set), 0, self, now);
        drop(table);
        self.count_swept(swept);
        handle
    }

    /// Lets go of a pin [`MemoryStore::pin_set`] made: the set is swept once empty again.
    pub(crate) fn unpin_set(handle: &SetHandle) {
        let mut set = handle.set.lock();
        set.pins = set.pins.saturating_sub(1);
    }

    /// [`MemoryStore::acquire_held`] for [`Slots`](crate::Slots) whose pinned set has gone:
    /// the set the handle is left on is pinned in its turn, and the one it replaces
    /// unpinned, so the slots' set keeps out of sweeps whichever it is.
    pub(crate) fn acquire_held_pinned(
        &self,
        hit: &Hit<'_>,
        lease: u64,
        handle: &mut Option<SetHandle>,
    ) -> Decision {
        let before = handle.clone();
        let decision = self.acquire_held(hit, lease, handle);
        let same = |a: &SetHandle, b: &SetHandle| Arc::ptr_eq(&a.set, &b.set);
        match (before, handle.as_ref()) {
            (Some(before), Some(after)) if same(&before, after) => {}
            (before, after) => {
                if let Some(after) = after {
                    after.set.lock().pins += 1;
                }
                if let Some(before) = before {
                    MemoryStore::unpin_set(&before);
                }
            }
        }
        decision
    }

    /// Takes lease `lease` of a rule of one concurrency leaf, `quota`, in the set `handle`
    /// holds, when it is this store's and the table still holds it: neither the
    /// identifier's hash nor the shard's lock, only the set's. `None`, having done nothing,
    /// otherwise.
    #[inline]
    pub(crate) fn acquire_pinned(
        &self,
        handle: &SetHandle,
        quota: &Quota,
        lease: u64,
    ) -> Option<Decision> {
        self.acquire_pinned_as(handle, quota, lease, ClockRead::BeforeLock, |verdict| {
            Decision::from_verdict(verdict, 0, quota.tick()).occupied()
        })
    }

    /// [`MemoryStore::acquire_pinned`], the clock read as `read` says, answered as `answer`
    /// makes the verdict into: a caller that needs the decision only when refused makes
    /// none when admitted.
    #[inline]
    pub(crate) fn acquire_pinned_as<R>(
        &self,
        handle: &SetHandle,
        quota: &Quota,
        lease: u64,
        read: ClockRead,
        answer: impl FnOnce(&Verdict) -> R,
    ) -> Option<R> {
        if handle.store != self.inner.id {
            return None;
        }
        let before = (read == ClockRead::BeforeLock).then(|| self.inner.clock.now());
        let mut set = handle.set.lock();
        if set.gone {
            return None;
        }
        let now = before.unwrap_or_else(|| self.inner.clock.now());
        let expired = set.leases.drop_expired(now);
        let verdict = concurrency::acquire(quota, &mut set.leases, now, lease);
        drop(set);
        if expired > 0 {
            self.inner
                .leases_expired
                .fetch_add(expired, Ordering::Relaxed);
        }
        Some(answer(&verdict))
    }

    /// Releases `lease` in the set `handle` holds, this store's, the clock read as `read`
    /// says: `None`, having done nothing, when the table let go of that set.
    #[inline]
    pub(crate) fn release_pinned(
        &self,
        handle: &SetHandle,
        lease: u64,
        read: ClockRead,
    ) -> Option<Released> {
        let before = (read == ClockRead::BeforeLock).then(|| self.inner.clock.now());
        let found = {
            let mut set = handle.set.lock();
            if set.gone {
                return None;
            }
            let now = before.unwrap_or_else(|| self.inner.clock.now());
            concurrency::release(&mut set.leases, now, lease)
        };
        if found == Released::Expired {
            self.inner.leases_expired.fetch_add(1, Ordering::Relaxed);
        }
        Some(found)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use crate::{Limiter, ManualClock, MemoryStore, Policy, Released};

    /// A limiter on `store` with two policies sharing `leaf`'s counters (key `jobs`): `one`
    /// is the leaf alone, `two` the leaf and `rate`, a compound rule.
    pub(in crate::memory) fn one_leaf_and_compound(
        store: &MemoryStore,
        leaf: &str,
        rate: &str,
    ) -> Arc<Limiter> {
        let limiter = Limiter::builder(store.clone())
            .policy(Policy::new("one", leaf).unwrap().key("jobs"))
            .policy(
                Policy::new("two", &format!("{leaf}; {rate}"))
                    .unwrap()
                    .key("jobs"),
            )
            .build()
            .unwrap();
        Arc::new(limiter)
    }

    /// A store on a manual clock, and a limiter there with the policy `one` =
    /// `x:1 concurrent lease=1s`.
    fn one_slot_on_a_manual_clock() -> (ManualClock, MemoryStore, Limiter) {
        let clock = ManualClock::new(1_000_000_000);
        let store = MemoryStore::builder().clock(clock.clone()).build();
        let limiter = Limiter::builder(store.clone())
            .policy(Policy::new("one", "x:1 concurrent lease=1s").unwrap())
            .build()
            .unwrap();
        (clock, store, limiter)
    }

    pub(in crate::memory) fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    /// A lease keeps a handle to its set, and its thread reuses it for the next acquire of
    /// the identifier; once the table has let go of that set (here a sweep of an expired
    /// lease), neither the release nor the next acquire may use it: the release finds
    /// nothing, as the table would answer, and the acquire takes its slot in the table's
    /// new set, where a second acquire is refused.
    #[test]
    fn a_handle_to_a_set_the_table_dropped_is_not_used() {
        let (clock, store, limiter) = one_slot_on_a_manual_clock();
        let x = &[("x", "a")];
        runtime().block_on(async {
            let first = limiter.acquire("one", x).await.unwrap().lease.unwrap();
            clock.advance(Duration::from_secs(2));
            store.sweep();
            assert_eq!(first.release().await.unwrap(), Released::NotHeld);

            let kept = limiter.acquire("one", x).await.unwrap().lease.unwrap();
            kept.forget();
            clock.advance(Duration::from_secs(2));
            store.sweep();
            // This thread's spare parts hold the handle to the swept set.
            let second = limiter.acquire("one", x).await.unwrap();
            assert!(second.lease.is_some());
            let third = limiter.acquire("one", x).await.unwrap();
            assert!(
                third.lease.is_none(),
                "the table's set holds the second lease"
            );
            drop(second);
            assert!(limiter.acquire("one", x).await.unwrap().lease.is_some());
        });
    }

    /// Sweeps drop every emptied lease set while threads take and release leases on its
    /// identifier, through handles to it (a thread's, and [`Slots`]' pinned one, made and
    /// dropped as they go, so that sets are pinned and unpinned as sweeps run) and through
    /// the table (a compound rule on the same identifier): never more than the one slot is
    /// held, and nothing stays held at the end.
    ///
    /// [`Slots`]: crate::Slots
    #[test]
    fn sweeps_racing_handles_never_admit_more_than_the_limit() {
        let store = MemoryStore::new();
        let limiter = one_leaf_and_compound(&store, "x:1 concurrent", "x:1000000000/s");
        let x = &[("x", "a")];
        let (holding, most, admitted, working) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(3)),
        );
        let sweeper = {
            let (store, working) = (store.clone(), working.clone());
            std::thread::spawn(move || {
                let mut sweeps = 0_u64;
                while working.load(Ordering::SeqCst) > 0 {
                    store.sweep();
                    sweeps += 1;
                }
                sweeps
            })
        };
        let threads: Vec<_> = (0..3)
            .map(|thread| {
                let (limiter, holding, most, admitted, working) = (
                    limiter.clone(),
                    holding.clone(),
                    most.clone(),
                    admitted.clone(),
                    working.clone(),
                );
                std::thread::spawn(move || {
                    runtime().block_on(async {
                        for i in 0..20_000 {
                            let acquired = match (thread + i) % 4 {
                                3 => limiter.slots("one", x).unwrap().acquire().await,
                                way => limiter.acquire(["one", "one", "two"][way], x).await,
                            }
                            .unwrap();
                            if let Some(lease) = acquired.lease {
                                let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                                most.fetch_max(now, Ordering::SeqCst);
                                admitted.fetch_add(1, Ordering::SeqCst);
                                holding.fetch_sub(1, Ordering::SeqCst);
                                lease.release().await.unwrap();
                            }
                        }
                    });
                    working.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let sweeps = sweeper.join().unwrap();
        assert!(sweeps > 0);
        assert!(
            store.stats().expired > 0,
            "sweeps dropped sets under the handles"
        );
        assert_eq!(
            most.load(Ordering::SeqCst),
            1,
            "one slot, never two holders"
        );
        assert!(admitted.load(Ordering::SeqCst) > 0);
        let free = runtime().block_on(limiter.acquire("one", x)).unwrap();
        assert!(free.lease.is_some(), "every lease was released");
    }

    /// Slots pin their key's lease set: a sweep keeps it, empty and expired, while they live
    /// (their acquires and releases then take the set's lock alone), and drops it once they
    /// are gone.
    #[test]
    fn slots_pin_their_set_against_sweeps() {
        let (clock, store, limiter) = one_slot_on_a_manual_clock();
        let x = &[("x", "a")];
        let slots = limiter.slots("one", x).unwrap();
        assert_eq!(store.stats().identifiers, 1, "made with the slots");
        runtime().block_on(async {
            let lease = slots.acquire().await.unwrap().lease.unwrap();
            assert_eq!(lease.release().await.unwrap(), Released::Released);
            let expired = slots.acquire().await.unwrap().lease.unwrap();
            clock.advance(Duration::from_secs(2));
            store.sweep();
            assert_eq!(store.stats().identifiers, 1, "kept while pinned");
            assert_eq!(store.stats().expired, 0);
            assert_eq!(expired.release().await.unwrap(), Released::Expired);
            let held = slots.acquire().await.unwrap().lease.unwrap();
            let by_name = limiter.acquire("one", x).await.unwrap();
            assert!(by_name.lease.is_none(), "one set, by slots and by name");
            drop(held);
        });
        let clone = slots.clone();
        drop(slots);
        clock.advance(Duration::from_secs(2));
        store.sweep();
        assert_eq!(store.stats().identifiers, 1, "a clone still pins it");
        drop(clone);
        store.sweep();
        assert_eq!(store.stats().identifiers, 0, "unpinned, the empty set goes");
        assert_eq!(store.stats().expired, 1);
    }

    /// A reset of the key empties the set the slots pinned, in place: a lease taken before
    /// it is held nowhere, and the slots go on sharing the set with acquires by name (by
    /// either rule), through sweeps.
    #[test]
    fn a_reset_empties_the_pinned_set_in_place() {
        let store = MemoryStore::new();
        let limiter = one_leaf_and_compound(&store, "x:1 concurrent", "x:1000000/s");
        let x = &[("x", "a")];
        let slots = limiter.slots("one", x).unwrap();
        runtime().block_on(async {
            let old = slots.acquire().await.unwrap().lease.unwrap();
            limiter.reset("one", x).await.unwrap();
            let new = slots
                .acquire()
                .await
                .unwrap()
                .lease
                .expect("the reset freed the slot");
            for policy in ["one", "two"] {
                let by_name = limiter.acquire(policy, x).await.unwrap();
                assert!(
                    by_name.lease.is_none(),
                    "the slots' lease is in the one set"
                );
            }
            assert_eq!(old.release().await.unwrap(), Released::NotHeld);
            assert!(slots.acquire().await.unwrap().lease.is_none());
            assert_eq!(new.release().await.unwrap(), Released::Released);
            let by_name = limiter.acquire("two", x).await.unwrap().lease.unwrap();
            assert!(slots.acquire().await.unwrap().lease.is_none());
            drop(by_name);
            store.sweep();
            assert!(slots.acquire().await.unwrap().lease.is_some());
        });
    }

    /// A shard full of pinned sets evicts them like any state when a new identifier needs
    /// room (they go last, but they go): the slots whose set was evicted then take their
    /// leases in the table's new set, still one set with acquires by name, never two.
    #[test]
    fn slots_whose_pinned_set_was_evicted_stay_exact() {
        let store = MemoryStore::builder().max_identifiers(4).shards(1).build();
        let limiter = Limiter::builder(store.clone())
            .policy(Policy::new("one", "x:1 concurrent").unwrap())
            .policy(Policy::new("rate", "y:10/s").unwrap())
            .build()
            .unwrap();
        let names = ["a", "b", "c", "d"];
        let slots: Vec<_> = names
            .iter()
            .map(|x| limiter.slots("one", &[("x", x)]).unwrap())
            .collect();
        assert_eq!(store.stats().identifiers, 4);
        runtime().block_on(async {
            // A fifth identifier: the shard is full of pinned sets, so some go.
            assert!(
                limiter
                    .check("rate", &[("y", "new")], 1)
                    .await
                    .unwrap()
                    .decision
                    .allowed()
            );
            assert!(store.stats().evictions > 0);
            for (x, slots) in names.iter().zip(&slots) {
                let held = slots.permit().await.unwrap().expect("a free slot");
                let by_name = limiter.acquire("one", &[("x", x)]).await.unwrap();
                assert!(
                    by_name.lease.is_none(),
                    "{x}: one set, by slots and by name"
                );
                assert!(
                    slots.permit().await.unwrap().is_err(),
                    "{x}: its one slot is held"
                );
                assert_eq!(held.release().await.unwrap(), Released::Released, "{x}");
                let by_name = limiter.acquire("one", &[("x", x)]).await.unwrap();
                assert!(by_name.lease.is_some(), "{x}: released where it was taken");
            }
        });
    }

    /// Slots whose pinned set was evicted pin the set they take their next lease in, so
    /// sweeps keep that one too while they live.
    #[test]
    fn slots_pin_the_set_that_replaces_an_evicted_one() {
        let clock = ManualClock::new(1_000_000_000);
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .max_identifiers(1)
            .shards(1)
            .build();
        let limiter = Limiter::builder(store.clone())
            .policy(Policy::new("one", "x:1 concurrent lease=1s").unwrap())
            .policy(Policy::new("rate", "y:10/s").unwrap())
            .build()
            .unwrap();
        let slots = limiter.slots("one", &[("x", "a")]).unwrap();
        runtime().block_on(async {
            // The only room there is: the pinned set goes for the rate's state.
            assert!(
                limiter
                    .check("rate", &[("y", "b")], 1)
                    .await
                    .unwrap()
                    .decision
                    .allowed()
            );
            assert_eq!(store.stats().evictions, 1);
            let lease = slots.acquire().await.unwrap().lease.expect("a new set");
            assert_eq!(lease.release().await.unwrap(), Released::Released);
        });
        clock.advance(Duration::from_secs(2));
        store.sweep();
        assert_eq!(
            store.stats().identifiers,
            1,
            "the new set is pinned in its turn"
        );
        drop(slots);
        store.sweep();
        assert_eq!(store.stats().identifiers, 0, "and unpinned with the slots");
    }

    /// Two limiters on two memory stores, one policy handle: a set handle is one store's,
    /// and a lease taken with the same leaf and value on the other store goes to that
    /// store's own set.
    #[test]
    fn a_handle_is_used_only_on_its_own_store() {
        let policy = Policy::new("one", "x:1 concurrent").unwrap();
        let a = Limiter::builder(MemoryStore::new())
            .policy(policy.clone())
            .build()
            .unwrap();
        let b = Limiter::builder(MemoryStore::new())
            .policy(policy)
            .build()
            .unwrap();
        let one = a.policy("one").unwrap();
        let x = &[("x", "a")];
        runtime().block_on(async {
            let on_a = a.acquire(&one, x).await.unwrap().lease.unwrap();
            assert_eq!(on_a.release().await.unwrap(), Released::Released);
            // The same compiled leaf and value: the spare parts' identifier is kept.
            let on_b = b.acquire(&one, x).await.unwrap().lease.unwrap();
            let held_on_a = a.acquire(&one, x).await.unwrap();
            assert!(held_on_a.lease.is_some(), "store a holds nothing of b's");
            assert_eq!(on_b.release().await.unwrap(), Released::Released);
        });
    }
}
