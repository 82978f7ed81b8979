//! Leases in a replay of a rule with a concurrency leaf (`user:3 concurrent`): each admitted
//! request holds its lease from its `t` to `t + duration`, and is released then, in time
//! order with the later arrivals (a release at the same instant as an arrival comes first).
//! A request that lasts its lease time or longer loses its slot when the lease expires, and
//! its release then finds the lease expired: the replay counts those per leaf.
//!
//! The counts are kept beside the store, from the same rules the store follows (a lease
//! expiring at `now` is no longer held), so that they can say what the store's answers
//! cannot: the most leases one selector value held at once.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use serde_json::json;
use sluice_limiter::{Lease, Policy, Released};

use super::{Header, Hit};

/// What a replay saw of one concurrency leaf's leases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafLeases {
    /// The leaf as written (`user:3 concurrent lease=30s`).
    pub leaf: String,
    /// The most leases one value of the leaf's selectors held at once.
    pub max_held: u64,
    /// Leases that expired before their request ended (a duration of at least the lease
    /// time): their slot came back at the lease's expiry, not at the request's end.
    pub expired: u64,
}

impl LeafLeases {
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "leaf": self.leaf,
            "max_held": self.max_held,
            "expired": self.expired,
        })
    }
}

/// One concurrency leaf's books: when each value's held leases end.
struct LeafBook {
    counts: LeafLeases,
    lease_nanos: u64,
    /// Where the leaf's selector values are in a hit's values.
    columns: Vec<usize>,
    /// Per value of the selectors: the times its held leases end, soonest first.
    ends: HashMap<Vec<String>, BinaryHeap<Reverse<u64>>>,
}

/// The leases a replay holds, and when it releases them.
pub(super) struct InFlight {
    /// `(end, order taken)` of each lease not yet released: soonest first, ties in order.
    due: BinaryHeap<Reverse<(u64, u64)>>,
    /// By order taken: the lease and the trace line that took it.
    leases: HashMap<u64, (Lease, u64)>,
    taken: u64,
    books: Vec<LeafBook>,
    /// Releases the store answered with anything but `Released`.
    pub(super) store_expired: u64,
}

impl InFlight {
    /// Books for the concurrency leaves of `policy`, or `None` when it has none.
    pub(super) fn new(policy: &Policy, header: &Header) -> Option<InFlight> {
        let books: Vec<LeafBook> = policy
            .rule
            .leaves()
            .into_iter()
            .filter(|leaf| leaf.is_concurrency())
            .map(|leaf| LeafBook {
                counts: LeafLeases {
                    leaf: leaf.to_string(),
                    max_held: 0,
                    expired: 0,
                },
                lease_nanos: leaf.rate.span().nanos(),
                columns: leaf
                    .selector
                    .names()
                    .iter()
                    .filter_map(|name| header.selectors.iter().position(|s| s == name))
                    .collect(),
                ends: HashMap::new(),
            })
            .collect();
        (!books.is_empty()).then_some(InFlight {
            due: BinaryHeap::new(),
            leases: HashMap::new(),
            taken: 0,
            books,
            store_expired: 0,
        })
    }

    /// The next lease to release no later than `t`, with its end and the line that took it.
    pub(super) fn next_due(&mut self, t: u64) -> Option<(u64, Lease, u64)> {
        let &Reverse((end, order)) = self.due.peek()?;
        if end > t {
            return None;
        }
        self.due.pop();
        let (lease, line) = self.leases.remove(&order)?;
        Some((end, lease, line))
    }

    /// Counts what the store answered to a release.
    pub(super) fn released(&mut self, answer: Released) {
        if answer != Released::Released {
            self.store_expired += 1;
        }
    }

    /// Holds `lease`, taken by `hit` at its time, until `hit.t + duration`.
    pub(super) fn hold(&mut self, hit: &Hit, duration: u64, lease: Lease) {
        let end = hit.t.saturating_add(duration);
        for book in &mut self.books {
            let key: Vec<String> = book
                .columns
                .iter()
                .map(|&i| hit.values[i].clone())
                .collect();
            let ends = book.ends.entry(key).or_default();
            while ends.peek().is_some_and(|&Reverse(e)| e <= hit.t) {
                ends.pop();
            }
            // The slot frees when the request ends, or when the lease expires if sooner.
            let expires = hit.t.saturating_add(book.lease_nanos);
            if duration >= book.lease_nanos {
                book.counts.expired += 1;
            }
            ends.push(Reverse(end.min(expires)));
            book.counts.max_held = book.counts.max_held.max(ends.len() as u64);
        }
        let order = self.taken;
        self.taken += 1;
        self.due.push(Reverse((end, order)));
        self.leases.insert(order, (lease, hit.line));
    }

    /// Each concurrency leaf's counts, in rule order.
    pub(super) fn counts(&self) -> Vec<LeafLeases> {
        self.books.iter().map(|b| b.counts.clone()).collect()
    }
}
