//! Sliding log: the timestamp and cost of every admitted hit within the window. Exact: in any
//! interval of the window's length, admitted cost never exceeds the limit. Memory O(limit).

use std::collections::VecDeque;

use crate::algorithm::{Quota, Retry, Verdict};

/// Admitted hits as (timestamp, cost), oldest first. Hits at the same instant are merged.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Log {
    hits: VecDeque<(u64, u64)>,
}

impl Log {
    /// Rebuilds a log from (timestamp, cost) pairs, oldest first.
    pub fn from_hits(hits: impl IntoIterator<Item = (u64, u64)>) -> Log {
        Log {
            hits: hits.into_iter().collect(),
        }
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

    /// Hits still inside the window at `now`: those with `timestamp + window > now`.
    fn active(&self, quota: &Quota, now: u64) -> impl DoubleEndedIterator<Item = (u64, u64)> + '_ {
        let window = quota.window_ticks();
        self.hits
            .iter()
            .copied()
            .filter(move |(at, _)| at + window > now)
    }

    pub(crate) fn record(&mut self, quota: &Quota, now: u64, cost: u64) {
        let window = quota.window_ticks();
        while self.hits.front().is_some_and(|(at, _)| at + window <= now) {
            self.hits.pop_front();
        }
        if cost == 0 {
            return;
        }
        let limit = quota.limit();
        match self.hits.back_mut() {
            Some((at, merged)) if *at == now => *merged = merged.saturating_add(cost).min(limit),
            _ => self.hits.push_back((now, cost.min(limit))),
        }
        // A denied hit recorded anyway pushes the oldest ones out, so the log never holds
        // more than `limit` in cost (and so never more than `limit` entries).
        let mut total: u64 = self.hits.iter().map(|(_, c)| c).sum();
        while total > limit {
            let (_, oldest) = self.hits.front_mut().expect("total > 0 means a hit");
            let cut = (total - limit).min(*oldest);
            *oldest -= cut;
            total -= cut;
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
        *cost = cost.saturating_sub(refund).saturating_add(debt);
        if *cost == 0 {
            self.hits.remove(index);
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
    let used: u64 = log.active(quota, now).map(|(_, c)| c).sum();
    let newest = log.active(quota, now).next_back().map(|(at, _)| at);

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
