//! What every case needs: a fresh namespace, limiters over the factory's stores, calls that
//! turn "could not decide" into a clear panic, concurrent attempts, and time bounds.

use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_core::Algorithm;

use super::StoreFactory;
use crate::clock::{Clock, SystemClock};
use crate::{Checked, Error, Limiter, Policy, Selectors};

pub(crate) const ALICE: &Selectors<'static> = &[("user", "alice")];
pub(crate) const BOB: &Selectors<'static> = &[("user", "bob")];

/// Concurrent tasks in every race.
pub(crate) const TASKS: usize = 64;

pub(crate) const MINUTE: Duration = Duration::from_secs(60);
pub(crate) const HOUR: Duration = Duration::from_secs(3_600);

/// How far a store's count of elapsed time may run ahead of ours: one tick of a store that
/// counts time coarsely (a millisecond, say), with room to spare.
const TICK_MARGIN: Duration = Duration::from_secs(1);

/// The span of rates in the cases: an hour (a GCRA bucket of 100 refills one unit per 36 s,
/// far longer than a case takes), but ten years for fixed windows, which are aligned to the
/// epoch and would otherwise roll over whenever a case straddles the top of an hour.
pub(crate) fn long_span(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => "10y",
        _ => "h",
    }
}

/// A namespace no other case, run or process has used, since a shared store (Redis) keeps
/// counters between tests and between runs.
pub(crate) struct Namespace(String);

impl Namespace {
    pub(crate) fn new(case: &str) -> Namespace {
        static RUNS: AtomicU64 = AtomicU64::new(0);
        let run = RUNS.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemClock::new().now();
        let pid = std::process::id();
        Namespace(format!("conf-{case}-{pid}-{nanos:x}-{run}"))
    }

    /// A policy named `name` in this namespace.
    pub(crate) fn policy(&self, name: &str, rule: &str) -> Policy {
        Policy::new(name, rule)
            .unwrap_or_else(|e| panic!("conformance rule `{rule}` does not parse: {e}"))
            .namespace(&self.0)
    }
}

/// A limiter over a new store from `factory`: one more app server on the shared store.
pub(crate) fn limiter<F: StoreFactory>(
    factory: &F,
    policies: impl IntoIterator<Item = Policy>,
) -> Arc<Limiter> {
    let built = Limiter::builder(factory.store()).policies(policies).build();
    Arc::new(built.unwrap_or_else(|e| panic!("conformance policies do not compile: {e}")))
}

/// The same, with a near cache of denials.
pub(crate) fn near_cached_limiter<F: StoreFactory>(
    factory: &F,
    policies: impl IntoIterator<Item = Policy>,
) -> Arc<Limiter> {
    let builder = Limiter::builder(factory.store()).policies(policies);
    let built = builder.near_cache(10_000, MINUTE).build();
    Arc::new(built.unwrap_or_else(|e| panic!("conformance policies do not compile: {e}")))
}

pub(crate) async fn check(
    limiter: &Limiter,
    policy: &str,
    selectors: &Selectors<'_>,
    cost: u64,
) -> Checked {
    let checked = limiter.check(policy, selectors, cost).await;
    by_the_store(checked, || {
        format!("check {policy} {selectors:?} cost {cost}")
    })
}

pub(crate) async fn peek(
    limiter: &Limiter,
    policy: &str,
    selectors: &Selectors<'_>,
    cost: u64,
) -> Checked {
    let checked = limiter.peek(policy, selectors, cost).await;
    by_the_store(checked, || {
        format!("peek {policy} {selectors:?} cost {cost}")
    })
}

/// The answer, if the store gave it. A decision the policy's failure mode took instead (the
/// store failed or timed out) says nothing about the store, and would blur every count.
fn by_the_store(checked: Result<Checked, Error>, what: impl Fn() -> String) -> Checked {
    match checked {
        Ok(Checked {
            without_store: Some(mode),
            ..
        }) => panic!(
            "{}: the store did not decide (failed or timed out; failure mode {mode:?} \
             answered instead)",
            what()
        ),
        Ok(checked) => checked,
        Err(e) => panic!("{}: {e}", what()),
    }
}

pub(crate) async fn reset(limiter: &Limiter, policy: &str, selectors: &Selectors<'_>) {
    let done = limiter.reset(policy, selectors).await;
    done.unwrap_or_else(|e| panic!("reset {policy} {selectors:?}: {e}"));
}

/// Makes `n` hits of cost 1 and asserts they are admitted with `remaining` counting down
/// from `n - 1` (the caller knows nothing else limits them sooner).
pub(crate) async fn admit(limiter: &Limiter, policy: &str, selectors: &Selectors<'_>, n: u64) {
    for i in 0..n {
        let d = check(limiter, policy, selectors, 1).await.decision;
        let what = format!("{policy} {selectors:?}: hit {} of {n}", i + 1);
        assert!(d.allowed(), "{what} was denied: {d:?}");
        assert_eq!(d.remaining, n - 1 - i, "{what}: remaining");
    }
}

