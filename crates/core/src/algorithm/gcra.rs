//! GCRA: a token bucket kept as one timestamp, the theoretical arrival time (TAT).
//!
//! With interval `T` (span / count) and capacity `tau = T * burst`, a hit of cost `c` at `now`
//! is admitted when `max(TAT, now) + c*T - now <= tau`; admitting sets TAT to that sum. From a
//! full bucket, `burst` hits pass at once, then one per `T`.

use crate::algorithm::{Quota, Retry, Verdict};

pub(crate) fn verdict(quota: &Quota, tat: u64, now: u64, cost: u64) -> Verdict {
    let interval = quota.interval_ticks();
    let tau = quota.burst() * interval; // bounded by Quota::from_leaf
    let base = tat.max(now);
    let debt = base - now; // time the bucket needs to become full again
    let increment = cost.checked_mul(interval);
    // Only the denied branches need the count before the hit: one division per verdict.
    // Denied means the room left is below `inc`: for a cost of 1, below one interval, so
    // the count is 0 without the division (tens of cycles, the most of a refusal's math).
    let remaining_before = || {
        let room = tau.saturating_sub(debt);
        if room < interval { 0 } else { room / interval }
    };
    match increment {
        // `inc <= tau` first: `debt + inc` can overflow when the cost is near u64::MAX.
        Some(inc) if inc <= tau && debt <= tau - inc => Verdict {
            allowed: true,
            limit: quota.burst(),
            remaining: (tau - debt - inc) / interval,
            reset_after: debt + inc,
            retry: Retry::Now,
        },
        Some(inc) if inc <= tau => Verdict {
            allowed: false,
            limit: quota.burst(),
            remaining: remaining_before(),
            reset_after: debt,
            // Earliest t with TAT + inc - t <= tau (TAT > t here, since the hit is denied).
            retry: Retry::After(tat + inc - tau - now),
        },
        _ => Verdict {
            allowed: false,
            limit: quota.burst(),
            remaining: remaining_before(),
            reset_after: debt,
            retry: Retry::Never,
        },
    }
}

/// Whether [`verdict`] would admit, and whether the cost can ever be admitted: the same
/// arithmetic without the counts, for a store deciding inside a critical section.
pub(crate) fn admits(quota: &Quota, tat: u64, now: u64, cost: u64) -> (bool, bool) {
    let interval = quota.interval_ticks();
    let tau = quota.burst() * interval;
    let debt = tat.max(now) - now;
    match cost.checked_mul(interval) {
        Some(inc) if inc <= tau => (debt <= tau - inc, true),
        _ => (false, false),
    }
}

pub(crate) fn record(quota: &Quota, tat: u64, now: u64, cost: u64) -> u64 {
    let interval = quota.interval_ticks();
    let tau = quota.burst() * interval;
    // A denied hit recorded anyway adds debt, but never more than one window beyond a full
    // bucket: counting denied attempts delays an abuser, it must not lock them out forever.
    let ceiling = now + tau + quota.window_ticks();
    let inc = cost.saturating_mul(interval);
    // `.max(tat)`: the ceiling must never move a TAT backwards (a caller's clock may).
    tat.max(now).saturating_add(inc).min(ceiling).max(tat)
}
