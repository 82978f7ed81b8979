//! The `Limiter`: named policies over a store.

mod acquire;
mod decide;
mod handle;
mod identify;
mod lean;
mod prefetch;
mod slots;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use sluice_core::{Decision, Recording};

use crate::clock::{Clock, SystemClock};
use crate::failure::{Counters, FailureMode, LimiterStats};
use crate::memory::MemoryStore;
use crate::near_cache::NearCache;
use crate::policy::{CompiledPolicy, Policy, PolicyError};
use crate::store::{DynStore, Store, StoreError};

pub use handle::{PolicyArg, PolicyRef, PolicyWatch};
pub(crate) use slots::SlotsInner;
pub use slots::{SlotPermit, Slots};

/// The answer of [`Limiter::check`].
#[derive(Clone)]
pub struct Checked {
    /// The decision as the caller should act on it. For a shadow policy, always allowed.
    pub decision: Decision,
    /// A shadow policy would have denied this hit.
    pub shadow_denied: bool,
    /// Answered in this process without asking the store: by the near cache, or from a
    /// `prefetch=N` leaf's block (or its standing refusal).
    pub cached: bool,
    /// The store could not decide; the policy's failure mode did (see [`FailureMode`]).
    pub without_store: Option<FailureMode>,
    /// The policy the decision was made under, as it stood when the call began: a reload
    /// since then does not change what this answer means.
    pub policy: PolicyRef,
}

impl Checked {
    /// The leaf whose numbers the decision reports.
    pub fn leaf(&self) -> &crate::policy::CompiledLeaf {
        &self.policy.leaves[self.decision.leaf]
    }
}

impl std::fmt::Debug for Checked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checked")
            .field("decision", &self.decision)
            .field("shadow_denied", &self.shadow_denied)
            .field("cached", &self.cached)
            .field("without_store", &self.without_store)
            .field("policy", &self.policy.name())
            .finish()
    }
}

/// Two answers are equal when they say the same under the same policy (the same handle).
impl PartialEq for Checked {
    fn eq(&self, other: &Self) -> bool {
        self.decision == other.decision
            && self.shadow_denied == other.shadow_denied
            && self.cached == other.cached
            && self.without_store == other.without_store
            && Arc::ptr_eq(&self.policy, &other.policy)
    }
}

/// The answer of [`Limiter::try_check_decision_now`] and [`Limiter::try_peek_decision_now`]:
/// a [`Checked`] without the handle to its policy, for a caller that holds the policy
/// already and acts on the decision alone (a middleware, a hot loop). Taking a handle is two
/// atomic writes to one line that every core deciding under the policy shares.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    /// The decision as the caller should act on it. For a shadow policy, always allowed.
    pub decision: Decision,
    /// A shadow policy would have denied this hit.
    pub shadow_denied: bool,
    /// Answered in this process without asking the store (see [`Checked::cached`]).
    pub cached: bool,
    /// The store could not decide; the policy's failure mode did (see [`FailureMode`]).
    pub without_store: Option<FailureMode>,
}

impl From<Checked> for Decided {
    fn from(checked: Checked) -> Decided {
        Decided {
            decision: checked.decision,
            shadow_denied: checked.shadow_denied,
            cached: checked.cached,
            without_store: checked.without_store,
        }
    }
}

/// Could not decide (being limited is not an error: see [`Decision`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("unknown policy `{0}`")]
    UnknownPolicy(String),
    #[error("policy `{policy}` needs selector `{selector}`")]
    MissingSelector { policy: String, selector: String },
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A check (or peek) on a policy with a concurrency leaf: only
    /// [`Limiter::acquire`] can take the lease such a leaf counts.
    #[error("policy `{0}` has a concurrency leaf: take a lease with `acquire`, not a check")]
    NeedsAcquire(String),
    /// [`Limiter::acquire`] on a policy without a concurrency leaf.
    #[error("policy `{0}` has no concurrency leaf: there is no lease to take; use a check")]
    NoConcurrencyLeaf(String),
    /// [`Limiter::reserve`] on a policy with a concurrency leaf: a reservation charges rates.
    #[error("policy `{0}` has a concurrency leaf: reservations apply to rate leaves only")]
    ReserveConcurrency(String),
}

impl Error {
    /// Whether the same call may succeed later (only store trouble can pass).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Store(e) if e.is_transient())
    }

    /// An unknown policy's error. The name is cut to 128 bytes (a policy name's limit): an
    /// error about a name a client sent never carries more of it than any policy could.
    pub fn unknown_policy(name: &str) -> Error {
        let mut end = name.len().min(128);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        Error::UnknownPolicy(name[..end].to_owned())
    }
}

