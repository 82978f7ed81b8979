//! The Limiter over the memory store, on a manual clock: errors, decision numbers, peek, cost,
//! reset, shadow, count_denied, penalties, keys, identifiers, near cache, replacing policies.
//! The answers without waiting (`try_check_now` and the decision alone) are in `check_now.rs`.

use std::sync::Arc;
use std::time::Duration;

use sha2::Digest;
use sluice_limiter::{
    Algorithm, Checked, Denial, Error, Limiter, Penalty, PolicyError, PolicyWatch, Selectors,
};

mod common;
use common::{ALICE, BOB, SEC, START, limiter, limiter_on, policy, secs};

const NS: Duration = Duration::from_nanos(1);

async fn check(l: &Limiter, name: &str, sel: &Selectors<'_>, cost: u64) -> Checked {
    l.check(name, sel, cost).await.unwrap()
}

async fn peek(l: &Limiter, name: &str, sel: &Selectors<'_>, cost: u64) -> Checked {
    l.peek(name, sel, cost).await.unwrap()
}

/// Makes `n` hits of cost 1 and asserts every one is admitted.
async fn admit(l: &Limiter, name: &str, sel: &Selectors<'_>, n: usize) {
    for i in 0..n {
        let allowed = check(l, name, sel, 1).await.decision.allowed();
        assert!(allowed, "{name}: hit {i} of {n}");
    }
}

#[tokio::test]
async fn unknown_policy_and_missing_selector_are_errors_that_record_nothing() {
    let (l, _) = limiter([policy("p", "or(10/m, ip+user:5/m)")]);
    let unknown = Error::UnknownPolicy("nope".into());
    assert_eq!(l.check("nope", ALICE, 1).await, Err(unknown.clone()));
    assert_eq!(l.peek("nope", ALICE, 1).await, Err(unknown.clone()));
    assert_eq!(l.reset("nope", ALICE).await, Err(unknown.clone()));
    assert!(!unknown.is_transient());

    let missing = l.check("p", ALICE, 1).await.unwrap_err();
    let expected = Error::MissingSelector {
        policy: "p".into(),
        selector: "ip".into(),
    };
    assert_eq!(missing, expected);
    assert!(!missing.is_transient());
    // The global leaf comes first, yet nothing reached the store.
    assert_eq!(l.store().as_memory().unwrap().stats().identifiers, 0);
    let both: &Selectors = &[("ip", "10.0.0.1"), ("user", "alice")];
    admit(&l, "p", both, 5).await;
    let sixth = check(&l, "p", &[("user", "alice"), ("ip", "10.0.0.1")], 1).await;
    assert!(matches!(
        sixth.decision.denial,
        Some(Denial::Limited { .. })
    ));
}

#[tokio::test]
async fn gcra_decisions_carry_exact_numbers() {
    let (l, clock) = limiter([policy("p", "user:5/m")]);
    for (i, remaining) in (0..5).rev().enumerate() {
        let d = check(&l, "p", ALICE, 1).await.decision;
        assert!(d.allowed() && d.denial.is_none() && d.retry_after().is_none());
        assert_eq!((d.limit, d.remaining, d.leaf), (5, remaining, 0));
        assert_eq!(d.reset_after, secs(12 * (i as u64 + 1)));
    }
    let sixth = check(&l, "p", ALICE, 1).await.decision;
    assert_eq!(
        (sixth.allowed(), sixth.limit, sixth.remaining),
        (false, 5, 0)
    );
    assert_eq!(sixth.retry_after(), Some(secs(12)));
    assert_eq!(sixth.reset_after, secs(60));
    assert!(matches!(sixth.denial, Some(Denial::Limited { .. })));

    clock.advance(secs(12) - NS);
    let early = check(&l, "p", ALICE, 1).await.decision;
    assert!(!early.allowed() && early.retry_after() == Some(NS));
    clock.advance(NS);
    let on_time = check(&l, "p", ALICE, 1).await.decision;
    assert!(on_time.allowed());
    assert_eq!((on_time.remaining, on_time.reset_after), (0, secs(60)));
}

