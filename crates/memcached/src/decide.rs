//! A whole rule on memcached, leaf by leaf, never over-admitting.
//!
//! memcached has no scripts and no transactions across keys, so a rule is decided in steps:
//!
//! 1. If the policy has a penalty, its record is read: a boxed key is denied at once.
//! 2. *Rules without `and`* (one leaf, or a list of limits): the leaves are judged in rule
//!    order, and each *takes* the hit (records it, atomically with its judgement: an `incr`,
//!    or a compare-and-swap) only if it admits it. Once one denies, the rest are only read.
//!    An admitted hit was thus taken by every leaf while that leaf admitted it: no
//!    interleaving admits more than any leaf allows.
//!
//!    *Rules with `and`* need more: a hit admitted by one child reaches the other child a
//!    round trip later, and a hit relying on that other child in between would see its
//!    count without the first one (Redis Cluster refuses such rules across slots for this
//!    reason). memcached has no transaction over two keys, so the hits of `and` rules on one
//!    operation take turns under a lease (see [`crate::lease`]): exact, at the price of one
//!    hit at a time per operation across the fleet.
//! 3. The verdicts are folded over the rule with the core's
//!    [`sluice_core::decide_verdicts`], so every store answers alike.
//! 4. Admitted: leaves that denied (possible inside `and`) record the hit too. Denied: what
//!    was taken or reserved is given back (`decr`, or a compare-and-swap that undoes it), or,
//!    for a policy that counts denied attempts, kept, and the other leaves record it too.
//! 5. A limited hit strikes the penalty (compare-and-swap on its record).
//!
//! An acquire (`lease` given) runs the same steps: a concurrency leaf *takes* the hit by
//! taking the lease when it has a free slot (and records it, inside an admitted `and`,
//! whatever it found), and gives it back by releasing it; every concurrency leaf it reads
//! drops its expired leases, as the memory store's acquire does (see [`crate::concurrency`]).
//!
//! The price of steps instead of one atomic script is *under-admission*: a hit taken or
//! reserved, then given back, holds its cost in those leaves meanwhile (two round trips at
//! most) and may deny other hits there. The hits wrongly denied are at most the cost of the
//! hits in flight that end up denied; reads before taking keep those few (a hit that a read
//! shows cannot pass never takes anything, but for the first of a batch on a sliding-window
//! counter this process has not seen lately, which is counted with the read and
//! given back if the read refuses it). For a single leaf, a sliding-window counter holds
//! a denied hit's cost for one round trip, and a compare-and-swap leaf never does. If the
//! store fails between steps, what was taken is given back in the background; if that fails
//! too, it stays until its window passes (counted in
//! [`MemcachedStats::unfinished`](crate::MemcachedStats)).

use std::sync::Arc;

use sluice_core::decision::ticks;
use sluice_core::{
    Algorithm, Decision, Denial, Penalty, PenaltyState, Recording, Shape, decide_verdicts,
};
use sluice_limiter::Hit;
use smallvec::SmallVec;

use crate::MemcachedError;
use crate::cas::{Answer, Plan, update};
use crate::key::Keys;
use crate::leaf::{Judged, LIVE_MARGIN, Mode, Recorded};
use crate::lease::lease_keys;
use crate::pool::Deadline;
use crate::stats::Counters;
use crate::store::Inner;
use crate::value::{Stored, decode, encode_penalty};

/// Times here are nanoseconds: memcached holds our own numbers, not a clock of its own.
const TICK_NS: u64 = 1;

/// One item per leaf of a rule, inline for the usual few: a decision on memcached made four
/// `Vec`s of them (keys, what is known, the judgements, the verdicts), an allocation each.
type PerLeaf<T> = SmallVec<[T; 2]>;

