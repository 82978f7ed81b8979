//! Concurrency leases and reservations on Redis: each step one script call per slot.
//!
//! - A rule of one concurrency leaf (no penalty), the common case: its acquires, releases
//!   and renews are batched with the others waiting (`src/lease_batch.rs`), each answered
//!   as the single-step scripts below would.
//! - `acquire`: [`ACQUIRE`] decides the rule's rate leaves as a check does and, when the
//!   rule admits, adds the lease to each concurrency leaf's lease set, in one call. An `or`
//!   rule whose keys fall in several Cluster slots is decided slot by slot
//!   (`split::decide_across_slots`), each concurrency leaf holding the lease where it
//!   admits, released again when the rule denies.
//! - `release` and `renew`: one call per slot of the lease's sets (one on a standalone
//!   server, and for every rule whose concurrency leaves share a selector).
//! - `reserve`: [`RESERVE`], the decision script answering Redis's time too; `settle`:
//!   [`SETTLE`], one call per slot, never refused.
//!
//! Lease sets, their keys and expiry are described in `src/lua/leases.lua`.

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_core::algorithm::concurrency::Released;
use sluice_core::decision::ticks;
use sluice_core::{Algorithm, Decision, Quota};
use sluice_limiter::{Hit, Identifier, LeaseKeys, Settlement};

use crate::RedisError;
use crate::lease_batch::{LeaseAnswer, LeaseStep};
use crate::script::{
    ACQUIRE, RELEASE, RENEW, RESERVE, SETTLE, TICK_NS, algorithm_code, arguments, decision, micro,
};
use crate::slot::{key, slot_of};
use crate::store::{RedisStore, one_slot};

impl RedisStore {
    /// The leaves' indices grouped by the slot their keys hash to (one group on a standalone
    /// server), in slot order.
    fn by_slot(&self, identifiers: &[Identifier]) -> Vec<Vec<usize>> {
        if !self.is_cluster() {
            return vec![(0..identifiers.len()).collect()];
        }
        let mut groups: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (i, id) in identifiers.iter().enumerate() {
            groups.entry(slot_of(id)).or_default().push(i);
        }
        groups.into_values().collect()
    }

    /// Refuses a hit whose keys span several Cluster slots: one script cannot take a lease
    /// (or answer one time of a reservation) across slots.
    fn in_one_slot(&self, hit: &Hit<'_>, what: &str) -> Result<(), RedisError> {
        if self.is_cluster() && !one_slot(hit) {
            return Err(RedisError::Unsupported(format!(
                "{what} on a rule whose leaves fall in several cluster slots: give its \
                 leaves a common selector"
            )));
        }
        Ok(())
    }

    /// [`Store::acquire`](sluice_limiter::Store::acquire): one script call, batched for a
    /// rule of one concurrency leaf.
    pub(crate) async fn acquire_lease(
        &self,
        hit: &Hit<'_>,
        lease: u64,
    ) -> Result<Decision, RedisError> {
        let ev = &hit.evaluation;
        if let ([id], [quota], None, None) = (
            hit.identifiers,
            ev.quotas,
            ev.penalty,
            hit.penalty_identifier,
        ) && quota.algorithm() == Algorithm::Concurrency
        {
            let q = micro(quota)?;
            let step = LeaseStep::Acquire {
                limit: q.limit(),
                lease: q.window_ticks(),
            };
            return match self.lease_step(id, step, lease).await? {
                LeaseAnswer::Acquired { decision, .. } => Ok(decision.occupied()),
                other => Err(unexpected(other)),
            };
        }
        let decision = if self.is_cluster() && !one_slot(hit) {
            // Boxed: the nested futures of the steps across slots would otherwise make
            // every caller's future type too deep for the compiler's layout queries.
            Box::pin(crate::split::decide_across_slots(self, hit, Some(lease))).await?
        } else {
            let keys = hit_keys(hit);
            let mut args = arguments(hit, self.next_token())?;
            args.push(lease.to_string());
            let reply: Vec<i64> = self.eval(&ACQUIRE, &keys, &args).await?;
            decision(&reply)?
        };
        let by_lease = hit
            .evaluation
            .quotas
            .get(decision.leaf)
            .is_some_and(|q| q.algorithm() == Algorithm::Concurrency);
        Ok(if by_lease {
            decision.occupied()
        } else {
            decision
        })
    }

    /// [`Store::release`](sluice_limiter::Store::release): one script call per slot,
    /// batched for one lease set.
    pub(crate) async fn release_lease(
        &self,
        leases: &LeaseKeys<'_>,
        lease: u64,
    ) -> Result<Released, RedisError> {
        if let [id] = leases.identifiers {
            let step = if self.surely_unexpired(leases) {
                LeaseStep::ReleaseUnexpired
            } else {
                LeaseStep::Release
            };
            return match self.lease_step(id, step, lease).await? {
                LeaseAnswer::Released(found) => Ok(found),
                other => Err(unexpected(other)),
            };
        }
        let mut found = Released::NotHeld;
        for group in self.by_slot(leases.identifiers) {
            let keys: Vec<String> = group.iter().map(|&i| key(&leases.identifiers[i])).collect();
            let code: i64 = self.eval(&RELEASE, &keys, &[lease.to_string()]).await?;
            match code {
                1 => found = Released::Released,
                2 if found == Released::NotHeld => found = Released::Expired,
                0 | 2 => {}
                other => return Err(RedisError::Reply(format!("release answered {other}"))),
            }
        }
        if found == Released::Expired {
            self.count_expired(1);
        }
        Ok(found)
    }