#[tokio::test]
async fn peek_and_cost_zero_record_nothing() {
    for algorithm in Algorithm::ALL {
        let (l, _) = limiter([policy("p", "user:5/m").algorithm(algorithm)]);
        for _ in 0..10 {
            let peeked = peek(&l, "p", ALICE, 1).await.decision;
            assert!(peeked.allowed() && peeked.remaining == 4, "{algorithm}");
            let free = check(&l, "p", ALICE, 0).await.decision;
            assert!(free.allowed() && free.remaining == 5, "{algorithm}");
        }
        assert_eq!(
            l.store().as_memory().unwrap().stats().identifiers,
            0,
            "{algorithm}"
        );
        for remaining in (0..5).rev() {
            let d = check(&l, "p", ALICE, 1).await.decision;
            assert_eq!((d.allowed(), d.remaining), (true, remaining), "{algorithm}");
            assert_eq!(check(&l, "p", ALICE, 0).await.decision.remaining, remaining);
        }
        let peeked = peek(&l, "p", ALICE, 1).await.decision;
        assert!(
            matches!(peeked.denial, Some(Denial::Limited { .. })),
            "{algorithm}"
        );
        assert!(peeked.retry_after().is_some(), "{algorithm}");
    }
}

#[tokio::test]
async fn a_cost_above_capacity_can_never_pass() {
    for (rule, capacity) in [("user:5/m", 5), ("user:5/m burst=10", 10)] {
        for algorithm in Algorithm::ALL {
            if capacity == 10 && algorithm != Algorithm::Gcra {
                continue; // burst is a GCRA option
            }
            let (l, _) = limiter([policy("p", rule).algorithm(algorithm)]);
            let d = check(&l, "p", ALICE, capacity + 1).await.decision;
            assert!(
                !d.allowed() && d.retry_after().is_none(),
                "{rule} {algorithm}"
            );
            assert_eq!(d.denial, Some(Denial::CostExceedsCapacity));
            // Nothing was spent: the whole capacity still passes in one hit.
            assert!(check(&l, "p", ALICE, capacity).await.decision.allowed());
            let d = check(&l, "p", ALICE, 1).await.decision;
            assert!(
                matches!(d.denial, Some(Denial::Limited { .. })),
                "{rule} {algorithm}"
            );
        }
    }
}

#[tokio::test]
async fn reset_clears_one_users_counters_only() {
    let (l, _) = limiter([policy("p", "user:5/m; 8/m")]);
    admit(&l, "p", ALICE, 5).await;
    admit(&l, "p", BOB, 2).await;
    assert_eq!(check(&l, "p", ALICE, 1).await.decision.leaf, 0);
    l.reset("p", ALICE).await.unwrap();
    // Alice's leaf is fresh, the global leaf (7 of 8 used) is not.
    let d = check(&l, "p", ALICE, 1).await.decision;
    assert_eq!((d.allowed(), d.remaining, d.leaf), (true, 0, 1));
    let d = check(&l, "p", ALICE, 1).await.decision;
    assert_eq!((d.allowed(), d.leaf), (false, 1));
    // Empty selectors reset the global leaf only: Bob keeps his two hits.
    l.reset("p", &[]).await.unwrap();
    let d = check(&l, "p", BOB, 1).await.decision;
    assert_eq!((d.allowed(), d.remaining, d.leaf), (true, 2, 0));
    assert_eq!(check(&l, "p", ALICE, 1).await.decision.remaining, 3);
}

