//! Concurrency leases and reservations in the memory store.
//!
//! Every step here runs like a compound rule's decision: the exclusive locks of the shards
//! involved, taken in shard order, around the core's pure functions. A lease set is a cell
//! like any other state, dropped once its last lease has expired.

use std::sync::atomic::Ordering;
use std::time::Duration;

use sluice_core::algorithm::concurrency::{self, Released};
use sluice_core::{Algorithm, Decision, PenaltyState, Quota, State, evaluate};

use super::table::{self, CellValue};
use super::{Few, MemoryStore, put_cell, put_state, take_penalty, take_state};
use crate::identifier::Identifier;
use crate::store::{Hit, LeaseKeys, Settlement};

/// The states of one locked step, and where they go back.
struct Step<'a> {
    states: Few<State>,
    penalty: Option<PenaltyState>,
    penalty_config: Option<&'a sluice_core::Penalty>,
}

impl MemoryStore {
    /// Leases that expired instead of being released, so far: each is a holder that vanished
    /// (or forgot to release), worth a look in the client that took it.
    pub fn leases_expired(&self) -> u64 {
        self.inner.leases_expired.load(Ordering::Relaxed)
    }

    /// Locks the shards of `identifiers` (and of the penalty record), in shard order, hands
    /// their states to `run`, and writes back what it left, dropping states that expired.
    fn locked<R>(
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
        let mut step = Step {
            states: (0..leaves)
                .map(|i| take_state(&mut guards[slots[i]].1, hashes[i], ids[i], &quotas[i]))
                .collect(),
            penalty: penalty
                .map(|_| take_penalty(&mut guards[slots[leaves]].1, hashes[leaves], ids[leaves])),
            penalty_config: penalty.map(|(_, config)| config),
        };
        let result = run(&mut step);

        let mut swept = table::Swept::default();
        for (i, state) in step.states.into_iter().enumerate() {
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
        self.inner
            .expired
            .fetch_add(swept.expired, Ordering::Relaxed);
        self.inner
            .evictions
            .fetch_add(swept.evicted, Ordering::Relaxed);
        result
    }

    /// [`Store::acquire`](crate::Store::acquire), synchronously: the rule's rate leaves are
    /// checked and recorded and lease `lease` is taken in its concurrency leaves, in one step.
    pub fn acquire_now(&self, hit: &Hit<'_>, lease: u64) -> Decision {
        let ev = &hit.evaluation;
        if let ([id], [quota], None) = (hit.identifiers, ev.quotas, ev.penalty)
            && quota.algorithm() == Algorithm::Concurrency
        {
            return self.acquire_one(id, quota, lease);
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

    /// The common case, a rule of one concurrency leaf: the lease set is changed in place
    /// under its shard's lock, with none of a compound rule's bookkeeping. An emptied set
    /// stays in the table, expired, so the next acquire does not allocate it again.
    fn acquire_one(&self, id: &Identifier, quota: &Quota, lease: u64) -> Decision {
        let hash = self.hash(id);
        let shard = &self.inner.shards[self.shard_of(hash)];
        let now = self.inner.clock.now();
        let mut table = shard.write();
        if let Some((_, cell)) = table.cells.find_mut(hash, |(k, _)| k == id.as_str())
            && let CellValue::Leaf(State::Concurrency(leases)) = &mut cell.value
        {
            let expired = leases.drop_expired(now);
            let verdict = concurrency::acquire(quota, leases, now, lease);
            cell.expires_at = leases.expires_at();
            drop(table);
            if expired > 0 {
                self.inner
                    .leases_expired
                    .fetch_add(expired, Ordering::Relaxed);
            }
            return Decision::from_verdict(&verdict, 0, quota.tick()).occupied();
        }
        let mut leases = concurrency::Leases::default();
        let verdict = concurrency::acquire(quota, &mut leases, now, lease);
        let expires_at = leases.expires_at();
        let value = CellValue::Leaf(State::Concurrency(leases));
        let swept = put_cell(&mut table, hash, id, value, expires_at, self, now);
        drop(table);
        self.inner
            .expired
            .fetch_add(swept.expired, Ordering::Relaxed);
        self.inner
            .evictions
            .fetch_add(swept.evicted, Ordering::Relaxed);
        Decision::from_verdict(&verdict, 0, quota.tick()).occupied()
    }

    /// [`Store::release`](crate::Store::release), synchronously.
    pub fn release_now(&self, leases: &LeaseKeys<'_>, lease: u64) -> Released {
        let now = self.inner.clock.now();
        if let [id] = leases.identifiers {
            // One leaf: release in place (an emptied set stays, expired, for the next acquire).
            let hash = self.hash(id);
            let mut table = self.inner.shards[self.shard_of(hash)].write();
            let Some((_, cell)) = table.cells.find_mut(hash, |(k, _)| k == id.as_str()) else {
                return Released::NotHeld;
            };
            let CellValue::Leaf(State::Concurrency(held)) = &mut cell.value else {
                return Released::NotHeld;
            };
            let found = concurrency::release(held, now, lease);
            cell.expires_at = held.expires_at();
            drop(table);
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
