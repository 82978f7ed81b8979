//! Concurrency leaves: the rule language (`user:3 concurrent lease=30s`) and the algorithm's
//! pure steps (acquire, release, renew, expiry).

use std::time::Duration;

use sluice_core::algorithm::concurrency::{self, Leases, Released};
use sluice_core::rule::DEFAULT_LEASE;
use sluice_core::{Algorithm, Decision, Denial, Quota, Retry, Rule, Span, State, Unit, parse_rule};

const S: u64 = 1_000_000_000;

fn quota(text: &str) -> Quota {
    let rule: Rule = text.parse().unwrap();
    Quota::from_leaf(rule.leaves()[0], Algorithm::Gcra).unwrap()
}

#[test]
fn a_concurrency_leaf_parses_and_prints_back() {
    let rule = parse_rule("user:3 concurrent").unwrap();
    let leaf = rule.leaves()[0];
    assert!(leaf.is_concurrency());
    assert_eq!(leaf.rate.count(), 3);
    assert_eq!(leaf.rate.span(), DEFAULT_LEASE);
    assert_eq!(rule.to_string(), "user:3 concurrent");

    let rule = parse_rule("user:3 CONCURRENT lease=30s").unwrap();
    assert_eq!(
        rule.leaves()[0].rate.span(),
        Span::new(30, Unit::Second).unwrap()
    );
    assert_eq!(rule.to_string(), "user:3 concurrent lease=30s");
    // A lease written as 60s is kept as written, not folded into the default.
    assert_eq!(
        parse_rule("2 concurrent lease=60s").unwrap().to_string(),
        "2 concurrent lease=60s"
    );
    assert_eq!(
        parse_rule("3 concurrent lease=2h").unwrap().to_string(),
        "3 concurrent lease=2h"
    );
}

#[test]
fn concurrency_and_rate_leaves_combine() {
    let rule = parse_rule("user:100/m; user:3 concurrent").unwrap();
    assert_eq!(rule.to_string(), "or(user:100/m, user:3 concurrent)");
    let rule = parse_rule("and(ip:1 concurrent lease=5s, 10/s)").unwrap();
    assert_eq!(rule.to_string(), "and(ip:1 concurrent lease=5s, 10/s)");
    assert_eq!(parse_rule(&rule.to_string()), Ok(rule));
}

#[test]
fn bad_concurrency_leaves_are_refused_with_a_column() {
    let cases: &[(&str, usize, &str)] = &[
        (
            "user:3 concurrent lease=0s",
            25,
            "a span of at least one unit",
        ),
        ("user:3 concurrent lease=-1s", 25, "a lease time"),
        ("user:3 concurrent lease=", 25, "a lease time"),
        ("user:3 concurrent lease 30s", 25, "`=`"),
        ("user:3 concurrent burst=5", 19, "takes no burst"),
        ("user:3 concurrent windows=5", 19, "takes no burst"),
        ("user:3 concurrent algorithm=gcra", 19, "takes no burst"),
        (
            "user:3 concurrent lease=5s lease=6s",
            28,
            "at most one `lease`",
        ),
        ("user:3 concurrent/s", 18, "takes a count, not a rate"),
        ("user:3/s concurrent", 10, "follow a bare count"),
        ("user:3/s lease=5s", 10, "follow a bare count"),
        ("user:0 concurrent", 6, "a count of leases from 1"),
        ("user:2000000 concurrent", 6, "a count of leases from 1"),
        ("user:3 concurrent lease=5x", 26, "a unit"),
        ("user:3 concurrent nonsense=1", 19, "an option (lease)"),
        ("user:3 concurrent lease=11y", 25, "at most ten years"),
        ("3 concurrent algorithm=concurrency", 14, "takes no burst"),
        ("3/s algorithm=concurrency", 15, "an algorithm"),
    ];
    for &(text, column, expected) in cases {
        let err = parse_rule(text).unwrap_err();
        assert_eq!(err.column, column, "{text}: {err}");
        assert!(err.expected.contains(expected), "{text}: {err}");
    }
}

#[test]
fn a_concurrency_quota_cannot_be_a_policy_default() {
    let rule = parse_rule("3/s").unwrap();
    assert!(Quota::from_leaf(rule.leaves()[0], Algorithm::Concurrency).is_err());
    assert!(!Algorithm::ALL.contains(&Algorithm::Concurrency));
    assert_eq!(Algorithm::from_name("concurrency"), None);
}