/// Whether the rule is reached, taking leaves not yet judged as `unknown_reached`.
fn reached(shape: &Shape, known: &[Option<bool>], unknown_reached: bool) -> bool {
    match shape {
        Shape::Leaf(i) => known[*i].map_or(unknown_reached, |allowed| !allowed),
        Shape::Or(children) => children.iter().any(|c| reached(c, known, unknown_reached)),
        Shape::And(children) => children.iter().all(|c| reached(c, known, unknown_reached)),
    }
}

impl Inner {
    /// Decides `hit` at `now` (see the module documentation); a concurrency leaf that
    /// records the hit takes `lease` (an acquire). Also answers the time the hit was recorded
    /// at, for a reservation to settle: `now`, or the latest time a leaf recorded it at
    /// when a leaf's state was ahead of `now` (see `leaf::settle`).
    pub async fn decide(
        self: &Arc<Self>,
        hit: &Hit<'_>,
        now: u64,
        deadline: Deadline,
        lease: Option<u64>,
    ) -> Result<(Decision, u64), MemcachedError> {
        let ev = &hit.evaluation;
        let counting = ev.recording != Recording::Never && ev.cost > 0;
        if !(counting && ev.shape.has_and()) {
            return self.decide_in_steps(hit, now, deadline, lease).await;
        }
        let keys = lease_keys(&hit.identifiers[0]);
        let life = self.timeout * 3;
        let lock = self
            .leases
            .acquire(&self.pool, &keys, life, deadline)
            .await?;
        let decided = self.decide_in_steps(hit, now, deadline, lease).await;
        let settle = Deadline::after(self.timeout);
        if self
            .leases
            .release(&self.pool, &keys, lock, settle)
            .await
            .is_err()
        {
            Counters::bump(&self.pool.counters.unfinished);
        }
        decided
    }

    async fn decide_in_steps(
        self: &Arc<Self>,
        hit: &Hit<'_>,
        now: u64,
        deadline: Deadline,
        lease: Option<u64>,
    ) -> Result<(Decision, u64), MemcachedError> {
        let ev = &hit.evaluation;
        let leaves: PerLeaf<Keys> = hit.identifiers.iter().map(|id| Keys::new(id)).collect();
        let penalty = match (ev.penalty, hit.penalty_identifier) {
            (Some(config), Some(id)) => Some((config, Keys::new(id))),
            _ => None,
        };

        if let Some((config, keys)) = &penalty {
            let record = self.penalty_record(keys, deadline).await?;
            if let Some(wait) = config.remaining(&record, now) {
                let first = self
                    .judge(
                        &leaves[0],
                        &ev.quotas[0],
                        now,
                        0,
                        Mode::Peek,
                        None,
                        deadline,
                    )
                    .await?
                    .verdict;
                let decision = Decision {
                    denial: Some(Denial::Penalized {
                        retry_after: ticks(wait, TICK_NS),
                    }),
                    limit: first.limit,
                    remaining: 0,
                    reset_after: ticks(first.reset_after.max(wait), TICK_NS),
                    leaf: 0,
                };
                return Ok((decision, now));
            }
        }

        let counting = ev.recording != Recording::Never && ev.cost > 0;
        let judged = self
            .take_in_turn(hit, &leaves, now, deadline, lease)
            .await?;
        let mut judged = judged;
        let verdicts: PerLeaf<_> = judged.iter().map(|j| j.verdict).collect();
        let mut decision = decide_verdicts(ev.shape, &verdicts, TICK_NS);
        // The decision is made; what follows settles the counters, on a deadline of its own.
        let deadline = Deadline::after(self.timeout);

        if counting {
            if ev.recording.records_decision(&decision) {
                let admitted = decision.allowed();
                let rest = (lease, admitted);
                self.record_the_rest(hit, &leaves, &mut judged, now, deadline, rest)
                    .await;
                if !decision.allowed() {
                    // A denied hit that counts makes the wait longer: report the wait of the
                    // recorded states, as the core does.
                    let after: Vec<_> = (judged.iter().zip(ev.quotas))
                        .map(|(j, quota)| match &j.after {
                            Some(state) => quota.verdict(state, now, ev.cost),
                            None => j.verdict,
                        })
                        .collect();
                    let recorded = decide_verdicts(ev.shape, &after, TICK_NS);
                    if !recorded.allowed() {
                        decision = recorded;
                    }
                }
            } else {
                for (i, leaf) in judged.iter().enumerate() {
                    if let Some(recorded) = &leaf.recorded {
                        let quota = &ev.quotas[i];
                        if self
                            .give_back(&leaves[i], quota, recorded, deadline)
                            .await
                            .is_err()
                        {
                            Counters::bump(&self.pool.counters.unfinished);
                        }
                    }
                }
            }
        }

        if let (Some((config, keys)), Some(Denial::Limited { retry_after })) =
            (&penalty, decision.denial)
            && ev.recording != Recording::Never
        {
            match self.strike(keys, config, now, deadline).await {
                Ok(wait) => {
                    let wait = ticks(wait, TICK_NS);
                    if retry_after < wait {
                        decision.denial = Some(Denial::Penalized { retry_after: wait });
                        decision.reset_after = decision.reset_after.max(wait);
                    }
                }
                Err(_) => Counters::bump(&self.pool.counters.unfinished),
            }
        }
        // Leaves whose state was ahead of `now` recorded the hit at that later time.
        let taken_at = judged
            .iter()
            .filter_map(|j| match j.recorded {
                Some(Recorded::State { at, .. }) => Some(at),
                _ => None,
            })
            .fold(now, u64::max);
        Ok((decision, taken_at))
    }

