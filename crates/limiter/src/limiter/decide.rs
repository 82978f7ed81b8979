//! One decision, around the store: the identifiers a hit names, the near cache before the
//! store, the failure mode after it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sluice_core::{Decision, Denial, Evaluation, Recording};

use super::identify::{write_leaf, write_penalty};
use super::prefetch::Prefetched;
use super::{Checked, Decided, Error, Limiter, PolicyRef, Selectors};
use crate::failure::{Counters, FailureMode, STORE_PAUSE};
use crate::identifier::{Identifier, Identifiers};
use crate::policy::CompiledPolicy;
use crate::store::{Hit, Store, StoreError};

/// What [`Limiter::prepare`] leaves for the store.
enum Prepared {
    /// Answered without the store (the near cache).
    Answered(Decision),
    Ask(Ask),
}

struct Ask {
    /// One per leaf, then the penalty record's when the policy has one.
    identifiers: Identifiers,
    /// The near cache applies to this hit.
    cached: bool,
    /// The store is resting after an error: the failure mode decides. (Set later too, by
    /// a hit that waited for a prefetched block while the store failed.)
    paused: AtomicBool,
}

impl Ask {
    fn hit<'a>(&'a self, policy: &'a CompiledPolicy, cost: u64, recording: Recording) -> Hit<'a> {
        hit(policy, self.identifiers.as_slice(), cost, recording)
    }
}

/// The hit of `policy` on `identifiers` (one per leaf, then the penalty record's when the
/// policy has one).
pub(super) fn hit<'a>(
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

impl Limiter {
    pub(super) async fn decide(
        &self,
        policy: PolicyRef,
        selectors: &Selectors<'_>,
        cost: u64,
        recording: Recording,
    ) -> Result<Checked, Error> {
        // A store in this process answers at once: the lean path, as `decide_now` takes it.
        if !self.store.is_remote()
            && let Some(decided) = self.decide_lean(&policy, selectors, cost, recording)
        {
            return decided.map(|answer| answer.into_checked(policy, false));
        }
        let ask = match self.prepare(&policy, selectors, cost, recording)? {
            Prepared::Answered(decision) => return Ok(finish(policy, decision, true)),
            Prepared::Ask(ask) => ask,
        };
        let hit = ask.hit(&policy, cost, recording);
        let result = if ask.paused.load(Ordering::Relaxed) {
            Err(paused())
        } else if let Some((take, span)) = self.prefetch(&policy, cost, recording) {
            match self.prefetched(&policy, &hit, take, span).await {
                Prefetched::Here(decision) => return Ok(finish(policy, decision, true)),
                Prefetched::Asked(result) => result,
                Prefetched::Paused => {
                    ask.paused.store(true, Ordering::Relaxed);
                    Err(paused())
                }
            }
        } else {
            self.store.decide(&hit).await
        };
        let concluded = self.conclude(&policy, &ask, &hit, result);
        drop(ask);
        concluded.map(|answer| answer.into_checked(policy, false))
    }

    /// [`Limiter::decide`] when the store can answer without waiting; `None` otherwise,
    /// having done nothing.
    pub(super) fn decide_now(
        &self,
        policy: PolicyRef,
        selectors: &Selectors<'_>,
        cost: u64,
        recording: Recording,
    ) -> Option<Result<Checked, Error>> {
        if let Some(decided) = self.decide_lean(&policy, selectors, cost, recording) {
            return Some(decided.map(|answer| answer.into_checked(policy, false)));
        }
        let answered = self.answer_now(&policy, selectors, cost, recording)?;
        Some(answered.map(|(answer, cached)| answer.into_checked(policy, cached)))
    }

    /// [`Limiter::decide_now`] answering the decision alone: `policy` is only borrowed.
    pub(super) fn decided_now(
        &self,
        policy: &PolicyRef,
        selectors: &Selectors<'_>,
        cost: u64,
        recording: Recording,
    ) -> Option<Result<Decided, Error>> {
        if let Some(decided) = self.decide_lean(policy, selectors, cost, recording) {
            return Some(decided.map(|answer| answer.decided(policy, false)));
        }
        let answered = self.answer_now(policy, selectors, cost, recording)?;
        Some(answered.map(|(answer, cached)| answer.decided(policy, cached)))
    }

    /// What [`Limiter::decide_now`] answers off the lean path, before it is dressed as a
    /// [`Checked`] or a [`Decided`]: the answer, and whether it came without the store. (The
    /// lean path answers through neither this nor a tuple: on a hot path every move of a
    /// result is a copy.)
    fn answer_now(
        &self,
        policy: &PolicyRef,
        selectors: &Selectors<'_>,
        cost: u64,
        recording: Recording,
    ) -> Option<Result<(Answer, bool), Error>> {
        let ask = match self.prepare(policy, selectors, cost, recording) {
            Ok(Prepared::Answered(decision)) => return Some(Ok((Answer::plain(decision), true))),
            Ok(Prepared::Ask(ask)) => ask,
            Err(error) => return Some(Err(error)),
        };
        let hit = ask.hit(policy, cost, recording);
        let result = if ask.paused.load(Ordering::Relaxed) {
            Err(paused())
        } else {
            self.store.try_decide_now(&hit)?
        };
        let concluded = self.conclude(policy, &ask, &hit, result);
        drop(ask);
        Some(concluded.map(|answer| (answer, false)))
    }

