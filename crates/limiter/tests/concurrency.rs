//! Exactness under concurrency: many OS threads or tokio tasks hammer the memory store, whose
//! clock is frozen so no refill can blur the count; the limits must hold to the unit.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Duration;

use sluice_limiter::{
    Algorithm, Checked, Denial, Limiter, ManualClock, MemoryStore, Penalty, Policy,
};

/// A fixed instant (nanoseconds since the epoch); the clock never moves in this file.
const FROZEN: u64 = 1_700_000_000_000_000_000;

/// One request of a plan: at most one selector (name, value), and the cost.
#[derive(Debug, Clone)]
struct Request {
    selector: Option<(&'static str, String)>,
    cost: u64,
}

impl Request {
    fn new(cost: u64) -> Request {
        let selector = None;
        Request { selector, cost }
    }

    fn with(self, name: &'static str, value: impl Into<String>) -> Request {
        let selector = Some((name, value.into()));
        Request { selector, ..self }
    }

    fn value(&self, name: &str) -> Option<&str> {
        let (n, v) = self.selector.as_ref()?;
        (*n == name).then_some(v.as_str())
    }
}

type Outcomes = Vec<(Request, Checked)>;

/// How the hits are made concurrent.
#[derive(Debug, Clone, Copy)]
enum Runner {
    /// 8 OS threads, each blocking on its own current-thread runtime.
    Threads,
    /// 64 tasks on a 4-worker tokio runtime, yielding between hits.
    Tasks,
}

const RUNNERS: [Runner; 2] = [Runner::Threads, Runner::Tasks];

fn limiter(policies: impl IntoIterator<Item = Policy>) -> Arc<Limiter> {
    let store = MemoryStore::builder()
        .clock(ManualClock::new(FROZEN))
        .build();
    Arc::new(Limiter::builder(store).policies(policies).build().unwrap())
}

async fn check(limiter: &Limiter, policy: &str, request: &Request) -> Checked {
    let selectors: Vec<(&str, &str)> = request
        .selector
        .iter()
        .map(|(n, v)| (*n, v.as_str()))
        .collect();
    limiter
        .check(policy, &selectors, request.cost)
        .await
        .expect("the memory store always decides")
}

/// Makes `total` hits on `policy`, spread over the runner's workers; hit `i` of worker `w`
/// is `plan(w, i)`.
fn run<P>(
    runner: Runner,
    limiter: &Arc<Limiter>,
    policy: &'static str,
    total: usize,
    plan: P,
) -> Outcomes
where
    P: Fn(usize, usize) -> Request + Send + Sync + 'static,
{
    match runner {
        Runner::Threads => on_threads(limiter, policy, 8, total / 8, plan),
        Runner::Tasks => on_tasks(limiter, policy, 64, total / 64, plan),
    }
}

fn on_threads<P>(
    limiter: &Limiter,
    policy: &str,
    threads: usize,
    per_thread: usize,
    plan: P,
) -> Outcomes
where
    P: Fn(usize, usize) -> Request + Sync,
{
    let barrier = Barrier::new(threads);
    thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|w| {
                let (barrier, plan) = (&barrier, &plan);
                scope.spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread().build();
                    let runtime = runtime.unwrap();
                    barrier.wait(); // start together, for the most contention
                    runtime.block_on(async {
                        let mut out = Vec::with_capacity(per_thread);
                        for i in 0..per_thread {
                            let request = plan(w, i);
                            out.push((request.clone(), check(limiter, policy, &request).await));
                        }
                        out
                    })
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    })
}

fn on_tasks<P>(
    limiter: &Arc<Limiter>,
    policy: &'static str,
    tasks: usize,
    per_task: usize,
    plan: P,
) -> Outcomes
where
    P: Fn(usize, usize) -> Request + Send + Sync + 'static,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .unwrap();
    let plan = Arc::new(plan);
    runtime.block_on(async {
        let handles: Vec<_> = (0..tasks)
            .map(|t| {
                let (limiter, plan) = (Arc::clone(limiter), Arc::clone(&plan));
                tokio::spawn(async move {
                    let mut out = Vec::with_capacity(per_task);
                    for i in 0..per_task {
                        let request = plan(t, i);
                        let checked = check(&limiter, policy, &request).await;
                        out.push((request, checked));
                        tokio::task::yield_now().await;
                    }
                    out
                })
            })
            .collect();
        let mut all = Vec::new();
        for handle in handles {
            all.extend(handle.await.unwrap());
        }
        all
    })
}

