//! What one request asks of the store: a peek or a cost of 0 records nothing, a cost above
//! capacity can never pass, a reset pardons exactly the keys it names, and any selector
//! value names a counter of its own.

use sluice_core::Algorithm;

use super::StoreFactory;
use super::harness::*;
use crate::identifier::push_hashed;
use crate::{Denial, Selectors};

/// For every algorithm on `user:5/h`: peeks and checks of cost 0 answer the numbers of the
/// moment and record nothing, before, during and after the hits that spend the limit.
pub async fn peek_and_cost_zero_record_nothing<F: StoreFactory>(factory: &F) {
    let ns = Namespace::new("peek_and_cost_zero");
    let policies = Algorithm::ALL.map(|algorithm| {
        let rule = format!("user:5/{}", long_span(algorithm));
        ns.policy(algorithm.name(), &rule).algorithm(algorithm)
    });
    let l = limiter(factory, policies);
    for algorithm in Algorithm::ALL {
        let name = algorithm.name();
        for _ in 0..10 {
            let peeked = peek(&l, name, ALICE, 1).await;
            let d = &peeked.decision;
            assert!(
                d.allowed() && !peeked.cached,
                "{name}: peek on a fresh key: {d:?}"
            );
            assert_eq!(d.remaining, 4, "{name}: peek on a fresh key");
            let free = check(&l, name, ALICE, 0).await.decision;
            assert!(free.allowed(), "{name}: cost 0 on a fresh key: {free:?}");
            assert_eq!(free.remaining, 5, "{name}: cost 0 on a fresh key");
            let big = peek(&l, name, ALICE, 5).await.decision;
            assert_eq!(
                (big.allowed(), big.remaining),
                (true, 0),
                "{name}: peek of 5"
            );
        }
        for remaining in (0..5).rev() {
            let d = check(&l, name, ALICE, 1).await.decision;
            let what = format!("{name}: hit leaving {remaining}");
            assert_eq!((d.allowed(), d.remaining), (true, remaining), "{what}");
            for _ in 0..3 {
                let free = check(&l, name, ALICE, 0).await.decision;
                assert_eq!(
                    (free.allowed(), free.remaining),
                    (true, remaining),
                    "{what}: cost 0"
                );
                let peeked = peek(&l, name, ALICE, 1).await.decision;
                assert_eq!(peeked.allowed(), remaining > 0, "{what}: peek");
                let left = remaining.saturating_sub(1);
                assert_eq!(peeked.remaining, left, "{what}: peek");
            }
        }
        let peeked = peek(&l, name, ALICE, 1).await.decision;
        assert!(
            matches!(peeked.denial, Some(Denial::Limited { .. })),
            "{name}: peek when spent"
        );
        assert!(
            peeked.retry_after().is_some(),
            "{name}: peek when spent: {peeked:?}"
        );
        // Peeks of the spent key did not touch Bob, nor did Alice's hits.
        let d = check(&l, name, BOB, 1).await.decision;
        assert_eq!((d.allowed(), d.remaining), (true, 4), "{name}: bob");
    }
}

/// A cost above what a leaf can ever admit is denied as `CostExceedsCapacity`, with no
/// `retry_after`, records nothing (not even for count-denied policies) and strikes no
/// penalty: the whole capacity still passes in one hit afterwards.
pub async fn cost_above_capacity_is_never<F: StoreFactory>(factory: &F) {
    let ns = Namespace::new("cost_above_capacity");
    let penalty = crate::Penalty::new(10 * MINUTE, 2, HOUR, HOUR).expect("a valid penalty");
    let mut cases = Vec::new();
    for algorithm in Algorithm::ALL {
        cases.push((format!("user:5/{}", long_span(algorithm)), algorithm, 5));
    }
    cases.push(("user:5/h burst=10".to_owned(), Algorithm::Gcra, 10));
    let mut policies = Vec::new();
    for (i, (rule, algorithm, _)) in cases.iter().enumerate() {
        let p = |flavour: &str| {
            ns.policy(&format!("{flavour}-{i}"), rule)
                .algorithm(*algorithm)
        };
        policies.push(p("plain"));
        policies.push(p("strict").count_denied(true));
        policies.push(p("boxed").penalty(penalty));
    }
    let l = limiter(factory, policies);
    for (i, (rule, algorithm, capacity)) in cases.iter().enumerate() {
        for flavour in ["plain", "strict", "boxed"] {
            let name = format!("{flavour}-{i}");
            let what = format!("{flavour} {rule} {algorithm}");
            let peeked = peek(&l, &name, ALICE, capacity + 1).await.decision;
            assert_eq!(
                peeked.denial,
                Some(Denial::CostExceedsCapacity),
                "{what}: peek"
            );
            for attempt in 1..=3 {
                let d = check(&l, &name, ALICE, capacity + 1).await.decision;
                let what = format!("{what}: attempt {attempt} of cost {}", capacity + 1);
                assert!(!d.allowed(), "{what} was admitted");
                assert_eq!(d.denial, Some(Denial::CostExceedsCapacity), "{what}");
                assert_eq!(d.retry_after(), None, "{what}");
                assert_eq!((d.limit, d.remaining), (*capacity, *capacity), "{what}");
            }
            // Nothing was spent and no penalty struck: the whole capacity passes at once.
            let d = check(&l, &name, ALICE, *capacity).await.decision;
            assert_eq!(
                (d.allowed(), d.remaining),
                (true, 0),
                "{what}: the full capacity"
            );
            let d = check(&l, &name, ALICE, 1).await.decision;
            assert!(!d.allowed(), "{what}: one more after the full capacity");
        }
    }
}

