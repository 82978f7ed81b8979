//! What a caller holds after [`Limiter::acquire`](crate::Limiter::acquire) and
//! [`Limiter::reserve`](crate::Limiter::reserve): a [`Lease`] on a concurrency slot, released
//! when dropped, and a [`Reservation`] of an estimated cost, settled at its actual cost.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_core::Quota;
pub use sluice_core::algorithm::concurrency::Released;

use crate::identifier::Identifier;
use crate::limiter::{Checked, Error, SlotsInner};
use crate::memory::{ClockRead, MemoryStore, SetHandle};
use crate::store::{DynStore, LeaseKeys, Settlement, Store};

mod spare;
mod token;

pub use token::TokenError;
pub(crate) use token::{
    TokenSelectors, hex16, join_token, parse_lease_token, parse_reservation_token, token_selectors,
};

/// A lease's id: 64 random-looking bits, written as 16 hex digits. Ids from different
/// processes do not collide in practice, so processes sharing a store need no coordination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseId(pub u64);

/// [`Lease`]'s `taken` when its age is not known.
pub(crate) const UNKNOWN: u64 = u64::MAX;

/// Lease numbers a thread takes at once (see [`LeaseId::random`]).
const ID_BLOCK: u64 = 1 << 20;

impl LeaseId {
    /// A fresh id: a number no other call in this process gets, mixed by a hasher seeded at
    /// random per process.
    ///
    /// Each thread takes numbers from a block of its own (2^20 at a time from one
    /// process-wide counter), so threads acquiring at once do not pass one counter's cache
    /// line between them on every lease.
    pub fn random() -> LeaseId {
        use std::cell::Cell;
        use std::hash::BuildHasher;
        static NEXT: AtomicU64 = AtomicU64::new(0);
        static SEED: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
        thread_local! {
            /// The next number of this thread's block, and the end of the block.
            static BLOCK: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
        }
        let n = BLOCK
            .try_with(|block| {
                let (mut next, mut end) = block.get();
                if next == end {
                    next = NEXT.fetch_add(ID_BLOCK, Ordering::Relaxed);
                    end = next + ID_BLOCK;
                }
                block.set((next + 1, end));
                next
            })
            // A thread being torn down: one number alone, never inside another's block.
            .unwrap_or_else(|_| NEXT.fetch_add(1, Ordering::Relaxed));
        LeaseId(SEED.get_or_init(Default::default).hash_one(n))
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Why a text is not a lease id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a lease id (16 hex digits)")]
pub struct BadLeaseId(pub String);

impl FromStr for LeaseId {
    type Err = BadLeaseId;

    fn from_str(text: &str) -> Result<LeaseId, BadLeaseId> {
        let valid = text.len() == 16 && text.bytes().all(|b| b.is_ascii_hexdigit());
        match u64::from_str_radix(text, 16) {
            Ok(n) if valid => Ok(LeaseId(n)),
            _ => Err(BadLeaseId(text.chars().take(32).collect())),
        }
    }
}

/// The concurrency leaves of one acquire: where its lease lives.
#[derive(Debug, Default)]
pub(crate) struct LeaseParts {
    pub(crate) identifiers: Vec<Identifier>,
    pub(crate) quotas: Vec<Quota>,
    /// The selector values these identifiers were made of, as a token carries them.
    pub(crate) selectors: TokenSelectors,
    /// The [`CompiledLeaf::uid`](crate::policy::CompiledLeaf) of the one leaf whose
    /// identifier and token bytes these parts hold, for the next acquire of that leaf on
    /// this thread to keep them (see `one_leaf_parts` in `limiter/acquire.rs`); 0 when
    /// they are not one leaf's.
    pub(crate) leaf: u64,
    /// On the memory store, a handle to the lease set of the one identifier (see
    /// [`MemoryStore::acquire_held`]): the release, and the next acquire of that identifier
    /// on this thread, go to the set without the table. Cleared whenever the identifier
    /// is written anew.
    pub(crate) set: Option<SetHandle>,
}

impl LeaseParts {
    /// Releases lease `id` of these parts on the memory store, through their set's handle
    /// when they have one.
    fn release_in(&self, memory: &MemoryStore, id: u64) -> Released {
        match self
            .set
            .as_ref()
            .and_then(|set| memory.release_held(set, id))
        {
            Some(found) => found,
            None => memory.release_now(&self.keys(None), id),
        }
    }
}

impl LeaseParts {
    /// The keys of these leases, held since `taken` ([`crate::clock::real_nanos`]) when known.
    #[inline]
    pub(crate) fn keys(&self, taken: Option<u64>) -> LeaseKeys<'_> {
        LeaseKeys {
            identifiers: &self.identifiers,
            quotas: &self.quotas,
            held_for: taken.map(|taken| {
                Duration::from_nanos(crate::clock::real_nanos().saturating_sub(taken))
            }),
        }
    }
}

/// The answer of [`Limiter::acquire`](crate::Limiter::acquire): the decision, and the lease
/// when the store admitted the hit.
#[derive(Debug)]
pub struct Acquired {
    pub checked: Checked,
    /// Held while this lives; `None` when denied (and for a shadow policy's denial, which is
    /// admitted without a slot).
    pub lease: Option<Lease>,
}

/// A held concurrency slot. Dropping it releases the slot: at once on the memory store; on a
/// remote store by a task spawned on the current tokio runtime (never blocking the thread),
/// or, with no runtime at hand, not at all: the lease then expires by itself after its lease
/// time. [`Lease::release`] releases and reports what it found.
pub struct Lease {
    id: LeaseId,
    store: DynStore,
    parts: Holder,
    /// When the acquire, or the latest renew that found the lease, left for a remote store
    /// ([`crate::clock::real_nanos`], read before it was sent, so the store took or renewed
    /// the lease no sooner): what a release tells the store of the lease's age.
    /// [`UNKNOWN`] on the memory store, whose release is exact and cheap anyway, and for a
    /// lease rebuilt from its token.
    taken: AtomicU64,
    done: bool,
}

/// Where a lease's parts are.
enum Holder {
    /// Its own, boxed, so that a lease moves as a pointer through the acquire's answer, and
    /// the box goes back to its thread's spares when the lease is dropped (see `spare.rs`):
    /// a warm thread allocates nothing.
    Own(Box<LeaseParts>),
    /// Those of the [`Slots`](crate::Slots) it was taken through, shared: nothing to fill
    /// or keep, and the slots' handle to the lease set.
    Slots(Arc<SlotsInner>),
    /// Taken by a release in the background (only `Drop` sees this).
    Gone,
}

impl Holder {
    /// The parts; empty ones once a release in the background took them.
    #[inline]
    fn parts(&self) -> &LeaseParts {
        static NONE: LeaseParts = LeaseParts {
            identifiers: Vec::new(),
            quotas: Vec::new(),
            selectors: TokenSelectors::EMPTY,
            leaf: 0,
            set: None,
        };
        match self {
            Holder::Own(parts) => parts,
            Holder::Slots(slots) => &slots.parts,
            Holder::Gone => &NONE,
        }
    }

