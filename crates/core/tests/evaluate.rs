//! `evaluate` over rule trees, checked against a plain reading of DESIGN.md §2: a leaf is
//! reached when its verdict denies the hit; `or` is reached when any child is, `and` when every
//! child is; an admitted hit is recorded in every leaf, a denied one in none unless the policy
//! counts denied attempts. Time is a manual clock.

use std::time::Duration;

use proptest::prelude::*;
use proptest::sample::select;
use sluice_core::algorithm::Quota;
use sluice_core::{
    Algorithm, Denial, Evaluation, Leaf, Outcome, Rate, Recording, Shape, Span, State, Unit,
    evaluate,
};

const SEC: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

fn quota(alg: Algorithm, count: u64, span: Span) -> Quota {
    let mut leaf = Leaf::new(Rate::new(count, span).unwrap());
    leaf.options.algorithm = Some(alg);
    Quota::from_leaf(&leaf, Algorithm::Gcra).unwrap()
}

fn per_second(alg: Algorithm, count: u64, secs: u64) -> Quota {
    quota(alg, count, Span::new(secs, Unit::Second).unwrap())
}

fn count_leaves(shape: &Shape) -> usize {
    match shape {
        Shape::Leaf(_) => 1,
        Shape::Or(children) | Shape::And(children) => children.iter().map(count_leaves).sum(),
    }
}

/// Numbers the leaves left to right, as `Rule::shape` does.
fn number(shape: Shape, next: &mut usize) -> Shape {
    let all = |children: Vec<Shape>, next: &mut usize| -> Vec<Shape> {
        children.into_iter().map(|c| number(c, next)).collect()
    };
    match shape {
        Shape::Leaf(_) => {
            *next += 1;
            Shape::Leaf(*next - 1)
        }
        Shape::Or(children) => Shape::Or(all(children, next)),
        Shape::And(children) => Shape::And(all(children, next)),
    }
}

/// Trees of 1 to 4 leaves, at most 3 deep, each leaf with its own small quota.
fn tree() -> impl Strategy<Value = (Shape, Vec<Quota>)> {
    let shape = Just(Shape::Leaf(0))
        .prop_recursive(2, 4, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 1..=3).prop_map(Shape::Or),
                prop::collection::vec(inner, 1..=3).prop_map(Shape::And),
            ]
        })
        .prop_filter("1 to 4 leaves", |s| count_leaves(s) <= 4)
        .prop_map(|s| number(s, &mut 0));
    shape.prop_flat_map(|shape| {
        let leaf = (select(Algorithm::ALL.to_vec()), 1..=5u64, 1..=5u64)
            .prop_map(|(alg, count, secs)| per_second(alg, count, secs));
        let n = count_leaves(&shape);
        (Just(shape), prop::collection::vec(leaf, n))
    })
}

fn hits() -> impl Strategy<Value = Vec<(u64, u64, Recording)>> {
    let gap = prop_oneof![Just(0u64), 1..SEC / 5, 0..2 * SEC];
    let recording = select(vec![
        Recording::Admitted,
        Recording::Admitted,
        Recording::Always,
        Recording::Never,
    ]);
    prop::collection::vec((gap, 0..=3u64, recording), 1..=100)
}

/// The reference semantics: whether the tree is reached when `leaf(i)` says leaf `i` is.
fn reached(shape: &Shape, leaf: &dyn Fn(usize) -> bool) -> bool {
    match shape {
        Shape::Leaf(i) => leaf(*i),
        Shape::Or(children) => children.iter().any(|c| reached(c, leaf)),
        Shape::And(children) => children.iter().all(|c| reached(c, leaf)),
    }
}

/// Cost-1 hits left before the tree is reached: the tightest child of an `or`, the loosest of
/// an `and`.
fn remaining(shape: &Shape, leaf: &dyn Fn(usize) -> u64) -> u64 {
    let children = |c: &[Shape]| c.iter().map(|c| remaining(c, leaf)).collect::<Vec<_>>();
    match shape {
        Shape::Leaf(i) => leaf(*i),
        Shape::Or(c) => children(c).into_iter().min().unwrap(),
        Shape::And(c) => children(c).into_iter().max().unwrap(),
    }
}

fn check(shape: &Shape, quotas: &[Quota], states: &mut [State], now: u64, cost: u64) -> Outcome {
    let evaluation = Evaluation {
        shape,
        quotas,
        cost,
        recording: Recording::Admitted,
        penalty: None,
    };
    evaluate(&evaluation, states, None, now)
}