/// `user:5/h; 8/h` for every algorithm: a reset of one user, made through another limiter
/// (another app server), clears that user's leaf and nothing else; a reset with no
/// selectors clears the global leaf only; other keys are untouched.
pub async fn reset_pardons_one_key_only<F: StoreFactory>(factory: &F) {
    let ns = Namespace::new("reset_pardons_one_key_only");
    let mut policies = Vec::new();
    for algorithm in Algorithm::ALL {
        let span = long_span(algorithm);
        let rule = format!("user:5/{span}; 8/{span}");
        policies.push(ns.policy(algorithm.name(), &rule).algorithm(algorithm));
        let other = format!("other-{algorithm}");
        let rule = format!("user:5/{span}");
        policies.push(ns.policy(&other, &rule).algorithm(algorithm));
    }
    let here = limiter(factory, policies.clone());
    let elsewhere = limiter(factory, policies);
    for algorithm in Algorithm::ALL {
        let (name, other) = (algorithm.name(), format!("other-{algorithm}"));
        for i in 0..2 {
            let d = check(&here, name, BOB, 1).await.decision;
            assert_eq!(
                (d.allowed(), d.remaining, d.leaf),
                (true, 4 - i, 0),
                "{name}: bob"
            );
        }
        admit(&here, name, ALICE, 5).await;
        admit(&here, &other, ALICE, 5).await;
        let d = check(&here, name, ALICE, 1).await.decision;
        assert_eq!(
            (d.allowed(), d.leaf),
            (false, 0),
            "{name}: alice spent her own 5"
        );

        reset(&elsewhere, name, ALICE).await;
        // Alice's leaf is fresh; the global leaf (7 of 8 used) is not.
        let d = check(&here, name, ALICE, 1).await.decision;
        let what = format!("{name}: alice after her reset");
        assert_eq!((d.allowed(), d.remaining, d.leaf), (true, 0, 1), "{what}");
        let d = check(&here, name, ALICE, 1).await.decision;
        assert_eq!((d.allowed(), d.leaf), (false, 1), "{what}: the global leaf");
        let d = check(&here, &other, ALICE, 1).await.decision;
        assert!(!d.allowed(), "{name}: the reset reached another key: {d:?}");

        // No selectors: the global leaf only. Bob keeps his 2 hits, Alice her 1.
        reset(&elsewhere, name, &[]).await;
        let d = check(&here, name, BOB, 1).await.decision;
        let what = format!("{name}: after the global reset");
        assert_eq!(
            (d.allowed(), d.remaining, d.leaf),
            (true, 2, 0),
            "{what}: bob"
        );
        let d = check(&here, name, ALICE, 1).await.decision;
        assert_eq!(
            (d.allowed(), d.remaining, d.leaf),
            (true, 3, 0),
            "{what}: alice"
        );
    }
}

/// Selector values that mean something in identifiers, keys or hash tags (`a:b`, `{tag}`,
/// `+`, `#`, empty, whitespace, 300 characters, unicode) work, and no two share a counter.
pub async fn special_selector_values<F: StoreFactory>(factory: &F) {
    let ns = Namespace::new("special_selector_values");
    let mut hashed = String::new();
    push_hashed(&mut hashed, "a:b");
    let long = "x".repeat(300);
    let long_too = format!("{}y", "x".repeat(299));
    let long_prefix = format!("{}z", "x".repeat(300));
    let values = [
        "a:b",
        "a",
        "b",
        "a:",
        ":b",
        ":",
        "{tag}",
        "{tag}x",
        "x{tag}",
        "tag",
        "{",
        "}",
        "{}",
        "",
        " ",
        "\t",
        "a+b",
        "+",
        "a b",
        "a\nb",
        "#",
        "*",
        "ünï",
        "日本語",
        "🦀",
        "a\u{0}b",
        &long,
        &long_too,
        &long_prefix,
        &hashed,
    ];
    let pairs = [
        ("a", "b"),
        ("a:b", ""),
        ("a", "b:"),
        ("a+b", ""),
        ("a", "+b"),
        ("", "a+b"),
        ("{t}", "{t}"),
        ("{t", "}{t}"),
    ];
    let mut requests: Vec<(&str, Vec<(&str, &str)>)> = Vec::new();
    requests.extend(values.iter().map(|&v| ("one", vec![("user", v)])));
    requests.extend(values.iter().map(|&v| ("log", vec![("user", v)])));
    let two = pairs
        .iter()
        .map(|&(ip, user)| ("two", vec![("ip", ip), ("user", user)]));
    requests.extend(two);
    let policies = [
        ns.policy("one", "user:1/h"),
        ns.policy("log", "user:1/h")
            .algorithm(Algorithm::SlidingLog),
        ns.policy("two", "ip+user:1/h"),
    ];
    let l = limiter(factory, policies);
    // Every request names its own counter: all pass once, then all are denied.
    for (name, selectors) in &requests {
        let selectors: &Selectors = selectors;
        let d = check(&l, name, selectors, 1).await.decision;
        assert!(d.allowed(), "{name} {selectors:?} shares a counter: {d:?}");
        assert_eq!(d.remaining, 0, "{name} {selectors:?}");
    }
    for (name, selectors) in &requests {
        let selectors: &Selectors = selectors;
        let d = check(&l, name, selectors, 1).await.decision;
        assert!(
            matches!(d.denial, Some(Denial::Limited { .. })),
            "{name} {selectors:?} lost its counter"
        );
    }
    for (name, selectors) in &requests {
        reset(&l, name, selectors).await;
        let d = check(&l, name, selectors, 1).await.decision;
        assert!(
            d.allowed(),
            "{name} {selectors:?}: reset missed its counter: {d:?}"
        );
    }
}
