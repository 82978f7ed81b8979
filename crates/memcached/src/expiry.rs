//! Expiry times for memcached: every key sluice writes lasts until its state is fresh again,
//! and not much longer.
//!
//! memcached reads an expiry up to 30 days as seconds from now, and a larger one as a Unix
//! time (on the server's clock), and counts in whole seconds. States carry times of the
//! callers' clocks, so an expiry is computed from the caller's `now` and rounded up, plus one
//! second for memcached's whole-second clock. memcached reads expiries as signed 32-bit
//! numbers: one past January 2038 is held to that date (the state then looks fresh a little
//! early, as if evicted).

/// Longest expiry memcached reads as relative seconds.
const MAX_RELATIVE_SECONDS: u64 = 30 * 86_400;
const NANOS: u64 = 1_000_000_000;

/// The expiry to send for a state that is fresh again at `expires_at` (ns, caller's clock),
/// written at `now`. Never 0, which would mean "never expires".
pub fn exptime(expires_at: u64, now: u64) -> u32 {
    let seconds = expires_at.saturating_sub(now).div_ceil(NANOS) + 1;
    if seconds <= MAX_RELATIVE_SECONDS {
        seconds as u32
    } else {
        (now / NANOS).saturating_add(seconds).min(i32::MAX as u64) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_then_absolute() {
        let now = 1_700_000_000 * NANOS;
        assert_eq!(exptime(now, now), 1);
        assert_eq!(exptime(now - 5, now), 1);
        assert_eq!(exptime(now + 1, now), 2);
        assert_eq!(exptime(now + 60 * NANOS, now), 61);
        let month = 31 * 86_400;
        assert_eq!(
            exptime(now + month * NANOS, now),
            (1_700_000_000 + month + 1) as u32
        );
        assert_eq!(exptime(u64::MAX, now), i32::MAX as u32);
    }
}