#[tokio::test]
async fn shadow_admits_reports_and_still_records() {
    let enforce = policy("enforce", "user:2/m").key("login");
    let observe = policy("observe", "user:2/m").key("login").shadow(true);
    let (l, clock) = limiter([enforce, observe]);
    for remaining in [1, 0] {
        let c = check(&l, "observe", ALICE, 1).await;
        assert!(c.decision.allowed() && !c.shadow_denied);
        assert_eq!(c.decision.remaining, remaining);
    }
    let c = check(&l, "observe", ALICE, 1).await;
    assert!(c.decision.allowed() && c.shadow_denied);
    assert_eq!((c.decision.denial, c.decision.retry_after()), (None, None));
    // The shadow's admitted hits were recorded in the shared counter; its denied one was not.
    assert!(!check(&l, "enforce", ALICE, 1).await.decision.allowed());
    clock.advance(secs(30));
    assert!(check(&l, "enforce", ALICE, 1).await.decision.allowed());
    assert!(check(&l, "observe", BOB, 1).await.decision.allowed());
}

#[tokio::test]
async fn count_denied_delays_the_key_but_only_about_one_window() {
    let plain = policy("plain", "user:5/m");
    let strict = policy("strict", "user:5/m").count_denied(true);
    let (l, clock) = limiter([plain, strict]);
    for name in ["plain", "strict"] {
        admit(&l, name, ALICE, 5).await;
        for _ in 0..20 {
            assert!(!check(&l, name, ALICE, 1).await.decision.allowed());
        }
    }
    clock.advance(secs(12));
    assert!(check(&l, "plain", ALICE, 1).await.decision.allowed());
    assert!(!peek(&l, "strict", ALICE, 1).await.decision.allowed());
    // The debt of denied attempts stops one window past a full bucket: 60 s + 12 s.
    clock.set(START + 72 * SEC - 1);
    assert!(!peek(&l, "strict", ALICE, 1).await.decision.allowed());
    clock.set(START + 72 * SEC);
    assert!(check(&l, "strict", ALICE, 1).await.decision.allowed());
}

#[tokio::test]
async fn penalties_grow_heal_and_are_pardoned() {
    let penalty = Penalty::new(secs(1), 2, secs(8), secs(60)).unwrap();
    let (l, clock) = limiter([policy("p", "user:5/s").penalty(penalty)]);
    // Spends the bucket (full again after any box) and returns the denial that follows.
    async fn abuse(l: &Limiter) -> sluice_limiter::Decision {
        admit(l, "p", ALICE, 5).await;
        check(l, "p", ALICE, 1).await.decision
    }
    for timeout in [1, 2, 4, 8, 8] {
        let d = abuse(&l).await;
        assert!(
            matches!(d.denial, Some(Denial::Penalized { .. })),
            "timeout {timeout}"
        );
        assert_eq!(d.retry_after(), Some(secs(timeout)));
        assert_eq!((d.allowed(), d.remaining), (false, 0));
        // Boxed until the very end, without a new strike; others pass.
        clock.advance(secs(timeout) - NS);
        let d = check(&l, "p", ALICE, 1).await.decision;
        assert!(matches!(d.denial, Some(Denial::Penalized { .. })));
        assert_eq!(d.retry_after(), Some(NS));
        assert!(check(&l, "p", BOB, 1).await.decision.allowed());
        clock.advance(NS);
    }
    // 59 s quiet after the last strike is not enough to forget; 60 s is.
    clock.advance(secs(59 - 8));
    assert_eq!(abuse(&l).await.retry_after(), Some(secs(8)));
    clock.advance(secs(8 + 60));
    assert_eq!(abuse(&l).await.retry_after(), Some(secs(1)));
    clock.advance(secs(1));
    assert_eq!(abuse(&l).await.retry_after(), Some(secs(2)));
    // Pardon: the box, the strikes and the counters go at once.
    l.reset("p", ALICE).await.unwrap();
    assert_eq!(abuse(&l).await.retry_after(), Some(secs(1)));
}

#[tokio::test]
async fn the_same_key_shares_counters_and_namespaces_separate_them() {
    let a = policy("a", "user:2/m").key("shared");
    let b = policy("b", "user:2/m").key("shared");
    let c = policy("c", "user:2/m").key("shared").namespace("other");
    let (l, _) = limiter([a, b, c]);
    assert!(check(&l, "a", ALICE, 1).await.decision.allowed());
    assert_eq!(check(&l, "b", ALICE, 1).await.decision.remaining, 0);
    assert!(!check(&l, "a", ALICE, 1).await.decision.allowed());
    assert_eq!(check(&l, "c", ALICE, 1).await.decision.remaining, 1);
}

