//! The space-saving sketch (Metwally, Agrawal and El Abbadi, "Efficient computation of
//! frequent and top-k elements in data streams", 2005): the most frequent items of a stream
//! in a fixed number of counters, whatever the number of distinct items.
//!
//! Each of the `capacity` (K) counters holds an item, its count and its overestimation
//! error. An item already held is counted; a new item takes a free counter, or else
//! replaces the item with the smallest count `min`, inheriting `min + 1` as its count and
//! `min` as its error. After N items:
//!
//! - every counter's `count - error <= true count <= count`;
//! - an item not held occurred at most `min` times, and `min <= N / K` (the K counts sum
//!   to N);
//! - so every item occurring more than N / K times is held.
//!
//! Until K distinct items have been seen, nothing is replaced and every count is exact.

/// Up to `capacity` counters. Items are named by a 64-bit hash (two items with the same hash
/// are one item); a held item's label is written only when it enters, into a buffer reused
/// from the item it replaced, so a flood of new items allocates nothing once warm.
#[derive(Debug)]
pub(crate) struct SpaceSaving {
    capacity: usize,
    /// Kept apart so that the two scans of the hot path (find an item, find the minimum)
    /// each read one dense array.
    hashes: Vec<u64>,
    counts: Vec<u64>,
    errors: Vec<u64>,
    labels: Vec<String>,
    /// Items counted since the last `clear`: N.
    total: u64,
    /// At most the smallest count (counts only grow), and where to look for it next: a
    /// flood of new items finds the minimum in amortised constant time instead of a scan.
    floor: u64,
    cursor: usize,
}

/// One counter, as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counter<'a> {
    pub hash: u64,
    pub label: &'a str,
    pub count: u64,
    pub error: u64,
}

impl SpaceSaving {
    /// An empty sketch of `capacity` counters (at least one). Memory grows as items arrive,
    /// up to `capacity` counters.
    pub fn new(capacity: usize) -> SpaceSaving {
        SpaceSaving {
            capacity: capacity.max(1),
            hashes: Vec::new(),
            counts: Vec::new(),
            errors: Vec::new(),
            labels: Vec::new(),
            total: 0,
            floor: 0,
            cursor: 0,
        }
    }

    /// Counts one occurrence of the item `hash` and returns its label; `label` writes the
    /// label into an empty string, and is called only when the item enters.
    #[inline]
    pub fn add(&mut self, hash: u64, label: impl FnOnce(&mut String)) -> &str {
        self.total += 1;
        if let Some(i) = self.find(hash) {
            self.counts[i] += 1;
            return &self.labels[i];
        }
        if self.hashes.len() < self.capacity {
            let mut text = String::new();
            label(&mut text);
            self.hashes.push(hash);
            self.counts.push(1);
            self.errors.push(0);
            self.labels.push(text);
            return self.labels.last().expect("just pushed");
        }
        let i = self.min_index();
        let min = self.counts[i];
        self.hashes[i] = hash;
        self.counts[i] = min + 1;
        self.errors[i] = min;
        self.labels[i].clear();
        label(&mut self.labels[i]);
        &self.labels[i]
    }

    /// Where `hash` is held. Compares a block of 8 at a time without stopping early, which
    /// the compiler turns into vector compares.
    #[inline]
    fn find(&self, hash: u64) -> Option<usize> {
        self.hashes
            .chunks(8)
            .enumerate()
            .find(|(_, block)| block.iter().fold(false, |any, &h| any | (h == hash)))
            .and_then(|(b, block)| Some(b * 8 + block.iter().position(|&h| h == hash)?))
    }

    /// A counter with the smallest count. A counter at the floor is one; past the cursor,
    /// none is left below it once the scan has passed (counts only grow), so the floor is
    /// raised to the true minimum only when the rest of the counters have none.
    fn min_index(&mut self) -> usize {
        let floor = self.floor;
        if let Some(i) = self.counts[self.cursor..].iter().position(|&c| c == floor) {
            self.cursor += i;
            return self.cursor;
        }
        self.floor = self
            .counts
            .iter()
            .copied()
            .min()
            .expect("full, so not empty");
        let floor = self.floor;
        self.cursor = self
            .counts
            .iter()
            .position(|&c| c == floor)
            .expect("the minimum is there");
        self.cursor
    }

    /// The most an item not held may have occurred: the smallest count once every counter
    /// is taken, 0 before (nothing was ever replaced).
    pub fn min(&self) -> u64 {
        if self.hashes.len() < self.capacity {
            0
        } else {
            self.counts.iter().copied().min().unwrap_or(0)
        }
    }

