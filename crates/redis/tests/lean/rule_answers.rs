//! The lean rule script's answers, without Redis: a reply no rule's leaves can give is an
//! error, never a decision; and the windows the store rebuilds from a sliding window's
//! answer decide and record as the window the answer was read from.

use std::time::Duration;

use sluice_core::algorithm::sliding_window::Counters;
use sluice_core::{Denial, Evaluation, Penalty, Quota, Recording, State, evaluate};
use sluice_redis::script::micro;
use sluice_testkit::vectors::Rng;

use super::rules::{Rule, log, quota, sliding, window_answer};

/// A reply of another length than the rule's, or a negative number, is an error, never a
/// decision.
#[test]
fn a_reply_of_the_wrong_shape_is_an_error() {
    let rule = Rule::new(vec![quota(5, 1, 5), quota(40, 1, 40)], None);
    let lean = rule.lean(1, Recording::Admitted);
    assert!(lean.decision(1_000, &[0]).is_err());
    assert!(lean.decision(1_000, &[0, 0, 0]).is_err());
    assert!(lean.decision(1_000, &[0, -1]).is_err());
    assert!(lean.decision(-1, &[0, 0]).is_err());
    assert!(lean.decision(1_000, &[0, 0]).unwrap().allowed());
    let seconds = Duration::from_secs;
    let penalty = Penalty::new(seconds(1), 2, seconds(60), seconds(600)).unwrap();
    let login = Rule::new(vec![quota(5, 60, 5)], Some(penalty)).lean(1, Recording::Always);
    assert!(login.decision(1_000, &[0]).is_err(), "no record");
    assert!(login.decision(1_000, &[0, -1, 0, 0]).is_err());
    assert!(login.decision(1_000, &[0, 0, 0, 0]).unwrap().allowed());
    let boxed = login.decision(1_000, &[0, 1, 5_000, 900]).unwrap();
    assert!(matches!(boxed.denial, Some(Denial::Penalized { .. })));

    // A sliding log answers its used units, newest time, the k-th oldest's and the
    // (k + cost)-th oldest's; an answer no log can give is an error. Two logs of 3 and 8
    // units, a hit of 2 counted even if denied: with 2 units used of 3, k is 1.
    let logs = Rule::new(vec![log(3, 1), log(8, 4)], None).lean(2, Recording::Always);
    let (now, fresh) = (10_000_000, [0, 0, 0, 0]);
    assert!(
        logs.decision(now, &[fresh, fresh].concat())
            .unwrap()
            .allowed()
    );
    let full = [2, 9_900_000, 9_500_000, 0];
    let denied = logs.decision(now, &[full, fresh].concat()).unwrap();
    // Found, the log would clear at 9.5 s + 1 s; recorded, it loses its oldest unit and
    // gains two of now, and the second oldest left is one of now: the wait is the window.
    assert_eq!(
        denied.denial,
        Some(Denial::Limited {
            retry_after: Duration::from_secs(1)
        })
    );
    for wrong in [
        [2, 0, 9_500_000, 0],         // units, but no newest
        [2, 9_900_000, 0, 0],         // denied, but no k-th oldest
        [1, 9_900_000, 9_500_000, 0], // room for the cost, yet a k-th oldest
        [2, 9_500_000, 9_900_000, 0], // the k-th oldest after the newest
        [0, 9_900_000, 0, 0],         // a newest unit in an empty log
        [2, 9_900_000, -1, 0],
    ] {
        assert!(
            logs.decision(now, &[wrong, fresh].concat()).is_err(),
            "{wrong:?}"
        );
    }
    // With 3 units used, k is 2 and the (k + cost)-th oldest would be past the newest: none.
    assert!(
        logs.decision(now, &[[3, 9_900_000, 9_600_000, 9_700_000], fresh].concat())
            .is_err()
    );
    assert!(
        logs.decision(now, &[[3, 9_900_000, 9_600_000, 0], fresh].concat())
            .is_ok()
    );
    // 3 units used of 8 by a hit of 2: k = 3 + 2 - 8 = -3, and k + cost = -1: nothing asked.
    assert!(
        logs.decision(now, &[fresh, [3, 9_900_000, 0, 0]].concat())
            .is_ok()
    );
    assert!(
        logs.decision(now, &[fresh, [3, 9_900_000, 0, 9_800_000]].concat())
            .is_err()
    );

    // A sliding window (3 in 4 sub-windows of 0.25 s) answers its units counted, the
    // current sub-window's, and as sub-windows back the newest earlier one holding units,
    // the k-th oldest's and the k2-th's, then how far ahead its newest is. At 10 s (the
    // current sub-window is the 40th), a hit of 1 counted when admitted.
    let window = Rule::new(vec![sliding(3, 1, 4)], None).lean(1, Recording::Admitted);
    assert!(window.decision(now, &[0, 0, 0, 0, 0, 0]).unwrap().allowed());
    // 3 units, 2 of them 2 sub-windows back: denied until that one slides out.
    let denied = window.decision(now, &[3, 1, 2, 2, 0, 0]).unwrap();
    assert_eq!(
        denied.denial,
        Some(Denial::Limited {
            retry_after: Duration::from_millis(500)
        })
    );
    for wrong in [
        [3, 1, 0, 2, 0, 0], // earlier units, but no earlier sub-window holding them
        [3, 1, 2, 0, 0, 0], // denied, but no sub-window to wait for
        [2, 1, 2, 2, 0, 0], // room for the hit, yet a sub-window to wait for
        [3, 1, 2, 2, 2, 0], // a recorded wait asked of a hit counted only when admitted
        [3, 1, 4, 4, 0, 0], // a sub-window the window no longer counts
        [3, 1, 3, 2, 0, 0], // the units to wait for after the newest earlier ones
        [1, 2, 0, 0, 0, 0], // more in the current sub-window than in all
        [3, 1, 2, -2, 0, 0],
    ] {
        assert!(window.decision(now, &wrong).is_err(), "{wrong:?}");
    }
}