#[tokio::test]
async fn odd_selector_values_get_their_own_counters() {
    // How the identifier writes "a:b": `#` and the hex of 128 bits of its SHA-256.
    let digest = sha2::Sha256::digest(b"a:b");
    let hashed_ab: String = std::iter::once("#".to_owned())
        .chain(digest[..16].iter().map(|b| format!("{b:02x}")))
        .collect();
    let long = "x".repeat(200);
    let long_too = format!("{}y", "x".repeat(199));
    let values = [
        "a:b", "a", "b", "", " ", "a+b", "a b", "a\nb", "ünï", &long, &long_too, &hashed_ab,
    ];
    let mut pairs = vec![("a", "b"), ("a:b", ""), ("a", "b:")];
    pairs.extend([("a+b", ""), ("a", "+b"), ("", "a+b")]);
    let ones = values.iter().map(|&v| ("one", vec![("user", v)]));
    let twos = pairs
        .iter()
        .map(|&(ip, user)| ("two", vec![("ip", ip), ("user", user)]));
    let requests: Vec<_> = ones.chain(twos).collect();
    let (l, _) = limiter([policy("one", "user:1/m"), policy("two", "ip+user:1/m")]);
    // Every request names its own counter: all pass once, then all are denied.
    for (name, sel) in &requests {
        let d = check(&l, name, sel, 1).await.decision;
        assert!(d.allowed() && d.remaining == 0, "{sel:?} shares a counter");
    }
    for (name, sel) in &requests {
        let d = check(&l, name, sel, 1).await.decision;
        assert!(
            matches!(d.denial, Some(Denial::Limited { .. })),
            "{sel:?} lost its counter"
        );
    }
}

#[tokio::test]
async fn the_near_cache_answers_denials_until_they_end() {
    let (l, clock) = limiter_on([policy("p", "user:5/m")], Some(secs(60)));
    admit(&l, "p", ALICE, 5).await;
    let stored = check(&l, "p", ALICE, 1).await;
    assert!(!stored.cached && stored.decision.retry_after() == Some(secs(12)));
    let cached = check(&l, "p", ALICE, 1).await;
    assert!(cached.cached);
    assert_eq!(cached.decision, stored.decision);
    clock.advance(secs(5));
    let later = check(&l, "p", ALICE, 1).await;
    assert!(later.cached && !later.decision.allowed());
    assert_eq!(later.decision.retry_after(), Some(secs(7)));
    assert_eq!(later.decision.reset_after, secs(55));
    // Peeks and other keys go to the store.
    assert!(!peek(&l, "p", ALICE, 1).await.cached);
    assert!(!check(&l, "p", BOB, 1).await.cached);
    clock.advance(secs(7) - NS);
    let last = check(&l, "p", ALICE, 1).await;
    assert!(last.cached && last.decision.retry_after() == Some(NS));
    clock.advance(NS);
    let open = check(&l, "p", ALICE, 1).await;
    assert!(open.decision.allowed() && !open.cached);
}