/// A peek: the decision `check` would make, changing nothing.
fn peek(shape: &Shape, quotas: &[Quota], states: &[State], now: u64, cost: u64) -> bool {
    let evaluation = Evaluation {
        shape,
        quotas,
        cost,
        recording: Recording::Never,
        penalty: None,
    };
    let mut copy = states.to_vec();
    let outcome = evaluate(&evaluation, &mut copy, None, now);
    assert!(
        !outcome.changed && copy == states,
        "a peek changed the states"
    );
    outcome.decision.allowed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn trees_follow_the_reference_semantics(
        (shape, quotas) in tree(), start in 0..100 * SEC, trace in hits(),
    ) {
        let mut states: Vec<State> = quotas.iter().map(Quota::fresh_state).collect();
        let mut now = start;
        for (gap, cost, recording) in trace {
            now += gap;
            let judge = |states: &[State]| -> Vec<_> {
                quotas.iter().zip(states).map(|(q, s)| q.verdict(s, now, cost)).collect()
            };
            let verdicts = judge(&states);
            let allowed = !reached(&shape, &|i| !verdicts[i].allowed);
            let before = states.clone();
            let evaluation = Evaluation { shape: &shape, quotas: &quotas, cost, recording, penalty: None };
            let Outcome { decision, changed } = evaluate(&evaluation, &mut states, None, now);
            prop_assert_eq!(decision.allowed(), allowed, "{:?} at {}: {:?}", shape, now, verdicts);

            // A hit the tree can never admit is not counted, even by count-denied policies.
            let never = !allowed && reached(&shape, &|i| cost > quotas[i].capacity());
            let record = match recording {
                Recording::Admitted => allowed,
                Recording::Always => !never,
                Recording::Never => false,
            };
            let mut expected = before.clone();
            if record {
                for (q, s) in quotas.iter().zip(&mut expected) {
                    q.record(s, now, cost);
                }
            }
            prop_assert_eq!(&states, &expected);
            prop_assert_eq!(changed, record);
            // A denial reports the states as they are after it (recorded or not).
            let reported = if allowed { verdicts.clone() } else { judge(&states) };
            prop_assert_eq!(decision.remaining, remaining(&shape, &|i| reported[i].remaining));
            prop_assert!(decision.leaf < quotas.len());
            prop_assert_eq!(decision.limit, quotas[decision.leaf].capacity());
            if allowed {
                prop_assert_eq!((decision.retry_after(), decision.denial), (None, None));
                continue;
            }
            let never = reached(&shape, &|i| cost > quotas[i].capacity());
            match decision.retry_after() {
                None => prop_assert!(never && decision.denial == Some(Denial::CostExceedsCapacity)),
                Some(wait) => {
                    prop_assert!(!never && matches!(decision.denial, Some(Denial::Limited { .. })), "{:?}", decision);
                    let d = u64::try_from(wait.as_nanos()).unwrap();
                    prop_assert!(d > 0);
                    prop_assert!(!peek(&shape, &quotas, &states, now + d - 1, cost), "{:?}", decision);
                    prop_assert!(peek(&shape, &quotas, &states, now + d, cost), "{:?}", decision);
                }
            }
        }
    }
}

/// Hits `shape` every `step` from `start` until `end`; returns the admitted times.
fn hammer(shape: &Shape, quotas: &[Quota], start: u64, step: u64, end: u64) -> Vec<u64> {
    let mut states: Vec<State> = quotas.iter().map(Quota::fresh_state).collect();
    (start..end)
        .step_by(step as usize)
        .filter(|&now| check(shape, quotas, &mut states, now, 1).decision.allowed())
        .collect()
}

#[test]
fn or_of_per_second_and_per_minute() {
    // or(10/s, 15/m) with exact sliding logs: 10 in the first second, 5 more once the first
    // second has passed, then nothing until the minute is over.
    let alg = Algorithm::SlidingLog;
    let quotas = [
        per_second(alg, 10, 1),
        quota(alg, 15, Span::new(1, Unit::Minute).unwrap()),
    ];
    let shape = Shape::or_of(2);
    let t0 = 3_600 * SEC;
    let admitted = hammer(&shape, &quotas, t0, 50 * MS, t0 + 61 * SEC);
    let expected: Vec<u64> = (0..10)
        .map(|k| t0 + k * 50 * MS)
        .chain((0..5).map(|k| t0 + SEC + k * 50 * MS))
        .chain((0..10).map(|k| t0 + 60 * SEC + k * 50 * MS))
        .collect();
    assert_eq!(admitted, expected);

    // The per-minute leaf decides, and says exactly when.
    let mut states: Vec<State> = quotas.iter().map(Quota::fresh_state).collect();
    for now in &expected[..15] {
        assert!(
            check(&shape, &quotas, &mut states, *now, 1)
                .decision
                .allowed()
        );
    }
    let decision = check(&shape, &quotas, &mut states, t0 + 2 * SEC, 1).decision;
    assert_eq!(decision.leaf, 1);
    assert!(matches!(decision.denial, Some(Denial::Limited { .. })));
    assert_eq!(decision.retry_after(), Some(Duration::from_secs(58)));
    assert_eq!(decision.remaining, 0);
}

