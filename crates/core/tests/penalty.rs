//! Penalties: timeouts of `base * factor^(strikes-1)` capped at `max`, strikes forgotten after a
//! quiet period, and how `evaluate` applies them. Time is a manual clock.

use std::time::Duration;

use proptest::prelude::*;
use proptest::sample::select;
use sluice_core::algorithm::Quota;
use sluice_core::penalty::PenaltyError;
use sluice_core::{
    Algorithm, Decision, Denial, Evaluation, Leaf, Outcome, Penalty, PenaltyState, Rate, Recording,
    Shape, Span, State, Unit, evaluate,
};

const SEC: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

/// `factor^(strikes-1) * base`, capped at `max`, in wide arithmetic.
fn expected_timeout(p: &Penalty, strikes: u32) -> u64 {
    let growth = u128::from(p.factor())
        .checked_pow(strikes - 1)
        .unwrap_or(u128::MAX);
    growth
        .saturating_mul(p.base().as_nanos())
        .min(p.max().as_nanos()) as u64
}

fn quota(alg: Algorithm, count: u64, secs: u64) -> Quota {
    let mut leaf = Leaf::new(Rate::new(count, Span::new(secs, Unit::Second).unwrap()).unwrap());
    leaf.options.algorithm = Some(alg);
    Quota::from_leaf(&leaf, Algorithm::Gcra).unwrap()
}

/// One hit on a single-leaf rule.
struct Key<'a> {
    quotas: [Quota; 1],
    penalty: Option<&'a Penalty>,
    states: Vec<State>,
    record: PenaltyState,
}