    /// Releases lease `id` on the memory store, through the set handle the parts have.
    #[inline]
    fn release_in(&self, memory: &MemoryStore, id: u64) -> Released {
        match self {
            Holder::Slots(slots) => slots.release_in(memory, id, ClockRead::BeforeLock),
            own => own.parts().release_in(memory, id),
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("id", &self.id)
            .field("identifiers", &self.parts().identifiers)
            .finish()
    }
}

impl Lease {
    pub(crate) fn new(
        id: LeaseId,
        store: DynStore,
        parts: Box<LeaseParts>,
        taken: Option<u64>,
    ) -> Lease {
        Lease {
            id,
            store,
            parts: Holder::Own(parts),
            taken: AtomicU64::new(taken.unwrap_or(UNKNOWN)),
            done: false,
        }
    }

    /// A lease taken through `slots`, whose parts it shares.
    #[inline]
    pub(crate) fn in_slots(
        id: LeaseId,
        store: DynStore,
        slots: Arc<SlotsInner>,
        taken: Option<u64>,
    ) -> Lease {
        Lease {
            id,
            store,
            parts: Holder::Slots(slots),
            taken: AtomicU64::new(taken.unwrap_or(UNKNOWN)),
            done: false,
        }
    }

    /// The parts.
    #[inline]
    fn parts(&self) -> &LeaseParts {
        self.parts.parts()
    }

    /// `taken`, when known.
    #[inline]
    fn taken(&self) -> Option<u64> {
        known(&self.taken)
    }

    /// A lease rebuilt from its token: its holder is elsewhere, so dropping this one
    /// releases nothing.
    pub(crate) fn rebuilt(id: LeaseId, store: DynStore, parts: LeaseParts) -> Lease {
        Lease {
            id,
            store,
            parts: Holder::Own(Box::new(parts)),
            taken: AtomicU64::new(UNKNOWN),
            done: true,
        }
    }

    pub fn id(&self) -> LeaseId {
        self.id
    }

    /// The lease as text, `<16 hex digits of its id>.<its selector values, base64url>`:
    /// enough for [`Limiter::lease`](crate::Limiter::lease) to rebuild it in any process
    /// on the same store and policy, e.g. to release it through another server.
    pub fn token(&self) -> String {
        join_token(&[&self.id.to_string()], &self.parts().selectors)
    }

    /// Releases the slot now. Answers [`Released::Expired`] if the lease had expired (its
    /// slot was already free, maybe taken by another holder) and [`Released::NotHeld`] if
    /// the store no longer knew it: both harmless, both worth logging.
    pub async fn release(mut self) -> Result<Released, Error> {
        self.done = true;
        if let Some(memory) = self.store.as_memory() {
            // In process: nothing to wait for.
            return Ok(self.parts.release_in(memory, self.id.0));
        }
        // Boxed: this future stays small, and moves cheaply, for the memory store.
        Box::pin(self.release_remote()).await
    }

