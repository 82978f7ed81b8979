//! Exactness: decision numbers, and counts that hold to the unit under concurrency, for every
//! algorithm, compound rules and costs above one.

use std::slice::from_ref;
use std::time::{Duration, Instant};

use sluice_core::Algorithm;

use super::StoreFactory;
use super::harness::*;
use crate::Denial;

/// `user:5/h` (fixed window: `5/10y`): remaining 4, 3, 2, 1, 0, then a denial whose
/// `retry_after` and `reset_after` are what the algorithm promises, counted from the first hit.
pub async fn exact_numbers<F: StoreFactory>(factory: &F) {
    let ns = Namespace::new("exact_numbers");
    let policies = Algorithm::ALL.map(|algorithm| {
        let rule = format!("user:5/{}", long_span(algorithm));
        ns.policy(algorithm.name(), &rule).algorithm(algorithm)
    });
    let l = limiter(factory, policies);
    let gcra_interval = 12 * MINUTE;
    let sub_window = HOUR / sluice_core::algorithm::DEFAULT_WINDOWS;
    for algorithm in Algorithm::ALL {
        let name = algorithm.name();
        let started = Instant::now();
        let mut first_reset = Duration::ZERO;
        for (i, remaining) in (0..5).rev().enumerate() {
            let d = check(&l, name, ALICE, 1).await.decision;
            let what = format!("{name}: hit {}", i + 1);
            assert!(d.allowed(), "{what} denied: {d:?}");
            assert_eq!((d.retry_after(), d.denial), (None, None), "{what}");
            assert_eq!((d.limit, d.remaining, d.leaf), (5, remaining, 0), "{what}");
            let reset = d.reset_after;
            match algorithm {
                Algorithm::Gcra => {
                    let debt = gcra_interval * (i as u32 + 1);
                    assert_counts_down(format!("{what}: reset_after"), reset, debt, started);
                }
                Algorithm::SlidingLog => assert_eq!(reset, HOUR, "{what}: reset_after"),
                Algorithm::SlidingWindow => {
                    let low = HOUR - sub_window;
                    assert_between(format!("{what}: reset_after"), reset, low, HOUR, started);
                }
                _ => {
                    if i == 0 {
                        first_reset = reset;
                        assert!(!reset.is_zero(), "{what}: reset_after is zero");
                    }
                    // The window ends at one instant: the time left only shrinks.
                    let what = format!("{what}: reset_after");
                    assert_counts_down(what, reset, first_reset, started);
                }
            }
        }
        let d = check(&l, name, ALICE, 1).await.decision;
        let what = format!("{name}: the sixth hit");
        assert!(!d.allowed(), "{what} was admitted: {d:?}");
        assert!(matches!(d.denial, Some(Denial::Limited { .. })), "{what}");
        assert_eq!((d.limit, d.remaining, d.leaf), (5, 0, 0), "{what}");
        let (retry, reset) = (d.retry_after(), d.reset_after);
        match algorithm {
            Algorithm::Gcra => {
                assert_retry(
                    format!("{what}: retry_after"),
                    retry,
                    gcra_interval,
                    started,
                );
                assert_counts_down(format!("{what}: reset_after"), reset, HOUR, started);
            }
            Algorithm::SlidingLog => {
                // The first hit leaves the log an hour after it was made.
                assert_retry(format!("{what}: retry_after"), retry, HOUR, started);
                assert_counts_down(format!("{what}: reset_after"), reset, HOUR, started);
            }
            Algorithm::SlidingWindow => {
                let retry = retry.unwrap_or_else(|| panic!("{what}: no retry_after"));
                let low = HOUR - sub_window;
                assert_between(format!("{what}: retry_after"), retry, low, HOUR, started);
                assert_between(format!("{what}: reset_after"), reset, low, HOUR, started);
            }
            _ => {
                assert_eq!(retry, Some(reset), "{what}: retry at the window's end");
                assert_counts_down(format!("{what}: reset_after"), reset, first_reset, started);
            }
        }
        // Counters are per user.
        let d = check(&l, name, BOB, 1).await.decision;
        assert_eq!((d.allowed(), d.remaining), (true, 4), "{name}: bob");
    }
}