impl<'a> Key<'a> {
    fn new(quota: Quota, penalty: Option<&'a Penalty>) -> Key<'a> {
        let states = vec![quota.fresh_state()];
        let record = PenaltyState::default();
        Key {
            quotas: [quota],
            penalty,
            states,
            record,
        }
    }

    fn hit(&mut self, now: u64, cost: u64, recording: Recording) -> Outcome {
        let shape = Shape::Leaf(0);
        let evaluation = Evaluation {
            shape: &shape,
            quotas: &self.quotas,
            cost,
            recording,
            penalty: self.penalty,
        };
        evaluate(&evaluation, &mut self.states, Some(&mut self.record), now)
    }
}

#[test]
fn invalid_penalties_are_rejected() {
    let ten_years = secs(10 * 365 * 86_400);
    let cases = [
        (
            Duration::ZERO,
            2,
            secs(10),
            secs(60),
            PenaltyError::ZeroBase,
        ),
        (secs(1), 0, secs(10), secs(60), PenaltyError::ZeroFactor),
        (secs(10), 2, secs(5), secs(60), PenaltyError::MaxBelowBase),
        (
            secs(1),
            2,
            secs(10),
            Duration::ZERO,
            PenaltyError::ZeroForget,
        ),
        (
            secs(1),
            2,
            ten_years + secs(1),
            secs(60),
            PenaltyError::TooLong,
        ),
        (
            secs(1),
            2,
            secs(10),
            ten_years + secs(1),
            PenaltyError::TooLong,
        ),
    ];
    for (base, factor, max, forget, error) in cases {
        assert_eq!(Penalty::new(base, factor, max, forget), Err(error));
    }
    let p = Penalty::new(secs(1), 1, ten_years, ten_years).unwrap();
    assert_eq!(
        (p.base(), p.factor(), p.max(), p.forget_after()),
        (secs(1), 1, ten_years, ten_years)
    );
}

#[test]
fn timeouts_double_up_to_the_cap_and_heal() {
    let p = Penalty::new(secs(1), 2, secs(60), secs(3_600)).unwrap();
    let mut state = PenaltyState::default();
    let mut now = 100 * SEC;
    for expected in [1, 2, 4, 8, 16, 32, 60, 60] {
        assert_eq!(p.strike(&mut state, now), expected * SEC);
        assert_eq!(p.remaining(&state, now), Some(expected * SEC));
        assert_eq!(p.remaining(&state, now + expected * SEC - 1), Some(1));
        assert_eq!(p.remaining(&state, now + expected * SEC), None);
        now += expected * SEC + 5 * SEC;
    }
    // One nanosecond short of the quiet period the strikes still count; after it they are gone.
    let last = state.last_strike;
    assert_eq!(p.expires_at(&state), last + 3_600 * SEC);
    assert_eq!(
        p.strike(&mut state.clone(), last + 3_600 * SEC - 1),
        60 * SEC
    );
    assert_eq!(p.strike(&mut state, last + 3_600 * SEC), SEC);
    assert_eq!(state.strikes, 1);
    assert_eq!(p.expires_at(&PenaltyState::default()), 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn strikes_follow_the_formula(
        base_ms in 1..=10_000u64,
        factor in 1..=4u32,
        cap in 1..=1_000u64,
        forget_ms in 1..=100_000u64,
        gaps in prop::collection::vec((any::<bool>(), 0..=1_000u64), 1..=60),
    ) {
        let p = Penalty::new(
            Duration::from_millis(base_ms), factor,
            Duration::from_millis(base_ms * cap), Duration::from_millis(forget_ms),
        ).unwrap();
        let forget = forget_ms * MS;
        let (mut state, mut now, mut strikes) = (PenaltyState::default(), 1_000 * SEC, 0);
        for (quiet, permille) in gaps {
            // Either within the quiet period or past it, by a random share of it.
            let gap = if quiet { forget + forget * permille / 1_000 } else { forget * permille / 1_001 };
            now += gap;
            strikes = if quiet { 1 } else { strikes + 1 };
            let timeout = p.strike(&mut state, now);
            prop_assert_eq!(timeout, expected_timeout(&p, strikes));
            prop_assert_eq!(state, PenaltyState { strikes, until: now + timeout, last_strike: now });
            prop_assert_eq!(p.expires_at(&state), (now + timeout).max(now + forget));
        }
    }

    /// With a penalty, a key behaves as without one except that a limited hit (not a peek)
    /// strikes, and a boxed key is denied without touching its counters.
    #[test]
    fn evaluate_applies_penalties(
        alg in select(Algorithm::ALL.to_vec()),
        (count, span) in (1..=5u64, 1..=5u64),
        (base_ms, factor, cap) in (1..=3_000u64, 1..=3u32, 1..=20u64),
        trace in prop::collection::vec((
            prop_oneof![Just(0u64), 0..SEC / 2, 0..5 * SEC],
            0..=3u64,
            select(vec![Recording::Admitted, Recording::Always, Recording::Never]),
        ), 1..=100),
    ) {
        let p = Penalty::new(
            Duration::from_millis(base_ms), factor,
            Duration::from_millis(base_ms * cap), secs(30),
        ).unwrap();
        let mut key = Key::new(quota(alg, count, span), Some(&p));
        let mut plain = Key::new(quota(alg, count, span), None);
        let (mut now, mut strikes) = (0, 0);
        for (gap, cost, recording) in trace {
            now += gap;
            let before = key.record;
            let counters = key.states.clone();
            plain.states = counters.clone();
            let expected = plain.hit(now, cost, recording);
            let Outcome { decision, changed } = key.hit(now, cost, recording);
            if let Some(wait) = p.remaining(&before, now) {
                prop_assert!(!decision.allowed() && matches!(decision.denial, Some(Denial::Penalized { .. })), "{:?}", decision);
                prop_assert_eq!(decision.retry_after(), Some(Duration::from_nanos(wait)));
                prop_assert!(!changed && key.record == before);
                prop_assert_eq!(&key.states, &counters);
                continue;
            }
            prop_assert_eq!(&key.states, &plain.states);
            let strike = matches!(expected.decision.denial, Some(Denial::Limited { .. })) && recording != Recording::Never;
            if !strike {
                prop_assert_eq!((&decision, changed, key.record), (&expected.decision, expected.changed, before));
                continue;
            }
            strikes = if before.strikes > 0 && now - before.last_strike >= 30 * SEC { 1 } else { strikes + 1 };
            let timeout = expected_timeout(&p, strikes);
            prop_assert_eq!(key.record, PenaltyState { strikes, until: now + timeout, last_strike: now });
            prop_assert!(changed && !decision.allowed());
            let rule_wait = nanos(expected.decision.retry_after().unwrap());
            let wait = Duration::from_nanos(rule_wait.max(timeout));
            let denial = if timeout > rule_wait { Denial::Penalized { retry_after: wait } } else { Denial::Limited { retry_after: wait } };
            prop_assert_eq!(decision.denial, Some(denial));
            prop_assert_eq!(decision.retry_after(), Some(Duration::from_nanos(rule_wait.max(timeout))));
            prop_assert!(decision.reset_after >= Duration::from_nanos(timeout));
        }
    }
}

#[test]
fn a_boxed_key_waits_out_its_timeout() {
    let p = Penalty::new(secs(10), 2, secs(60), secs(3_600)).unwrap();
    let mut key = Key::new(quota(Algorithm::SlidingLog, 2, 1), Some(&p));
    let t0 = 50 * SEC;
    for _ in 0..2 {
        assert!(key.hit(t0, 1, Recording::Admitted).decision.allowed());
    }
    // A peek sees the limit but never strikes.
    let peek = key.hit(t0, 1, Recording::Never);
    assert!(matches!(peek.decision.denial, Some(Denial::Limited { .. })));
    assert!(!peek.changed);
    assert_eq!(key.record, PenaltyState::default());
    // The rule would admit again after 1 s; the box lasts 10 s.
    let counters = key.states.clone();
    let Outcome { decision, changed } = key.hit(t0, 1, Recording::Admitted);
    assert!(matches!(decision.denial, Some(Denial::Penalized { .. })));
    assert_eq!(decision.retry_after(), Some(secs(10)));
    assert!(changed && key.states == counters);
    assert_eq!(
        key.record,
        PenaltyState {
            strikes: 1,
            until: t0 + 10 * SEC,
            last_strike: t0
        }
    );
    // Boxed: denied without recording, whatever the rule would say.
    for now in [t0 + SEC, t0 + 10 * SEC - 1] {
        let Outcome { decision, changed } = key.hit(now, 1, Recording::Always);
        assert!(matches!(decision.denial, Some(Denial::Penalized { .. })));
        assert_eq!(
            decision.retry_after(),
            Some(Duration::from_nanos(t0 + 10 * SEC - now))
        );
        assert!(!changed && key.states == counters);
    }
    assert_eq!(key.record.strikes, 1);
    // Out of the box: admitted again; the next abuse doubles the timeout.
    let t1 = t0 + 10 * SEC;
    for _ in 0..2 {
        assert!(key.hit(t1, 1, Recording::Admitted).decision.allowed());
    }
    let decision: Decision = key.hit(t1, 1, Recording::Admitted).decision;
    assert_eq!(decision.retry_after(), Some(secs(20)));
    assert_eq!(key.record.strikes, 2);
}

#[test]
fn a_short_penalty_keeps_the_rules_retry_and_oversized_costs_do_not_strike() {
    let p = Penalty::new(Duration::from_millis(100), 2, secs(1), secs(60)).unwrap();
    let mut key = Key::new(quota(Algorithm::FixedWindow, 2, 10), Some(&p));
    let t0 = 20 * SEC;
    let oversized = key.hit(t0, 3, Recording::Admitted);
    assert_eq!(oversized.decision.denial, Some(Denial::CostExceedsCapacity));
    assert_eq!(key.record, PenaltyState::default());
    key.hit(t0, 2, Recording::Admitted);
    let decision = key.hit(t0 + SEC, 1, Recording::Always).decision;
    assert!(matches!(decision.denial, Some(Denial::Limited { .. })));
    assert_eq!(decision.retry_after(), Some(secs(9)));
    assert_eq!(key.record.until, t0 + SEC + 100 * MS);
    assert_eq!(
        key.states[0],
        State::FixedWindow {
            window: 2,
            count: 3
        }
    );
}