/// Selector values of one request, by name: `&[("user", "alice"), ("ip", "10.0.0.1")]`.
pub type Selectors<'a> = [(&'a str, &'a str)];

type Policies = HashMap<String, PolicyRef, foldhash::fast::RandomState>;

/// Bound on identifiers the in-process fallback holds while the store is away.
const FALLBACK_IDENTIFIERS: usize = 1 << 20;

/// Named policies over a store.
///
/// A policy is named by its name (`"login"`, looked up on each call), by a [`PolicyRef`]
/// from [`Limiter::policy`] (no lookup; it keeps deciding under the definition it was taken
/// from, even after a reload replaced or removed that policy), or by a [`PolicyWatch`] (the
/// name's meaning, looked up again only after a reload).
pub struct Limiter {
    store: DynStore,
    /// Read on every hit without a lock or a reference count bumped on a shared cache
    /// line (workers on other cores would fight over it); replaced whole.
    policies: ArcSwap<Policies>,
    /// Bumped after each change of `policies`: a [`PolicyWatch`] looks its name up again
    /// only when it has moved.
    generation: AtomicU64,
    /// This limiter among others, for watches (from 1).
    id: u64,
    /// Serialises writers, so `add_policy`'s read-modify-write loses nothing.
    replacing: Mutex<()>,
    clock: Arc<dyn Clock>,
    near_cache: Option<NearCache>,
    /// Decides for policies failing `local` while the store is away.
    fallback: MemoryStore,
    counters: Counters,
    /// Admissions taken from the store ahead of time for `prefetch=N` leaves.
    blocks: prefetch::Blocks,
}

/// Configures a [`Limiter`].
pub struct LimiterBuilder {
    store: DynStore,
    policies: Vec<Policy>,
    clock: Arc<dyn Clock>,
    near_cache: Option<(usize, Duration)>,
}

impl LimiterBuilder {
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policies.push(policy);
        self
    }

    pub fn policies(mut self, policies: impl IntoIterator<Item = Policy>) -> Self {
        self.policies.extend(policies);
        self
    }

    /// The clock the near cache runs on (the store keeps its own time).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Answers identifiers known to be denied without asking the store, remembering at most
    /// `max_entries` denials, each for at most `max_ttl` (how late a reset made by another
    /// process may be seen here).
    pub fn near_cache(mut self, max_entries: usize, max_ttl: Duration) -> Self {
        self.near_cache = Some((max_entries, max_ttl));
        self
    }

    pub fn build(self) -> Result<Limiter, PolicyError> {
        let policies = compile_all(self.policies)?;
        let fallback = MemoryStore::builder()
            .clock(self.clock.clone())
            .max_identifiers(FALLBACK_IDENTIFIERS)
            .build();
        Ok(Limiter {
            store: self.store,
            policies: ArcSwap::from_pointee(policies),
            generation: AtomicU64::new(0),
            id: NEXT_LIMITER_ID.fetch_add(1, Ordering::Relaxed),
            replacing: Mutex::new(()),
            clock: self.clock,
            near_cache: self.near_cache.map(|(n, ttl)| NearCache::new(n, ttl)),
            fallback,
            counters: Counters::default(),
            blocks: prefetch::Blocks::default(),
        })
    }
}

/// Ids of limiters, for [`PolicyWatch`]: 0 is no limiter.
static NEXT_LIMITER_ID: AtomicU64 = AtomicU64::new(1);

fn compile_all(policies: Vec<Policy>) -> Result<Policies, PolicyError> {
    let mut out = Policies::default();
    for policy in policies {
        let compiled = CompiledPolicy::compile(policy)?;
        out.insert(compiled.name().to_owned(), Arc::new(compiled));
    }
    Ok(out)
}

impl Limiter {
    /// A limiter over `store` (any [`Store`]; it is held as a [`DynStore`]).
    pub fn builder(store: impl Store) -> LimiterBuilder {
        LimiterBuilder {
            store: DynStore::new(store),
            policies: Vec::new(),
            clock: Arc::new(SystemClock::new()),
            near_cache: None,
        }
    }

    pub fn store(&self) -> &DynStore {
        &self.store
    }

    /// The clock this limiter runs on (the near cache's, and the memory store's when it is
    /// built on the same one): for code that reports times beside its decisions.
    pub fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    /// Counts of near-cache answers, store errors and decisions taken without the store.
    pub fn stats(&self) -> LimiterStats {
        self.counters.snapshot()
    }

    /// A handle on the policy named `name`, to decide on without a lookup per call.
    pub fn policy(&self, name: &str) -> Option<PolicyRef> {
        self.policies.load().get(name).cloned()
    }

