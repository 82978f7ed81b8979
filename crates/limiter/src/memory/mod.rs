//! The in-memory store: sharded, bounded, and lock-free for GCRA's one-word state.
//!
//! Each shard is a table behind a reader-writer lock. A single-leaf GCRA hit, the hot path,
//! takes the shared lock and updates the state word with compare-and-swap, so hits on any
//! identifiers, the same one included, never wait for each other. A one-leaf concurrency
//! rule's acquire, release and renew take the shared lock too, then the lease set's own lock,
//! or only the set's lock through a handle a lease keeps (see `leases.rs` and
//! `handles.rs`). Everything else (other algorithms, compound rules, penalties, new
//! identifiers) takes the exclusive locks of the shards involved, in shard order, and so is
//! one atomic step.
//!
//! The shard lock's read side is sharded by thread (crossbeam's `ShardedLock`: eight locks,
//! each on its own cache line; a reader takes its thread's, a writer all eight). With one
//! lock word per shard, two cores hitting one identifier passed that word's cache line back
//! and forth on every hit, and the hot path ran at governor's speed at best (its map has the
//! same lock); with a lock word per thread only the state word moves. Measured with
//! `benches/vs_governor.rs`, two threads on one key: 130 ns to 52 ns a hit (governor 125),
//! 55-95 ns to 35 ns when denying. The price is on the exclusive path: about 30 ns more per
//! decision on one thread (a fixed-window hit, 166 ns to 197 ns).
//!
//! GCRA words are keyed by the identifier's bytes held in the slot itself, in one table per
//! length class (up to 24, 32 and 40 bytes; longer ones boxed): identifiers as real policies
//! form them (`sluice:api:user:00001234:100/m`, 30 bytes) cost no allocation and no second
//! cache miss, and are hashed from the key's words once per hit (see `words.rs`).

mod handles;
mod leases;
mod locked;

pub(crate) use handles::{ClockRead, SetHandle};
mod table;
mod words;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};
use sluice_core::{Algorithm, Decision, PenaltyState, State, evaluate};

use smallvec::SmallVec;

use crate::clock::{Clock, StoreClock, SystemClock};
use crate::identifier::Identifier;
use crate::store::{Hit, Store, StoreError};
use table::{Cell, CellValue, KeyHasher, Probe, Table};

/// A short list kept on the stack: one item per leaf of a rule (and its penalty).
type Few<T> = SmallVec<[T; 4]>;

/// Default bound on identifiers held.
pub const DEFAULT_MAX_IDENTIFIERS: usize = 1 << 22;

/// Counts the memory store keeps about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// Identifiers held now.
    pub identifiers: usize,
    /// The bound on identifiers.
    pub capacity: usize,
    /// Live states evicted to respect the bound (their clients start afresh).
    pub evictions: u64,
    /// Expired states dropped (no effect on any decision).
    pub expired: u64,
}

/// State in this process's memory. Cheap to clone (clones share the same state).
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

/// One shard of the table behind a reader-writer lock whose read side is itself sharded by
/// thread: a reader locks only its own thread's lock word, on its own cache line, so threads
/// hitting the same shard (the same identifier included) do not pass the lock's line between
/// their cores; a writer locks all of them. Reads are the hot path; writes (new identifiers,
/// compound rules, other algorithms) pay for it.
struct Shard(ShardedLock<Table>);

impl Shard {
    fn read(&self) -> ShardedLockReadGuard<'_, Table> {
        // A panic while writing cannot leave a table half-changed (hashbrown's operations are
        // panic-safe), so a poisoned lock is used as it is.
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> ShardedLockWriteGuard<'_, Table> {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

struct Inner {
    shards: Box<[Shard]>,
    shard_cap: usize,
    hasher: KeyHasher,
    clock: StoreClock,
    evictions: AtomicU64,
    expired: AtomicU64,
    /// Leases dropped because they expired instead of being released.
    leases_expired: AtomicU64,
    /// This store's number, unique in the process: what a lease's [`SetHandle`] checks.
    id: u64,
}

/// The next [`Inner::id`].
static NEXT_STORE: AtomicU64 = AtomicU64::new(1);

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// A store on the system clock holding at most [`DEFAULT_MAX_IDENTIFIERS`].
    pub fn new() -> MemoryStore {
        MemoryStore::builder().build()
    }

