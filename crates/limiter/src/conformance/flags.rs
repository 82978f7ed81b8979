//! Policy options as the store carries them out: counted denials, penalties, shadow mode,
//! and the near cache in front of the store.

use std::slice::from_ref;
use std::time::{Duration, Instant};

use sluice_core::Algorithm;

use super::StoreFactory;
use super::harness::*;
use crate::{Denial, Penalty};

/// Denied attempts of a count-denied policy lengthen the wait (GCRA `user:5/h`: 24 min after
/// the first, 36 min after the second), never beyond one window past a full bucket (72 min);
/// a plain policy's denials change nothing; other algorithms stay within their window.
pub async fn count_denied_counts_denials<F: StoreFactory>(factory: &F) {
    let ns = Namespace::new("count_denied_counts_denials");
    let mut policies = vec![
        ns.policy("strict", "user:5/h").count_denied(true),
        ns.policy("lenient", "user:5/h").key("strict"),
        ns.policy("plain", "user:5/h"),
    ];
    for algorithm in [Algorithm::SlidingWindow, Algorithm::SlidingLog] {
        let name = format!("strict-{algorithm}");
        policies.push(
            ns.policy(&name, "user:5/h")
                .algorithm(algorithm)
                .count_denied(true),
        );
    }
    let l = limiter(factory, policies);
    let interval = 12 * MINUTE;

    let started = Instant::now();
    admit(&l, "plain", ALICE, 5).await;
    let mut last = None;
    for attempt in 1..=3 {
        let d = check(&l, "plain", ALICE, 1).await.decision;
        let what = format!("plain: denial {attempt}");
        assert_eq!(d.denial, Some(Denial::Limited), "{what}");
        assert_retry(&what, d.retry_after, interval, started);
        if let Some(last) = last {
            assert!(
                d.retry_after <= Some(last),
                "{what}: {d:?} waits longer than {last:?}"
            );
        }
        last = d.retry_after;
    }

    let started = Instant::now();
    admit(&l, "strict", ALICE, 5).await;
    let first = check(&l, "strict", ALICE, 1).await.decision;
    assert_eq!(first.denial, Some(Denial::Limited), "strict: denial 1");
    assert_retry("strict: denial 1", first.retry_after, 2 * interval, started);
    let second = check(&l, "strict", ALICE, 1).await.decision;
    assert_eq!(second.denial, Some(Denial::Limited), "strict: denial 2");
    assert_retry(
        "strict: denial 2",
        second.retry_after,
        3 * interval,
        started,
    );
    assert!(
        second.retry_after > first.retry_after,
        "strict: {second:?} after {first:?}"
    );
    let ceiling = HOUR + interval;
    let mut since = Instant::now();
    for attempt in 3..=30 {
        since = Instant::now();
        let d = check(&l, "strict", ALICE, 1).await.decision;
        let what = format!("strict: denial {attempt}");
        assert_eq!(d.denial, Some(Denial::Limited), "{what}");
        let retry = d
            .retry_after
            .unwrap_or_else(|| panic!("{what}: no retry_after"));
        assert!(
            retry <= ceiling,
            "{what}: waits {retry:?}, beyond {ceiling:?}"
        );
        if attempt == 30 {
            // Long since at the ceiling, which is counted from each attempt.
            assert_counts_down(what, retry, ceiling, since);
        }
    }
    // The denials are in the shared counter: a policy on the same key sees the debt, and its
    // own denials add none.
    for attempt in 1..=3 {
        let d = check(&l, "lenient", ALICE, 1).await.decision;
        assert_retry(
            format!("lenient: denial {attempt}"),
            d.retry_after,
            ceiling,
            since,
        );
    }

    for algorithm in [Algorithm::SlidingWindow, Algorithm::SlidingLog] {
        let name = format!("strict-{algorithm}");
        admit(&l, &name, ALICE, 5).await;
        for attempt in 1..=10 {
            let d = check(&l, &name, ALICE, 1).await.decision;
            let what = format!("{name}: denial {attempt}");
            assert_eq!(d.denial, Some(Denial::Limited), "{what}");
            let retry = d
                .retry_after
                .unwrap_or_else(|| panic!("{what}: no retry_after"));
            assert!(retry <= HOUR, "{what}: waits {retry:?}, beyond the window");
        }
    }
}

