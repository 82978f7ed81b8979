//! What a policy does when the store cannot decide in time.
//!
//! `Open` admits, `Closed` denies, `Local` decides with an in-process limiter holding a
//! share of each limit. Every decision taken without the store is counted in
//! [`LimiterStats`], so no error turns into a silent allow. After a transient error the store
//! is skipped for a short pause (so an outage costs one timeout, not one per request), then
//! tried again: when it answers, decisions return to it by themselves.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_core::{Leaf, Quota, Rate};

/// A policy's behaviour when the store fails.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
#[non_exhaustive]
pub enum FailureMode {
    /// Admit the hit.
    Open,
    /// Deny the hit (`Denial::StoreUnavailable`).
    Closed,
    /// Decide in this process with `share` (0 < share <= 1) of each limit: with N servers,
    /// a share of 1/N keeps the whole fleet near the real limit while the store is away.
    Local { share: f64 },
    /// The default: decide locally with the whole limit in each process. Never unlimited,
    /// at worst N times the limit across N servers.
    #[default]
    LocalFull,
}

impl FailureMode {
    /// `Local { share }`, with the share checked.
    pub fn local(share: f64) -> Result<FailureMode, String> {
        if share > 0.0 && share <= 1.0 {
            Ok(FailureMode::Local { share })
        } else {
            Err(format!("local share {share} is not in (0, 1]"))
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            FailureMode::Open => "open",
            FailureMode::Closed => "closed",
            FailureMode::Local { .. } | FailureMode::LocalFull => "local",
        }
    }

    pub(crate) fn share(&self) -> Option<f64> {
        match self {
            FailureMode::Local { share } => Some(*share),
            FailureMode::LocalFull => Some(1.0),
            _ => None,
        }
    }
}

/// `leaf` with its count and burst scaled by `share` (at least 1 each).
pub(crate) fn local_quota(leaf: &Leaf, quota: &Quota, share: f64) -> Quota {
    let scale = |n: u64| ((n as f64 * share).floor() as u64).max(1);
    let rate = Rate::new(scale(leaf.rate.count()), leaf.rate.span()).expect("a smaller valid rate");
    let mut local = leaf.clone();
    local.rate = rate;
    if let Some(burst) = leaf.options.burst {
        local.options.burst = Some(scale(burst));
    }
    Quota::from_leaf(&local, quota.algorithm()).unwrap_or(*quota)
}

/// Counters of decisions and of the store's failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LimiterStats {
    /// Decisions answered by the near cache without the store.
    pub near_cache_hits: u64,
    /// Calls to the store that failed with a transient error (timeouts included).
    pub store_errors: u64,
    /// Decisions taken without the store, by failure mode.
    pub failed_open: u64,
    pub failed_closed: u64,
    pub failed_local: u64,
    /// Blocks of admissions taken from the store for `prefetch=N` leaves.
    pub prefetch_blocks: u64,
    /// Decisions spent from such a block, without the store.
    pub prefetch_spent: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) near_cache_hits: AtomicU64,
    pub(crate) store_errors: AtomicU64,
    pub(crate) failed_open: AtomicU64,
    pub(crate) failed_closed: AtomicU64,
    pub(crate) failed_local: AtomicU64,
    pub(crate) prefetch_blocks: AtomicU64,
    pub(crate) prefetch_spent: AtomicU64,
    /// Local-clock nanoseconds until which the store is not asked.
    pub(crate) store_paused_until: AtomicU64,
}

/// How long the store is skipped after a transient error.
pub const STORE_PAUSE: Duration = Duration::from_millis(500);

impl Counters {
    pub(crate) fn snapshot(&self) -> LimiterStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        LimiterStats {
            near_cache_hits: get(&self.near_cache_hits),
            store_errors: get(&self.store_errors),
            failed_open: get(&self.failed_open),
            failed_closed: get(&self.failed_closed),
            failed_local: get(&self.failed_local),
            prefetch_blocks: get(&self.prefetch_blocks),
            prefetch_spent: get(&self.prefetch_spent),
        }
    }

    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