/// 64 tasks race on one `user:100/h` (and on a global `100/h`) for every algorithm:
/// exactly 100 pass, every other attempt is `Limited`.
pub async fn exact_under_concurrency_each_algorithm<F: StoreFactory>(factory: &F) {
    let ns = Namespace::new("exact_under_concurrency");
    let mut policies = Vec::new();
    for algorithm in Algorithm::ALL {
        let span = long_span(algorithm);
        let user = format!("user-{algorithm}");
        policies.push(
            ns.policy(&user, &format!("user:100/{span}"))
                .algorithm(algorithm),
        );
        let global = format!("100/{span} algorithm={algorithm}");
        policies.push(ns.policy(&format!("global-{algorithm}"), &global));
    }
    let l = limiter(factory, policies);
    for algorithm in Algorithm::ALL {
        for (name, selectors) in [
            (format!("user-{algorithm}"), ALICE),
            (format!("global-{algorithm}"), &[][..]),
        ] {
            let attempt = match selectors {
                [(n, v)] => Attempt::new(1).with(n, *v),
                _ => Attempt::new(1),
            };
            let outcomes = hammer(from_ref(&l), &name, TASKS, 5, |_| attempt.clone()).await;
            assert_eq!(total(&outcomes), 100, "{name}: admitted of 320");
            let limited = count(&outcomes, |c| {
                matches!(c.decision.denial, Some(Denial::Limited { .. }))
            });
            assert_eq!(limited, 220, "{name}: denied as Limited");
            let after = peek(&l, &name, selectors, 1).await.decision;
            assert!(
                matches!(after.denial, Some(Denial::Limited { .. })),
                "{name}: after the race"
            );
        }
    }
}

/// Compound rules under 64 tasks: `or` holds the shared global leaf and each user's leaf to
/// the unit; `and` admits exactly until every child is reached.
pub async fn exact_compound_rules<F: StoreFactory>(factory: &F) {
    let ns = Namespace::new("exact_compound_rules");
    let global_decides = [
        "or(user:100/h, 150/h)",
        "or(user:100/h algorithm=sliding-log, 150/10y algorithm=fixed-window)",
        "user:100/h algorithm=sliding-window; 150/h",
    ];
    let mut policies: Vec<_> = (global_decides.iter().enumerate())
        .map(|(i, rule)| ns.policy(&format!("or-{i}"), rule))
        .collect();
    policies.push(ns.policy("or-users", "or(user:100/h, 1000/h)"));
    let one_key = [
        "and(apikey:100/h, 150/h)",
        "and(apikey:100/h algorithm=sliding-log, 150/10y algorithm=fixed-window)",
    ];
    for (i, rule) in one_key.iter().enumerate() {
        policies.push(ns.policy(&format!("and-{i}"), rule));
    }
    policies.push(ns.policy("and-keys", "and(apikey:100/h, 150/h)"));
    let l = limiter(factory, policies);
    let four_users = |t: usize| Attempt::new(1).with("user", format!("user-{}", t % 4));

    for (i, rule) in global_decides.iter().enumerate() {
        // Four users, 160 attempts each: each could pass its own 100, so the global leaf must
        // stop them, at exactly 150.
        let name = format!("or-{i}");
        let outcomes = hammer(from_ref(&l), &name, TASKS, 10, four_users).await;
        assert_eq!(total(&outcomes), 150, "{rule}: admitted");
        for user in 0..4 {
            let user = format!("user-{user}");
            let mine = admitted(&outcomes, |a| a.value("user") == Some(&user));
            assert!(mine <= 100, "{rule}: {user} admitted {mine}");
        }
        let newcomer = peek(&l, &name, &[("user", "newcomer")], 1).await.decision;
        assert!(!newcomer.allowed(), "{rule}: the global leaf is spent");
        assert_eq!(newcomer.leaf, 1, "{rule}: the global leaf decides");
    }

    let outcomes = hammer(from_ref(&l), "or-users", TASKS, 10, four_users).await;
    for user in 0..4 {
        let user = format!("user-{user}");
        let mine = admitted(&outcomes, |a| a.value("user") == Some(&user));
        assert_eq!(mine, 100, "or(user:100/h, 1000/h): {user}");
    }

    for (i, rule) in one_key.iter().enumerate() {
        let one = |_| Attempt::new(1).with("apikey", "k");
        let outcomes = hammer(from_ref(&l), &format!("and-{i}"), TASKS, 5, one).await;
        assert_eq!(total(&outcomes), 150, "{rule}: one key, admitted");
    }

    // Four keys: each passes its own 100 whatever the global leaf says, and beyond that only
    // while the global leaf is below 150.
    let four_keys = |t: usize| Attempt::new(1).with("apikey", format!("k{}", t % 4));
    let outcomes = hammer(from_ref(&l), "and-keys", TASKS, 10, four_keys).await;
    let mut beyond = 0;
    for key in 0..4 {
        let key = format!("k{key}");
        let mine = admitted(&outcomes, |a| a.value("apikey") == Some(&key));
        assert!(
            (100..=160).contains(&mine),
            "and, four keys: {key} admitted {mine}"
        );
        beyond += mine - 100;
    }
    assert!(
        beyond <= 150,
        "and, four keys: {beyond} admitted past the keys' own limits"
    );
}

