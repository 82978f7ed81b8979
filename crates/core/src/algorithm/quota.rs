//! A leaf's validated parameters, ready for the algorithms.

use crate::algorithm::{Algorithm, State, Verdict};
use crate::algorithm::{concurrency, fixed_window, gcra, sliding_log, sliding_window};
use crate::rule::{Leaf, MAX_WINDOWS};

/// Sub-windows of a sliding window counter when the leaf names none.
pub const DEFAULT_WINDOWS: u32 = 10;
/// Most entries a sliding log may hold (its memory is O(limit)).
pub const MAX_LOG_LIMIT: u64 = 1_000_000;
/// Longest time a full GCRA bucket may take to drain: bounds every timestamp the algorithm
/// writes far below `u64::MAX` nanoseconds.
pub const MAX_BUCKET_NANOS: u64 = 100 * 365 * 86_400 * 1_000_000_000;

/// The parameters of one leaf, validated: every combination that reaches the algorithms is
/// meaningful and overflow-safe.
///
/// Times are counted in *ticks*: nanoseconds by default. A store whose arithmetic is coarser
/// takes [`Quota::with_tick`]: Redis's Lua numbers are doubles, exact only below 2^53, so the
/// Redis store counts microseconds (which is also the resolution of Redis `TIME`). The
/// interval is rounded up to a whole tick, so a coarser tick can only make a limit stricter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quota {
    algorithm: Algorithm,
    limit: u64,
    /// The rate's span in nanoseconds, whatever the tick.
    span: u64,
    /// Nanoseconds per tick; divides one second.
    tick: u64,
    window: u64,
    interval: u64,
    burst: u64,
    windows: u32,
}

/// Why a leaf cannot become a quota.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QuotaError {
    #[error("`burst` only applies to gcra, not to {0}")]
    BurstWithoutGcra(Algorithm),
    #[error("`windows` only applies to sliding-window, not to {0}")]
    WindowsWithoutSlidingWindow(Algorithm),
    #[error(
        "burst {burst} at one hit per {interval_ns} ns would take more than 100 years to drain"
    )]
    BucketTooDeep { burst: u64, interval_ns: u64 },
    #[error("a sliding log keeps one entry per hit; a limit above {MAX_LOG_LIMIT} is too large")]
    LogTooLarge,
    #[error("sub-windows must number from 1 to {MAX_WINDOWS}")]
    BadWindows,
    #[error("a tick of {0} ns does not divide one second")]
    BadTick(u64),
    #[error(
        "a concurrency leaf keeps one entry per lease; more than {} at once is too many",
        concurrency::MAX_CONCURRENT
    )]
    TooConcurrent,
    #[error("concurrency cannot be a policy's default algorithm; write `N concurrent` leaves")]
    ConcurrencyByDefault,
}

impl Quota {
    /// The quota of `leaf`, with `default` as its algorithm when the leaf names none.
    pub fn from_leaf(leaf: &Leaf, default: Algorithm) -> Result<Quota, QuotaError> {
        let algorithm = match leaf.options.algorithm {
            Some(algorithm) => algorithm,
            None if default == Algorithm::Concurrency => {
                return Err(QuotaError::ConcurrencyByDefault);
            }
            None => default,
        };
        let rate = leaf.rate;
        if leaf.options.burst.is_some() && algorithm != Algorithm::Gcra {
            return Err(QuotaError::BurstWithoutGcra(algorithm));
        }
        if leaf.options.windows.is_some() && algorithm != Algorithm::SlidingWindow {
            return Err(QuotaError::WindowsWithoutSlidingWindow(algorithm));
        }
        let windows = leaf.options.windows.unwrap_or(DEFAULT_WINDOWS);
        if windows == 0 || windows > MAX_WINDOWS {
            return Err(QuotaError::BadWindows);
        }
        let interval = rate.interval_nanos();
        let burst = leaf.options.burst.unwrap_or(rate.count());
        if algorithm == Algorithm::Gcra
            && burst
                .checked_mul(interval)
                .is_none_or(|tau| tau > MAX_BUCKET_NANOS)
        {
            return Err(QuotaError::BucketTooDeep {
                burst,
                interval_ns: interval,
            });
        }
        if algorithm == Algorithm::SlidingLog && rate.count() > MAX_LOG_LIMIT {
            return Err(QuotaError::LogTooLarge);
        }
        if algorithm == Algorithm::Concurrency && rate.count() > concurrency::MAX_CONCURRENT {
            return Err(QuotaError::TooConcurrent);
        }
        Ok(Quota {
            algorithm,
            limit: rate.count(),
            span: rate.span().nanos(),
            tick: 1,
            window: rate.span().nanos(),
            interval,
            burst,
            windows,
        })
    }

