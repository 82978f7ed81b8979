//! Throughput rounds for the stores' benchmarks, and the hits they and some tests send
//! straight to a store.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_core::{Evaluation, Quota, Recording, Shape};
use sluice_limiter::{Hit, Identifier, Store};

/// The middle value (the upper one of an even count).
pub fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(|a, b| a.total_cmp(b));
    xs[xs.len() / 2]
}

/// A process's CPU time so far (user + system, from `/proc/PID/stat`), in seconds; `None` is
/// this process. With `children`, the time of its exited and waited-for children is added
/// (stat(5)'s cutime and cstime). `None` if the process is gone.
pub fn cpu_seconds(pid: Option<u32>, children: bool) -> Option<f64> {
    let path = pid.map_or("/proc/self/stat".to_owned(), |p| format!("/proc/{p}/stat"));
    let stat = std::fs::read_to_string(path).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split(' ').collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    // utime, stime, cutime and cstime are fields 14 to 17 of stat(5); `fields` starts at 3.
    let own = ticks(11)? + ticks(12)?;
    let waited = if children {
        ticks(13)? + ticks(14)?
    } else {
        0.0
    };
    // The kernel's clock ticks, 100 a second on Linux.
    Some((own + waited) / 100.0)
}

/// A rule as a store sees it, cost 1, recorded when admitted: one leaf (the simplest
/// policy), or leaves joined by `;`.
pub struct BenchRule {
    shape: Shape,
    quotas: Vec<Quota>,
}

impl BenchRule {
    /// One leaf of `quota`.
    pub fn one_leaf(quota: Quota) -> BenchRule {
        BenchRule {
            shape: Shape::Leaf(0),
            quotas: vec![quota],
        }
    }

    /// Leaves of `quotas` joined by `;` (an `or`: denied when any would be exceeded).
    pub fn or(quotas: Vec<Quota>) -> BenchRule {
        BenchRule {
            shape: Shape::Or((0..quotas.len()).map(Shape::Leaf).collect()),
            quotas,
        }
    }

    /// A hit of this rule on `identifiers` (one per leaf).
    pub fn hit<'a>(&'a self, identifiers: &'a [Identifier]) -> Hit<'a> {
        Hit {
            identifiers,
            evaluation: Evaluation {
                shape: &self.shape,
                quotas: &self.quotas,
                cost: 1,
                recording: Recording::Admitted,
                penalty: None,
            },
            penalty_identifier: None,
        }
    }
}

/// What the tasks of one timed round share: whether to keep going, and the calls made.
#[derive(Default)]
pub struct Round {
    stop: AtomicBool,
    done: AtomicU64,
}

impl Round {
    /// Whether the round is still on: a task loops while it is.
    pub fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }

    /// Counts one call.
    pub fn count(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }
}

/// Calls per second over `round`: starts `callers` tasks, the `i`-th running what
/// `caller(i, round)` returns (a loop while [`Round::running`], counting each call with
/// [`Round::count`]), stops them after `round` and waits for them. A panic in a task is
/// the benchmark's panic.
pub async fn calls_per_second<F, Fut>(callers: usize, round: Duration, caller: F) -> f64
where
    F: Fn(usize, Arc<Round>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let shared = Arc::new(Round::default());
    let tasks: Vec<_> = (0..callers)
        .map(|i| tokio::spawn(caller(i, shared.clone())))
        .collect();
    let started = Instant::now();
    tokio::time::sleep(round).await;
    shared.stop.store(true, Ordering::Relaxed);
    let total = shared.done.load(Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    for task in tasks {
        task.await.expect("a caller panicked");
    }
    total as f64 / elapsed
}

/// Decisions per second from `callers` tasks deciding one-leaf hits of `quota` on `store`
/// for `round`, each walking `keys` from its own offset with a stride that visits all.
/// Panics unless nearly every hit was admitted (the quota is meant to admit all).
pub async fn decisions_per_second<S: Store + Clone>(
    store: &S,
    quota: Quota,
    keys: Arc<Vec<[Identifier; 1]>>,
    callers: usize,
    round: Duration,
) -> f64 {
    let rule = Arc::new(BenchRule::one_leaf(quota));
    rule_decisions_per_second(store, rule, keys, callers, round).await
}

/// [`decisions_per_second`] of any rule: each hit names one element of `keys` (one
/// identifier per leaf of `rule`).
pub async fn rule_decisions_per_second<S, K>(
    store: &S,
    rule: Arc<BenchRule>,
    keys: Arc<Vec<K>>,
    callers: usize,
    round: Duration,
) -> f64
where
    S: Store + Clone,
    K: AsRef<[Identifier]> + Send + Sync + 'static,
{
    let calls = Arc::new(AtomicU64::new(0));
    let admitted = Arc::new(AtomicU64::new(0));
    let rate = calls_per_second(callers, round, |caller, round| {
        let (store, keys, rule) = (store.clone(), keys.clone(), rule.clone());
        let (calls, admitted) = (calls.clone(), admitted.clone());
        async move {
            let mut i = caller * (keys.len() / callers).max(1);
            while round.running() {
                let hit = rule.hit(keys[i % keys.len()].as_ref());
                let decision = store.decide(&hit).await.expect("a decision");
                admitted.fetch_add(u64::from(decision.allowed()), Ordering::Relaxed);
                calls.fetch_add(1, Ordering::Relaxed);
                round.count();
                i = i.wrapping_add(7919);
            }
        }
    })
    .await;
    assert!(
        admitted.load(Ordering::Relaxed) * 10 >= calls.load(Ordering::Relaxed) * 9,
        "the quota admits nearly all"
    );
    rate
}