/// A penalty (base 10 min, factor 2) boxes the key on its first denial for exactly the base;
/// attempts while boxed add no strike, a peek shows the box, other users and policies
/// without the penalty are not boxed; a reset pardons box and strikes. Growth: with base 1 ms
/// and factor 100,000, the strike after the first box (which ends at once) boxes for 100 s.
/// (Assumes the store counts time in ticks of at most a millisecond.)
pub async fn penalties_box_and_grow<F: StoreFactory>(factory: &F) {
    let ns = Namespace::new("penalties_box_and_grow");
    let boxing = Penalty::new(10 * MINUTE, 2, HOUR, HOUR).expect("a valid penalty");
    let base = Duration::from_millis(1);
    let growing = Penalty::new(base, 100_000, HOUR, HOUR).expect("a valid penalty");
    let policies = [
        ns.policy("boxed", "user:5/5m").penalty(boxing),
        ns.policy("free", "user:5/5m").key("boxed"),
        ns.policy("growing", "user:5/5m").penalty(growing),
    ];
    let l = limiter(factory, policies);
    let ten_minutes = 10 * MINUTE;

    let started = Instant::now();
    admit(&l, "boxed", ALICE, 5).await;
    let struck = Instant::now();
    let d = check(&l, "boxed", ALICE, 1).await.decision;
    let what = "boxed: first denial";
    assert!(!d.allowed, "{what}: admitted");
    assert_eq!(d.denial, Some(Denial::Penalized), "{what}");
    assert_eq!(
        (d.retry_after, d.reset_after),
        (Some(ten_minutes), ten_minutes),
        "{what}"
    );
    assert_eq!((d.limit, d.remaining), (5, 0), "{what}");
    for attempt in 2..=4 {
        let d = check(&l, "boxed", ALICE, 1).await.decision;
        let what = format!("boxed: attempt {attempt} in the box");
        assert_eq!(d.denial, Some(Denial::Penalized), "{what}");
        // A new strike would double the box to 20 minutes.
        assert_retry(what, d.retry_after, ten_minutes, struck);
    }
    let d = peek(&l, "boxed", ALICE, 1).await.decision;
    assert_eq!(d.denial, Some(Denial::Penalized), "boxed: peek");
    assert_retry("boxed: peek", d.retry_after, ten_minutes, struck);
    let d = check(&l, "boxed", BOB, 1).await.decision;
    assert_eq!((d.allowed, d.remaining), (true, 4), "boxed: bob");
    // Same counter, no penalty: limited until the next unit, one minute after the first hit.
    let d = check(&l, "free", ALICE, 1).await.decision;
    assert_eq!(d.denial, Some(Denial::Limited), "free: alice");
    assert_retry("free: alice", d.retry_after, MINUTE, started);

    reset(&l, "boxed", ALICE).await;
    let d = check(&l, "boxed", ALICE, 1).await.decision;
    assert_eq!(
        (d.allowed, d.remaining),
        (true, 4),
        "boxed: alice after the pardon"
    );
    admit(&l, "boxed", ALICE, 4).await;
    let d = check(&l, "boxed", ALICE, 1).await.decision;
    let what = "boxed: first denial after the pardon";
    assert_eq!(d.denial, Some(Denial::Penalized), "{what}");
    assert_eq!(
        d.retry_after,
        Some(ten_minutes),
        "{what}: strikes were kept"
    );

    let started = Instant::now();
    admit(&l, "growing", ALICE, 5).await;
    // Strike 1 boxes for 1 ms, less than the limited wait, which is reported.
    let d = check(&l, "growing", ALICE, 1).await.decision;
    assert_eq!(d.denial, Some(Denial::Limited), "growing: first denial");
    assert_retry("growing: first denial", d.retry_after, MINUTE, started);
    let grown = Duration::from_secs(100);
    let deadline = Instant::now() + Duration::from_secs(10);
    let struck = loop {
        let since = Instant::now();
        assert!(
            since < deadline,
            "growing: the 1 ms box did not end in 10 s"
        );
        let d = check(&l, "growing", ALICE, 1).await.decision;
        let what = "growing: after strike 1";
        assert_eq!(d.denial, Some(Denial::Penalized), "{what}: {d:?}");
        let retry = d
            .retry_after
            .unwrap_or_else(|| panic!("{what}: no retry_after"));
        if retry > base {
            assert_eq!(retry, grown, "growing: strike 2 boxes for base × factor");
            break since;
        }
    };
    let d = check(&l, "growing", ALICE, 1).await.decision;
    assert_eq!(
        d.denial,
        Some(Denial::Penalized),
        "growing: in the second box"
    );
    assert_retry("growing: in the second box", d.retry_after, grown, struck);
}

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
        assert!(c.decision.allowed && !c.shadow_denied, "{what}: {c:?}");
        assert_eq!(c.decision.remaining, remaining, "{what}");
    }
    let c = check(&l, "observe", ALICE, 1).await;
    assert!(
        c.decision.allowed && c.shadow_denied,
        "observe: third hit: {c:?}"
    );
    assert_eq!(
        (c.decision.denial, c.decision.retry_after),
        (None, None),
        "observe"
    );
    let d = check(&l, "enforce", ALICE, 1).await.decision;
    assert_eq!(
        d.denial,
        Some(Denial::Limited),
        "enforce: after the shadow's 2 hits"
    );
    let d = check(&l, "enforce", BOB, 1).await.decision;
    assert_eq!((d.allowed, d.remaining), (true, 1), "enforce: bob");

    let started = Instant::now();
    let alice = |_| Attempt::new(1).with("user", "alice");
    let outcomes = hammer(from_ref(&l), "crowd", 64, 5, alice).await;
    assert_eq!(
        count(&outcomes, |c| !c.decision.allowed),
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
        c.shadow_denied && d.denial.is_none() && d.retry_after.is_none()
    });
    assert_eq!(shadow_denied, 220, "crowd: shadow denials");
    // Only the 100 were recorded: the next unit comes 36 s after the first hit.
    let d = peek(&l, "crowd-enforce", ALICE, 1).await.decision;
    assert_eq!(
        d.denial,
        Some(Denial::Limited),
        "crowd-enforce: after the race"
    );
    let interval = Duration::from_secs(36);
    assert_retry(
        "crowd-enforce: after the race",
        d.retry_after,
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
    assert_eq!(
        stored.decision.denial,
        Some(Denial::Limited),
        "the first denial"
    );
    let retry = stored.decision.retry_after;
    assert_retry("the first denial", retry, 12 * MINUTE, started);
    let retry = retry.expect("checked above");
    for (attempt, cost) in [(2, 1), (3, 1), (4, 2)] {
        let c = check(&cached, "p", ALICE, cost).await;
        let what = format!("denial {attempt} (cost {cost})");
        assert!(
            c.cached && !c.decision.allowed,
            "{what} not from the near cache: {c:?}"
        );
        let (d, s) = (&c.decision, &stored.decision);
        assert_eq!(
            (d.denial, d.limit, d.remaining, d.leaf),
            (s.denial, 5, 0, 0),
            "{what}"
        );
        assert_retry(what, d.retry_after, retry, stored_at);
    }
    let c = peek(&cached, "p", ALICE, 1).await;
    assert!(!c.cached && !c.decision.allowed, "peek: {c:?}");
    let c = check(&cached, "p", ALICE, 0).await;
    assert!(!c.cached && c.decision.allowed, "cost 0: {c:?}");
    let c = check(&cached, "p", BOB, 1).await;
    assert!(!c.cached && c.decision.remaining == 4, "bob: {c:?}");
    let c = check(&other, "p", ALICE, 1).await;
    assert!(!c.cached && !c.decision.allowed, "another server: {c:?}");

    reset(&cached, "p", ALICE).await;
    let c = check(&cached, "p", ALICE, 1).await;
    assert!(!c.cached, "after the reset: {c:?}");
    assert_eq!(
        (c.decision.allowed, c.decision.remaining),
        (true, 4),
        "after the reset"
    );

    admit(&cached, "strict", ALICE, 5).await;
    for attempt in 1..=3 {
        let c = check(&cached, "strict", ALICE, 1).await;
        let what = format!("strict: denial {attempt}");
        assert!(!c.cached && !c.decision.allowed, "{what}: {c:?}");
    }
}
