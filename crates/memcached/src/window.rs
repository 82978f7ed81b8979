//! How a batch of combined sliding-window hits reads its window (see [`crate::combine`]),
//! and the guess it sends with the read: from how this process last saw the counter, the
//! batch's first hit is counted in the same round trip where it should fit, so most
//! batches are one round trip, not two.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_core::Quota;

use crate::MemcachedError;
use crate::commands::StoreReply;
use crate::key::Keys;
use crate::leaf::counter_record;
use crate::pool::Deadline;
use crate::store::Inner;
use crate::value::count_named;

/// Counters this process has lately read or made, by hash: a direct-mapped table whose
/// slot holds the hash of the counter last seen there, its lowest byte replaced by how many
/// of the window's oldest sub-windows had no counter (seven bits). A batch guesses from it
/// (see [`read_window`]): a counter not known is guessed absent, one known is read first;
/// and the sub-windows known empty are not read again. Wrong only in cost: a counter whose
/// slot another took is guessed absent once more (an `add` that fails), one known but since
/// expired or evicted is read, then added, as without guessing.
///
/// Why an empty past sub-window stays empty: a counter is made only by hits in its own
/// sub-window (by the clocks of app servers within `skew` of each other), so once a whole
/// sub-window, and at least the skew and two seconds, have passed since it ended, no hit
/// can make it again: only such sub-windows are skipped, which leaves a hit sent just
/// before a boundary that long to arrive, far past its deadline. (A reservation's debt settled into a counter
/// that was evicted or reset makes it again; skipping it then forgets that debt, as the
/// eviction or the reset did.)
pub(crate) struct Known {
    slots: Box<[AtomicU64]>,
}

/// Slots of [`Known`]: 8 MiB per store, enough to remember most of a million counters in
/// use at once (the throughput bench's sliding window on 1,000,000 keys made 79,000-81,000
/// decisions a second with 2^20 slots, 66,000-72,000 with 2^18, about 48,000 with 2^13, where
/// most windows were read whole and guessed absent again).
const KNOWN_SLOTS: usize = 1 << 20;
/// Most empty sub-windows one slot remembers (seven bits; the eighth is unused).
const MAX_EMPTY: u64 = 0x7F;
/// How long after a sub-window ended (beyond the skew) an absent counter of it is taken as
/// final, if a whole sub-window is shorter: far past any request's deadline.
const SETTLED: Duration = Duration::from_secs(2);

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

    /// What a batch of the counter of `hash` guesses, from how it was last seen here (if
    /// lately), and how many of the window's oldest sub-windows it need not read.
    pub(crate) fn guess(&self, hash: u64, now: u64, cost: u64) -> (Guess, u64) {
        let seen = self.slot(hash).load(Ordering::Relaxed);
        if seen & !0xFF != hash & !0xFF {
            return (Guess::Absent { now, cost }, 0);
        }
        (Guess::Read, seen & MAX_EMPTY)
    }

    /// Notes the counter of `hash` as seen, with its `empty` oldest sub-windows holding no
    /// counter.
    pub(crate) fn remember(&self, hash: u64, empty: u64) {
        let seen = (hash & !0xFF) | empty.min(MAX_EMPTY);
        self.slot(hash).store(seen, Ordering::Relaxed);
    }
}

/// Where a sub-window's boundary is near enough for clocks that differ by the skew.
impl Inner {
    /// Whether an app server whose clock runs ahead of ours (by the skew at most) may have
    /// counted into sub-window `current + 1` by the time a call sent now reaches memcached
    /// (at its deadline at the latest): only then does a read of the window need the next
    /// sub-window's counter. Far from the boundary no such counter can exist yet, and
    /// leaving it out saves memcached a key (of three to eleven) on most reads. Timed from
    /// the clock now, not from the hits' own times: a batch's read may leave well after
    /// its first hit was made.
    pub(crate) fn ahead_may_count(&self, quota: &Quota, current: u64, deadline: Deadline) -> bool {
        let next = (current + 1).saturating_mul(quota.sub_window_ticks());
        let left = deadline
            .at
            .saturating_duration_since(tokio::time::Instant::now());
        let reach = (self.skew + left).as_nanos() as u64;
        self.clock.now().saturating_add(reach) >= next
    }