/// Total cost admitted.
fn total(outcomes: &Outcomes) -> u64 {
    admitted(outcomes, |_| true)
}

/// Total cost admitted among the requests `whose` selects.
fn admitted(outcomes: &Outcomes, whose: impl Fn(&Request) -> bool) -> u64 {
    outcomes
        .iter()
        .filter(|(r, c)| c.decision.allowed() && whose(r))
        .map(|(r, _)| r.cost)
        .sum()
}

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    let runtime = tokio::runtime::Builder::new_current_thread().build();
    runtime.unwrap().block_on(future)
}

/// What a hit of cost 1 would get now, recording nothing.
fn peek(limiter: &Limiter, policy: &str, selectors: &[(&str, &str)]) -> Checked {
    block_on(limiter.peek(policy, selectors, 1)).unwrap()
}

#[test]
fn every_algorithm_admits_exactly_the_limit() {
    for runner in RUNNERS {
        for algorithm in Algorithm::ALL {
            let by_policy = Policy::new("by-policy", "user:100/m")
                .unwrap()
                .algorithm(algorithm);
            let by_leaf = Policy::new("by-leaf", &format!("100/m algorithm={algorithm}")).unwrap();
            let limiter = limiter([by_policy, by_leaf]);

            let outcomes = run(runner, &limiter, "by-policy", 320, |_, _| {
                Request::new(1).with("user", "alice")
            });
            let what = format!("{runner:?} {algorithm}");
            assert_eq!(total(&outcomes), 100, "{what} (policy default)");
            let limited = |(_, c): &&(Request, Checked)| {
                matches!(c.decision.denial, Some(Denial::Limited { .. }))
            };
            assert_eq!(outcomes.iter().filter(limited).count(), 220, "{what}");
            let after = peek(&limiter, "by-policy", &[("user", "alice")]);
            assert!(!after.decision.allowed(), "{what}");

            let outcomes = run(runner, &limiter, "by-leaf", 320, |_, _| Request::new(1));
            assert_eq!(total(&outcomes), 100, "{what} (leaf option)");
            assert!(!peek(&limiter, "by-leaf", &[]).decision.allowed());
        }
    }
}

#[test]
fn costs_that_divide_the_limit_admit_exactly_the_limit() {
    for runner in RUNNERS {
        for algorithm in Algorithm::ALL {
            for cost in [2, 4, 5, 10, 25] {
                let limiter =
                    limiter([Policy::new("p", "user:100/m").unwrap().algorithm(algorithm)]);
                let outcomes = run(runner, &limiter, "p", 320, move |_, _| {
                    Request::new(cost).with("user", "u")
                });
                assert_eq!(total(&outcomes), 100, "{runner:?} {algorithm} cost {cost}");
                let hits = outcomes
                    .iter()
                    .filter(|(_, c)| c.decision.allowed())
                    .count() as u64;
                assert_eq!(hits, 100 / cost, "{runner:?} {algorithm} cost {cost}");
            }
        }
    }
}

#[test]
fn mixed_costs_never_exceed_the_limit() {
    for runner in RUNNERS {
        for algorithm in Algorithm::ALL {
            let limiter = limiter([Policy::new("p", "100/m").unwrap().algorithm(algorithm)]);
            // Costs 3 and 7 interleave. 160 hits of cost 3 cannot all pass, and once one is
            // denied fewer than 3 units are left: at most 2 go unused.
            let outcomes = run(runner, &limiter, "p", 320, |w, _| {
                Request::new(if w % 2 == 0 { 3 } else { 7 })
            });
            let total = total(&outcomes);
            assert!(
                (98..=100).contains(&total),
                "{runner:?} {algorithm}: admitted cost {total}"
            );
        }
    }
}

#[test]
fn or_rule_holds_the_shared_global_leaf_and_each_user() {
    let rules = [
        "or(user:100/m, 150/m)",
        "or(user:100/m algorithm=sliding-log, 150/m algorithm=fixed-window)",
        "or(user:100/m algorithm=sliding-window, 150/m)",
        "user:100/m; 150/m algorithm=sliding-window",
    ];
    for runner in RUNNERS {
        for rule in rules {
            let limiter = limiter([Policy::new("p", rule).unwrap()]);
            // Four users, 160 attempts each: every user could pass its own 100, so the global
            // leaf must be the one that stops them, at exactly 150.
            let outcomes = run(runner, &limiter, "p", 640, |w, _| {
                Request::new(1).with("user", format!("user-{}", w % 4))
            });
            assert_eq!(total(&outcomes), 150, "{runner:?} {rule}");
            for user in 0..4 {
                let name = format!("user-{user}");
                let mine = admitted(&outcomes, |r| r.value("user") == Some(&name));
                assert!(mine <= 100, "{runner:?} {rule}: {name} admitted {mine}");
            }
            let fresh = peek(&limiter, "p", &[("user", "newcomer")]);
            assert!(
                !fresh.decision.allowed(),
                "{runner:?} {rule}: the global leaf is spent"
            );
            assert_eq!(fresh.decision.leaf, 1);
        }
    }
}

