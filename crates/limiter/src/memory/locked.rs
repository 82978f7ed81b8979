//! The general path of the memory store: the exclusive locks of every shard a step touches,
//! taken in shard order, around the core's pure functions. Decisions of compound rules,
//! penalties, a new identifier's first hit, and every lease step but the one-leaf ones go
//! through [`MemoryStore::locked`].

use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::MutexGuard;
use sluice_core::{Algorithm, PenaltyState, Quota, State};

use super::table::{self, CellValue, SetState, SharedSet};
use super::{Few, MemoryStore, put_cell, put_state, take_penalty, take_state};
use crate::identifier::Identifier;

/// The states of one locked step, and where they go back.
pub(super) struct Step<'a> {
    pub(super) states: Few<State>,
    pub(super) penalty: Option<PenaltyState>,
    pub(super) penalty_config: Option<&'a sluice_core::Penalty>,
}

impl MemoryStore {
    /// Locks the shards of `identifiers` (and of the penalty record), in shard order, hands
    /// their states to `run`, and writes back what it left, dropping states that expired.
    pub(super) fn locked<R>(
        &self,
        identifiers: &[Identifier],
        quotas: &[Quota],
        penalty: Option<(&Identifier, &sluice_core::Penalty)>,
        now: u64,
        run: impl FnOnce(&mut Step<'_>) -> R,
    ) -> R {
        let ids: Few<&str> = identifiers
            .iter()
            .chain(penalty.map(|(id, _)| id))
            .map(Identifier::as_str)
            .collect();
        let hashes: Few<u64> = ids.iter().map(|id| self.hash(id)).collect();
        let mut order: Few<usize> = hashes.iter().map(|&h| self.shard_of(h)).collect();
        order.sort_unstable();
        order.dedup();
        let mut guards: Few<_> = order
            .iter()
            .map(|&i| (i, self.inner.shards[i].write()))
            .collect();
        let slots: Few<usize> = hashes
            .iter()
            .map(|&h| {
                let shard = self.shard_of(h);
                guards
                    .iter()
                    .position(|(i, _)| *i == shard)
                    .expect("locked above")
            })
            .collect();
        let leaves = identifiers.len();
        // Lease sets are held under their own locks for the whole step: holders with a
        // handle reach them without the shard's lock (see `handles.rs`).
        let mut sets: Few<Option<SharedSet>> = Few::new();
        for i in 0..leaves {
            let set = match guards[slots[i]]
                .1
                .cells
                .find(hashes[i], |(k, _)| k == ids[i])
            {
                Some((_, cell)) if quotas[i].algorithm() == Algorithm::Concurrency => {
                    match &cell.value {
                        CellValue::Leases(set) => Some(set.0.clone()),
                        _ => None,
                    }
                }
                _ => None,
            };
            // The same identifier twice in a rule: the first leaf takes the set.
            let again = |set: &SharedSet| sets.iter().flatten().any(|s| Arc::ptr_eq(s, set));
            sets.push(set.filter(|set| !again(set)));
        }
        let mut held: Few<Option<MutexGuard<'_, SetState>>> = sets
            .iter()
            .map(|set| set.as_ref().map(|set| set.lock()))
            .collect();
        let mut step = Step {
            states: (0..leaves)
                .map(|i| match &mut held[i] {
                    Some(set) => State::Concurrency(std::mem::take(&mut set.leases)),
                    None => take_state(&mut guards[slots[i]].1, hashes[i], ids[i], &quotas[i]),
                })
                .collect(),
            penalty: penalty
                .map(|_| take_penalty(&mut guards[slots[leaves]].1, hashes[leaves], ids[leaves])),
            penalty_config: penalty.map(|(_, config)| config),
        };
        let result = run(&mut step);

        // The held sets get their leases back, and their locks go before any cell is
        // added or removed: dropping a set's cell takes its lock (see `TableSet`).
        let (mut rest, mut emptied): (Few<(usize, State)>, Few<usize>) = Default::default();
        for (i, state) in step.states.into_iter().enumerate() {
            match (&mut held[i], state) {
                (Some(set), State::Concurrency(leases)) => {
                    set.leases = leases;
                    if set.expires_at() <= now {
                        // Marked in this hold of its lock, as `Cell::retained` does.
                        set.gone = true;
                        emptied.push(i);
                    }
                }
                (_, state) => rest.push((i, state)),
            }
        }
        drop(held);
        for i in emptied {
            guards[slots[i]].1.remove(hashes[i], ids[i]);
        }
        let mut swept = table::Swept::default();
        for (i, state) in rest {
            let table = &mut guards[slots[i]].1;
            let expires_at = quotas[i].expires_at(&state);
            if expires_at <= now {
                table.remove(hashes[i], ids[i]);
                continue;
            }
            let more = put_state(table, hashes[i], ids[i], state, expires_at, self, now);
            swept.expired += more.expired;
            swept.evicted += more.evicted;
        }
        if let (Some(record), Some(config)) = (step.penalty, step.penalty_config) {
            let table = &mut guards[slots[leaves]].1;
            let expires_at = config.expires_at(&record);
            if expires_at <= now {
                table.remove(hashes[leaves], ids[leaves]);
            } else {
                let value = CellValue::Penalty(record);
                let more = put_cell(
                    table,
                    hashes[leaves],
                    ids[leaves],
                    value,
                    expires_at,
                    self,
                    now,
                );
                swept.expired += more.expired;
                swept.evicted += more.evicted;
            }
        }
        drop(guards);
        self.count_swept(swept);
        result
    }

    /// Adds what making room dropped to the store's counts (after the locks are let go).
    pub(super) fn count_swept(&self, swept: table::Swept) {
        self.inner
            .expired
            .fetch_add(swept.expired, Ordering::Relaxed);
        self.inner
            .evictions
            .fetch_add(swept.evicted, Ordering::Relaxed);
    }
}
