//! Sliding log: the timestamp and cost of every admitted hit within the window. Exact: in any
//! interval of the window's length, admitted cost never exceeds the limit. Memory O(limit).

use std::collections::VecDeque;

use crate::algorithm::{Quota, Retry, Verdict};

/// Admitted hits as (timestamp, cost), oldest first. Hits at the same instant are merged.
///
/// The log keeps the sum of its costs beside them, so a decision reads what is in the
/// window by subtracting the few oldest hits that have left it, not by summing up to
/// `limit` entries (on a full log of 1,000 hits, that sum was most of a denial's time).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Log {
    hits: VecDeque<(u64, u64)>,
    /// The sum of `hits`' costs (saturating).
    total: u64,
}

impl Log {
    /// Rebuilds a log from (timestamp, cost) pairs, oldest first.
    pub fn from_hits(hits: impl IntoIterator<Item = (u64, u64)>) -> Log {
        let hits: VecDeque<(u64, u64)> = hits.into_iter().collect();
        let total = hits.iter().fold(0u64, |sum, (_, c)| sum.saturating_add(*c));
        Log { hits, total }
    }

    pub fn hits(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.hits.iter().copied()
    }

    pub fn len(&self) -> usize {
        self.hits.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hits.is_empty()
    }

    /// How many of the oldest hits have left the window at `now` (those with
    /// `timestamp + window <= now`), and their cost. The log is oldest first, so they are a
    /// prefix; a log just recorded holds none, so the walk is short.
    fn expired(&self, quota: &Quota, now: u64) -> (usize, u64) {
        let window = quota.window_ticks();
        let mut cost = 0u64;
        let count = self
            .hits
            .iter()
            .take_while(|(at, _)| at + window <= now)
            .inspect(|(_, c)| cost = cost.saturating_add(*c))
            .count();
        (count, cost)
    }

    /// Hits still inside the window at `now`: those with `timestamp + window > now`.
    fn active(&self, quota: &Quota, now: u64) -> impl DoubleEndedIterator<Item = (u64, u64)> + '_ {
        let (expired, _) = self.expired(quota, now);
        self.hits.iter().copied().skip(expired)
    }

    /// The cost of the hits still inside the window at `now`.
    fn used(&self, quota: &Quota, now: u64) -> u64 {
        let (_, expired) = self.expired(quota, now);
        self.total - expired
    }

    pub(crate) fn record(&mut self, quota: &Quota, now: u64, cost: u64) {
        let window = quota.window_ticks();
        while let Some(&(at, c)) = self.hits.front()
            && at + window <= now
        {
            self.hits.pop_front();
            self.total -= c;
        }
        if cost == 0 {
            return;
        }
        let limit = quota.limit();
        match self.hits.back_mut() {
            Some((at, merged)) if *at == now => {
                let before = *merged;
                *merged = merged.saturating_add(cost).min(limit);
                self.total = self.total.saturating_add(*merged - before);
            }
            _ => {
                self.hits.push_back((now, cost.min(limit)));
                self.total = self.total.saturating_add(cost.min(limit));
            }
        }
        // A denied hit recorded anyway pushes the oldest ones out, so the log never holds
        // more than `limit` in cost (and so never more than `limit` entries).
        while self.total > limit {
            let (_, oldest) = self.hits.front_mut().expect("total > 0 means a hit");
            let cut = (self.total - limit).min(*oldest);
            *oldest -= cut;
            self.total -= cut;
            if *oldest == 0 {
                self.hits.pop_front();
            }
        }
    }

    /// Takes `refund` from and adds `debt` to the entry at `at`, if it is still in the log
    /// (an entry refunded to nothing goes). Returns whether it was.
    pub(crate) fn adjust(&mut self, at: u64, refund: u64, debt: u64) -> bool {
        let Some(index) = self.hits.iter().position(|(t, _)| *t == at) else {
            return false;
        };
        let cost = &mut self.hits[index].1;
        let before = *cost;
        *cost = cost.saturating_sub(refund).saturating_add(debt);
        let after = *cost;
        // Summed again rather than moved by the difference: the saturating sum of a log
        // whose costs were clamped differs from the sum of its differences.
        if after == 0 {
            self.hits.remove(index);
        }
        if before != after {
            self.total = self
                .hits
                .iter()
                .fold(0u64, |sum, (_, c)| sum.saturating_add(*c));
        }
        true
    }

    pub(crate) fn expires_at(&self, quota: &Quota) -> u64 {
        self.hits
            .back()
            .map_or(0, |(at, _)| at + quota.window_ticks())
    }
}

pub(crate) fn verdict(quota: &Quota, log: &Log, now: u64, cost: u64) -> Verdict {
    let window = quota.window_ticks();
    let limit = quota.limit();
    let used = log.used(quota, now);
    // The newest hit, if it is still in the window (when it has left, every hit has).
    let newest = log
        .hits
        .back()
        .map(|&(at, _)| at)
        .filter(|at| at + window > now);

    if let Some(total) = used.checked_add(cost).filter(|&t| t <= limit) {
        let reset_at = if cost > 0 {
            now + window
        } else {
            newest.map_or(now, |at| at + window)
        };
        return Verdict {
            allowed: true,
            limit,
            remaining: limit - total,
            reset_after: reset_at - now,
            retry: Retry::Now,
        };
    }
    let retry = if cost > limit {
        Retry::Never
    } else {
        // The hit fits once enough of the oldest hits have left the window.
        let mut left = used;
        let mut retry_at = now;
        for (at, c) in log.active(quota, now) {
            if left + cost <= limit {
                break;
            }
            left -= c;
            retry_at = at + window;
        }
        Retry::After(retry_at - now)
    };
    Verdict {
        allowed: false,
        limit,
        remaining: limit.saturating_sub(used),
        reset_after: newest.map_or(now, |at| at + window) - now,
        retry,
    }
}
