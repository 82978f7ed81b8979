//! "Over the last minutes": a ring of [`SLOTS`] space-saving sketches, one per minute of
//! wall time, merged when read. A minute's sketch is cleared when the ring comes back to it,
//! so what is reported covers the current minute and the `SLOTS - 1` before it (4 to 5
//! minutes), and memory stays `SLOTS` sketches whatever the traffic.
//!
//! Merging keeps space-saving's guarantee: for an item, a minute that holds it says its
//! true count there is within `[count - error, count]`; a minute that does not says within
//! `[0, min]` (that minute's smallest count, 0 when it never replaced anything). Summed over
//! the minutes, the reported `count` is the upper end and `error` the width, so again
//! `count - error <= true count <= count`, with `error <= sum of the minutes' mins <= N / K`
//! (N the hits of the window). An item seen more than N / K times in the window was more
//! than N_m / K times in some minute m, so it is held there and reported.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use super::sketch::SpaceSaving;

/// Minutes kept.
pub const SLOTS: usize = 5;
/// Length of one slot.
pub const SLOT: Duration = Duration::from_secs(60);
const SLOT_NANOS: u64 = SLOT.as_nanos() as u64;

/// One item as the window reports it: its true count over the window is within
/// `[count - error, count]`. As JSON: `{"selectors": "ip=203.0.113.9", "count": 120,
/// "error": 0}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeavyHitter {
    /// The selector values counted by, `name=value` pairs by name, joined by `,` (each
    /// value cut to 128 bytes; empty for a policy without selectors).
    pub selectors: String,
    /// Hits counted for these values over the window: never fewer than there were.
    pub count: u64,
    /// How much of `count` may belong to other values: 0 when exact.
    pub error: u64,
}

#[derive(Debug)]
struct Slot {
    /// Which minute (nanoseconds since the epoch / [`SLOT`]) the sketch holds.
    minute: u64,
    sketch: SpaceSaving,
}

/// The last [`SLOTS`] minutes of one stream.
#[derive(Debug)]
pub(crate) struct Windowed {
    slots: Vec<Slot>,
}

impl Windowed {
    /// No minute seen yet; each minute's sketch holds up to `capacity` counters.
    pub fn new(capacity: usize) -> Windowed {
        Windowed {
            slots: (0..SLOTS)
                .map(|_| Slot {
                    minute: u64::MAX,
                    sketch: SpaceSaving::new(capacity),
                })
                .collect(),
        }
    }

    /// Counts one occurrence of item `hash` at `now` (nanoseconds since the epoch) and
    /// returns its label; `label` writes it, when the item enters this minute's sketch.
    #[inline]
    pub fn add(&mut self, now: u64, hash: u64, label: impl FnOnce(&mut String)) -> &str {
        let minute = now / SLOT_NANOS;
        let slot = &mut self.slots[(minute % SLOTS as u64) as usize];
        if slot.minute != minute {
            slot.sketch.clear();
            slot.minute = minute;
        }
        slot.sketch.add(hash, label)
    }

    /// The minutes that count at `now`: this one and the `SLOTS - 1` before it.
    fn live(&self, now: u64) -> impl Iterator<Item = &SpaceSaving> + Clone {
        let minute = now / SLOT_NANOS;
        self.slots
            .iter()
            .filter(move |s| s.minute <= minute && minute - s.minute < SLOTS as u64)
            .map(|s| &s.sketch)
    }

    /// Hits counted in the window at `now`: N.
    pub fn total(&self, now: u64) -> u64 {
        self.live(now).map(SpaceSaving::total).sum()
    }

