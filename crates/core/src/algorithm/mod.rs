//! The algorithms: pure functions from (state, now, quota, cost) to a verdict and a new state.
//!
//! Time is an argument everywhere: `now` is nanoseconds since an epoch the caller chooses
//! (the Unix epoch for real clocks). Nothing here reads a clock.

use std::fmt;
use std::str::FromStr;

/// Which algorithm a leaf uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// Generic cell rate algorithm, a token bucket kept as one timestamp. Exact. The default.
    #[default]
    Gcra,
    /// Sub-window counters summed over the window. Approximate within a documented bound.
    SlidingWindow,
    /// Every admitted hit's timestamp within the window. Exact; memory O(limit).
    SlidingLog,
    /// One counter per aligned window. Exact per window; up to 2x the limit across an edge.
    FixedWindow,
    /// At most N leases held at once (`user:3 concurrent`). Not a rate: only a concurrency
    /// leaf has it, written with `concurrent` rather than `algorithm=`, and it is not in
    /// [`Algorithm::ALL`] (the rate algorithms).
    Concurrency,
}

impl Algorithm {
    /// The rate algorithms (every one but [`Algorithm::Concurrency`]).
    pub const ALL: [Algorithm; 4] = [
        Algorithm::Gcra,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
        Algorithm::FixedWindow,
    ];

    /// The name used in rules and config: `gcra`, `sliding-window`, `sliding-log`, `fixed-window`.
    pub const fn name(self) -> &'static str {
        match self {
            Algorithm::Gcra => "gcra",
            Algorithm::SlidingWindow => "sliding-window",
            Algorithm::SlidingLog => "sliding-log",
            Algorithm::FixedWindow => "fixed-window",
            Algorithm::Concurrency => "concurrency",
        }
    }

    /// Reads a rate algorithm's name; `token-bucket` is accepted as another name for GCRA and
    /// `_` for `-`. `concurrency` is not read here: a concurrency leaf says `N concurrent`.
    pub fn from_name(name: &str) -> Option<Algorithm> {
        let name = name.to_ascii_lowercase().replace('_', "-");
        match name.as_str() {
            "gcra" | "token-bucket" => Some(Algorithm::Gcra),
            "sliding-window" => Some(Algorithm::SlidingWindow),
            "sliding-log" => Some(Algorithm::SlidingLog),
            "fixed-window" => Some(Algorithm::FixedWindow),
            _ => None,
        }
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error for an unknown algorithm name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown algorithm `{0}` (expected gcra, sliding-window, sliding-log or fixed-window)")]
pub struct UnknownAlgorithm(pub String);

impl FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::from_name(s).ok_or_else(|| UnknownAlgorithm(s.to_owned()))
    }
}

pub mod concurrency;
pub mod fixed_window;
pub mod gcra;
mod quota;
pub mod settle;
pub mod sliding_log;
pub mod sliding_window;

pub use quota::{DEFAULT_WINDOWS, MAX_BUCKET_NANOS, MAX_LOG_LIMIT, Quota, QuotaError};

/// The state one identifier holds, per algorithm.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum State {
    /// GCRA: the theoretical arrival time, in nanoseconds. 0 (or any past time) = full bucket.
    Gcra {
        tat: u64,
    },
    SlidingWindow(sliding_window::Counters),
    SlidingLog(sliding_log::Log),
    /// Fixed window: the window number (`now / span`) and its count.
    FixedWindow {
        window: u64,
        count: u64,
    },
    /// Concurrency: the leases held.
    Concurrency(concurrency::Leases),
}

/// When a denied hit could pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Admitted now.
    Now,
    /// Admitted after this many nanoseconds if nothing else arrives, and not one earlier.
    After(u64),
    /// Never: the cost is above the capacity.
    Never,
}

/// One leaf's answer to one hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    /// The capacity reported to clients: the burst for GCRA, the count otherwise.
    pub limit: u64,
    /// Hits of cost 1 still admissible after this one (if admitted) or now (if denied).
    pub remaining: u64,
    /// Nanoseconds until the state is fresh again (counting this hit if admitted).
    pub reset_after: u64,
    pub retry: Retry,
}
