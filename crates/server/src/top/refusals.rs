//! The last refusals, in a ring of fixed size whose entries' strings are reused: recording
//! one under a flood allocates nothing once the ring is full.

use std::time::Duration;

use serde::Serialize;

/// One refused hit (or one a shadow-mode policy would have refused). As JSON, times in
/// seconds (fractional): `{"at": 1700000000.25, "policy": "login", "selectors":
/// "ip=203.0.113.9", "denial": "limited", "retry_after": 2.5, "shadow": false}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// When, in nanoseconds since the Unix epoch (the limiter's clock).
    #[serde(serialize_with = "super::nanos_as_seconds")]
    pub at: u64,
    /// The policy's name, or the kind of a policy made on the fly (`cl.throttle`,
    /// `envoy.override`), as in the metrics.
    pub policy: String,
    /// The selector values the policy counts by, as in [`HeavyHitter`](super::HeavyHitter).
    pub selectors: String,
    /// Why (`limited`, `penalized`, `cost_exceeds_capacity`, `store_unavailable`); `None`
    /// for a shadow-mode policy's would-be refusal, which was admitted.
    pub denial: Option<&'static str>,
    /// When the same hit would pass, if known (see `Decision::retry_after`).
    #[serde(serialize_with = "super::maybe_seconds")]
    pub retry_after: Option<Duration>,
    /// A shadow-mode policy would have refused the hit; it was admitted.
    pub shadow: bool,
}

/// Up to `capacity` refusals, oldest overwritten first.
#[derive(Debug)]
pub(crate) struct Ring {
    entries: Vec<Refusal>,
    /// Where the next one goes once the ring is full.
    next: usize,
    capacity: usize,
}

impl Ring {
    pub fn new(capacity: usize) -> Ring {
        Ring {
            entries: Vec::new(),
            next: 0,
            capacity,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Records a refusal; `selectors` writes the label into an empty string.
    pub fn record(
        &mut self,
        at: u64,
        policy: &str,
        selectors: impl FnOnce(&mut String),
        denial: Option<&'static str>,
        retry_after: Option<Duration>,
        shadow: bool,
    ) {
        if self.capacity == 0 {
            return;
        }
        let entry = if self.entries.len() < self.capacity {
            self.entries.push(Refusal {
                at,
                policy: String::new(),
                selectors: String::new(),
                denial,
                retry_after,
                shadow,
            });
            self.entries.last_mut().expect("just pushed")
        } else {
            let entry = &mut self.entries[self.next];
            self.next = (self.next + 1) % self.capacity;
            entry.at = at;
            entry.denial = denial;
            entry.retry_after = retry_after;
            entry.shadow = shadow;
            entry.policy.clear();
            entry.selectors.clear();
            entry
        };
        entry.policy.push_str(policy);
        selectors(&mut entry.selectors);
    }

    /// The last `n` refusals, newest first.
    pub fn recent(&self, n: usize) -> Vec<Refusal> {
        // Oldest first: from `next` to the end, then the start (before the ring is full,
        // `next` is 0 and the order is the push order).
        let (newer, older) = self.entries.split_at(self.next);
        older.iter().chain(newer).rev().take(n).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(ring: &mut Ring, at: u64) {
        ring.record(
            at,
            "login",
            |out| out.push_str(&format!("ip={at}")),
            Some("limited"),
            Some(Duration::from_secs(at)),
            false,
        );
    }

    #[test]
    fn keeps_the_last_ones_newest_first() {
        let mut ring = Ring::new(3);
        assert_eq!(ring.recent(10), []);
        for at in 1..=2 {
            record(&mut ring, at);
        }
        let ats = |ring: &Ring, n| ring.recent(n).iter().map(|r| r.at).collect::<Vec<_>>();
        assert_eq!(ats(&ring, 10), [2, 1]);
        for at in 3..=7 {
            record(&mut ring, at);
        }
        assert_eq!(ats(&ring, 10), [7, 6, 5]);
        assert_eq!(ats(&ring, 2), [7, 6]);
        let newest = &ring.recent(1)[0];
        assert_eq!(
            (newest.policy.as_str(), newest.selectors.as_str()),
            ("login", "ip=7")
        );
        assert_eq!(ring.entries.len(), 3);
    }

    #[test]
    fn a_ring_of_nothing_keeps_nothing() {
        let mut ring = Ring::new(0);
        record(&mut ring, 1);
        assert_eq!(ring.recent(10), []);
    }
}