    /// A [`PolicyWatch`] of `name` that has looked it up already: until the policies change,
    /// a call through it reads what it found with no atomic operation at all.
    pub fn watch(&self, name: &str) -> PolicyWatch {
        let generation = self.generation.load(Ordering::Acquire);
        let policy = self.policies.load().get(name).cloned();
        PolicyWatch::found(
            name.to_owned(),
            handle::Seen {
                limiter: self.id,
                generation,
                policy,
            },
        )
    }

    /// Every policy, sorted by name.
    pub fn policies(&self) -> Vec<PolicyRef> {
        let mut all: Vec<_> = self.policies.load().values().cloned().collect();
        all.sort_by(|a, b| a.name().cmp(b.name()));
        all
    }

    /// Replaces every policy at once. Counters are kept: a policy whose leaves are unchanged
    /// keeps counting where it was. On error nothing changes.
    pub fn replace_policies(&self, policies: Vec<Policy>) -> Result<(), PolicyError> {
        let compiled = compile_all(policies)?;
        let _writer = self.replacing.lock();
        self.policies.store(Arc::new(compiled));
        self.generation.fetch_add(1, Ordering::Release);
        if let Some(cache) = &self.near_cache {
            cache.clear();
        }
        Ok(())
    }

    /// Adds `policy`, or replaces the one of the same name, keeping every other. Meant for
    /// policies made on the fly (a protocol naming its limit in the request); each call copies
    /// the table, so keep their number bounded.
    pub fn add_policy(&self, policy: Policy) -> Result<PolicyRef, PolicyError> {
        let compiled = Arc::new(CompiledPolicy::compile(policy)?);
        let _writer = self.replacing.lock();
        let mut next = Policies::clone(&self.policies.load());
        next.insert(compiled.name().to_owned(), compiled.clone());
        self.policies.store(Arc::new(next));
        self.generation.fetch_add(1, Ordering::Release);
        Ok(compiled)
    }

    /// How many policies are loaded.
    pub fn policy_count(&self) -> usize {
        self.policies.load().len()
    }

