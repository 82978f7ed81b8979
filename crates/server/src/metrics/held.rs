//! `sluice_leases_held{policy}`: the leases this process granted that it has not seen end.
//!
//! A lease lives in the shared store, and any server on it may release it, so no server
//! knows on its own how many the fleet holds; each knows the leases it granted. One is
//! counted here from its acquire until it is released or renewed-too-late through this
//! process, or its lease time passes (renews through this process push that on). A lease
//! released through another server stays counted here until its lease time passes. So
//! where clients release through the server they acquired from, `sum` over the servers is
//! what the fleet holds; otherwise it is an upper bound that settles within a lease time.
//!
//! At most [`MAX_TRACKED`] leases are tracked; past that, new ones are not counted (the
//! gauge says so by staying at the bound) rather than the process growing without limit.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;

/// Most leases tracked at once (about 100 bytes each).
pub(crate) const MAX_TRACKED: usize = 100_000;

/// What one tracked lease is: its policy and when its lease time passes (nanoseconds on
/// the limiter's clock).
struct Tracked {
    policy: String,
    until: u64,
}

/// The leases granted through this process and not seen ending, by lease id.
#[derive(Default)]
pub(crate) struct HeldLeases {
    leases: Mutex<HashMap<u64, Tracked>>,
}

impl HeldLeases {
    /// Lease `id` of `policy` was granted here at `now` for `lease_time`.
    pub(crate) fn granted(&self, policy: &str, id: u64, lease_time: Duration, now: u64) {
        let mut leases = self.leases.lock();
        if leases.len() >= MAX_TRACKED {
            leases.retain(|_, t| t.until > now);
            if leases.len() >= MAX_TRACKED {
                return;
            }
        }
        let until = now.saturating_add(lease_time.as_nanos() as u64);
        leases.insert(
            id,
            Tracked {
                policy: policy.to_owned(),
                until,
            },
        );
    }

    /// Lease `id` ended here: released, or found expired.
    pub(crate) fn ended(&self, id: u64) {
        self.leases.lock().remove(&id);
    }

    /// Lease `id` was renewed here and has `left` from `now`.
    pub(crate) fn renewed(&self, id: u64, left: Duration, now: u64) {
        if let Some(tracked) = self.leases.lock().get_mut(&id) {
            tracked.until = now.saturating_add(left.as_nanos() as u64);
        }
    }

    /// Leases held at `now`, by policy, sorted by policy name (forgetting the ones whose
    /// lease time has passed).
    pub(crate) fn by_policy(&self, now: u64) -> Vec<(String, u64)> {
        let mut leases = self.leases.lock();
        leases.retain(|_, t| t.until > now);
        let mut counts: HashMap<&str, u64> = HashMap::new();
        for tracked in leases.values() {
            *counts.entry(tracked.policy.as_str()).or_default() += 1;
        }
        let mut out: Vec<(String, u64)> = counts
            .into_iter()
            .map(|(policy, n)| (policy.to_owned(), n))
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_counts_until_it_ends_or_its_time_passes() {
        let held = HeldLeases::default();
        let t0 = 1_000_000_000_000;
        let s = Duration::from_secs(1);
        let at = |d: Duration| t0 + d.as_nanos() as u64;
        held.granted("exports", 1, 10 * s, t0);
        held.granted("exports", 2, 10 * s, t0);
        held.granted("logins", 3, 5 * s, t0);
        assert_eq!(
            held.by_policy(t0),
            [("exports".to_owned(), 2), ("logins".to_owned(), 1)]
        );
        held.ended(1);
        held.ended(1); // twice: harmless
        held.ended(99); // never granted here: harmless
        assert_eq!(
            held.by_policy(t0),
            [("exports".into(), 1), ("logins".into(), 1)]
        );
        // Lease 3's time passes; lease 2 is renewed at 8 s for 10 s more.
        held.renewed(2, 10 * s, at(8 * s));
        assert_eq!(held.by_policy(at(6 * s)), [("exports".into(), 1)]);
        assert_eq!(held.by_policy(at(17 * s)), [("exports".into(), 1)]);
        assert!(held.by_policy(at(18 * s)).is_empty());
    }

    #[test]
    fn tracking_is_bounded() {
        let held = HeldLeases::default();
        let t0 = 1_000_000_000_000;
        let long = Duration::from_secs(60);
        let later = t0 + long.as_nanos() as u64;
        for id in 0..MAX_TRACKED as u64 + 10 {
            held.granted("p", id, long, t0);
        }
        assert_eq!(held.by_policy(t0), [("p".into(), MAX_TRACKED as u64)]);
        // Once they have expired, there is room again.
        held.granted("p", u64::MAX, long, later);
        assert_eq!(held.by_policy(later), [("p".into(), 1)]);
    }
}