    /// Everything before the store: identifiers, the near cache, the pause after an error.
    fn prepare(
        &self,
        policy: &CompiledPolicy,
        selectors: &Selectors<'_>,
        cost: u64,
        recording: Recording,
    ) -> Result<Prepared, Error> {
        if policy.concurrent {
            return Err(Error::NeedsAcquire(policy.name().to_owned()));
        }
        let mut identifiers = Identifiers::take();
        for leaf in &policy.leaves {
            write_leaf(identifiers.next(), policy, leaf, selectors)?;
        }
        if policy.policy.penalty.is_some() {
            write_penalty(identifiers.next(), policy, selectors)?;
        }
        // Denials counted by the store must reach it, so count-denied policies skip the cache.
        let cached = self.near_cache.is_some() && recording == Recording::Admitted && cost > 0;
        if cached
            && let Some(cache) = &self.near_cache
            && let Some(decision) = cache.get(
                policy.name(),
                &identifiers.as_slice()[..policy.leaves.len()],
                cost,
                self.clock.now(),
            )
        {
            Counters::bump(&self.counters.near_cache_hits);
            return Ok(Prepared::Answered(decision));
        }
        // Only a store that has failed sets the pause: read the clock only then.
        let until = self.counters.store_paused_until.load(Ordering::Relaxed);
        let paused = until != 0 && until > self.clock.now();
        Ok(Prepared::Ask(Ask {
            identifiers,
            cached,
            paused: AtomicBool::new(paused),
        }))
    }

    /// Everything after the store: the failure mode on error, the near cache on denial.
    fn conclude(
        &self,
        policy: &CompiledPolicy,
        ask: &Ask,
        hit: &Hit<'_>,
        result: Result<Decision, StoreError>,
    ) -> Result<Answer, Error> {
        let decision = match result {
            Ok(decision) => decision,
            Err(error) => {
                return self.failed(policy, hit, error, ask.paused.load(Ordering::Relaxed));
            }
        };
        if ask.cached
            && !decision.allowed()
            && let Some(cache) = &self.near_cache
        {
            cache.remember(
                policy.name(),
                hit.identifiers,
                hit.evaluation.cost,
                &decision,
                self.clock.now(),
            );
        }
        Ok(Answer {
            decision,
            without_store: None,
        })
    }

    /// The store failed `hit` (or was `paused`): a transient error pauses it (unless paused
    /// already) and the failure mode decides; any other is the caller's.
    pub(super) fn failed(
        &self,
        policy: &CompiledPolicy,
        hit: &Hit<'_>,
        error: StoreError,
        paused: bool,
    ) -> Result<Answer, Error> {
        if !error.is_transient() {
            return Err(error.into());
        }
        if !paused {
            Counters::bump(&self.counters.store_errors);
            let until = self.clock.now() + STORE_PAUSE.as_nanos() as u64;
            self.counters
                .store_paused_until
                .store(until, Ordering::Relaxed);
        }
        Ok(self.without_store(policy, hit))
    }

    /// Decides `hit` as the policy's failure mode says, counting it.
    fn without_store(&self, policy: &CompiledPolicy, hit: &Hit<'_>) -> Answer {
        let mode = policy.policy.failure;
        let capacity = policy.quotas[0].capacity();
        let decision = match (mode, &policy.local_quotas) {
            (FailureMode::Open, _) => {
                Counters::bump(&self.counters.failed_open);
                Decision::admitted(capacity, 0, Duration::ZERO, 0)
            }
            (_, Some(local)) => {
                Counters::bump(&self.counters.failed_local);
                let mut local_hit = *hit;
                local_hit.evaluation.quotas = local;
                self.fallback.decide_now(&local_hit)
            }
            _ => {
                Counters::bump(&self.counters.failed_closed);
                Decision {
                    denial: Some(Denial::StoreUnavailable),
                    limit: capacity,
                    remaining: 0,
                    reset_after: Duration::ZERO,
                    leaf: 0,
                }
            }
        };
        Answer {
            decision,
            without_store: Some(mode),
        }
    }
}

/// A decision before the policy's shadow flag is applied.
pub(super) struct Answer {
    pub(super) decision: Decision,
    pub(super) without_store: Option<FailureMode>,
}

impl Answer {
    fn plain(decision: Decision) -> Answer {
        Answer {
            decision,
            without_store: None,
        }
    }

    pub(super) fn into_checked(self, policy: PolicyRef, cached: bool) -> Checked {
        let mut checked = finish(policy, self.decision, cached);
        checked.without_store = self.without_store;
        checked
    }

    /// The answer as [`Answer::into_checked`] dresses it, without the handle.
    fn decided(self, policy: &CompiledPolicy, cached: bool) -> Decided {
        let (decision, shadow_denied) = shadowed(policy, self.decision);
        Decided {
            decision,
            shadow_denied,
            cached,
            without_store: self.without_store,
        }
    }
}

/// A shadow policy's denial reported, not enforced: the decision to act on, and whether the
/// policy would have denied.
pub(super) fn shadowed(policy: &CompiledPolicy, mut decision: Decision) -> (Decision, bool) {
    let shadow_denied = policy.policy.shadow && !decision.allowed();
    if shadow_denied {
        decision.denial = None;
    }
    (decision, shadow_denied)
}

pub(super) fn paused() -> StoreError {
    StoreError::Unavailable("paused after a recent error".into())
}

/// The answer the caller acts on: a shadow policy's denial is reported, not enforced.
pub(super) fn finish(policy: PolicyRef, decision: Decision, cached: bool) -> Checked {
    let (decision, shadow_denied) = shadowed(&policy, decision);
    Checked {
        decision,
        shadow_denied,
        cached,
        without_store: None,
        policy,
    }
}