    /// Judges the leaves in rule order, each taking the hit only if it admits it, and only
    /// while the rule can still admit it: exact for rules without `and`.
    async fn take_in_turn(
        self: &Arc<Self>,
        hit: &Hit<'_>,
        leaves: &[Keys],
        now: u64,
        deadline: Deadline,
        lease: Option<u64>,
    ) -> Result<PerLeaf<Judged>, MemcachedError> {
        let ev = &hit.evaluation;
        let counting = ev.recording != Recording::Never && ev.cost > 0;
        let mut known: PerLeaf<Option<bool>> = smallvec::smallvec![None; leaves.len()];
        let mut judged: PerLeaf<Judged> = PerLeaf::with_capacity(leaves.len());
        for (i, keys) in leaves.iter().enumerate() {
            let mode = if !counting || reached(ev.shape, &known, false) {
                Mode::Peek
            } else if !reached(ev.shape, &known, true) {
                Mode::Force
            } else if leaves.len() == 1 && ev.recording == Recording::Always {
                Mode::TakeOrCount
            } else {
                Mode::Take
            };
            match self
                .judge(keys, &ev.quotas[i], now, ev.cost, mode, lease, deadline)
                .await
            {
                Ok(leaf) => {
                    known[i] = Some(leaf.verdict.allowed);
                    judged.push(leaf);
                }
                Err(error) => {
                    self.give_back_later(hit, leaves, &judged);
                    return Err(error);
                }
            }
        }
        Ok(judged)
    }

    /// Records the hit in every leaf that has not: the rule admitted it, or counts denials.
    /// `(lease, admitted)`: the lease an acquire takes, which concurrency leaves hold only
    /// when the rule admitted the hit (a denied attempt holds no slot).
    async fn record_the_rest(
        self: &Arc<Self>,
        hit: &Hit<'_>,
        leaves: &[Keys],
        judged: &mut [Judged],
        now: u64,
        deadline: Deadline,
        (lease, admitted): (Option<u64>, bool),
    ) {
        let ev = &hit.evaluation;
        for (i, leaf) in judged.iter_mut().enumerate() {
            let quota = &ev.quotas[i];
            let concurrent = quota.algorithm() == Algorithm::Concurrency;
            // A denied hit holds no slot; an acquire already dropped the expired leases of
            // every concurrency leaf, other hits drop them here (recording one, as the
            // memory store does).
            if leaf.recorded.is_some() || (concurrent && !admitted && lease.is_some()) {
                continue;
            }
            let lease = lease.filter(|_| admitted);
            match self
                .judge(
                    &leaves[i],
                    quota,
                    now,
                    ev.cost,
                    Mode::Force,
                    lease,
                    deadline,
                )
                .await
            {
                Ok(forced) => {
                    leaf.recorded = forced.recorded;
                    leaf.after = forced.after;
                }
                Err(_) => Counters::bump(&self.pool.counters.unfinished),
            }
        }
    }

