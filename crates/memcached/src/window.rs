//! How a batch of combined sliding-window hits reads its window (see [`crate::combine`]),
//! and the guess it sends with the read: from how this process last saw the counter, the
//! batch's first hit is counted in the same round trip where it should fit, so most
//! batches are one round trip, not two.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_core::Quota;

use crate::MemcachedError;
use crate::commands::StoreReply;
use crate::key::Keys;
use crate::leaf::{count, counter_record};
use crate::pool::Deadline;
use crate::store::Inner;

/// Counters this process has lately read or made, by hash: a direct-mapped table whose
/// slot holds the hash of the counter last seen there, its lowest bit replaced by whether
/// the window had room left then. A batch guesses from it (see [`read_window`]): a counter
/// not known is guessed absent, one known with room is counted with the read, one known
/// without room is read first. Wrong only in cost: a counter whose slot another took is
/// guessed absent once more (an `add` that fails), one known but since expired or evicted
/// is read, then added, as without guessing.
pub(crate) struct Known {
    slots: Box<[AtomicU64]>,
}

/// Slots of [`Known`]: 64 KiB.
const KNOWN_SLOTS: usize = 8192;

impl Known {
    pub(crate) fn new() -> Known {
        Known {
            slots: (0..KNOWN_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn slot(&self, hash: u64) -> &AtomicU64 {
        // The high bits: the low ones pick the combiner's shard.
        &self.slots[(hash >> 32) as usize % KNOWN_SLOTS]
    }

    /// What a batch of the counter of `hash` guesses: how it was last seen here, if lately.
    pub(crate) fn guess(&self, hash: u64, now: u64, cost: u64) -> Guess {
        let seen = self.slot(hash).load(Ordering::Relaxed);
        match (seen | 1 == hash | 1, seen & 1 == 1) {
            (false, _) => Guess::Absent { now, cost },
            (true, true) => Guess::Roomy { cost },
            (true, false) => Guess::Full,
        }
    }

    /// Notes the counter of `hash` as seen, with room left in its window or not.
    pub(crate) fn remember(&self, hash: u64, roomy: bool) {
        let seen = (hash & !1) | u64::from(roomy);
        self.slot(hash).store(seen, Ordering::Relaxed);
    }
}

/// The window as read: the sub-windows' counts, oldest first (the current one last), the
/// next sub-window's count, and whether the current counter exists.
pub(crate) struct Window {
    pub(crate) counts: Vec<u64>,
    pub(crate) ahead: u64,
    pub(crate) present: bool,
    /// What the read's guess counted already: the batch's first hit's cost, and the
    /// counter's total right after it was added.
    pub(crate) counted: Option<Counted>,
}

#[derive(Clone, Copy)]
pub(crate) struct Counted {
    pub(crate) cost: u64,
    pub(crate) total: u64,
}

/// How a batch reads its window, from how this process last saw the counter.
#[derive(Clone, Copy)]
pub(crate) enum Guess {
    /// Not seen lately: absent (an identifier's first hit, or a sub-window's), so the
    /// counter is added holding the first hit's cost, with the read.
    Absent { now: u64, cost: u64 },
    /// Seen with room left: the first hit's cost is added to it with the read (`incr`).
    Roomy { cost: u64 },
    /// Seen full (or the hit cannot fit): the read alone, so a refusal writes nothing.
    Full,
}

/// Reads the window, counting the batch's first hit in the same round trip where the
/// guess says it should fit, so such a batch is one round trip, not two (a read, then an
/// `add` or `incr`). The `add` of a guessed-absent counter goes behind the `get`, and
/// memcached stores it only if the counter is absent when it comes; one that exists makes
/// it fail, and the batch goes on as without a guess (the guess cost the `add` and its
/// `|m` record's few bytes). The `incr` of a counter guessed roomy counts the hit whatever
/// the window says; a batch whose hit the window then refuses gives it back with a `decr`,
/// as a hit denied on the total `incr` returns always has.
pub(crate) async fn read_window(
    inner: &Arc<Inner>,
    (keys, quota, current): (&Keys, &Quota, u64),
    guess: Guess,
    deadline: Deadline,
) -> Result<Window, MemcachedError> {
    let g = u64::from(quota.windows());
    let oldest = (current + 1).saturating_sub(g);
    // The next sub-window too: app servers whose clocks run ahead count into it.
    let names: Vec<String> = (oldest..=current + 1).map(|n| keys.window(n)).collect();
    let key = &names[names.len() - 2];
    // `found`: the counter is there, whatever the read saw before the write behind it.
    let (read, counted, found) = match guess {
        Guess::Full => {
            let read = inner.pool.get_in_order(keys.route(), &names, deadline);
            (read.await?, None, false)
        }
        Guess::Absent { now, cost } => {
            let (expiry, meta) = counter_record(quota, current, now);
            let (read, added) = inner
                .pool
                .get_and_add_with(
                    keys.route(),
                    &names,
                    (key, cost.to_string().as_bytes()),
                    (&keys.meta(), meta.as_bytes()),
                    expiry,
                    deadline,
                )
                .await?;
            match added {
                StoreReply::Stored => (read, Some(Counted { cost, total: cost }), false),
                _ => (read, None, true),
            }
        }
        Guess::Roomy { cost } => {
            let (read, total) = inner
                .pool
                .get_and_incr(keys.route(), &names, key, cost, deadline)
                .await?;
            (read, total.map(|total| Counted { cost, total }), false)
        }
    };
    let ceiling = quota.limit().saturating_mul(2);
    // Oldest first, g of them (sub-windows before number 0 count nothing).
    let mut counts = Vec::with_capacity(g as usize + 1);
    counts.resize((g - (current + 1 - oldest)) as usize, 0);
    for (name, value) in names.iter().zip(&read) {
        counts.push(match value {
            Some(value) => count(name, value)?.min(ceiling),
            None => 0,
        });
    }
    let ahead = counts.pop().unwrap_or(0);
    Ok(Window {
        counts,
        ahead,
        present: read[names.len() - 2].is_some() || found,
        counted,
    })
}
