//! Denials that cost the client: counted denied attempts, and penalty timeouts.

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
        assert!(matches!(d.denial, Some(Denial::Limited { .. })), "{what}");
        assert_retry(&what, d.retry_after(), interval, started);
        if let Some(last) = last {
            assert!(
                d.retry_after() <= Some(last),
                "{what}: {d:?} waits longer than {last:?}"
            );
        }
        last = d.retry_after();
    }

    let started = Instant::now();
    admit(&l, "strict", ALICE, 5).await;
    let first = check(&l, "strict", ALICE, 1).await.decision;
    assert!(
        matches!(first.denial, Some(Denial::Limited { .. })),
        "strict: denial 1"
    );
    assert_retry(
        "strict: denial 1",
        first.retry_after(),
        2 * interval,
        started,
    );
    let second = check(&l, "strict", ALICE, 1).await.decision;
    assert!(
        matches!(second.denial, Some(Denial::Limited { .. })),
        "strict: denial 2"
    );
    assert_retry(
        "strict: denial 2",
        second.retry_after(),
        3 * interval,
        started,
    );
    assert!(
        second.retry_after() > first.retry_after(),
        "strict: {second:?} after {first:?}"
    );
    let ceiling = HOUR + interval;
    let mut since = Instant::now();
    for attempt in 3..=30 {
        since = Instant::now();
        let d = check(&l, "strict", ALICE, 1).await.decision;
        let what = format!("strict: denial {attempt}");
        assert!(matches!(d.denial, Some(Denial::Limited { .. })), "{what}");
        let retry = d
            .retry_after()
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
            d.retry_after(),
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
            assert!(matches!(d.denial, Some(Denial::Limited { .. })), "{what}");
            let retry = d
                .retry_after()
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
    assert!(!d.allowed(), "{what}: admitted");
    assert!(matches!(d.denial, Some(Denial::Penalized { .. })), "{what}");
    assert_eq!(
        (d.retry_after(), d.reset_after),
        (Some(ten_minutes), ten_minutes),
        "{what}"
    );
    assert_eq!((d.limit, d.remaining), (5, 0), "{what}");
    for attempt in 2..=4 {
        let d = check(&l, "boxed", ALICE, 1).await.decision;
        let what = format!("boxed: attempt {attempt} in the box");
        assert!(matches!(d.denial, Some(Denial::Penalized { .. })), "{what}");
        // A new strike would double the box to 20 minutes.
        assert_retry(what, d.retry_after(), ten_minutes, struck);
    }
    let d = peek(&l, "boxed", ALICE, 1).await.decision;
    assert!(
        matches!(d.denial, Some(Denial::Penalized { .. })),
        "boxed: peek"
    );
    assert_retry("boxed: peek", d.retry_after(), ten_minutes, struck);
    let d = check(&l, "boxed", BOB, 1).await.decision;
    assert_eq!((d.allowed(), d.remaining), (true, 4), "boxed: bob");
    // Same counter, no penalty: limited until the next unit, one minute after the first hit.
    let d = check(&l, "free", ALICE, 1).await.decision;
    assert!(
        matches!(d.denial, Some(Denial::Limited { .. })),
        "free: alice"
    );
    assert_retry("free: alice", d.retry_after(), MINUTE, started);

    reset(&l, "boxed", ALICE).await;
    let d = check(&l, "boxed", ALICE, 1).await.decision;
    assert_eq!(
        (d.allowed(), d.remaining),
        (true, 4),
        "boxed: alice after the pardon"
    );
    admit(&l, "boxed", ALICE, 4).await;
    let d = check(&l, "boxed", ALICE, 1).await.decision;
    let what = "boxed: first denial after the pardon";
    assert!(matches!(d.denial, Some(Denial::Penalized { .. })), "{what}");
    assert_eq!(
        d.retry_after(),
        Some(ten_minutes),
        "{what}: strikes were kept"
    );

    let started = Instant::now();
    admit(&l, "growing", ALICE, 5).await;
    // Strike 1 boxes for 1 ms, less than the limited wait, which is reported.
    let d = check(&l, "growing", ALICE, 1).await.decision;
    assert!(
        matches!(d.denial, Some(Denial::Limited { .. })),
        "growing: first denial"
    );
    assert_retry("growing: first denial", d.retry_after(), MINUTE, started);
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
        assert!(
            matches!(d.denial, Some(Denial::Penalized { .. })),
            "{what}: {d:?}"
        );
        let retry = d
            .retry_after()
            .unwrap_or_else(|| panic!("{what}: no retry_after"));
        if retry > base {
            assert_eq!(retry, grown, "growing: strike 2 boxes for base × factor");
            break since;
        }
    };
    let d = check(&l, "growing", ALICE, 1).await.decision;
    assert!(
        matches!(d.denial, Some(Denial::Penalized { .. })),
        "growing: in the second box"
    );
    assert_retry("growing: in the second box", d.retry_after(), grown, struck);
}
