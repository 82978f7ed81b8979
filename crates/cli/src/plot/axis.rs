//! Round numbers for axes: the bin width, time ticks and their unit, hit-count ticks.
//!
//! Integer nanoseconds and plain arithmetic only (no `log10` or `powf`, whose last bit may
//! differ between C libraries), so the same trace draws the same bytes everywhere.

const MS: u64 = 1_000_000;
const S: u64 = 1_000 * MS;

/// Widths a bin or a tick step may have, shortest first; past a day, days double.
const ROUND_SPANS: [u64; 23] = [
    10 * MS,
    20 * MS,
    50 * MS,
    100 * MS,
    200 * MS,
    500 * MS,
    S,
    2 * S,
    5 * S,
    10 * S,
    15 * S,
    30 * S,
    60 * S,
    120 * S,
    300 * S,
    600 * S,
    900 * S,
    1_800 * S,
    3_600 * S,
    7_200 * S,
    3 * 3_600 * S,
    6 * 3_600 * S,
    12 * 3_600 * S,
];

/// Round spans in increasing order, without end.
fn round_spans() -> impl Iterator<Item = u64> {
    ROUND_SPANS
        .into_iter()
        .chain(std::iter::successors(Some(86_400 * S), |d| {
            d.checked_mul(2)
        }))
}

/// The shortest round bin width that covers `0..=end` in at most `max_bins` bins, and how
/// many bins that makes.
pub fn bin_width(end: u64, max_bins: u64) -> (u64, usize) {
    let width = round_spans()
        .find(|w| end / w < max_bins)
        .unwrap_or(u64::MAX);
    (width, (end / width + 1) as usize)
}

/// The unit time labels are written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeUnit {
    pub nanos: u64,
    /// As in axis titles: `s`, `min`, `h`, `d`.
    pub name: &'static str,
}

/// Seconds up to 3 minutes, minutes up to 3 hours, hours up to 3 days, then days.
pub fn time_unit(extent: u64) -> TimeUnit {
    let (nanos, name) = match extent {
        e if e <= 180 * S => (S, "s"),
        e if e <= 3 * 3_600 * S => (60 * S, "min"),
        e if e <= 3 * 86_400 * S => (3_600 * S, "h"),
        _ => (86_400 * S, "d"),
    };
    TimeUnit { nanos, name }
}

/// A tick step for an axis `extent` long: round, a whole number of bins, about 6 to 12
/// ticks.
pub fn time_step(extent: u64, bin: u64) -> u64 {
    round_spans()
        .find(|&step| step >= extent / 10 && step % bin == 0)
        .unwrap_or(extent)
}

/// `nanos` in `unit`, with up to 3 decimals and no trailing zeros: `2`, `2.5`, `0.125`.
pub fn time_label(nanos: u64, unit: TimeUnit) -> String {
    let thousandths = (u128::from(nanos) * 1_000 / u128::from(unit.nanos)) as u64;
    decimal(thousandths, 3)
}

/// `value / 10^places` with trailing zeros trimmed.
fn decimal(value: u64, places: u32) -> String {
    let scale = 10u64.pow(places);
    let (whole, fraction) = (value / scale, value % scale);
    if fraction == 0 {
        return whole.to_string();
    }
    let digits = format!("{fraction:0width$}", width = places as usize);
    format!("{whole}.{}", digits.trim_end_matches('0'))
}

/// A bin width as a reader says it: `5 s`, `1 min`, `0.5 s`, `2 h`.
pub fn span_label(nanos: u64) -> String {
    let unit = match nanos {
        n if n < 60 * S || n % (60 * S) != 0 => time_unit(0),
        n if n < 3_600 * S || n % (3_600 * S) != 0 => time_unit(3_600 * S),
        n if n < 86_400 * S || n % (86_400 * S) != 0 => time_unit(86_400 * S),
        _ => time_unit(u64::MAX),
    };
    format!("{} {}", time_label(nanos, unit), unit.name)
}

/// A round top for a count axis at least `max`, and the step between its ticks (1, 2 or 5
/// times a power of ten, at most 5 ticks above zero).
pub fn count_scale(max: f64) -> (f64, f64) {
    let mut step = 1.0;
    'search: loop {
        for factor in [1.0, 2.0, 5.0] {
            if max <= step * factor * 5.0 {
                step *= factor;
                break 'search;
            }
        }
        step *= 10.0;
    }
    let top = (max / step).ceil().max(1.0) * step;
    (top, step)
}

/// A count as a label: whole when it is, else one decimal (`8.3`).
pub fn count_label(value: f64) -> String {
    if (value - value.round()).abs() < 0.05 {
        format!("{}", value.round())
    } else {
        format!("{value:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_are_round_and_few() {
        assert_eq!(bin_width(0, 75), (10 * MS, 1));
        assert_eq!(bin_width(300 * S, 75), (5 * S, 61));
        assert_eq!(bin_width(3_600 * S, 75), (60 * S, 61));
        assert_eq!(bin_width(100 * 86_400 * S, 75), (2 * 86_400 * S, 51));
    }

    #[test]
    fn labels_read_well() {
        assert_eq!(span_label(5 * S), "5 s");
        assert_eq!(span_label(500 * MS), "0.5 s");
        assert_eq!(span_label(90 * S), "90 s");
        assert_eq!(span_label(120 * S), "2 min");
        assert_eq!(span_label(7_200 * S), "2 h");
        assert_eq!(time_label(150 * S, time_unit(600 * S)), "2.5");
        assert_eq!(count_label(8.333), "8.3");
        assert_eq!(count_label(100.0), "100");
    }

    #[test]
    fn count_axes_end_on_a_tick() {
        assert_eq!(count_scale(0.0), (1.0, 1.0));
        assert_eq!(count_scale(7.0), (8.0, 2.0));
        assert_eq!(count_scale(23.0), (25.0, 5.0));
        assert_eq!(count_scale(140.0), (150.0, 50.0));
        assert_eq!(time_step(300 * S, 5 * S), 30 * S);
    }
}