/// The sub-windows the store rebuilds from a sliding window's answer decide and record as
/// the window the answer was read from: random windows (sub-windows stale, current, and
/// newer than now, as after Redis's clock stepped back; times near the epoch), costs and
/// recordings, the window joined by `;` to a GCRA leaf, each answered as the script answers
/// ([`window_answer`]) and decided by the store against the core on the window itself.
#[test]
fn windows_rebuilt_from_answers_decide_as_the_windows_read() {
    let mut rng = Rng(0x51d3);
    let recordings = [Recording::Admitted, Recording::Always, Recording::Never];
    let (mut ahead, mut waits, mut denied, mut limited_waits) = (0, 0, 0, 0);
    for case in 0..20_000 {
        // One window in ten of 120 sub-windows, the rest of 1 to 12.
        let g = match rng.next_u64() % 10 {
            0 => 120,
            _ => 1 + rng.next_u64() % 12,
        };
        let limit = 1 + rng.next_u64() % 12;
        // Sub-windows of 1 s.
        let rule = Rule::new(vec![sliding(limit, g, g as u32), quota(5, 1, 5)], None);
        let micros: Vec<Quota> = rule.quotas.iter().map(|q| micro(q).unwrap()).collect();
        let sub = micros[0].sub_window_ticks();
        let current = rng.next_u64() % 40;
        let now = current * sub + rng.next_u64() % sub;
        let newest = (current + rng.next_u64() % 8).saturating_sub(5);
        // Counts up to twice the limit (denials counted anyway stop there), some above it (a
        // window counted under a larger limit), and the current sub-window often full.
        let mut counts: Vec<u64> = (0..g)
            .map(|_| match rng.next_u64() % 4 {
                0 => 0,
                1 => rng.next_u64() % (3 * limit + 1),
                _ => rng.next_u64() % (2 * limit + 1),
            })
            .collect();
        if newest == current && rng.next_u64() % 3 == 0 {
            counts[g as usize - 1] = 2 * limit - rng.next_u64() % 2;
        }
        let window = State::SlidingWindow(Counters::from_parts(newest, &counts));
        let tat = now + rng.next_u64() % 2_000_000;
        let cost = [0, 1, 1, 2, limit, limit + 1][(rng.next_u64() % 6) as usize];
        let recording = recordings[(rng.next_u64() % 3) as usize];
        let mut reply = window_answer(&micros[0], &window, now, cost, recording);
        ahead += u64::from(reply[5] > 0);
        waits += u64::from(reply[4] > 0);
        reply.push(tat - now);
        let reply: Vec<i64> = reply.iter().map(|&x| x as i64).collect();
        let decision = rule
            .lean(cost, recording)
            .decision(now as i64, &reply)
            .unwrap_or_else(|e| panic!("case {case}: {e}"));
        let mut states = vec![window.clone(), State::Gcra { tat }];
        let evaluation = Evaluation {
            shape: &rule.shape,
            quotas: &micros,
            cost,
            recording,
            penalty: None,
        };
        let outcome = evaluate(&evaluation, &mut states, None, now);
        assert_eq!(
            decision, outcome.decision,
            "case {case}: {window:?} at {now}, cost {cost}, {recording:?}, answered {reply:?}"
        );
        denied += u64::from(!decision.allowed());
        limited_waits += u64::from(
            matches!(decision.denial, Some(Denial::Limited { .. }))
                && decision.leaf == 0
                && reply[3] > 0,
        );
    }
    assert!(ahead > 1_000, "only {ahead} windows newer than now");
    assert!(
        waits > 500,
        "only {waits} answers of a recorded window's wait"
    );
    assert!(denied > 3_000, "only {denied} denials");
    assert!(
        limited_waits > 1_000,
        "only {limited_waits} waits read from an earlier sub-window"
    );
}
