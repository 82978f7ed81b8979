//! Durations written in config: `500ms`, `1s`, `15m`, `2h`, `1d`.

use std::time::Duration;

use sluice_core::Unit;

/// Reads `N` followed by a unit (`ms` or any rate unit name). Zero is allowed; the caller
/// decides whether it makes sense.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let number: u64 = number.parse().map_err(|_| {
        format!("`{text}` is not a duration (expected a number and a unit, like `30s` or `15m`)")
    })?;
    let unit = unit.trim();
    if matches!(unit, "ms" | "millis" | "milliseconds") {
        return Ok(Duration::from_millis(number));
    }
    let unit = Unit::from_name(unit)
        .ok_or_else(|| format!("`{text}` has no known unit (ms, s, m, h, d, w, y)"))?;
    number
        .checked_mul(unit.seconds())
        .map(Duration::from_secs)
        .ok_or_else(|| format!("`{text}` is too long a duration"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("15m"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("2 hours"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("m").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("99999999999999999999s").is_err());
    }
}