#[test]
fn or_rule_stops_each_user_at_exactly_its_own_limit() {
    for runner in RUNNERS {
        let limiter = limiter([Policy::new("p", "or(user:100/m, 1000/m)").unwrap()]);
        let outcomes = run(runner, &limiter, "p", 640, |w, _| {
            Request::new(1).with("user", format!("user-{}", w % 4))
        });
        for user in 0..4 {
            let name = format!("user-{user}");
            assert_eq!(
                admitted(&outcomes, |r| r.value("user") == Some(&name)),
                100,
                "{runner:?} {name}"
            );
        }
    }
}

#[test]
fn and_rule_admits_exactly_until_every_child_is_reached() {
    let rules = [
        "and(apikey:100/m, 150/m)",
        "and(apikey:100/m algorithm=sliding-log, 150/m algorithm=fixed-window)",
    ];
    for runner in RUNNERS {
        for rule in rules {
            let limiter = limiter_with(rule);
            let outcomes = run(runner, &limiter, "p", 320, |_, _| {
                Request::new(1).with("apikey", "k")
            });
            assert_eq!(total(&outcomes), 150, "{runner:?} {rule}");
        }

        // Several keys: each passes its own 100 regardless of the global leaf, and beyond
        // that only while the global leaf is below 150.
        let limiter = limiter_with("and(apikey:100/m, 150/m)");
        let outcomes = run(runner, &limiter, "p", 640, |w, _| {
            Request::new(1).with("apikey", format!("k{}", w % 4))
        });
        let mut excess = 0;
        for key in 0..4 {
            let name = format!("k{key}");
            let mine = admitted(&outcomes, |r| r.value("apikey") == Some(&name));
            assert!(
                (100..=160).contains(&mine),
                "{runner:?}: {name} admitted {mine}"
            );
            excess += mine - 100;
        }
        assert!(
            excess <= 150,
            "{runner:?}: {excess} admitted past the keys' own limits"
        );
    }
}

fn limiter_with(rule: &str) -> Arc<Limiter> {
    limiter([Policy::new("p", rule).unwrap()])
}

#[test]
fn gcra_hot_path_admits_exactly_the_burst() {
    // Races are rare events: many short rounds find a lost update more surely than one long one.
    for round in 0..20 {
        for threads in [2, 4, 8] {
            let limiter = limiter_with("10/s burst=250");
            // From round 10 on, the state word exists before the race, so every hit takes
            // compare-and-swap; before, the first hits also race to create it.
            let warm = round >= 10;
            let first = warm
                && block_on(check(&limiter, "p", &Request::new(1)))
                    .decision
                    .allowed();
            let outcomes = on_threads(&limiter, "p", threads, 300, |_, _| Request::new(1));
            let admitted = u64::from(first) + total(&outcomes);
            assert_eq!(admitted, 250, "round {round}, {threads} threads");
        }
    }
}

#[test]
fn policy_flags_keep_the_count_exact() {
    let secs = Duration::from_secs;
    let penalty = Penalty::new(secs(1), 2, secs(8), secs(60)).unwrap();
    for runner in RUNNERS {
        for algorithm in Algorithm::ALL {
            let policy = |name| {
                Policy::new(name, "user:100/m")
                    .unwrap()
                    .algorithm(algorithm)
            };
            let limiter = limiter([
                policy("penalty").penalty(penalty),
                policy("count-denied").count_denied(true),
                policy("shadow").shadow(true),
            ]);
            for policy in ["penalty", "count-denied", "shadow"] {
                let outcomes = run(runner, &limiter, policy, 320, |_, _| {
                    Request::new(1).with("user", "u")
                });
                let really = outcomes
                    .iter()
                    .filter(|(_, c)| c.decision.allowed() && !c.shadow_denied);
                assert_eq!(really.count(), 100, "{runner:?} {algorithm} {policy}");
            }
        }
    }
}