    /// Items counted: N.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Counters held (at most the capacity).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// Every counter, in no order.
    pub fn counters(&self) -> impl Iterator<Item = Counter<'_>> {
        (0..self.hashes.len()).map(|i| Counter {
            hash: self.hashes[i],
            label: &self.labels[i],
            count: self.counts[i],
            error: self.errors[i],
        })
    }

    /// Forgets every item (memory is kept for the next ones).
    pub fn clear(&mut self) {
        self.hashes.clear();
        self.counts.clear();
        self.errors.clear();
        self.labels.clear();
        self.total = 0;
        self.floor = 0;
        self.cursor = 0;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// A deterministic shuffle (xorshift), so the heavy items are spread through the stream.
    fn shuffle<T>(items: &mut [T], mut state: u64) {
        for i in (1..items.len()).rev() {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            items.swap(i, (state % (i as u64 + 1)) as usize);
        }
    }

    fn label(item: u64) -> impl FnOnce(&mut String) {
        move |out: &mut String| out.push_str(&format!("v={item}"))
    }

    /// Every counter as (label, count, error), sorted.
    fn sorted(sketch: &SpaceSaving) -> Vec<(&str, u64, u64)> {
        let mut counters: Vec<_> = sketch
            .counters()
            .map(|c| (c.label, c.count, c.error))
            .collect();
        counters.sort();
        counters
    }

    #[test]
    fn exact_until_full() {
        let mut sketch = SpaceSaving::new(4);
        for item in [1, 2, 1, 3, 1, 2] {
            sketch.add(item, label(item));
        }
        let counters = sorted(&sketch);
        assert_eq!(counters, [("v=1", 3, 0), ("v=2", 2, 0), ("v=3", 1, 0)]);
        assert_eq!((sketch.min(), sketch.total()), (0, 6));
    }

    #[test]
    fn a_new_item_replaces_the_minimum_and_inherits_it_as_error() {
        let mut sketch = SpaceSaving::new(2);
        for item in [1, 1, 1, 2, 2, 3] {
            sketch.add(item, label(item));
        }
        let counters = sorted(&sketch);
        // 3 took 2's counter: counted 2 + 1, of which 2 may be 2's.
        assert_eq!(counters, [("v=1", 3, 0), ("v=3", 3, 2)]);
        assert_eq!(sketch.min(), 3);
    }

    /// The case: 100,000 distinct values once each and 10 heavy ones (3,000 to
    /// 7,500 times), shuffled. N = 152,500 and K = 64, so N / K = 2,382: every heavy one
    /// is held, its count within `error <= N / K` above its true count, and they are the
    /// top 10.
    #[test]
    fn ten_heavy_among_a_hundred_thousand_distinct_are_found_within_the_bound() {
        const K: usize = 64;
        let heavy: Vec<(u64, u64)> = (0..10).map(|i| (1_000_000 + i, 3_000 + 500 * i)).collect();
        let mut stream: Vec<u64> = (0..100_000).collect();
        for &(item, times) in &heavy {
            stream.extend(std::iter::repeat_n(item, times as usize));
        }
        shuffle(&mut stream, 0x9E37_79B9_7F4A_7C15);
        let n = stream.len() as u64;
        let mut sketch = SpaceSaving::new(K);
        for &item in &stream {
            sketch.add(item, label(item));
        }
        assert_eq!(sketch.total(), n);
        assert_eq!(sketch.len(), K);
        let bound = n / K as u64;
        assert!(sketch.min() <= bound);
        let held: HashMap<u64, Counter> = sketch.counters().map(|c| (c.hash, c)).collect();
        for &(item, times) in &heavy {
            let c = held
                .get(&item)
                .unwrap_or_else(|| panic!("heavy {item} missing"));
            assert!(
                c.count - c.error <= times && times <= c.count,
                "{c:?} vs {times}"
            );
            assert!(c.error <= bound, "{c:?}");
            assert_eq!(c.label, format!("v={item}"));
        }
        let mut ranked: Vec<Counter> = sketch.counters().collect();
        ranked.sort_by_key(|c| std::cmp::Reverse(c.count));
        let mut top: Vec<u64> = ranked[..10].iter().map(|c| c.hash).collect();
        top.sort();
        assert_eq!(top, heavy.iter().map(|h| h.0).collect::<Vec<_>>());
        // Every counter (not only the heavy ones) brackets its item's true count.
        let mut truth: HashMap<u64, u64> = HashMap::new();
        for &item in &stream {
            *truth.entry(item).or_default() += 1;
        }
        for c in sketch.counters() {
            assert!(c.count - c.error <= truth[&c.hash] && truth[&c.hash] <= c.count);
        }
    }

    #[test]
    fn a_flood_of_unique_items_keeps_k_counters_and_reuses_labels() {
        let mut sketch = SpaceSaving::new(8);
        for item in 0..100_000 {
            sketch.add(item, label(item));
        }
        assert_eq!(sketch.len(), 8);
        assert_eq!(sketch.total(), 100_000);
        assert!(sketch.min() <= 100_000 / 8);
        sketch.clear();
        assert_eq!((sketch.len(), sketch.total(), sketch.min()), (0, 0, 0));
    }
}
