//! The `Limiter`: named policies over a store.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use sluice_core::{Decision, Denial, Evaluation, Recording};

use crate::clock::{Clock, SystemClock};
use crate::failure::{Counters, FailureMode, LimiterStats, STORE_PAUSE};
use crate::identifier::{Identifiers, push_value};
use crate::memory::MemoryStore;
use crate::near_cache::NearCache;
use crate::policy::{CompiledPolicy, Policy, PolicyError};
use crate::store::{Hit, Store, StoreError};

/// The answer of [`Limiter::check`].
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    /// The decision as the caller should act on it. For a shadow policy, always allowed.
    pub decision: Decision,
    /// A shadow policy would have denied this hit.
    pub shadow_denied: bool,
    /// Answered by the near cache, without asking the store.
    pub cached: bool,
    /// The store could not decide; the policy's failure mode did (see [`FailureMode`]).
    pub without_store: Option<FailureMode>,
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
}

impl Error {
    /// Whether the same call may succeed later (only store trouble can pass).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Store(e) if e.is_transient())
    }
}

/// Selector values of one request, by name: `&[("user", "alice"), ("ip", "10.0.0.1")]`.
pub type Selectors<'a> = [(&'a str, &'a str)];

type Policies = HashMap<String, Arc<CompiledPolicy>, foldhash::fast::RandomState>;

/// Bound on identifiers the in-process fallback holds while the store is away.
const FALLBACK_IDENTIFIERS: usize = 1 << 20;

/// Named policies over a [`Store`].
pub struct Limiter<S> {
    store: S,
    /// Read on every hit without a lock or a reference count bumped on a shared cache
    /// line (workers on other cores would fight over it); replaced whole.
    policies: ArcSwap<Policies>,
    /// Serialises writers, so `add_policy`'s read-modify-write loses nothing.
    replacing: Mutex<()>,
    clock: Arc<dyn Clock>,
    near_cache: Option<NearCache>,
    /// Decides for policies failing `local` while the store is away.
    fallback: MemoryStore,
    counters: Counters,
}

/// Configures a [`Limiter`].
pub struct LimiterBuilder<S> {
    store: S,
    policies: Vec<Policy>,
    clock: Arc<dyn Clock>,
    near_cache: Option<(usize, Duration)>,
}

impl<S: Store> LimiterBuilder<S> {
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

    pub fn build(self) -> Result<Limiter<S>, PolicyError> {
        let policies = compile_all(self.policies)?;
        let fallback = MemoryStore::builder()
            .clock(self.clock.clone())
            .max_identifiers(FALLBACK_IDENTIFIERS)
            .build();
        Ok(Limiter {
            store: self.store,
            policies: ArcSwap::from_pointee(policies),
            replacing: Mutex::new(()),
            clock: self.clock,
            near_cache: self.near_cache.map(|(n, ttl)| NearCache::new(n, ttl)),
            fallback,
            counters: Counters::default(),
        })
    }
}

fn compile_all(policies: Vec<Policy>) -> Result<Policies, PolicyError> {
    let mut out = Policies::default();
    for policy in policies {
        let compiled = CompiledPolicy::compile(policy)?;
        out.insert(compiled.name().to_owned(), Arc::new(compiled));
    }
    Ok(out)
}