    /// The same quota counted in ticks of `tick_ns` nanoseconds (which must divide one
    /// second). The emission interval is rounded up to a whole tick.
    pub fn with_tick(&self, tick_ns: u64) -> Result<Quota, QuotaError> {
        if tick_ns == 0 || 1_000_000_000 % tick_ns != 0 {
            return Err(QuotaError::BadTick(tick_ns));
        }
        // Spans are whole seconds, so the window is a whole number of ticks.
        let window = self.span / tick_ns;
        Ok(Quota {
            tick: tick_ns,
            window,
            interval: window.div_ceil(self.limit),
            ..*self
        })
    }

    /// Nanoseconds per tick (1 unless [`Quota::with_tick`] chose another).
    pub const fn tick(&self) -> u64 {
        self.tick
    }

    /// A GCRA quota of `rate` with the given burst (`None` = the rate's count).
    pub fn gcra(rate: crate::Rate, burst: Option<u64>) -> Result<Quota, QuotaError> {
        let mut leaf = Leaf::new(rate);
        leaf.options.burst = burst;
        Quota::from_leaf(&leaf, Algorithm::Gcra)
    }

    pub const fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The rate's count: hits per window (for a concurrency leaf, leases held at once).
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// The rate's span, in ticks; for a concurrency leaf, the lease time.
    pub const fn window_ticks(&self) -> u64 {
        self.window
    }

    /// GCRA emission interval: span / count, rounded up, in ticks.
    pub const fn interval_ticks(&self) -> u64 {
        self.interval
    }

    /// GCRA capacity (hits admitted at once from a full bucket).
    pub const fn burst(&self) -> u64 {
        self.burst
    }

    /// Sliding window counter: number of sub-windows.
    pub const fn windows(&self) -> u32 {
        self.windows
    }

    /// Sliding window counter: length of one sub-window in ticks, rounded up so that
    /// the summed sub-windows always cover at least the whole window.
    pub const fn sub_window_ticks(&self) -> u64 {
        self.window.div_ceil(self.windows as u64)
    }

    /// The largest cost one hit may have and still be admitted from a fresh state.
    pub const fn capacity(&self) -> u64 {
        match self.algorithm {
            Algorithm::Gcra => self.burst,
            _ => self.limit,
        }
    }

    /// The state of an identifier never seen: a full bucket, empty counters.
    pub fn fresh_state(&self) -> State {
        match self.algorithm {
            Algorithm::Gcra => State::Gcra { tat: 0 },
            Algorithm::SlidingWindow => State::SlidingWindow(sliding_window::Counters::new(self)),
            Algorithm::SlidingLog => State::SlidingLog(sliding_log::Log::default()),
            Algorithm::FixedWindow => State::FixedWindow {
                window: 0,
                count: 0,
            },
            Algorithm::Concurrency => State::Concurrency(concurrency::Leases::default()),
        }
    }

    /// Whether `state` was made by this quota's algorithm (and shape). A mismatched state
    /// (the same identifier reused with another algorithm) is treated as fresh.
    pub fn fits(&self, state: &State) -> bool {
        match (self.algorithm, state) {
            (Algorithm::Gcra, State::Gcra { .. }) => true,
            (Algorithm::SlidingWindow, State::SlidingWindow(c)) => c.len() == self.windows,
            (Algorithm::SlidingLog, State::SlidingLog(_)) => true,
            (Algorithm::FixedWindow, State::FixedWindow { .. }) => true,
            (Algorithm::Concurrency, State::Concurrency(_)) => true,
            _ => false,
        }
    }