    /// Decides a hit of `cost` on `policy` and records it. Cost 0 checks without recording.
    pub async fn check<'p>(
        &self,
        policy: impl Into<PolicyArg<'p>>,
        selectors: &Selectors<'_>,
        cost: u64,
    ) -> Result<Checked, Error> {
        let policy = self.resolve(policy.into())?;
        let recording = counting(&policy);
        self.decide(policy, selectors, cost, recording).await
    }

    /// What a hit of `cost` would get, recording nothing.
    pub async fn peek<'p>(
        &self,
        policy: impl Into<PolicyArg<'p>>,
        selectors: &Selectors<'_>,
        cost: u64,
    ) -> Result<Checked, Error> {
        let policy = self.resolve(policy.into())?;
        self.decide(policy, selectors, cost, Recording::Never).await
    }

    /// [`Limiter::check`] without waiting, when the store can decide in this process (the
    /// memory store always can): for code that has no runtime at hand, and for hot paths
    /// that would rather not allocate a future. `None` when the store must be asked over the
    /// network, having done nothing: call [`Limiter::check`] then.
    pub fn try_check_now<'p>(
        &self,
        policy: impl Into<PolicyArg<'p>>,
        selectors: &Selectors<'_>,
        cost: u64,
    ) -> Option<Result<Checked, Error>> {
        match self.resolve(policy.into()) {
            Ok(policy) => {
                let recording = counting(&policy);
                self.decide_now(policy, selectors, cost, recording)
            }
            Err(error) => Some(Err(error)),
        }
    }

    /// [`Limiter::try_check_now`] answering the decision alone ([`Decided`]), for a caller
    /// that holds the policy already: a handle or a watch is borrowed for the call, not
    /// cloned into the answer, so calls on many cores under one policy write nothing they
    /// share (on the lean path: one leaf, no penalty, no near cache).
    pub fn try_check_decision_now<'p>(
        &self,
        policy: impl Into<PolicyArg<'p>>,
        selectors: &Selectors<'_>,
        cost: u64,
    ) -> Option<Result<Decided, Error>> {
        self.decision_now(policy.into(), selectors, cost, false)
    }

    /// [`Limiter::try_peek_now`] answering the decision alone, as
    /// [`Limiter::try_check_decision_now`].
    pub fn try_peek_decision_now<'p>(
        &self,
        policy: impl Into<PolicyArg<'p>>,
        selectors: &Selectors<'_>,
        cost: u64,
    ) -> Option<Result<Decided, Error>> {
        self.decision_now(policy.into(), selectors, cost, true)
    }

    /// What both answer: a peek records nothing, a check what the policy counts.
    fn decision_now(
        &self,
        policy: PolicyArg<'_>,
        selectors: &Selectors<'_>,
        cost: u64,
        peek: bool,
    ) -> Option<Result<Decided, Error>> {
        let recording = |policy: &PolicyRef| {
            if peek {
                Recording::Never
            } else {
                counting(policy)
            }
        };
        // A handle, the usual argument on a hot path, goes straight in: through
        // `with_policy` its answer is wrapped in one more result and moved out again.
        if let PolicyArg::Ref(policy) = policy {
            return self.decided_now(policy, selectors, cost, recording(policy));
        }
        let decided = self.with_policy(policy, |policy| {
            self.decided_now(policy, selectors, cost, recording(policy))
        });
        decided.unwrap_or_else(|error| Some(Err(error)))
    }

    /// [`Limiter::peek`] without waiting, as [`Limiter::try_check_now`].
    pub fn try_peek_now<'p>(
        &self,
        policy: impl Into<PolicyArg<'p>>,
        selectors: &Selectors<'_>,
        cost: u64,
    ) -> Option<Result<Checked, Error>> {
        match self.resolve(policy.into()) {
            Ok(policy) => self.decide_now(policy, selectors, cost, Recording::Never),
            Err(error) => Some(Err(error)),
        }
    }

    /// Pardon: clears the counters and the penalty of the keys `selectors` name. A leaf is
    /// cleared when all its selectors are given; global leaves only when `selectors` is empty.
    pub async fn reset<'p>(
        &self,
        policy: impl Into<PolicyArg<'p>>,
        selectors: &Selectors<'_>,
    ) -> Result<(), Error> {
        let policy = self.resolve(policy.into())?;
        let ids = identify::reset_identifiers(&policy, selectors);
        self.store.reset(&ids).await?;
        if let Some(cache) = &self.near_cache {
            cache.clear();
        }
        Ok(())
    }

    /// Runs `f` on the policy a call names, borrowed where it can be (the handle given, the
    /// handle a watch found, the entry of the loaded table) rather than cloned as
    /// [`Limiter::resolve`] does.
    fn with_policy<R>(
        &self,
        policy: PolicyArg<'_>,
        f: impl FnOnce(&PolicyRef) -> R,
    ) -> Result<R, Error> {
        match policy {
            PolicyArg::Ref(policy) => Ok(f(policy)),
            PolicyArg::Name(name) => {
                let table = self.policies.load();
                table
                    .get(name)
                    .map(f)
                    .ok_or_else(|| Error::unknown_policy(name))
            }
            PolicyArg::Watch(watch) => {
                let generation = self.generation.load(Ordering::Acquire);
                match watch.first_seen(self.id, generation) {
                    Some(found) => found
                        .map(f)
                        .ok_or_else(|| Error::unknown_policy(watch.name())),
                    None => self.resolve(policy).map(|policy| f(&policy)),
                }
            }
        }
    }

    /// [`Limiter::resolve`] for a call that takes leases: a policy without a concurrency
    /// leaf is an error.
    fn resolve_concurrent(&self, policy: PolicyArg<'_>) -> Result<PolicyRef, Error> {
        let policy = self.resolve(policy)?;
        if !policy.concurrent {
            return Err(Error::NoConcurrencyLeaf(policy.name().to_owned()));
        }
        Ok(policy)
    }

    /// The policy a call names: the handle it was given, or the one loaded under the name.
    fn resolve(&self, policy: PolicyArg<'_>) -> Result<PolicyRef, Error> {
        match policy {
            PolicyArg::Ref(policy) => Ok(policy.clone()),
            PolicyArg::Name(name) => self
                .policies
                .load()
                .get(name)
                .cloned()
                .ok_or_else(|| Error::unknown_policy(name)),
            PolicyArg::Watch(watch) => {
                // Read before the table: a reload between the two is seen by the next call.
                let generation = self.generation.load(Ordering::Acquire);
                let policy = match watch.seen(self.id, generation) {
                    Some(seen) => seen,
                    None => {
                        let found = self.policies.load().get(watch.name()).cloned();
                        watch.remember(handle::Seen {
                            limiter: self.id,
                            generation,
                            policy: found.clone(),
                        });
                        found
                    }
                };
                policy.ok_or_else(|| Error::unknown_policy(watch.name()))
            }
        }
    }
}

/// What a check records: denied attempts too when the policy counts them.
pub(super) fn counting(policy: &CompiledPolicy) -> Recording {
    if policy.policy.count_denied {
        Recording::Always
    } else {
        Recording::Admitted
    }
}