impl<S: Store> Limiter<S> {
    pub fn builder(store: S) -> LimiterBuilder<S> {
        LimiterBuilder {
            store,
            policies: Vec::new(),
            clock: Arc::new(SystemClock::new()),
            near_cache: None,
        }
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// Counts of near-cache answers, store errors and decisions taken without the store.
    pub fn stats(&self) -> LimiterStats {
        self.counters.snapshot()
    }

    /// The policy named `name`.
    pub fn policy(&self, name: &str) -> Option<Arc<CompiledPolicy>> {
        self.policies.load().get(name).cloned()
    }

    /// Every policy, sorted by name.
    pub fn policies(&self) -> Vec<Arc<CompiledPolicy>> {
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
        if let Some(cache) = &self.near_cache {
            cache.clear();
        }
        Ok(())
    }

    /// Adds `policy`, or replaces the one of the same name, keeping every other. Meant for
    /// policies made on the fly (a protocol naming its limit in the request); each call copies
    /// the table, so keep their number bounded.
    pub fn add_policy(&self, policy: Policy) -> Result<Arc<CompiledPolicy>, PolicyError> {
        let compiled = Arc::new(CompiledPolicy::compile(policy)?);
        let _writer = self.replacing.lock();
        let mut next = Policies::clone(&self.policies.load());
        next.insert(compiled.name().to_owned(), compiled.clone());
        self.policies.store(Arc::new(next));
        Ok(compiled)
    }

    /// How many policies are loaded.
    pub fn policy_count(&self) -> usize {
        self.policies.load().len()
    }

    /// Decides a hit of `cost` on `policy` and records it. Cost 0 checks without recording.
    pub async fn check(
        &self,
        policy: &str,
        selectors: &Selectors<'_>,
        cost: u64,
    ) -> Result<Checked, Error> {
        let table = self.policies.load();
        let policy = lookup(&table, policy)?;
        self.decide(policy, selectors, cost, counting(policy)).await
    }

    /// What a hit of `cost` would get, recording nothing.
    pub async fn peek(
        &self,
        policy: &str,
        selectors: &Selectors<'_>,
        cost: u64,
    ) -> Result<Checked, Error> {
        let table = self.policies.load();
        let policy = lookup(&table, policy)?;
        self.decide(policy, selectors, cost, Recording::Never).await
    }

    /// [`Limiter::check`] without waiting, when the store can decide in this process (the
    /// memory store always can): for code that has no runtime at hand, and for hot paths
    /// that would rather not allocate a future. `None` when the store must be asked over the
    /// network, having done nothing: call [`Limiter::check`] then.
    pub fn try_check_now(
        &self,
        policy: &str,
        selectors: &Selectors<'_>,
        cost: u64,
    ) -> Option<Result<Checked, Error>> {
        let table = self.policies.load();
        let policy = match lookup(&table, policy) {
            Ok(policy) => policy,
            Err(error) => return Some(Err(error)),
        };
        self.decide_now(policy, selectors, cost, counting(policy))
    }

    /// [`Limiter::peek`] without waiting, as [`Limiter::try_check_now`].
    pub fn try_peek_now(
        &self,
        policy: &str,
        selectors: &Selectors<'_>,
        cost: u64,
    ) -> Option<Result<Checked, Error>> {
        let table = self.policies.load();
        match lookup(&table, policy) {
            Ok(policy) => self.decide_now(policy, selectors, cost, Recording::Never),
            Err(error) => Some(Err(error)),
        }
    }

    /// Pardon: clears the counters and the penalty of the keys `selectors` name. A leaf is
    /// cleared when all its selectors are given; global leaves only when `selectors` is empty.
    pub async fn reset(&self, policy: &str, selectors: &Selectors<'_>) -> Result<(), Error> {
        let table = self.policies.load();
        let policy = lookup(&table, policy)?;
        let mut ids = Vec::new();
        for leaf in &policy.leaves {
            let names = leaf.leaf.selector.names();
            if names.is_empty() != selectors.is_empty() {
                continue;
            }
            if let Ok(id) = leaf_identifier(policy, leaf, selectors) {
                ids.push(id);
            }
        }
        if let Ok(Some(id)) = penalty_identifier(policy, selectors) {
            ids.push(id);
        }
        self.store.reset(&ids).await?;
        if let Some(cache) = &self.near_cache {
            cache.clear();
        }
        Ok(())
    }

    async fn decide(
        &self,
        policy: &CompiledPolicy,
        selectors: &Selectors<'_>,
        cost: u64,
        recording: Recording,
    ) -> Result<Checked, Error> {
        let ask = match self.prepare(policy, selectors, cost, recording)? {
            Prepared::Answered(checked) => return Ok(checked),
            Prepared::Ask(ask) => ask,
        };
        let hit = ask.hit(policy, cost, recording);
        let result = if ask.paused {
            Err(paused())
        } else {
            self.store.decide(&hit).await
        };
        self.conclude(policy, &ask, &hit, result)
    }

    /// [`Limiter::decide`] when the store can answer without waiting; `None` otherwise,
    /// having done nothing.
    fn decide_now(
        &self,
        policy: &CompiledPolicy,
        selectors: &Selectors<'_>,
        cost: u64,
        recording: Recording,
    ) -> Option<Result<Checked, Error>> {
        let ask = match self.prepare(policy, selectors, cost, recording) {
            Ok(Prepared::Answered(checked)) => return Some(Ok(checked)),
            Ok(Prepared::Ask(ask)) => ask,
            Err(error) => return Some(Err(error)),
        };
        let hit = ask.hit(policy, cost, recording);
        let result = if ask.paused {
            Err(paused())
        } else {
            self.store.try_decide_now(&hit)?
        };
        Some(self.conclude(policy, &ask, &hit, result))
    }

    /// Everything before the store: identifiers, the near cache, the pause after an error.
    fn prepare(
        &self,
        policy: &CompiledPolicy,
        selectors: &Selectors<'_>,
        cost: u64,
        recording: Recording,
    ) -> Result<Prepared, Error> {
        let mut identifiers = Identifiers::take();
        for leaf in &policy.leaves {
            write_leaf_identifier(identifiers.next(), policy, leaf, selectors)?;
        }
        let penalty_identifier = penalty_identifier(policy, selectors)?;
        // Denials counted by the store must reach it, so count-denied policies skip the cache.
        let cached = self.near_cache.is_some() && recording == Recording::Admitted && cost > 0;
        if cached
            && let Some(cache) = &self.near_cache
            && let Some(decision) = cache.get(
                policy.name(),
                identifiers.as_slice(),
                cost,
                self.clock.now(),
            )
        {
            Counters::bump(&self.counters.near_cache_hits);
            return Ok(Prepared::Answered(finish(policy, decision, true)));
        }
        // Only a store that has failed sets the pause: read the clock only then.
        let until = self.counters.store_paused_until.load(Ordering::Relaxed);
        let paused = until != 0 && until > self.clock.now();
        Ok(Prepared::Ask(Ask {
            identifiers,
            penalty_identifier,
            cached,
            paused,
        }))
    }

    /// Everything after the store: the failure mode on error, the near cache on denial.
    fn conclude(
        &self,
        policy: &CompiledPolicy,
        ask: &Ask,
        hit: &Hit<'_>,
        result: Result<Decision, StoreError>,
    ) -> Result<Checked, Error> {
        let decision = match result {
            Ok(decision) => decision,
            Err(error) if error.is_transient() => {
                if !ask.paused {
                    Counters::bump(&self.counters.store_errors);
                    let until = self.clock.now() + STORE_PAUSE.as_nanos() as u64;
                    self.counters
                        .store_paused_until
                        .store(until, Ordering::Relaxed);
                }
                return Ok(self.without_store(policy, hit));
            }
            Err(error) => return Err(error.into()),
        };
        if ask.cached
            && !decision.allowed
            && let Some(cache) = &self.near_cache
        {
            cache.remember(
                policy.name(),
                ask.identifiers.as_slice(),
                hit.evaluation.cost,
                &decision,
                self.clock.now(),
            );
        }
        Ok(finish(policy, decision, false))
    }

    /// Decides `hit` as the policy's failure mode says, counting it.
    fn without_store(&self, policy: &CompiledPolicy, hit: &Hit<'_>) -> Checked {
        let mode = policy.policy.failure;
        let capacity = policy.quotas[0].capacity();
        let decision = match (mode, &policy.local_quotas) {
            (FailureMode::Open, _) => {
                Counters::bump(&self.counters.failed_open);
                Decision {
                    allowed: true,
                    limit: capacity,
                    remaining: 0,
                    reset_after: Duration::ZERO,
                    retry_after: None,
                    denial: None,
                    leaf: 0,
                }
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
                    allowed: false,
                    limit: capacity,
                    remaining: 0,
                    reset_after: Duration::ZERO,
                    retry_after: None,
                    denial: Some(Denial::StoreUnavailable),
                    leaf: 0,
                }
            }
        };
        let mut checked = finish(policy, decision, false);
        checked.without_store = Some(mode);
        checked
    }
}

