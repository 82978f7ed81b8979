//! Settling reservations: refunds and debts per algorithm.

use sluice_core::{Algorithm, Quota, Rule, State};

const S: u64 = 1_000_000_000;

fn quota(text: &str) -> Quota {
    let rule: Rule = text.parse().unwrap();
    Quota::from_leaf(rule.leaves()[0], Algorithm::Gcra).unwrap()
}

/// Reserves `estimate` at `at` (asserting it is admitted) and returns the state.
fn reserved(quota: &Quota, at: u64, estimate: u64) -> State {
    let mut state = quota.fresh_state();
    assert!(quota.verdict(&state, at, estimate).allowed);
    quota.record(&mut state, at, estimate);
    state
}

#[test]
fn gcra_refund_gives_the_unused_cost_back_and_debt_delays() {
    let q = quota("10/s");
    let mut state = reserved(&q, 10 * S, 8);
    assert_eq!(q.verdict(&state, 10 * S, 1).remaining, 1);
    assert!(q.settle(&mut state, 10 * S, 10 * S, 8, 3));
    assert_eq!(q.verdict(&state, 10 * S, 1).remaining, 6);

    let mut state = reserved(&q, 10 * S, 8);
    assert!(q.settle(&mut state, 10 * S, 10 * S, 8, 14));
    // 14 units at 100 ms each: the bucket is 4 units past empty; the next hit waits 500 ms.
    let denied = q.verdict(&state, 10 * S, 1);
    assert!(!denied.allowed);
    assert_eq!(denied.retry, sluice_core::Retry::After(500_000_000));
    assert!(
        !q.settle(&mut state, 10 * S, 10 * S, 5, 5),
        "no difference, no change"
    );
}

#[test]
fn fixed_window_settles_only_in_its_window() {
    let q = quota("10/m algorithm=fixed-window");
    let mut state = reserved(&q, 60 * S, 8);
    assert!(q.settle(&mut state, 70 * S, 60 * S, 8, 2));
    assert_eq!(q.verdict(&state, 70 * S, 1).remaining, 7);
    assert!(q.settle(&mut state, 70 * S, 60 * S, 2, 12));
    assert!(!q.verdict(&state, 70 * S, 1).allowed);
    // The next window starts afresh, and a settle after the window ended changes nothing.
    assert!(!q.settle(&mut state, 120 * S, 60 * S, 8, 20));
    assert!(q.verdict(&state, 120 * S, 10).allowed);
}

#[test]
fn sliding_window_and_log_settle_the_entry_they_took() {
    for text in [
        "10/m algorithm=sliding-window windows=6",
        "10/m algorithm=sliding-log",
    ] {
        let q = quota(text);
        let mut state = reserved(&q, 60 * S, 8);
        assert!(q.settle(&mut state, 61 * S, 60 * S, 8, 1), "{text}");
        assert_eq!(q.verdict(&state, 61 * S, 1).remaining, 8, "{text}");
        assert!(q.settle(&mut state, 61 * S, 60 * S, 1, 11), "{text}");
        assert!(!q.verdict(&state, 61 * S, 1).allowed, "{text}");
        // Once the entry slid out of the window, settling changes nothing.
        assert!(!q.settle(&mut state, 200 * S, 60 * S, 11, 1), "{text}");
    }
}

#[test]
fn a_refund_to_nothing_removes_the_log_entry() {
    let q = quota("10/m algorithm=sliding-log");
    let mut state = reserved(&q, 60 * S, 4);
    assert!(q.settle(&mut state, 61 * S, 60 * S, 4, 0));
    let State::SlidingLog(log) = &state else {
        unreachable!()
    };
    assert!(log.is_empty());
}