    /// Whether `now` is within the store's clock skew of a sub-window boundary.
    pub(crate) fn near_boundary(&self, quota: &Quota, now: u64) -> bool {
        let sub = quota.sub_window_ticks();
        let into = now % sub;
        let skew = self.skew.as_nanos() as u64;
        into < skew || sub - into <= skew
    }
}

/// The window as read: the sub-windows' counts, oldest first (the current one last), the
/// next sub-window's count (zero when it was not read: see [`Inner::ahead_may_count`]),
/// and whether the current counter exists.
pub(crate) struct Window {
    pub(crate) counts: Vec<u64>,
    pub(crate) ahead: u64,
    pub(crate) present: bool,
    /// How many of the oldest sub-windows hold no counter (known before, or read so).
    pub(crate) empty: u64,
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
    /// Seen lately (or the hit cannot fit): the read alone, so a refusal writes nothing.
    Read,
}

/// Reads the window. A counter guessed absent gets the `add` that creates it, holding the
/// batch's first hit's cost, behind the `get` in the same round trip, so such a batch is
/// one round trip, not two (a read, then an `add`): memcached stores it only if the counter
/// is absent when it comes; one that exists makes it fail, and the batch goes on as without
/// a guess (the guess cost the `add` and its `|m` record's few bytes). A batch whose first
/// hit the window then refuses gives it back with a `decr`, as a hit denied on the total
/// `incr` returns always has.
///
/// The `empty` oldest sub-windows are known to hold no counter (see [`Known`]) and are not
/// read: the window of an identifier new in this sub-window is two keys (the previous and
/// the current sub-window's; three near the next one's start), not `g + 1`.
pub(crate) async fn read_window(
    inner: &Arc<Inner>,
    (keys, quota, current, now): (&Keys, &Quota, u64, u64),
    (guess, empty): (Guess, u64),
    deadline: Deadline,
) -> Result<Window, MemcachedError> {
    let g = u64::from(quota.windows());
    let oldest = (current + 1).saturating_sub(g);
    // Sub-windows that may be skipped end before this one: never the current one's counter,
    // which hits are still making, nor the previous one's, which a hit sent just before the
    // boundary may still be making, nor one that ended less than the skew and `SETTLED` ago.
    let guard = (inner.skew + SETTLED).as_nanos() as u64;
    let settled = now.saturating_sub(guard) / quota.sub_window_ticks();
    let skippable_end = settled.min(current.saturating_sub(1)).max(oldest);
    let empty = empty.min(skippable_end - oldest);
    let first = oldest + empty;
    // The next sub-window too when app servers whose clocks run ahead may count into it.
    let ahead = inner.ahead_may_count(quota, current, deadline);
    let names = keys.windows(first, current + u64::from(ahead));
    let at_current = (current - first) as usize;
    // `found`: the counter is there, whatever the read saw before the write behind it.
    let (read, counted, found) = match guess {
        Guess::Read => {
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
                    (
                        &names.name(at_current),
                        itoa::Buffer::new().format(cost).as_bytes(),
                    ),
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
    };
    let ceiling = quota.limit().saturating_mul(2);
    // Oldest first, g of them (sub-windows before number 0, and those known empty, count
    // nothing), then the next one's when read.
    let mut counts = Vec::with_capacity(g as usize + 1);
    counts.resize((g - (current + 1 - first)) as usize, 0);
    for (i, value) in read.iter().enumerate() {
        counts.push(match value {
            Some(value) => count_named(value, || names.name(i))?.min(ceiling),
            None => 0,
        });
    }
    let ahead = if ahead { counts.pop().unwrap_or(0) } else { 0 };
    // Skippable sub-windows read without a counter, after those known so.
    let past = skippable_end.saturating_sub(first) as usize;
    let empty = empty + read[..past].iter().take_while(|v| v.is_none()).count() as u64;
    Ok(Window {
        counts,
        ahead,
        present: read[at_current].is_some() || found,
        empty,
        counted,
    })
}
