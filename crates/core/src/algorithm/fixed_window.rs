//! Fixed window: one counter per window aligned to the epoch. Exact within each window; a
//! client may pass up to twice the limit across a window edge. Kept for compatibility.

use crate::algorithm::{Quota, Retry, Verdict};

pub(crate) fn verdict(quota: &Quota, window: u64, count: u64, now: u64, cost: u64) -> Verdict {
    let length = quota.window_ticks();
    let current = now / length;
    let used = if window == current { count } else { 0 };
    let window_end = (current + 1) * length;
    let limit = quota.limit();
    let remaining_before = limit.saturating_sub(used);
    match used.checked_add(cost) {
        Some(total) if total <= limit => Verdict {
            allowed: true,
            limit,
            remaining: limit - total,
            reset_after: if total == 0 { 0 } else { window_end - now },
            retry: Retry::Now,
        },
        _ => Verdict {
            allowed: false,
            limit,
            remaining: remaining_before,
            reset_after: if used == 0 { 0 } else { window_end - now },
            retry: if cost > limit {
                Retry::Never
            } else {
                Retry::After(window_end - now)
            },
        },
    }
}

pub(crate) fn record(quota: &Quota, window: u64, count: u64, now: u64, cost: u64) -> (u64, u64) {
    let current = now / quota.window_ticks();
    let used = if window == current { count } else { 0 };
    // Denied hits recorded anyway cannot push the count past twice the limit, which is
    // already past every decision it influences.
    (current, used.saturating_add(cost).min(quota.limit() * 2))
}
