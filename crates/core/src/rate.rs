//! Rates: `N/span`, where span is an optional multiplier and a unit.

use std::fmt;
use std::time::Duration;

/// Largest count a rate, burst or window may name. Larger values are rejected as absurd:
/// they cannot be meant, and rejecting them keeps every product in the algorithms far from
/// overflow.
pub const MAX_COUNT: u64 = 1_000_000_000_000;

/// Longest span a rate may cover (ten years of 365 days).
pub const MAX_SPAN: Duration = Duration::from_secs(10 * 365 * 86_400);

/// The unit of a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Year,
}

impl Unit {
    /// All units, shortest first.
    pub const ALL: [Unit; 6] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Year,
    ];

    /// Length of one unit in seconds (a year is 365 days, a day 86,400 seconds).
    pub const fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Year => 365 * 86_400,
        }
    }

    /// The short name used when printing (`s`, `m`, `h`, `d`, `w`, `y`).
    pub const fn short(self) -> &'static str {
        match self {
            Unit::Second => "s",
            Unit::Minute => "m",
            Unit::Hour => "h",
            Unit::Day => "d",
            Unit::Week => "w",
            Unit::Year => "y",
        }
    }

    /// Reads a unit name, short or long, singular or plural, case-insensitively.
    pub fn from_name(name: &str) -> Option<Unit> {
        let unit = match name.to_ascii_lowercase().as_str() {
            "s" | "sec" | "secs" | "second" | "seconds" => Unit::Second,
            "m" | "min" | "mins" | "minute" | "minutes" => Unit::Minute,
            "h" | "hr" | "hrs" | "hour" | "hours" => Unit::Hour,
            "d" | "day" | "days" => Unit::Day,
            "w" | "wk" | "week" | "weeks" => Unit::Week,
            "y" | "yr" | "year" | "years" => Unit::Year,
            _ => return None,
        };
        Some(unit)
    }
}

/// A span of time written as an optional multiplier and a unit: `s`, `5m`, `10min`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Span {
    multiplier: u64,
    unit: Unit,
}

impl Span {
    /// A span of `multiplier` units. Zero and spans longer than [`MAX_SPAN`] are rejected.
    pub const fn new(multiplier: u64, unit: Unit) -> Result<Span, RateError> {
        if multiplier == 0 {
            return Err(RateError::ZeroSpan);
        }
        match multiplier.checked_mul(unit.seconds()) {
            Some(secs) if secs <= MAX_SPAN.as_secs() => Ok(Span { multiplier, unit }),
            _ => Err(RateError::SpanTooLong),
        }
    }

    pub const fn multiplier(self) -> u64 {
        self.multiplier
    }

    pub const fn unit(self) -> Unit {
        self.unit
    }

    /// The span in nanoseconds (always below 2^59, so sums of a few spans cannot overflow).
    pub const fn nanos(self) -> u64 {
        self.multiplier * self.unit.seconds() * 1_000_000_000
    }

    pub const fn duration(self) -> Duration {
        Duration::from_secs(self.multiplier * self.unit.seconds())
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.multiplier == 1 {
            f.write_str(self.unit.short())
        } else {
            write!(f, "{}{}", self.multiplier, self.unit.short())
        }
    }
}

/// `count` hits per `span`: `10/s`, `100/5m`, `1000/day`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rate {
    count: u64,
    span: Span,
}

impl Rate {
    /// A rate of `count` per `span`. Zero and counts above [`MAX_COUNT`] are rejected.
    pub fn new(count: u64, span: Span) -> Result<Rate, RateError> {
        if count == 0 {
            return Err(RateError::ZeroCount);
        }
        if count > MAX_COUNT {
            return Err(RateError::CountTooLarge);
        }
        Ok(Rate { count, span })
    }

    pub const fn count(self) -> u64 {
        self.count
    }

    pub const fn span(self) -> Span {
        self.span
    }

    /// The emission interval in nanoseconds, rounded up so that rounding can only make the
    /// limit stricter, never looser. Always at least 1.
    pub const fn interval_nanos(self) -> u64 {
        self.span.nanos().div_ceil(self.count)
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.count, self.span)
    }
}

/// Why a rate (or a size in a rule) is not acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RateError {
    #[error("a rate's count must be at least 1")]
    ZeroCount,
    #[error("a count above {MAX_COUNT} is not a meaningful limit")]
    CountTooLarge,
    #[error("a span must be at least one unit long")]
    ZeroSpan,
    #[error("a span longer than ten years is not a meaningful window")]
    SpanTooLong,
}
