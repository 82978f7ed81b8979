//! One shard of the memory store: GCRA states as bare atomic words (see [`super::words`]),
//! every other state as a plain cell, and the bound on how many identifiers the shard holds.
//!
//! Memory: a GCRA identifier of up to 24, 32 or 40 bytes costs one slot of 32, 40 or 48
//! bytes (the identifier whole and the state word) in an open-addressing table, plus one
//! control byte; a longer one, a 24-byte slot and its exact-length copy on the heap. Tables
//! grow by doubling, so a slot costs 8/7 to 16/7 of its size depending on where the table
//! is in its doubling cycle. Measured (`benches/vs_governor.rs`, `tests/memory_size.rs`):
//! 86 bytes per identifier at 1,000,000 GCRA identifiers of 30 bytes (87 resident with
//! glibc), against 99 (117) for governor's keyed limiter on `String` keys of the same text.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use compact_str::CompactString;
use hashbrown::HashTable;
use parking_lot::Mutex;
use sluice_core::algorithm::concurrency::Leases;
use sluice_core::{PenaltyState, State};

pub(crate) use super::words::{KeyHasher, Probe, Words};

/// A state other than a GCRA word, with the time from which it is equivalent to fresh.
#[derive(Debug)]
pub(crate) struct Cell {
    pub(crate) value: CellValue,
    /// Unused for a lease set, whose leases say when it expires (see [`Cell::expiry`]).
    /// Atomic so that a leaf decided under the shard's shared lock can move it.
    pub(crate) expires_at: AtomicU64,
}

#[derive(Debug)]
pub(crate) enum CellValue {
    /// A leaf's state (any algorithm but GCRA's words and concurrency's leases) behind a
    /// lock of its own: a rule of one such leaf is decided under the shard's shared lock
    /// and this one (see `MemoryStore::decide_cell`); under the exclusive lock, the state
    /// is reached without locking.
    Leaf(Mutex<State>),
    Penalty(PenaltyState),
    /// A concurrency leaf's leases behind a lock of their own, shared with the holders of
    /// its leases (see `handles.rs`). Every step on the set takes that lock, under the
    /// exclusive lock too.
    Leases(TableSet),
}

/// A lease set: its leases, and whether the table still holds it.
#[derive(Debug, Default)]
pub(crate) struct SetState {
    pub(crate) leases: Leases,
    /// The table let go of this set (removed, replaced, evicted, or the store dropped): a
    /// holder that kept a handle to it finds its identifier's set in the table again.
    pub(crate) gone: bool,
    /// How many [`Slots`](crate::Slots) hold this set pinned (see
    /// [`super::MemoryStore::pin_set`]): a pinned set is never swept, even empty, and is
    /// evicted last, so their handle to it stays good.
    pub(crate) pins: u32,
}

impl SetState {
    /// When the set is equivalent to fresh: once its last lease has expired, never while
    /// it is pinned.
    pub(crate) fn expires_at(&self) -> u64 {
        if self.pins > 0 {
            u64::MAX
        } else {
            self.leases.expires_at()
        }
    }
}

/// A lease set as holders reach it without the table (see [`super::SetHandle`]).
pub(crate) type SharedSet = Arc<Mutex<SetState>>;

/// The table's own reference to a lease set. Dropped, however the cell goes, it marks the
/// set gone under the set's lock, so no handle can take a lease in a set the table no
/// longer holds. A thread holding a set's lock never drops its cell (see `locked.rs`).
#[derive(Debug)]
pub(crate) struct TableSet(pub(crate) SharedSet);

impl TableSet {
    pub(crate) fn new(leases: Leases) -> TableSet {
        TableSet(Arc::new(Mutex::new(SetState {
            leases,
            gone: false,
            pins: 0,
        })))
    }
}

impl Drop for TableSet {
    fn drop(&mut self) {
        self.0.lock().gone = true;
    }
}

impl Cell {
    /// When the state is equivalent to fresh: a lease set once its last lease has expired
    /// (see [`SetState::expires_at`]).
    pub(crate) fn expiry(&mut self) -> u64 {
        match &mut self.value {
            CellValue::Leases(set) => set.0.lock().expires_at(),
            _ => *self.expires_at.get_mut(),
        }
    }