#[tokio::test]
async fn the_near_cache_respects_cost_resets_ttl_and_count_denied() {
    let strict = policy("strict", "user:5/m").count_denied(true);
    let (l, clock) = limiter_on([policy("p", "user:5/m"), strict], Some(secs(2)));
    admit(&l, "p", ALICE, 4).await;
    assert!(!check(&l, "p", ALICE, 2).await.cached);
    assert!(check(&l, "p", ALICE, 2).await.cached);
    assert!(check(&l, "p", ALICE, 3).await.cached);
    // A smaller cost may pass: the store decides, and admits it.
    let small = check(&l, "p", ALICE, 1).await;
    assert!(small.decision.allowed() && !small.cached);

    assert!(!check(&l, "p", ALICE, 1).await.cached);
    assert!(check(&l, "p", ALICE, 1).await.cached);
    l.reset("p", ALICE).await.unwrap();
    let pardoned = check(&l, "p", ALICE, 1).await;
    assert!(pardoned.decision.allowed() && !pardoned.cached);

    // A reset through another limiter on the same store is seen once the entry's ttl ends.
    admit(&l, "p", ALICE, 4).await;
    assert!(!check(&l, "p", ALICE, 1).await.decision.allowed());
    let other = Limiter::builder(l.store().clone()).policy(policy("p", "user:5/m"));
    other.build().unwrap().reset("p", ALICE).await.unwrap();
    clock.advance(secs(2) - NS);
    assert!(check(&l, "p", ALICE, 1).await.cached);
    clock.advance(NS);
    let seen = check(&l, "p", ALICE, 1).await;
    assert!(seen.decision.allowed() && !seen.cached);

    admit(&l, "strict", ALICE, 5).await;
    for _ in 0..3 {
        let c = check(&l, "strict", ALICE, 1).await;
        assert!(!c.decision.allowed() && !c.cached);
    }
}

#[tokio::test]
async fn replace_policies_keeps_unchanged_counters_and_rejects_bad_sets() {
    let (l, _) = limiter([policy("a", "user:2/m"), policy("b", "user:2/m")]);
    admit(&l, "a", ALICE, 2).await;
    let kept = vec![policy("a", "user:2/m"), policy("c", "3/m")];
    l.replace_policies(kept).unwrap();
    assert!(!check(&l, "a", ALICE, 1).await.decision.allowed());
    let gone = l.check("b", ALICE, 1).await;
    assert_eq!(gone, Err(Error::UnknownPolicy("b".into())));
    assert!(check(&l, "c", &[], 1).await.decision.allowed());
    // Flags are not leaves: a shadow of the same rule keeps the counter.
    let shadowed = vec![policy("a", "user:2/m").shadow(true)];
    l.replace_policies(shadowed).unwrap();
    assert!(check(&l, "a", ALICE, 1).await.shadow_denied);

    let bad = [
        policy("bad name", "1/s"),
        policy("dup", "or(5/m, 5/m)"),
        policy("q", "5/m burst=9 algorithm=fixed-window"),
    ];
    let mut errors = Vec::new();
    for bad in bad {
        let set = vec![policy("a", "user:9/m"), bad];
        errors.push(l.replace_policies(set).unwrap_err());
        let names: Vec<_> = l.policies().iter().map(|p| p.name().to_owned()).collect();
        assert_eq!(names, ["a"]);
        assert!(check(&l, "a", ALICE, 1).await.shadow_denied);
    }
    assert!(matches!(errors[0], PolicyError::BadName(_)));
    assert!(matches!(errors[1], PolicyError::DuplicateLeaf { .. }));
    assert!(matches!(errors[2], PolicyError::Quota { .. }));
    // A changed leaf is a new counter.
    l.replace_policies(vec![policy("a", "user:3/m")]).unwrap();
    assert!(check(&l, "a", ALICE, 1).await.decision.allowed());
}