    pub fn builder() -> MemoryStoreBuilder {
        MemoryStoreBuilder {
            max_identifiers: DEFAULT_MAX_IDENTIFIERS,
            shards: 64,
            clock: StoreClock::System(SystemClock::new()),
        }
    }

    pub fn stats(&self) -> MemoryStats {
        let inner = &self.inner;
        MemoryStats {
            identifiers: inner.shards.iter().map(|s| s.read().len()).sum(),
            capacity: inner.shard_cap * inner.shards.len(),
            evictions: inner.evictions.load(Ordering::Relaxed),
            expired: inner.expired.load(Ordering::Relaxed),
        }
    }

    /// Drops every state that has expired. Optional: full shards also do it on insert.
    pub fn sweep(&self) {
        let now = self.inner.clock.now();
        for shard in self.inner.shards.iter() {
            let dropped = shard.write().drop_expired(now);
            self.inner.expired.fetch_add(dropped, Ordering::Relaxed);
        }
    }

    /// Decides a hit synchronously (the memory store never waits on anything but its locks).
    pub fn decide_now(&self, hit: &Hit<'_>) -> Decision {
        let ev = &hit.evaluation;
        if let ([id], [quota], None) = (hit.identifiers, ev.quotas, ev.penalty) {
            match quota.algorithm() {
                Algorithm::Gcra => return self.decide_word(id, hit),
                Algorithm::Concurrency => {}
                _ => return self.decide_cell(id, hit),
            }
        }
        self.decide_locked(hit, self.inner.clock.now())
    }

    /// A rule of one leaf of another algorithm than GCRA (fixed window, sliding window,
    /// sliding log): its state is decided in place under the shard's shared lock and the
    /// cell's own, so other identifiers of the shard do not wait, and none of a compound
    /// rule's bookkeeping is done. An unknown identifier (or one whose state is of another
    /// algorithm, after a reload) takes the general path, which adds the cell.
    ///
    /// Measured on one thread (callgrind, a fixed-window `try_check_now` on 10,000 users),
    /// the general path's exclusive lock (eight lock words) and its lists were two thirds
    /// of a decision.
    fn decide_cell(&self, id: &Identifier, hit: &Hit<'_>) -> Decision {
        let ev = &hit.evaluation;
        let quota = &ev.quotas[0];
        let hash = self.hash(id);
        let now = self.inner.clock.now();
        {
            let table = self.inner.shards[self.shard_of(hash)].read();
            if let Some((_, cell)) = table.cells.find(hash, |(k, _)| k == id.as_str())
                && let CellValue::Leaf(state) = &cell.value
            {
                let mut state = state.lock();
                if quota.fits(&state) {
                    let outcome = evaluate(ev, std::slice::from_mut(&mut *state), None, now);
                    if outcome.changed {
                        // A state equivalent to fresh stays: a sweep drops it, and the next
                        // hit decides on it as on a fresh one.
                        let expires_at = quota.expires_at(&state);
                        cell.expires_at.store(expires_at, Ordering::Relaxed);
                    }
                    return outcome.decision;
                }
            }
        }
        self.decide_locked(hit, now)
    }

    /// The hash of an identifier, as the tables hash what they hold.
    #[inline]
    fn hash(&self, id: &str) -> u64 {
        self.inner.hasher.probe(&Probe::new(id))
    }

    /// Bits above those hashbrown uses for buckets (low) and tags (top 7) pick the shard.
    fn shard_of(&self, hash: u64) -> usize {
        (hash >> 32) as usize & (self.inner.shards.len() - 1)
    }