    /// Counters held over every slot (at most `SLOTS` times the capacity).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.slots.iter().map(|s| s.sketch.len()).sum()
    }

    /// The `n` items with the highest counts over the window at `now`, highest first (ties:
    /// smaller error, then label).
    pub fn top(&self, now: u64, n: usize) -> Vec<HeavyHitter> {
        struct Merged<'a> {
            label: &'a str,
            upper: u64,
            lower: u64,
            /// Bit i: held in the i-th live slot.
            held: u32,
        }
        let live = self.live(now);
        let mut merged: HashMap<u64, Merged> = HashMap::new();
        for (i, sketch) in live.clone().enumerate() {
            for c in sketch.counters() {
                let m = merged.entry(c.hash).or_insert(Merged {
                    label: c.label,
                    upper: 0,
                    lower: 0,
                    held: 0,
                });
                m.upper += c.count;
                m.lower += c.count - c.error;
                m.held |= 1 << i;
            }
        }
        let mins: Vec<u64> = live.map(SpaceSaving::min).collect();
        let mut out: Vec<HeavyHitter> = merged
            .into_values()
            .map(|m| {
                let absent: u64 = mins
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| m.held & (1 << i) == 0)
                    .map(|(_, min)| min)
                    .sum();
                let count = m.upper + absent;
                HeavyHitter {
                    selectors: m.label.to_owned(),
                    count,
                    error: count - m.lower,
                }
            })
            .collect();
        out.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then(a.error.cmp(&b.error))
                .then_with(|| a.selectors.cmp(&b.selectors))
        });
        out.truncate(n);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: u64 = SLOT_NANOS;
    /// Some minute's start, far from the epoch.
    const T0: u64 = 1_700_000_040 * 1_000_000_000;

    fn add(window: &mut Windowed, now: u64, item: u64, times: usize) {
        for _ in 0..times {
            window.add(now, item, |out| out.push_str(&format!("v={item}")));
        }
    }

    fn counts(window: &Windowed, now: u64) -> Vec<(String, u64, u64)> {
        window
            .top(now, 100)
            .into_iter()
            .map(|h| (h.selectors, h.count, h.error))
            .collect()
    }

    #[test]
    fn minutes_add_up_and_fall_out_of_the_window() {
        let mut window = Windowed::new(8);
        add(&mut window, T0, 1, 3);
        add(&mut window, T0 + MINUTE + 5, 1, 2);
        add(&mut window, T0 + MINUTE + 5, 2, 4);
        assert_eq!(
            counts(&window, T0 + MINUTE + 6),
            [("v=1".into(), 5, 0), ("v=2".into(), 4, 0)]
        );
        // Still there at the last second of the fifth minute...
        let last = T0 + 5 * MINUTE - 1;
        assert_eq!(window.total(last), 9);
        // ...then the first minute leaves, then the second.
        assert_eq!(
            counts(&window, T0 + 5 * MINUTE),
            [("v=2".into(), 4, 0), ("v=1".into(), 2, 0)]
        );
        assert_eq!(counts(&window, T0 + 6 * MINUTE), []);
        assert_eq!(window.total(T0 + 6 * MINUTE), 0);
    }

    #[test]
    fn a_slot_is_cleared_when_the_ring_comes_back_to_it() {
        let mut window = Windowed::new(8);
        add(&mut window, T0, 1, 3);
        // Same slot, five minutes on: the old minute is dropped, not added to.
        add(&mut window, T0 + 5 * MINUTE, 1, 1);
        assert_eq!(counts(&window, T0 + 5 * MINUTE), [("v=1".into(), 1, 0)]);
        assert_eq!(window.len(), 1);
        // A clock read before the slot's minute (another thread's `now`) sees nothing of it.
        assert_eq!(window.total(T0), 0);
    }

    /// A minute that replaced items adds its `min` to the error of items it does not hold:
    /// they may have been there, unseen.
    #[test]
    fn merged_counts_bracket_the_truth() {
        let mut window = Windowed::new(2);
        // Minute 1: 1 x5, then 2 and 3 fight for the second counter.
        add(&mut window, T0, 1, 5);
        add(&mut window, T0, 2, 1);
        add(&mut window, T0, 3, 1);
        // Minute 2: 2 x4 only (exact).
        add(&mut window, T0 + MINUTE, 2, 4);
        let top = counts(&window, T0 + MINUTE);
        // 1: 5 exact in minute 1, absent in minute 2 (min 0): 5 exact.
        // 2: absent from minute 1 (replaced; min there 2), 4 in minute 2: 4..6.
        // 3: 2 with error 1 in minute 1, absent from minute 2: 1..2.
        assert_eq!(
            top,
            [
                ("v=2".into(), 6, 2),
                ("v=1".into(), 5, 0),
                ("v=3".into(), 2, 1)
            ]
        );
    }

    #[test]
    fn heavy_items_over_several_minutes_are_found_within_the_bound() {
        const K: usize = 16;
        let mut window = Windowed::new(K);
        let mut unique = 0u64;
        let mut truth = [0u64; 5];
        for minute in 0..SLOTS as u64 {
            for step in 0..4_000u64 {
                let now = T0 + minute * MINUTE + step;
                // Every second hit is one of 5 heavy items (400 a minute, above N_m / K =
                // 250), the others never repeat.
                if step % 2 == 0 {
                    let heavy = (step / 2) % 5;
                    truth[heavy as usize] += 1;
                    add(&mut window, now, 1_000_000 + heavy, 1);
                } else {
                    unique += 1;
                    add(&mut window, now, unique, 1);
                }
            }
        }
        let now = T0 + 4 * MINUTE + 59 * 1_000_000_000;
        let n = window.total(now);
        assert_eq!(n, 20_000);
        assert_eq!(window.len(), SLOTS * K, "memory stays SLOTS x K counters");
        let top = window.top(now, 5);
        for (i, &t) in truth.iter().enumerate() {
            let h = top
                .iter()
                .find(|h| h.selectors == format!("v={}", 1_000_000 + i))
                .unwrap_or_else(|| panic!("heavy {i} missing from {top:?}"));
            assert!(h.count - h.error <= t && t <= h.count, "{h:?} vs {t}");
            assert!(h.error <= n / K as u64, "{h:?}");
        }
    }
}
