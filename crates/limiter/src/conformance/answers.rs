//! How answers reach the caller: a shadow policy admits while reporting what it would deny,
//! and the near cache answers known denials without the store.

use std::slice::from_ref;
use std::time::{Duration, Instant};

use super::StoreFactory;
use super::harness::*;
use crate::Denial;

/// A shadow policy admits every hit and reports the ones it would deny, while recording
/// exactly what an enforcing policy would (the admitted hits, not the would-be denials),
/// also under 64 concurrent tasks.
pub async fn shadow_admits_and_counts<F: StoreFactory>(factory: &F) {
    let ns = Namespace::new("shadow_admits_and_counts");
    let policies = [
        ns.policy("enforce", "user:2/h").key("login"),
        ns.policy("observe", "user:2/h").key("login").shadow(true),
        ns.policy("crowd-enforce", "user:100/h").key("crowd"),
        ns.policy("crowd", "user:100/h").key("crowd").shadow(true),
    ];
    let l = limiter(factory, policies);
    for remaining in [1, 0] {
        let c = check(&l, "observe", ALICE, 1).await;
        let what = format!("observe: hit leaving {remaining}");
        assert!(c.decision.allowed() && !c.shadow_denied, "{what}: {c:?}");
        assert_eq!(c.decision.remaining, remaining, "{what}");
    }
    let c = check(&l, "observe", ALICE, 1).await;
    assert!(
        c.decision.allowed() && c.shadow_denied,
        "observe: third hit: {c:?}"
    );
    assert_eq!(
        (c.decision.denial, c.decision.retry_after()),
        (None, None),
        "observe"
    );
    let d = check(&l, "enforce", ALICE, 1).await.decision;
    assert!(
        matches!(d.denial, Some(Denial::Limited { .. })),
        "enforce: after the shadow's 2 hits"
    );
    let d = check(&l, "enforce", BOB, 1).await.decision;
    assert_eq!((d.allowed(), d.remaining), (true, 1), "enforce: bob");

    let started = Instant::now();
    let alice = |_| Attempt::new(1).with("user", "alice");
    let outcomes = hammer(from_ref(&l), "crowd", TASKS, 5, alice).await;
    assert_eq!(
        count(&outcomes, |c| !c.decision.allowed()),
        0,
        "crowd: a denial"
    );
    assert_eq!(
        total(&outcomes),
        100,
        "crowd: admitted without shadow denial"
    );
    let shadow_denied = count(&outcomes, |c| {
        let d = &c.decision;
        c.shadow_denied && d.denial.is_none() && d.retry_after().is_none()
    });
    assert_eq!(shadow_denied, 220, "crowd: shadow denials");
    // Only the 100 were recorded: the next unit comes 36 s after the first hit.
    let d = peek(&l, "crowd-enforce", ALICE, 1).await.decision;
    assert!(
        matches!(d.denial, Some(Denial::Limited { .. })),
        "crowd-enforce: after the race"
    );
    let interval = Duration::from_secs(36);
    assert_retry(
        "crowd-enforce: after the race",
        d.retry_after(),
        interval,
        started,
    );
}

/// With a near cache, a denial is answered from this process until it ends: the next hits
/// come back `cached` with the same numbers, while peeks, cost 0, other users, other app
/// servers and count-denied policies still go to the store; a reset through the same
/// limiter clears it.
pub async fn near_cache_answers_denied<F: StoreFactory>(factory: &F) {
    let ns = Namespace::new("near_cache_answers_denied");
    let policies = [
        ns.policy("p", "user:5/h"),
        ns.policy("strict", "user:5/h").count_denied(true),
    ];
    let cached = near_cached_limiter(factory, policies.clone());
    let other = limiter(factory, policies);

    let started = Instant::now();
    admit(&cached, "p", ALICE, 5).await;
    let stored_at = Instant::now();
    let stored = check(&cached, "p", ALICE, 1).await;
    assert!(!stored.cached, "the first denial came from the near cache");
    assert!(
        matches!(stored.decision.denial, Some(Denial::Limited { .. })),
        "the first denial"
    );
    let retry = stored.decision.retry_after();
    assert_retry("the first denial", retry, 12 * MINUTE, started);
    let retry = retry.expect("checked above");
    for (attempt, cost) in [(2, 1), (3, 1), (4, 2)] {
        let c = check(&cached, "p", ALICE, cost).await;
        let what = format!("denial {attempt} (cost {cost})");
        assert!(
            c.cached && !c.decision.allowed(),
            "{what} not from the near cache: {c:?}"
        );
        let (d, s) = (&c.decision, &stored.decision);
        assert_eq!(
            (d.denial.map(Denial::name), d.limit, d.remaining, d.leaf),
            (s.denial.map(Denial::name), 5, 0, 0),
            "{what}"
        );
        assert_retry(what, d.retry_after(), retry, stored_at);
    }
    let c = peek(&cached, "p", ALICE, 1).await;
    assert!(!c.cached && !c.decision.allowed(), "peek: {c:?}");
    let c = check(&cached, "p", ALICE, 0).await;
    assert!(!c.cached && c.decision.allowed(), "cost 0: {c:?}");
    let c = check(&cached, "p", BOB, 1).await;
    assert!(!c.cached && c.decision.remaining == 4, "bob: {c:?}");
    let c = check(&other, "p", ALICE, 1).await;
    assert!(!c.cached && !c.decision.allowed(), "another server: {c:?}");

    reset(&cached, "p", ALICE).await;
    let c = check(&cached, "p", ALICE, 1).await;
    assert!(!c.cached, "after the reset: {c:?}");
    assert_eq!(
        (c.decision.allowed(), c.decision.remaining),
        (true, 4),
        "after the reset"
    );

    admit(&cached, "strict", ALICE, 5).await;
    for attempt in 1..=3 {
        let c = check(&cached, "strict", ALICE, 1).await;
        let what = format!("strict: denial {attempt}");
        assert!(!c.cached && !c.decision.allowed(), "{what}: {c:?}");
    }
}