    /// Whether to keep the cell, as `keep` says of its expiry. A lease set to be dropped
    /// is marked gone in the same hold of its lock: a holder with a handle cannot take a
    /// lease in it between the look and the drop.
    pub(crate) fn retained(&mut self, keep: impl FnOnce(u64) -> bool) -> bool {
        match &mut self.value {
            CellValue::Leases(set) => {
                let mut set = set.0.lock();
                let kept = keep(set.expires_at());
                set.gone |= !kept;
                kept
            }
            _ => keep(*self.expires_at.get_mut()),
        }
    }
}

#[derive(Default)]
pub(crate) struct Table {
    pub(crate) words: Words,
    pub(crate) cells: HashTable<(Key, Cell)>,
}

/// An identifier as the table of cells holds it: inline up to 24 bytes. Cells (other
/// algorithms than GCRA, lease sets, penalty records) cost a lock of their own, or the
/// shard's exclusive lock, where a second read for a long identifier is not what the time
/// goes to.
pub(crate) type Key = CompactString;

/// What making room did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Swept {
    pub(crate) expired: u64,
    pub(crate) evicted: u64,
}

impl Table {
    pub(crate) fn len(&self) -> usize {
        self.words.len() + self.cells.len()
    }

    #[inline]
    pub(crate) fn word(&self, hash: u64, probe: &Probe<'_>) -> Option<&AtomicU64> {
        self.words.get(hash, probe)
    }

    /// Removes `id` wherever it is. Returns whether it was present.
    pub(crate) fn remove(&mut self, hash: u64, id: &str) -> bool {
        let word = self.words.remove(hash, &Probe::new(id));
        let cell = self
            .cells
            .find_entry(hash, |(k, _)| k == id)
            .map(|e| e.remove());
        word || cell.is_ok()
    }

    /// Forgets `id`'s state, as a reset asks: removes it, but empties in place a lease set
    /// that [`Slots`](crate::Slots) pin, so that their handle to it stays good.
    pub(crate) fn reset(&mut self, hash: u64, id: &str) {
        if let Some((_, cell)) = self.cells.find(hash, |(k, _)| k == id)
            && let CellValue::Leases(set) = &cell.value
        {
            let mut set = set.0.lock();
            if set.pins > 0 {
                set.leases = Leases::default();
                drop(set);
                self.words.remove(hash, &Probe::new(id));
                return;
            }
        }
        self.remove(hash, id);
    }

    /// Drops states that are equivalent to fresh at `now`.
    pub(crate) fn drop_expired(&mut self, now: u64) -> u64 {
        let before = self.len();
        self.words.retain(|tat| tat > now);
        self.cells
            .retain(|(_, c)| c.retained(|expiry| expiry > now));
        (before - self.len()) as u64
    }

    /// Makes room for one more identifier under a bound of `cap`: first drops what has
    /// expired, then, if still full, evicts the eighth of the shard that expires soonest
    /// (the idlest: state that nobody has touched for longest drains first).
    pub(crate) fn make_room(&mut self, cap: usize, now: u64) -> Swept {
        let mut swept = Swept::default();
        if self.len() < cap {
            return swept;
        }
        swept.expired = self.drop_expired(now);
        if self.len() < cap {
            return swept;
        }
        let mut expiries: Vec<u64> = self
            .words
            .values()
            .chain(self.cells.iter_mut().map(|(_, c)| c.expiry()))
            .collect();
        let evict = (cap / 8).max(self.len() + 1 - cap).min(expiries.len());
        let (_, &mut threshold, _) = expiries.select_nth_unstable(evict - 1);
        // Everything strictly below the threshold goes; ties at it go until `evict` is met.
        let mut ties = evict - expiries.iter().filter(|&&e| e < threshold).count();
        let mut keep = |expiry: u64| {
            if expiry < threshold {
                return false;
            }
            if expiry == threshold && ties > 0 {
                ties -= 1;
                return false;
            }
            true
        };
        let before = self.len();
        self.words.retain(&mut keep);
        self.cells.retain(|(_, c)| c.retained(&mut keep));
        swept.evicted = (before - self.len()) as u64;
        swept
    }
}
