//! Sliding window counter: the window is cut into `G` sub-windows aligned to the epoch, each
//! with its own counter; a hit is admitted when the counters of the last `G` sub-windows
//! (the current one included) plus its cost stay within the limit.
//!
//! Bound: the counted sub-windows always cover the last `(G-1)/G` of the window, so any
//! interval of length `(G-1)·W/G` holds at most `limit` admitted hits. An interval of the full
//! length `W` can hold more, because its oldest sub-window may be only partly counted; at
//! most `limit` plus that one sub-window's count (worst case, all hits in one sub-window,
//! `2·limit`). More sub-windows make the bound tighter and the state larger.

use crate::algorithm::{Quota, Retry, Verdict};

/// Counters of the last `G` sub-windows, as a ring indexed by sub-window number modulo `G`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counters {
    /// Number of the newest sub-window written.
    newest: u64,
    counts: Box<[u64]>,
}

impl Counters {
    pub fn new(quota: &Quota) -> Counters {
        Counters {
            newest: 0,
            counts: vec![0; quota.windows() as usize].into_boxed_slice(),
        }
    }

    /// Rebuilds counters from a store's representation: the newest sub-window number and the
    /// counts of sub-windows `newest - G + 1 ..= newest`, oldest first.
    pub fn from_parts(newest: u64, oldest_first: &[u64]) -> Counters {
        let g = oldest_first.len() as u64;
        let mut counts = vec![0; oldest_first.len()].into_boxed_slice();
        for (offset, &count) in oldest_first.iter().enumerate() {
            let number = (newest + 1 + offset as u64) % g.max(1);
            counts[number as usize] = count;
        }
        Counters { newest, counts }
    }

    pub fn len(&self) -> u32 {
        self.counts.len() as u32
    }

    pub fn is_empty(&self) -> bool {
        self.counts.iter().all(|&c| c == 0)
    }

    pub fn newest(&self) -> u64 {
        self.newest
    }

    /// Count of sub-window `number`, as of the newest sub-window written.
    pub fn count(&self, number: u64) -> u64 {
        let g = self.counts.len() as u64;
        if number > self.newest || number + g <= self.newest {
            0
        } else {
            self.counts[(number % g) as usize]
        }
    }

    pub(crate) fn record(&mut self, quota: &Quota, now: u64, cost: u64) {
        let current = now / quota.sub_window_ticks();
        let g = self.counts.len() as u64;
        if current > self.newest {
            // Clear the sub-windows that the window slid past.
            let stale = (current - self.newest).min(g);
            for number in current + 1 - stale..=current {
                self.counts[(number % g) as usize] = 0;
            }
            self.newest = current;
        }
        let slot = &mut self.counts[(self.newest % g) as usize];
        // Denied hits recorded anyway stop counting at twice the limit.
        *slot = slot.saturating_add(cost).min(quota.limit() * 2);
    }

    /// Takes `refund` from and adds `debt` to sub-window `number`'s count, if it is still
    /// one of the counted sub-windows. Returns whether it was.
    pub(crate) fn adjust(&mut self, number: u64, refund: u64, debt: u64) -> bool {
        let g = self.counts.len() as u64;
        if number > self.newest || number + g <= self.newest {
            return false;
        }
        let slot = &mut self.counts[(number % g) as usize];
        *slot = slot.saturating_sub(refund).saturating_add(debt);
        true
    }

    pub(crate) fn expires_at(&self, quota: &Quota) -> u64 {
        let g = self.counts.len() as u64;
        let last = (0..g)
            .map(|back| self.newest.saturating_sub(back))
            .find(|&number| self.count(number) > 0);
        match last {
            Some(number) => (number + g).saturating_mul(quota.sub_window_ticks()),
            None => 0,
        }
    }
}

pub(crate) fn verdict(quota: &Quota, counters: &Counters, now: u64, cost: u64) -> Verdict {
    verdict_with(quota, now, cost, |number| counters.count(number))
}

/// [`verdict`] on counts read as [`Counters::from_parts`] takes them (sub-window `newest`
/// last), without building the counters.
pub(crate) fn verdict_of_parts(
    quota: &Quota,
    newest: u64,
    oldest_first: &[u64],
    now: u64,
    cost: u64,
) -> Verdict {
    let g = oldest_first.len() as u64;
    verdict_with(quota, now, cost, |number| {
        if number > newest || number + g <= newest {
            0
        } else {
            oldest_first[(number + g - 1 - newest) as usize]
        }
    })
}

/// The verdict on the count of each sub-window, as `counted` gives it.
fn verdict_with(quota: &Quota, now: u64, cost: u64, counted: impl Fn(u64) -> u64) -> Verdict {
    let sub = quota.sub_window_ticks();
    let g = quota.windows() as u64;
    let current = now / sub;
    let oldest = (current + 1).saturating_sub(g);
    let used: u64 = (oldest..=current).map(&counted).sum();
    let limit = quota.limit();
    // The newest sub-window holding hits decides when everything has expired.
    let last_nonzero = (oldest..=current).rev().find(|&n| counted(n) > 0);
    let reset_at = |last: Option<u64>| last.map_or(now, |n| (n + g) * sub);

    if let Some(total) = used.checked_add(cost).filter(|&t| t <= limit) {
        let last = if cost > 0 {
            Some(current)
        } else {
            last_nonzero
        };
        return Verdict {
            allowed: true,
            limit,
            remaining: limit - total,
            reset_after: reset_at(last) - now,
            retry: Retry::Now,
        };
    }
    let retry = if cost > limit {
        Retry::Never
    } else {
        // The hit fits once enough old sub-windows have slid out: sub-window `n` stops being
        // counted at the start of sub-window `n + G`.
        let mut left = used;
        let mut retry_at = now;
        for number in oldest..=current {
            if left + cost <= limit {
                break;
            }
            let count = counted(number);
            if count > 0 {
                left -= count;
                retry_at = (number + g) * sub;
            }
        }
        Retry::After(retry_at - now)
    };
    Verdict {
        allowed: false,
        limit,
        remaining: limit.saturating_sub(used),
        reset_after: reset_at(last_nonzero) - now,
        retry,
    }
}