    /// What admitting a hit of `cost` at `now` would do to `state`. Changes nothing.
    pub fn verdict(&self, state: &State, now: u64, cost: u64) -> Verdict {
        if !self.fits(state) {
            return self.verdict(&self.fresh_state(), now, cost);
        }
        match state {
            State::Gcra { tat } => gcra::verdict(self, *tat, now, cost),
            State::SlidingWindow(counters) => sliding_window::verdict(self, counters, now, cost),
            State::SlidingLog(log) => sliding_log::verdict(self, log, now, cost),
            State::FixedWindow { window, count } => {
                fixed_window::verdict(self, *window, *count, now, cost)
            }
            State::Concurrency(leases) => concurrency::verdict(self, leases, now, cost),
        }
    }

    /// [`Quota::verdict`] for a GCRA quota whose state is the bare TAT word, for stores
    /// that keep it in one atomic word. Meaningless for other algorithms.
    #[inline]
    pub fn gcra_verdict(&self, tat: u64, now: u64, cost: u64) -> Verdict {
        debug_assert_eq!(self.algorithm, Algorithm::Gcra);
        gcra::verdict(self, tat, now, cost)
    }

    /// [`Quota::verdict`] for a sliding-window quota whose counts are read oldest first, the
    /// last of them sub-window `newest`'s (as [`Counters::from_parts`] takes them), for
    /// stores that read them that way: no [`State`] is built. Meaningless for other
    /// algorithms, or with other than [`Quota::windows`] counts.
    ///
    /// [`Counters::from_parts`]: crate::algorithm::sliding_window::Counters::from_parts
    pub fn sliding_window_verdict(
        &self,
        newest: u64,
        oldest_first: &[u64],
        now: u64,
        cost: u64,
    ) -> Verdict {
        debug_assert_eq!(self.algorithm, Algorithm::SlidingWindow);
        debug_assert_eq!(oldest_first.len(), self.windows() as usize);
        sliding_window::verdict_of_parts(self, newest, oldest_first, now, cost)
    }

    /// For a GCRA quota's bare TAT word: whether [`Quota::gcra_verdict`] would admit a hit
    /// of `cost`, and whether that cost can ever be admitted (`retry` is not `Never`), without
    /// computing the counts a verdict carries.
    #[inline]
    pub fn gcra_admits(&self, tat: u64, now: u64, cost: u64) -> (bool, bool) {
        debug_assert_eq!(self.algorithm, Algorithm::Gcra);
        gcra::admits(self, tat, now, cost)
    }

    /// [`Quota::record`] for a GCRA quota's bare TAT word: the word after the hit.
    #[inline]
    pub fn gcra_record(&self, tat: u64, now: u64, cost: u64) -> u64 {
        debug_assert_eq!(self.algorithm, Algorithm::Gcra);
        gcra::record(self, tat, now, cost)
    }

    /// Records a hit of `cost` at `now` in `state`, admitted or not. Recording a denied hit
    /// (for policies that count denied attempts) is bounded: it can delay the identifier by
    /// at most about one more window, never lock it out for good.
    ///
    /// A concurrency state only drops its expired leases here: a lease is taken with
    /// [`concurrency::acquire`], which needs the lease's id, so a hit that merely passes a
    /// concurrency leaf holds no slot.
    pub fn record(&self, state: &mut State, now: u64, cost: u64) {
        if !self.fits(state) {
            *state = self.fresh_state();
        }
        match state {
            State::Gcra { tat } => *tat = gcra::record(self, *tat, now, cost),
            State::SlidingWindow(counters) => counters.record(self, now, cost),
            State::SlidingLog(log) => log.record(self, now, cost),
            State::FixedWindow { window, count } => {
                (*window, *count) = fixed_window::record(self, *window, *count, now, cost)
            }
            State::Concurrency(leases) => {
                leases.drop_expired(now);
            }
        }
    }

    /// When `state` becomes equivalent to a fresh state (ticks, same epoch as `now`).
    /// A store may drop it from then on.
    pub fn expires_at(&self, state: &State) -> u64 {
        match state {
            State::Gcra { tat } => *tat,
            State::SlidingWindow(counters) => counters.expires_at(self),
            State::SlidingLog(log) => log.expires_at(self),
            State::FixedWindow { window, count } => {
                if *count == 0 {
                    0
                } else {
                    window.saturating_add(1).saturating_mul(self.window)
                }
            }
            State::Concurrency(leases) => leases.expires_at(),
        }
    }
}