#[test]
fn acquire_admits_up_to_the_limit_then_reports_free_slots_and_the_earliest_expiry() {
    let quota = quota("3 concurrent lease=10s");
    let mut leases = Leases::default();
    for (i, free) in [(1u64, 2u64), (2, 1), (3, 0)] {
        let v = concurrency::acquire(&quota, &mut leases, i * S, i);
        assert!(v.allowed);
        assert_eq!(v.remaining, free);
        assert_eq!(v.limit, 3);
    }
    let denied = concurrency::acquire(&quota, &mut leases, 5 * S, 4);
    assert!(!denied.allowed);
    assert_eq!(denied.remaining, 0);
    // Lease 1 (taken at 1 s) expires at 11 s: 6 s from now, if nobody renews it.
    assert_eq!(denied.retry, Retry::After(6 * S));
    assert_eq!(denied.reset_after, 8 * S);
    assert_eq!(leases.len(), 3);
    // A cost above the limit can never pass.
    let never = concurrency::verdict(&quota, &leases, 5 * S, 4);
    assert_eq!(never.retry, Retry::Never);
    // Cost 2 needs the two earliest leases gone: lease 2 expires at 12 s.
    let two = concurrency::verdict(&quota, &Leases::from_leases(leases.leases()), 5 * S, 2);
    assert_eq!(two.retry, Retry::After(7 * S));
}

#[test]
fn leases_expire_by_themselves() {
    let quota = quota("1 concurrent lease=10s");
    let mut leases = Leases::default();
    assert!(concurrency::acquire(&quota, &mut leases, 0, 1).allowed);
    assert!(!concurrency::acquire(&quota, &mut leases, 10 * S - 1, 2).allowed);
    // At exactly 10 s lease 1 has expired.
    assert!(concurrency::acquire(&quota, &mut leases, 10 * S, 2).allowed);
    assert_eq!(leases.len(), 1, "the expired lease was dropped");
    assert_eq!(
        concurrency::release(&mut leases, 10 * S, 1),
        Released::NotHeld
    );
}

#[test]
fn release_frees_at_once_and_twice_is_harmless() {
    let quota = quota("1 concurrent");
    let mut leases = Leases::default();
    assert!(concurrency::acquire(&quota, &mut leases, 0, 7).allowed);
    assert_eq!(concurrency::release(&mut leases, S, 8), Released::NotHeld);
    assert_eq!(leases.held(S), 1, "another id releases nothing");
    assert_eq!(concurrency::release(&mut leases, S, 7), Released::Released);
    assert_eq!(concurrency::release(&mut leases, S, 7), Released::NotHeld);
    assert!(leases.is_empty());
    assert!(concurrency::acquire(&quota, &mut leases, S, 9).allowed);
    // An expired lease still in the set is reported as such.
    assert_eq!(
        concurrency::release(&mut leases, 61 * S, 9),
        Released::Expired
    );
    assert!(leases.is_empty());
}

#[test]
fn renew_keeps_a_lease_and_cannot_revive_an_expired_one() {
    let quota = quota("1 concurrent lease=10s");
    let mut leases = Leases::default();
    assert!(concurrency::acquire(&quota, &mut leases, 0, 1).allowed);
    assert_eq!(
        concurrency::renew(&quota, &mut leases, 9 * S, 1),
        Some(19 * S)
    );
    assert!(!concurrency::acquire(&quota, &mut leases, 15 * S, 2).allowed);
    assert_eq!(concurrency::renew(&quota, &mut leases, 19 * S, 1), None);
    assert_eq!(concurrency::renew(&quota, &mut leases, 5 * S, 3), None);
    assert!(concurrency::acquire(&quota, &mut leases, 19 * S, 2).allowed);
    // Acquiring an id already held renews it rather than taking a second slot.
    let again = concurrency::acquire(&quota, &mut leases, 20 * S, 2);
    assert!(again.allowed);
    assert_eq!(leases.len(), 1);
    assert_eq!(leases.expiry(2, 20 * S), Some(30 * S));
}

#[test]
fn a_quota_judges_leases_without_taking_one() {
    let quota = quota("2 concurrent lease=10s");
    let mut state = quota.fresh_state();
    assert!(matches!(state, State::Concurrency(_)));
    let State::Concurrency(leases) = &mut state else {
        unreachable!()
    };
    concurrency::acquire(&quota, leases, 0, 1);
    concurrency::acquire(&quota, leases, 0, 2);
    assert!(!quota.verdict(&state, S, 1).allowed);
    assert_eq!(quota.expires_at(&state), 10 * S);
    // Recording drops expired leases only.
    quota.record(&mut state, 10 * S, 1);
    assert_eq!(state, State::Concurrency(Leases::default()));
}

#[test]
fn a_denial_by_a_concurrency_leaf_says_its_wait_is_a_bound() {
    let quota = quota("1 concurrent lease=10s");
    let mut leases = Leases::default();
    concurrency::acquire(&quota, &mut leases, 0, 1);
    let verdict = concurrency::verdict(&quota, &leases, 4 * S, 1);
    let decision = Decision::from_verdict(&verdict, 0, 1).occupied();
    assert_eq!(
        decision.denial,
        Some(Denial::Occupied {
            retry_after: Duration::from_secs(6)
        })
    );
    assert_eq!(decision.retry_after(), Some(Duration::from_secs(6)));
    assert_eq!(decision.denial.unwrap().name(), "occupied");
    let aged = decision.aged(Duration::from_secs(1));
    assert_eq!(aged.retry_after(), Some(Duration::from_secs(5)));
}