    /// The hot path: one GCRA leaf, one state word, compare-and-swap under a shared lock.
    ///
    /// Only the admission test and the next word are computed while the shard is locked;
    /// the decision's counts (a division) come after the lock is released. Under contention
    /// on one identifier the lock's cache line then spends less time away from the others.
    fn decide_word(&self, id: &str, hit: &Hit<'_>) -> Decision {
        let ev = &hit.evaluation;
        let quota = &ev.quotas[0];
        // The identifier is written into its table's key once, and hashed from that.
        let probe = Probe::new(id);
        let hash = self.inner.hasher.probe(&probe);
        let shard = &self.inner.shards[self.shard_of(hash)];
        // Read before the lock: the time is taken outside the critical section, and on a large
        // table the read overlaps the lookup's cache misses better than after it.
        let now = self.inner.clock.now();
        // The word to report the decision from: before an admitted hit, after a counted denial.
        let reported = {
            let table = shard.read();
            table.word(hash, &probe).map(|word| {
                let mut tat = word.load(Ordering::Acquire);
                loop {
                    let (allowed, possible) = quota.gcra_admits(tat, now, ev.cost);
                    if !ev.recording.records(allowed, possible) {
                        return tat;
                    }
                    let next = quota.gcra_record(tat, now, ev.cost);
                    match word.compare_exchange_weak(tat, next, Ordering::AcqRel, Ordering::Acquire)
                    {
                        Ok(_) if allowed => return tat,
                        // A counted denial lengthens the wait: report the recorded word's.
                        Ok(_) => return next,
                        Err(seen) => tat = seen,
                    }
                }
            })
        };
        if let Some(tat) = reported {
            return Decision::from_verdict(&quota.gcra_verdict(tat, now, ev.cost), 0, quota.tick());
        }
        // Unknown identifier: decide on a fresh state; only store it if something is recorded.
        let fresh = quota.fresh_state();
        let verdict = quota.verdict(&fresh, now, ev.cost);
        if !ev
            .recording
            .records(verdict.allowed, verdict.retry != sluice_core::Retry::Never)
        {
            return Decision::from_verdict(&verdict, 0, quota.tick());
        }
        self.decide_locked(hit, now)
    }

    /// The general path: exclusive locks on every shard involved, in shard order.
    fn decide_locked(&self, hit: &Hit<'_>, now: u64) -> Decision {
        let ev = &hit.evaluation;
        let penalty = hit.penalty_identifier.zip(ev.penalty);
        self.locked(hit.identifiers, ev.quotas, penalty, now, |step| {
            evaluate(ev, &mut step.states, step.penalty.as_mut(), now).decision
        })
    }
}

/// Moves a leaf's state out of the table (a fresh one if absent or of another algorithm).
fn take_state(table: &mut Table, hash: u64, id: &str, quota: &sluice_core::Quota) -> State {
    if quota.algorithm() == Algorithm::Gcra {
        if let Some(word) = table.word(hash, &Probe::new(id)) {
            return State::Gcra {
                tat: word.load(Ordering::Acquire),
            };
        }
    } else if let Some((_, cell)) = table.cells.find_mut(hash, |(k, _)| k == id)
        // A lease set is taken under its own lock by `locked`; one met here is a second
        // leaf of the same identifier, which starts fresh as it always has.
        && let CellValue::Leaf(state) = &mut cell.value
    {
        // The exclusive lock is held: nobody else can be inside the cell's own lock.
        let state = state.get_mut();
        if quota.fits(state) {
            return std::mem::replace(state, State::Gcra { tat: 0 });
        }
    }
    quota.fresh_state()
}

fn take_penalty(table: &mut Table, hash: u64, id: &str) -> PenaltyState {
    match table.cells.find(hash, |(k, _)| k == id) {
        Some((
            _,
            Cell {
                value: CellValue::Penalty(p),
                ..
            },
        )) => *p,
        _ => PenaltyState::default(),
    }
}

fn put_state(
    table: &mut Table,
    hash: u64,
    id: &str,
    state: State,
    expires_at: u64,
    store: &MemoryStore,
    now: u64,
) -> table::Swept {
    match state {
        State::Gcra { tat } => {
            let probe = Probe::new(id);
            if let Some(word) = table.word(hash, &probe) {
                word.store(tat, Ordering::Release);
                return table::Swept::default();
            }
            let swept = table.make_room(store.inner.shard_cap, now);
            table.words.insert(hash, &probe, tat, &store.inner.hasher);
            swept
        }
        State::Concurrency(leases) => put_cell(
            table,
            hash,
            id,
            CellValue::Leases(table::TableSet::new(leases)),
            expires_at,
            store,
            now,
        ),
        other => put_cell(
            table,
            hash,
            id,
            CellValue::Leaf(parking_lot::Mutex::new(other)),
            expires_at,
            store,
            now,
        ),
    }
}