    /// [`Lease::release`] on a remote store.
    async fn release_remote(&self) -> Result<Released, Error> {
        let keys = self.parts().keys(self.taken());
        Ok(self.store.release(&keys, self.id.0).await?)
    }

    /// Extends the lease to one lease time from now: the time it has left, or `None` if it
    /// had expired (it cannot come back; acquire again).
    pub async fn renew(&self) -> Result<Option<Duration>, Error> {
        renew(&self.store, self.parts(), self.id, &self.taken).await
    }

    /// Lets go of the guard without releasing: the slot stays held until the lease expires
    /// (or someone releases the returned id). For handing a lease to another process, and
    /// for tests of holders that vanish.
    pub fn forget(mut self) -> LeaseId {
        self.done = true;
        self.id
    }
}

/// A lease's `taken` (see [`Lease`]), when known.
#[inline]
pub(crate) fn known(taken: &AtomicU64) -> Option<u64> {
    Some(taken.load(Ordering::Relaxed)).filter(|&taken| taken != UNKNOWN)
}

/// Renews lease `id` of `parts` on `store`: the time it has left, or `None` if it had
/// expired. `taken` moves to when the renew was sent, when it is known.
pub(crate) async fn renew(
    store: &DynStore,
    parts: &LeaseParts,
    id: LeaseId,
    taken: &AtomicU64,
) -> Result<Option<Duration>, Error> {
    let sent = known(taken).map(|_| crate::clock::real_nanos());
    let left = store.renew(&parts.keys(None), id.0).await?;
    if let (Some(sent), Some(_)) = (sent, left) {
        // Renewed from no sooner than `sent`: the lease's age counts from there now.
        taken.fetch_max(sent, Ordering::Relaxed);
    }
    Ok(left)
}

impl Drop for Lease {
    fn drop(&mut self) {
        if !self.done {
            match self.store.as_memory() {
                Some(memory) => {
                    self.parts.release_in(memory, self.id.0);
                }
                None => self.release_in_background(),
            }
        }
        if let Holder::Own(parts) = std::mem::replace(&mut self.parts, Holder::Gone) {
            parts.keep_spare();
        }
    }
}

impl Lease {
    /// Releases on a task of the current tokio runtime; with none, the lease expires by
    /// itself (a thread is never blocked on the store).
    #[cfg(feature = "tokio")]
    fn release_in_background(&mut self) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let parts = std::mem::replace(&mut self.parts, Holder::Gone);
            let (store, id, taken) = (self.store.clone(), self.id.0, self.taken());
            runtime.spawn(async move {
                let _ = store.release(&parts.parts().keys(taken), id).await;
            });
        }
    }

    #[cfg(not(feature = "tokio"))]
    fn release_in_background(&mut self) {}
}

/// The answer of [`Limiter::reserve`](crate::Limiter::reserve): the decision on the estimate,
/// and the reservation to settle when it was admitted.
#[derive(Debug)]
pub struct Reserved {
    pub checked: Checked,
    /// `None` when denied (nothing was charged), and for a shadow policy's denial.
    pub reservation: Option<Reservation>,
}

/// An admitted hit charged its estimate, waiting for its actual cost. Dropping it without
/// settling leaves the estimate charged.
pub struct Reservation {
    store: DynStore,
    identifiers: Vec<Identifier>,
    quotas: Vec<Quota>,
    taken_at: u64,
    estimate: u64,
    selectors: TokenSelectors,
}

impl fmt::Debug for Reservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reservation")
            .field("estimate", &self.estimate)
            .field("taken_at", &self.taken_at)
            .finish()
    }
}

impl Reservation {
    pub(crate) fn new(
        store: DynStore,
        identifiers: Vec<Identifier>,
        quotas: Vec<Quota>,
        taken_at: u64,
        estimate: u64,
        selectors: TokenSelectors,
    ) -> Reservation {
        Reservation {
            store,
            identifiers,
            quotas,
            taken_at,
            estimate,
            selectors,
        }
    }

    /// The reservation as text, `<taken_at>.<estimate>.<selector values>` (16 hex digits,
    /// 16 hex digits, base64url): enough for
    /// [`Limiter::reservation`](crate::Limiter::reservation) to rebuild it in any process on
    /// the same store and policy, e.g. to settle it through another server.
    pub fn token(&self) -> String {
        let (taken_at, estimate) = (hex16(self.taken_at), hex16(self.estimate));
        join_token(&[&taken_at, &estimate], &self.selectors)
    }

    /// The cost charged when the reservation was admitted.
    pub fn estimate(&self) -> u64 {
        self.estimate
    }

    /// Charges the actual cost: refunds what the estimate took too much, or charges the
    /// excess as debt that delays the next admissions. Never refused (see
    /// [`sluice_core::algorithm::settle`] for each algorithm and the bound).
    pub async fn settle(self, actual: u64) -> Result<(), Error> {
        let settlement = Settlement {
            identifiers: &self.identifiers,
            quotas: &self.quotas,
            taken_at: self.taken_at,
            reserved: self.estimate,
            actual,
        };
        Ok(self.store.settle(&settlement).await?)
    }
}