/// Costs of 5 on `user:100/h`, for every algorithm: in sequence the numbers step by 5 and a
/// hit that does not fit records nothing; under 64 tasks exactly 20 hits (100 units) pass;
/// mixed costs 3 and 7 leave at most 2 units unused.
pub async fn costs_above_one<F: StoreFactory>(factory: &F) {
    let ns = Namespace::new("costs_above_one");
    let policies = Algorithm::ALL.map(|algorithm| {
        let rule = format!("user:100/{}", long_span(algorithm));
        ns.policy(algorithm.name(), &rule).algorithm(algorithm)
    });
    let l = limiter(factory, policies);
    for algorithm in Algorithm::ALL {
        let name = algorithm.name();
        let seq: &[(&str, &str)] = &[("user", "sequence")];
        for hit in 1..=19 {
            let d = check(&l, name, seq, 5).await.decision;
            assert_eq!(
                (d.allowed(), d.remaining),
                (true, 100 - 5 * hit),
                "{name}: hit {hit}"
            );
        }
        let d = check(&l, name, seq, 10).await.decision;
        assert!(
            matches!(d.denial, Some(Denial::Limited { .. })),
            "{name}: 10 units with 5 left"
        );
        assert_eq!(
            (d.allowed(), d.remaining),
            (false, 5),
            "{name}: 10 units with 5 left"
        );
        let d = check(&l, name, seq, 5).await.decision;
        assert_eq!(
            (d.allowed(), d.remaining),
            (true, 0),
            "{name}: the last 5 units"
        );
        let d = check(&l, name, seq, 1).await.decision;
        assert!(
            matches!(d.denial, Some(Denial::Limited { .. })),
            "{name}: one unit more"
        );

        let fives = |_| Attempt::new(5).with("user", "fives");
        let outcomes = hammer(from_ref(&l), name, TASKS, 5, fives).await;
        assert_eq!(total(&outcomes), 100, "{name}: cost 5, units admitted");
        let hits = count(&outcomes, |c| c.decision.allowed());
        assert_eq!(hits, 20, "{name}: cost 5, hits admitted");

        // 160 hits of cost 3 cannot all pass; once one is denied, fewer than 3 units are left.
        let mixed = |t: usize| Attempt::new(if t % 2 == 0 { 3 } else { 7 }).with("user", "mixed");
        let outcomes = hammer(from_ref(&l), name, TASKS, 5, mixed).await;
        let units = total(&outcomes);
        assert!(
            (98..=100).contains(&units),
            "{name}: costs 3 and 7, {units} admitted"
        );
    }
}