#[test]
fn and_applies_the_per_second_limit_only_after_the_hourly_quota() {
    // and(100/h, 10/s): the first 100 in the hour pass at once; after that, 10 per second.
    let alg = Algorithm::SlidingLog;
    let quotas = [
        quota(alg, 100, Span::new(1, Unit::Hour).unwrap()),
        per_second(alg, 10, 1),
    ];
    let shape = Shape::And(vec![Shape::Leaf(0), Shape::Leaf(1)]);
    let mut states: Vec<State> = quotas.iter().map(Quota::fresh_state).collect();
    let t0 = 7 * SEC;
    for _ in 0..100 {
        assert!(
            check(&shape, &quotas, &mut states, t0, 1)
                .decision
                .allowed()
        );
    }
    let decision = check(&shape, &quotas, &mut states, t0, 1).decision;
    assert!(!decision.allowed());
    // The and clears when its first child does: the per-second leaf, after one second.
    assert_eq!(decision.retry_after(), Some(Duration::from_secs(1)));
    assert!(
        !check(&shape, &quotas, &mut states, t0 + SEC - 1, 1)
            .decision
            .allowed()
    );
    for second in 1..=3 {
        let now = t0 + second * SEC;
        let passed = (0..15)
            .filter(|_| {
                check(&shape, &quotas, &mut states, now, 1)
                    .decision
                    .allowed()
            })
            .count();
        assert_eq!(passed, 10, "second {second}");
    }
    // A cost only the hourly leaf can take waits for the hourly leaf; above both, never.
    let decision = check(&shape, &quotas, &mut states, t0 + 4 * SEC, 11).decision;
    assert!(matches!(decision.denial, Some(Denial::Limited { .. })));
    assert_eq!(decision.retry_after(), Some(Duration::from_secs(3_596)));
    let decision = check(&shape, &quotas, &mut states, t0 + 4 * SEC, 101).decision;
    assert_eq!(decision.denial, Some(Denial::CostExceedsCapacity));
}

#[test]
fn denied_hits_are_recorded_only_when_the_policy_counts_them() {
    let quotas = [per_second(Algorithm::FixedWindow, 2, 10)];
    let shape = Shape::Leaf(0);
    let counted = |count| State::FixedWindow { window: 2, count };
    for (recording, expected) in [
        (Recording::Admitted, counted(2)),
        (Recording::Always, counted(3)),
        (Recording::Never, quotas[0].fresh_state()),
    ] {
        let mut states = vec![quotas[0].fresh_state()];
        let evaluation = Evaluation {
            shape: &shape,
            quotas: &quotas,
            cost: 1,
            recording,
            penalty: None,
        };
        for _ in 0..3 {
            evaluate(&evaluation, &mut states, None, 20 * SEC);
        }
        assert_eq!(states[0], expected, "{recording:?}");
    }
}

#[test]
fn counted_denials_still_tell_a_true_retry_time() {
    // Login protection records denied attempts; a client that waits exactly `retry_after`
    // after each denial must get in, however its attempts were counted.
    for alg in Algorithm::ALL {
        let quotas = [per_second(alg, 2, 2)];
        let shape = Shape::Leaf(0);
        let evaluation = Evaluation {
            shape: &shape,
            quotas: &quotas,
            cost: 1,
            recording: Recording::Always,
            penalty: None,
        };
        let mut states = vec![quotas[0].fresh_state()];
        let now = 10 * SEC + 300 * MS;
        let mut decision = evaluate(&evaluation, &mut states, None, now).decision;
        while decision.allowed() {
            decision = evaluate(&evaluation, &mut states, None, now).decision;
        }
        let wait = u64::try_from(decision.retry_after().unwrap().as_nanos()).unwrap();
        let peek = Evaluation {
            recording: Recording::Never,
            ..evaluation
        };
        let early = evaluate(&peek, &mut states, None, now + wait - 1).decision;
        assert!(!early.allowed(), "{alg}: admitted before {wait} ns");
        let retried = evaluate(&evaluation, &mut states, None, now + wait).decision;
        assert!(
            retried.allowed(),
            "{alg}: still denied after {wait} ns: {retried:?}"
        );
    }
}