    /// Whether the one lease of `leases` cannot have expired when its release runs: its
    /// holder has held it for less than its lease time less twice this store's timeout (a
    /// release runs within the timeout of being sent, or its caller hears an error; twice,
    /// as a call may start late in that time and take all of its own). Redis's clock is
    /// taken to run at the holder's rate; a step of Redis's clock larger than the margin
    /// could make a release answer `Released` for a lease Redis had just let expire (the
    /// slot is freed alike; only the report and the expired count differ).
    fn surely_unexpired(&self, leases: &LeaseKeys<'_>) -> bool {
        let (Some(held_for), [quota]) = (leases.held_for, leases.quotas) else {
            return false;
        };
        let lease = Duration::from_nanos(quota.window_ticks().saturating_mul(quota.tick()));
        held_for.saturating_add(self.call_timeout().saturating_mul(2)) < lease
    }

    /// [`Store::renew`](sluice_limiter::Store::renew): one script call per slot, batched
    /// for one lease set.
    pub(crate) async fn renew_lease(
        &self,
        leases: &LeaseKeys<'_>,
        lease: u64,
    ) -> Result<Option<Duration>, RedisError> {
        if let ([id], [quota]) = (leases.identifiers, leases.quotas) {
            let step = LeaseStep::Renew {
                lease: micro(quota)?.window_ticks(),
            };
            return match self.lease_step(id, step, lease).await? {
                LeaseAnswer::Renewed(left) => Ok(left.map(|n| ticks(n, TICK_NS))),
                other => Err(unexpected(other)),
            };
        }
        let mut left: Option<u64> = None;
        for group in self.by_slot(leases.identifiers) {
            let keys: Vec<String> = group.iter().map(|&i| key(&leases.identifiers[i])).collect();
            let mut args = vec![lease.to_string()];
            for &i in &group {
                let quota = leases
                    .quotas
                    .get(i)
                    .ok_or_else(|| RedisError::Reply("a lease set without its quota".to_owned()))?;
                args.push(micro(quota)?.window_ticks().to_string());
            }
            let ticks_left: i64 = self.eval(&RENEW, &keys, &args).await?;
            if let Ok(this) = u64::try_from(ticks_left) {
                left = Some(left.map_or(this, |l| l.min(this)));
            }
        }
        Ok(left.map(|n| ticks(n, TICK_NS)))
    }

    /// [`Store::reserve`](sluice_limiter::Store::reserve): one script call; the time is
    /// Redis's, in nanoseconds (as the memory store answers).
    pub(crate) async fn reserve_hit(&self, hit: &Hit<'_>) -> Result<(Decision, u64), RedisError> {
        self.in_one_slot(hit, "a reservation")?;
        let keys = hit_keys(hit);
        let args = arguments(hit, self.next_token())?;
        let reply: Vec<i64> = self.eval(&RESERVE, &keys, &args).await?;
        let [decided @ .., now] = reply.as_slice() else {
            return Err(RedisError::Reply("reserve answered nothing".to_owned()));
        };
        let now = u64::try_from(*now)
            .map_err(|_| RedisError::Reply(format!("reserve answered time {now}")))?;
        Ok((decision(decided)?, now.saturating_mul(TICK_NS)))
    }

    /// [`Store::settle`](sluice_limiter::Store::settle): one script call per slot.
    pub(crate) async fn settle_reservation(
        &self,
        settlement: &Settlement<'_>,
    ) -> Result<(), RedisError> {
        let Settlement {
            identifiers,
            quotas,
            taken_at,
            reserved,
            actual,
        } = *settlement;
        if actual == reserved {
            return Ok(());
        }
        if quotas.len() < identifiers.len() {
            return Err(RedisError::Reply(
                "a settlement without its quotas".to_owned(),
            ));
        }
        let token = self.next_token();
        for group in self.by_slot(identifiers) {
            let keys: Vec<String> = group.iter().map(|&i| key(&identifiers[i])).collect();
            let args = settle_arguments(&group, quotas, taken_at, reserved, actual, token)?;
            let _: i64 = self.eval(&SETTLE, &keys, &args).await?;
        }
        Ok(())
    }
}

/// A batched step answered as another kind of step: the store's fault.
fn unexpected(answer: LeaseAnswer) -> RedisError {
    RedisError::Reply(format!("a lease step answered {answer:?}"))
}

/// The keys of a hit's leaves, then of its penalty record.
fn hit_keys(hit: &Hit<'_>) -> Vec<String> {
    hit.identifiers
        .iter()
        .chain(hit.penalty_identifier)
        .map(key)
        .collect()
}

/// ARGV for [`SETTLE`] (see `settle` in reservations.lua) settling `leaves` of a rule whose
/// quotas are `quotas`; `taken_at` in nanoseconds, as [`RedisStore::reserve_hit`] answered.
pub fn settle_arguments(
    leaves: &[usize],
    quotas: &[Quota],
    taken_at: u64,
    reserved: u64,
    actual: u64,
    token: u64,
) -> Result<Vec<String>, RedisError> {
    let mut args = vec![
        (taken_at / TICK_NS).to_string(),
        reserved.to_string(),
        actual.to_string(),
        format!("{token:x}"),
        leaves.len().to_string(),
    ];
    for &i in leaves {
        let q = micro(&quotas[i])?;
        args.push(i.to_string());
        for n in [
            u64::from(algorithm_code(q.algorithm())?),
            q.limit(),
            q.window_ticks(),
            q.interval_ticks(),
            q.burst(),
            u64::from(q.windows()),
        ] {
            args.push(n.to_string());
        }
    }
    Ok(args)
}
