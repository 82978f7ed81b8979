//! The Limiter's answers without waiting, over the memory store on a manual clock:
//! `try_check_now` and `try_peek_now` decide as the async calls do, and the decision alone
//! (`try_check_decision_now`, `try_peek_decision_now`) is what a check answers.

use std::time::Duration;

use sluice_limiter::{Error, Penalty};

mod common;
use common::{ALICE, BOB, limiter, limiter_on, policy, secs};

#[test]
fn try_check_now_decides_on_the_memory_store_exactly_as_check() {
    let (l, clock) = limiter([policy("p", "user:3/m")]);
    for i in 0..3 {
        let checked = l.try_check_now("p", ALICE, 1).expect("memory decides now");
        assert!(checked.unwrap().decision.allowed(), "hit {i}");
    }
    let denied = l.try_check_now("p", ALICE, 1).unwrap().unwrap().decision;
    assert!(!denied.allowed());
    assert_eq!(denied.retry_after(), Some(secs(20)));
    // A peek records nothing: the same answer twice.
    let peeked = l.try_peek_now("p", BOB, 1).unwrap().unwrap().decision;
    assert_eq!(peeked.remaining, 2);
    assert_eq!(
        l.try_peek_now("p", BOB, 1).unwrap().unwrap().decision,
        peeked
    );
    // The same counters as the async path: 20 s later one more hit passes, then none.
    clock.advance(secs(20));
    let async_path = futures_lite(l.check("p", ALICE, 1));
    assert!(async_path.unwrap().decision.allowed());
    assert!(
        !l.try_check_now("p", ALICE, 1)
            .unwrap()
            .unwrap()
            .decision
            .allowed()
    );
}

#[test]
fn try_check_now_reports_errors_without_recording() {
    let (l, _) = limiter([policy("p", "user:1/m")]);
    assert!(matches!(
        l.try_check_now("nope", ALICE, 1),
        Some(Err(Error::UnknownPolicy(_)))
    ));
    assert!(matches!(
        l.try_check_now("p", &[("ip", "10.0.0.1")], 1),
        Some(Err(Error::MissingSelector { .. }))
    ));
    assert!(
        l.try_check_now("p", ALICE, 1)
            .unwrap()
            .unwrap()
            .decision
            .allowed()
    );
}

/// `try_check_decision_now` and `try_peek_decision_now` answer what `try_check_now` and
/// `try_peek_now` answer, less the handle: two limiters alike, one asked each way, step by
/// step, by name, handle and watch, on the lean path and off it (penalty, near cache,
/// two leaves), shadow, peek, errors, and a reload under a watch.
#[test]
fn the_decision_alone_is_what_a_check_answers() {
    let penalty = Penalty::new(secs(1), 2, secs(8), secs(60)).unwrap();
    let policies = || {
        [
            policy("lean", "user:3/m"),
            policy("shadow", "user:1/m").shadow(true),
            policy("penalty", "user:2/s").penalty(penalty),
            policy("two", "user:2/s; user:4/m"),
        ]
    };
    for near_cache in [None, Some(secs(5))] {
        let (checks, checks_clock) = limiter_on(policies(), near_cache);
        let (decisions, decisions_clock) = limiter_on(policies(), near_cache);
        let (check_watch, decision_watch) = (checks.watch("lean"), decisions.watch("lean"));
        let users = [ALICE, BOB, &[("user", "carol")], &[("ip", "10.0.0.1")]];
        for step in 0..40 {
            let sel = users[step % users.len()];
            let name = ["lean", "shadow", "penalty", "two", "nope"][step % 5];
            let (checked, decided) = match step % 4 {
                0 => (
                    checks.try_check_now(name, sel, 1),
                    decisions.try_check_decision_now(name, sel, 1),
                ),
                1 => (
                    checks.try_peek_now(name, sel, 1),
                    decisions.try_peek_decision_now(name, sel, 1),
                ),
                2 => (
                    checks.try_check_now(&check_watch, sel, 1),
                    decisions.try_check_decision_now(&decision_watch, sel, 1),
                ),
                _ => {
                    let (a, b) = (checks.policy(name), decisions.policy(name));
                    match (a, b) {
                        (Some(a), Some(b)) => (
                            checks.try_check_now(&a, sel, 1),
                            decisions.try_check_decision_now(&b, sel, 1),
                        ),
                        (None, None) => continue,
                        _ => panic!("the limiters differ"),
                    }
                }
            };
            let checked = checked.expect("memory decides now");
            let decided = decided.expect("memory decides now");
            assert_eq!(
                checked.map(sluice_limiter::Decided::from),
                decided,
                "step {step}: {name} {sel:?}, near cache {near_cache:?}"
            );
            if step == 20 {
                for l in [&checks, &decisions] {
                    l.replace_policies(vec![policy("lean", "user:5/m")])
                        .unwrap();
                    l.replace_policies(policies().into()).unwrap();
                }
            }
            for clock in [&checks_clock, &decisions_clock] {
                clock.advance(Duration::from_millis(300));
            }
        }
        // Some of each answer came: admitted, denied, shadow-denied, cached.
        let decided: Vec<_> = (0..6)
            .filter_map(|_| decisions.try_check_decision_now("shadow", ALICE, 1))
            .map(Result::unwrap)
            .collect();
        assert!(decided.iter().all(|d| d.decision.allowed()));
        assert!(decided.iter().any(|d| d.shadow_denied));
    }
}

/// Polls a future that never waits (the memory store's) to its end, without a runtime.
fn futures_lite<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => panic!("the memory store never waits"),
    }
}