/// What [`Limiter::prepare`] leaves for the store.
enum Prepared {
    /// Answered without the store (the near cache).
    Answered(Checked),
    Ask(Ask),
}

struct Ask {
    identifiers: Identifiers,
    penalty_identifier: Option<String>,
    /// The near cache applies to this hit.
    cached: bool,
    /// The store is resting after an error: the failure mode decides.
    paused: bool,
}

impl Ask {
    fn hit<'a>(&'a self, policy: &'a CompiledPolicy, cost: u64, recording: Recording) -> Hit<'a> {
        Hit {
            identifiers: self.identifiers.as_slice(),
            evaluation: Evaluation {
                shape: &policy.shape,
                quotas: &policy.quotas,
                cost,
                recording,
                penalty: policy.policy.penalty.as_ref(),
            },
            penalty_identifier: self.penalty_identifier.as_deref(),
        }
    }
}

fn paused() -> StoreError {
    StoreError::Unavailable("paused after a recent error".into())
}

/// What a check records: denied attempts too when the policy counts them.
fn counting(policy: &CompiledPolicy) -> Recording {
    if policy.policy.count_denied {
        Recording::Always
    } else {
        Recording::Admitted
    }
}

/// The policy named `name` in `table`, borrowed: a hit clones no `Arc`.
fn lookup<'t>(table: &'t Policies, name: &str) -> Result<&'t CompiledPolicy, Error> {
    table
        .get(name)
        .map(|policy| &**policy)
        .ok_or_else(|| Error::UnknownPolicy(name.to_owned()))
}