#[tokio::test]
async fn a_policy_watch_follows_replacements_additions_and_removals() {
    let (l, _) = limiter([policy("a", "user:2/m")]);
    let watch = PolicyWatch::new("a");
    let limit = |checked: Checked| checked.decision.limit;
    assert_eq!(limit(l.check(&watch, ALICE, 1).await.unwrap()), 2);
    // Found once, then reused: the same handle until the policies change.
    let first = l.check(&watch, ALICE, 1).await.unwrap().policy;
    assert!(Arc::ptr_eq(
        &first,
        &l.check(&watch, ALICE, 1).await.unwrap().policy
    ));

    // One made by the limiter has found its handle already, and follows reloads alike.
    let made = l.watch("a");
    assert!(Arc::ptr_eq(
        &first,
        &l.check(&made, ALICE, 1).await.unwrap().policy
    ));

    l.replace_policies(vec![policy("a", "user:5/m")]).unwrap();
    assert_eq!(limit(l.check(&watch, ALICE, 1).await.unwrap()), 5);
    assert_eq!(limit(l.check(&made, ALICE, 1).await.unwrap()), 5);
    let unknown = l.watch("nope");
    assert_eq!(
        l.check(&unknown, ALICE, 1).await,
        Err(Error::UnknownPolicy("nope".into()))
    );
    l.add_policy(policy("a", "user:7/m")).unwrap();
    assert_eq!(
        limit(l.try_check_now(&watch, ALICE, 1).unwrap().unwrap()),
        7
    );
    l.replace_policies(vec![policy("b", "3/m")]).unwrap();
    let gone = l.check(&watch, ALICE, 1).await;
    assert_eq!(gone, Err(Error::UnknownPolicy("a".into())));
    // Unknown stays unknown without a change, and comes back with one.
    assert!(l.peek(&watch, ALICE, 1).await.is_err());
    l.add_policy(policy("a", "user:9/m")).unwrap();
    assert_eq!(limit(l.peek(&watch, ALICE, 1).await.unwrap()), 9);

    // A watch used with another limiter finds that limiter's policy, whatever the
    // generations (both limiters have seen the same number of changes here).
    let (other, _) = limiter([policy("a", "user:4/m")]);
    for _ in 0..4 {
        other.add_policy(policy("x", "1/m")).unwrap();
    }
    assert_eq!(limit(other.check(&watch, ALICE, 1).await.unwrap()), 4);
    assert_eq!(limit(l.check(&watch, ALICE, 1).await.unwrap()), 9);
    assert_eq!(watch.name(), "a");
    assert_eq!(watch.to_string(), "a");
}

#[tokio::test]
async fn the_near_cache_keeps_policies_sharing_a_key_apart() {
    let penalty = Penalty::new(secs(8), 2, secs(8), secs(60)).unwrap();
    let boxed = policy("boxed", "user:5/s").key("k").penalty(penalty);
    let free = policy("free", "user:5/s").key("k");
    let or = policy("or", "or(user:5/m, 10/m)").key("j");
    let and = policy("and", "and(user:5/m, 10/m)").key("j");
    let (l, _) = limiter_on([boxed, free, or, and], Some(secs(60)));
    admit(&l, "boxed", ALICE, 5).await;
    let d = check(&l, "boxed", ALICE, 1).await.decision;
    assert!(matches!(d.denial, Some(Denial::Penalized { .. })));
    // `free` shares the counter but has no penalty: limited for one interval, not boxed.
    let d = check(&l, "free", ALICE, 1).await.decision;
    let wait = Duration::from_millis(200);
    assert_eq!(d.denial, Some(Denial::Limited { retry_after: wait }));
    // `or` is reached by Alice's own leaf; `and` also needs the global one (6 of 10 used).
    admit(&l, "or", ALICE, 5).await;
    assert!(!check(&l, "or", ALICE, 1).await.decision.allowed());
    assert!(check(&l, "and", ALICE, 1).await.decision.allowed());
}

#[tokio::test]
async fn penalty_records_do_not_collide_with_a_selector_named_penalty() {
    let penalty = Penalty::new(secs(8), 2, secs(8), secs(60)).unwrap();
    let a = policy("a", "penalty:1/m").key("k");
    let b = policy("b", "user:5/s").key("k").penalty(penalty);
    let (l, _) = limiter([a, b]);
    let victim: &Selectors = &[("penalty", "user")];
    admit(&l, "a", victim, 1).await;
    // This user value is spelled like `a`'s rate: its penalty record is `a`'s counter's name,
    // and an admitted hit (no strike, so the record is dropped) deletes that counter.
    admit(&l, "b", &[("user", "1/m")], 1).await;
    assert!(!check(&l, "a", victim, 1).await.decision.allowed());
}