/// What one task sends, again and again.
#[derive(Debug, Clone)]
pub(crate) struct Attempt {
    pub(crate) selectors: Vec<(&'static str, String)>,
    pub(crate) cost: u64,
}

impl Attempt {
    pub(crate) fn new(cost: u64) -> Attempt {
        let selectors = Vec::new();
        Attempt { selectors, cost }
    }

    pub(crate) fn with(mut self, name: &'static str, value: impl Into<String>) -> Attempt {
        self.selectors.push((name, value.into()));
        self
    }

    pub(crate) fn value(&self, name: &str) -> Option<&str> {
        let (_, value) = self.selectors.iter().find(|(n, _)| *n == name)?;
        Some(value)
    }
}

pub(crate) type Outcomes = Vec<(Attempt, Checked)>;

/// `tasks` tokio tasks, released together, each making `per_task` checks of its attempt
/// (`plan(task)`) on `policy`; task `t` goes through `limiters[t % limiters.len()]`.
pub(crate) async fn hammer(
    limiters: &[Arc<Limiter>],
    policy: &str,
    tasks: usize,
    per_task: usize,
    plan: impl Fn(usize) -> Attempt,
) -> Outcomes {
    let start = Arc::new(tokio::sync::Barrier::new(tasks));
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let limiter = Arc::clone(&limiters[t % limiters.len()]);
            let (start, policy, attempt) = (Arc::clone(&start), policy.to_owned(), plan(t));
            tokio::spawn(async move {
                let selectors: Vec<(&str, &str)> = attempt
                    .selectors
                    .iter()
                    .map(|(n, v)| (*n, v.as_str()))
                    .collect();
                start.wait().await; // all at once, for the most contention
                let mut checked = Vec::with_capacity(per_task);
                for _ in 0..per_task {
                    checked.push(check(&limiter, &policy, &selectors, attempt.cost).await);
                    tokio::task::yield_now().await;
                }
                (attempt, checked)
            })
        })
        .collect();
    let mut outcomes = Vec::with_capacity(tasks * per_task);
    for handle in handles {
        let (attempt, checked) = match handle.await {
            Ok(done) => done,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("a conformance task did not finish: {e}"),
        };
        outcomes.extend(checked.into_iter().map(|c| (attempt.clone(), c)));
    }
    outcomes
}

/// Total cost really admitted (a shadow policy's would-be denials excluded) among the
/// attempts `whose` selects.
pub(crate) fn admitted(outcomes: &Outcomes, whose: impl Fn(&Attempt) -> bool) -> u64 {
    outcomes
        .iter()
        .filter(|(a, c)| c.decision.allowed() && !c.shadow_denied && whose(a))
        .map(|(a, _)| a.cost)
        .sum()
}

/// Total cost really admitted.
pub(crate) fn total(outcomes: &Outcomes) -> u64 {
    admitted(outcomes, |_| true)
}

/// How many outcomes `which` selects.
pub(crate) fn count(outcomes: &Outcomes, which: impl Fn(&Checked) -> bool) -> usize {
    outcomes.iter().filter(|(_, c)| which(c)).count()
}

/// Asserts `got` is `full` less the time since `since`: at most `full`, and short of it by
/// no more than what has elapsed here (plus a store tick). Stores keep their own time (Redis
/// `TIME`), so our clock can only bound theirs.
pub(crate) fn assert_counts_down(
    what: impl Display,
    got: Duration,
    full: Duration,
    since: Instant,
) {
    let low = full.saturating_sub(since.elapsed() + TICK_MARGIN);
    assert!(
        low <= got && got <= full,
        "{what}: {got:?} is not within [{low:?}, {full:?}]"
    );
}

/// The same for a `retry_after`, which must be there.
pub(crate) fn assert_retry(
    what: impl Display,
    got: Option<Duration>,
    full: Duration,
    since: Instant,
) {
    match got {
        Some(got) => assert_counts_down(what, got, full, since),
        None => panic!("{what}: no retry_after (expected about {full:?})"),
    }
}

/// Asserts `low <= got <= high`, allowing `got` below `low` by the time since `since`.
pub(crate) fn assert_between(
    what: impl Display,
    got: Duration,
    low: Duration,
    high: Duration,
    since: Instant,
) {
    let low = low.saturating_sub(since.elapsed() + TICK_MARGIN);
    assert!(
        low <= got && got <= high,
        "{what}: {got:?} is not within [{low:?}, {high:?}]"
    );
}