fn finish(policy: &CompiledPolicy, mut decision: Decision, cached: bool) -> Checked {
    let shadow_denied = policy.policy.shadow && !decision.allowed;
    if shadow_denied {
        decision.allowed = true;
        decision.retry_after = None;
        decision.denial = None;
    }
    Checked {
        decision,
        shadow_denied,
        cached,
        without_store: None,
    }
}

fn value<'a>(
    policy: &CompiledPolicy,
    selectors: &Selectors<'a>,
    name: &str,
) -> Result<&'a str, Error> {
    selectors
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| *v)
        .ok_or_else(|| Error::MissingSelector {
            policy: policy.name().to_owned(),
            selector: name.to_owned(),
        })
}

fn leaf_identifier(
    policy: &CompiledPolicy,
    leaf: &crate::policy::CompiledLeaf,
    selectors: &Selectors<'_>,
) -> Result<String, Error> {
    let mut id = String::with_capacity(leaf.prefix.len() + leaf.suffix.len() + 24);
    write_leaf_identifier(&mut id, policy, leaf, selectors)?;
    Ok(id)
}

/// Writes a leaf's identifier into `id` (empty).
fn write_leaf_identifier(
    id: &mut String,
    policy: &CompiledPolicy,
    leaf: &crate::policy::CompiledLeaf,
    selectors: &Selectors<'_>,
) -> Result<(), Error> {
    id.push_str(&leaf.prefix);
    push_values(
        id,
        policy,
        leaf.leaf.selector.names(),
        leaf.tag_at,
        selectors,
    )?;
    id.push_str(&leaf.suffix);
    Ok(())
}

/// Appends the selector values for `names`, `+`-joined, with the one at `tag_at` wrapped in
/// a Redis Cluster hash tag; a global leaf (no names) gets the policy's tag.
fn push_values(
    id: &mut String,
    policy: &CompiledPolicy,
    names: &[String],
    tag_at: Option<usize>,
    selectors: &Selectors<'_>,
) -> Result<(), Error> {
    if names.is_empty() {
        id.push_str(&policy.global_tag);
    }
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            id.push('+');
        }
        let tagged = tag_at == Some(i);
        if tagged {
            id.push('{');
        }
        push_value(id, value(policy, selectors, name)?);
        if tagged {
            id.push('}');
        }
    }
    Ok(())
}

fn penalty_identifier(
    policy: &CompiledPolicy,
    selectors: &Selectors<'_>,
) -> Result<Option<String>, Error> {
    if policy.policy.penalty.is_none() {
        return Ok(None);
    }
    // `namespace:key:names:values:penalty`: counters end in a rate, which always holds a
    // `/`, so a penalty record can never share a counter's name.
    let mut id = policy.penalty_prefix.clone();
    push_values(
        &mut id,
        policy,
        &policy.penalty_names,
        policy.penalty_tag_at,
        selectors,
    )?;
    id.push_str(":penalty");
    Ok(Some(id))
}