fn put_cell(
    table: &mut Table,
    hash: u64,
    id: &str,
    value: CellValue,
    expires_at: u64,
    store: &MemoryStore,
    now: u64,
) -> table::Swept {
    if let Some((_, cell)) = table.cells.find_mut(hash, |(k, _)| k == id) {
        *cell = Cell {
            value,
            expires_at: AtomicU64::new(expires_at),
        };
        return table::Swept::default();
    }
    let swept = table.make_room(store.inner.shard_cap, now);
    let hasher = |(k, _): &(table::Key, Cell)| store.hash(k);
    table.cells.insert_unique(
        hash,
        (
            table::Key::from(id),
            Cell {
                value,
                expires_at: AtomicU64::new(expires_at),
            },
        ),
        hasher,
    );
    swept
}

impl Store for MemoryStore {
    async fn decide(&self, hit: &Hit<'_>) -> Result<Decision, StoreError> {
        Ok(self.decide_now(hit))
    }

    fn try_decide_now(&self, hit: &Hit<'_>) -> Option<Result<Decision, StoreError>> {
        Some(Ok(self.decide_now(hit)))
    }

    fn is_remote(&self) -> bool {
        false
    }

    async fn acquire(&self, hit: &Hit<'_>, lease: u64) -> Result<Decision, StoreError> {
        Ok(self.acquire_now(hit, lease))
    }

    async fn release(
        &self,
        leases: &crate::store::LeaseKeys<'_>,
        lease: u64,
    ) -> Result<sluice_core::algorithm::concurrency::Released, StoreError> {
        Ok(self.release_now(leases, lease))
    }

    async fn renew(
        &self,
        leases: &crate::store::LeaseKeys<'_>,
        lease: u64,
    ) -> Result<Option<std::time::Duration>, StoreError> {
        Ok(self.renew_now(leases, lease))
    }

    async fn reserve(&self, hit: &Hit<'_>) -> Result<(Decision, u64), StoreError> {
        Ok(self.reserve_now(hit))
    }

    async fn settle(&self, settlement: &crate::store::Settlement<'_>) -> Result<(), StoreError> {
        self.settle_now(settlement);
        Ok(())
    }

    async fn reset(&self, identifiers: &[Identifier]) -> Result<(), StoreError> {
        for id in identifiers {
            let hash = self.hash(id);
            self.inner.shards[self.shard_of(hash)]
                .write()
                .reset(hash, id);
        }
        Ok(())
    }
}

/// Configures a [`MemoryStore`].
pub struct MemoryStoreBuilder {
    max_identifiers: usize,
    shards: usize,
    clock: StoreClock,
}

impl MemoryStoreBuilder {
    /// Bound on identifiers held (at least 1). When full, expired states go first, then
    /// the states that expire soonest.
    pub fn max_identifiers(mut self, max: usize) -> Self {
        self.max_identifiers = max.max(1);
        self
    }

    /// Number of shards, rounded down to a power of two (at least 1).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = shards.max(1);
        self
    }

    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = StoreClock::new(clock);
        self
    }

    pub fn build(self) -> MemoryStore {
        // Power of two, and never more shards than identifiers, so each holds at least one.
        let wanted = self.shards.min(self.max_identifiers);
        let shards = 1usize << (usize::BITS - 1 - wanted.leading_zeros());
        MemoryStore {
            inner: Arc::new(Inner {
                shards: (0..shards)
                    .map(|_| Shard(ShardedLock::new(Table::default())))
                    .collect(),
                shard_cap: self.max_identifiers / shards,
                hasher: KeyHasher::new(),
                clock: self.clock,
                evictions: AtomicU64::new(0),
                expired: AtomicU64::new(0),
                leases_expired: AtomicU64::new(0),
                id: NEXT_STORE.fetch_add(1, Ordering::Relaxed),
            }),
        }
    }
}