    /// After a failure mid-decision, gives back what was taken, in the background and with
    /// a deadline of its own (the decision's may be spent).
    fn give_back_later(self: &Arc<Self>, hit: &Hit<'_>, leaves: &[Keys], judged: &[Judged]) {
        let taken: Vec<_> = judged
            .iter()
            .enumerate()
            .filter_map(|(i, j)| {
                let recorded = j.recorded.clone()?;
                Some((leaves[i].clone(), hit.evaluation.quotas[i], recorded))
            })
            .collect();
        if taken.is_empty() {
            return;
        }
        let inner = Arc::clone(self);
        tokio::spawn(async move {
            let deadline = Deadline::after(inner.timeout);
            for (keys, quota, recorded) in taken {
                if inner
                    .give_back(&keys, &quota, &recorded, deadline)
                    .await
                    .is_err()
                {
                    Counters::bump(&inner.pool.counters.unfinished);
                }
            }
        });
    }

    async fn penalty_record(
        &self,
        keys: &Keys,
        deadline: Deadline,
    ) -> Result<PenaltyState, MemcachedError> {
        let read = self
            .pool
            .get(keys.route(), &[keys.state()], deadline)
            .await?;
        penalty_state(keys, read.values().next().map(Vec::as_slice))
    }

    /// Adds a strike; returns the nanoseconds the key must now wait.
    async fn strike(
        self: &Arc<Self>,
        keys: &Keys,
        config: &Penalty,
        now: u64,
        deadline: Deadline,
    ) -> Result<u64, MemcachedError> {
        let (config, keys_owned) = (*config, keys.clone());
        let plan = Box::new(move |value: Option<&[u8]>| {
            let before = penalty_state(&keys_owned, value)?;
            let mut record = before;
            let wait = config.strike(&mut record, now);
            Ok(Plan::Write {
                value: encode_penalty(&record),
                expires_at: config.expires_at(&record),
                was_live: value.is_some() && config.expires_at(&before) > now + LIVE_MARGIN,
                answer: Answer::Wait(wait),
            })
        });
        match update(self, keys, now, deadline, plan).await? {
            Answer::Wait(wait) => Ok(wait),
            other => unreachable!("a strike answers a wait, not {other:?}"),
        }
    }
}

fn penalty_state(keys: &Keys, value: Option<&[u8]>) -> Result<PenaltyState, MemcachedError> {
    match value.map(decode) {
        None | Some(Ok(Stored::Leaf(_))) => Ok(PenaltyState::default()),
        Some(Ok(Stored::Penalty(record))) => Ok(record),
        Some(Err(why)) => Err(MemcachedError::Corrupt {
            key: keys.state(),
            why,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knows_when_a_rule_is_settled() {
        // or(0, and(1, 2))
        let shape = Shape::Or(vec![
            Shape::Leaf(0),
            Shape::And(vec![Shape::Leaf(1), Shape::Leaf(2)]),
        ]);
        let could_admit = |known: &[Option<bool>]| !reached(&shape, known, false);
        let certain = |known: &[Option<bool>]| !reached(&shape, known, true);
        assert!(could_admit(&[None, None, None]));
        assert!(!certain(&[None, None, None]));
        assert!(!could_admit(&[Some(false), None, None]));
        assert!(could_admit(&[Some(true), Some(false), None]));
        assert!(certain(&[Some(true), Some(true), None]));
        assert!(!could_admit(&[Some(true), Some(false), Some(false)]));
    }
}
