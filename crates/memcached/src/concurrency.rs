//! Concurrency leaves on memcached: the leases held, as one small set under the leaf's `|s`
//! key, changed only by compare-and-swap.
//!
//! The set is `(lease id, expires at)` pairs (see [`crate::value`]). Every step reads it with
//! `gets`, runs the core's function on the whole set ([`sluice_core::algorithm::concurrency`]:
//! drop the expired leases, count, add; release; renew), and writes it back with `cas` (`add`
//! when absent), again on a lost race (see [`crate::cas`]). Each write is of the whole set
//! as read, so no two steps can both take the last slot: exact, as the memory store is.
//! The key expires one second after its last lease would, so a set whose holders all
//! vanished leaves nothing behind; a lease's own expiry is judged on the callers' clocks.
//!
//! **Cost.** An acquire, a release and a renew each cost two round trips to the leaf's server
//! (`gets`, then `cas`) and read and write the whole set, about 42 bytes per lease held; a
//! denied acquire costs one `gets` (and a `cas` only when it dropped expired leases). Steps
//! on one set from one process are combined: a batch of them costs one `gets` and one
//! `cas`, so many callers of one process on one key do not race each other. Callers on
//! several app servers do race: a lost race costs two more round trips, and past
//! [`MemcachedStoreBuilder::cas_tries`](crate::MemcachedStoreBuilder::cas_tries) lost races
//! the step fails with a transient [`Contention`](crate::MemcachedError::Contention) error.
//! A leaf's count is at most [`MAX_LEASES`](crate::MAX_LEASES).
//!
//! **What memcached can lose.** An evicted set (memcached's memory full) forgets its leases:
//! up to N more holders may be admitted, and releases of the forgotten leases answer
//! `NotHeld` (an eviction found is counted in
//! [`MemcachedStats::evictions`](crate::MemcachedStats)). Callers' clocks `d` apart see a
//! lease expire `d` apart: an abandoned lease frees its slot up to `d` early for the caller
//! ahead. An acquire that fails after its lease was written (a timeout, a reply lost with
//! its connection) answers an error, so no one holds the lease to release it: its slot
//! comes back when its lease time passes. A lease taken by a leaf and then given back
//! (a later leaf denied the hit, or a step failed) held its slot meanwhile.
//!
//! **A release racing an acquire.** A lease dropped is released in the background; an
//! acquire made right after may reach the set first and find it full. An acquire that
//! finds its leaf full while a release of this store is in flight is judged once more,
//! behind it (the two are concurrent, so either order is a true answer): a slot freed just
//! before is found. Releases from other app servers have no such help.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use sluice_core::algorithm::concurrency::{self, Leases, Released};
use sluice_core::{Quota, State};

use crate::MemcachedError;
use crate::cas::{Answer, Plan, PlanFn, update};
use crate::key::Keys;
use crate::leaf::{Judged, LIVE_MARGIN, Mode, Recorded};
use crate::pool::Deadline;
use crate::store::Inner;
use crate::value::{MAX_LEASE_ENTRIES, Stored, decode, encode_leases};

/// The lease set a `|s` value holds; an empty one when absent or written by another
/// algorithm (the same identifier reused), as for every leaf.
fn lease_set(keys: &Keys, value: Option<&[u8]>) -> Result<Leases, MemcachedError> {
    match value.map(decode) {
        None | Some(Ok(Stored::Penalty(_))) => Ok(Leases::default()),
        Some(Ok(Stored::Leaf(State::Concurrency(leases)))) => Ok(leases),
        Some(Ok(Stored::Leaf(_))) => Ok(Leases::default()),
        Some(Err(why)) => Err(MemcachedError::Corrupt {
            key: keys.state(),
            why,
        }),
    }
}

/// Writes `leases` back; `before`: when the set read would have expired.
fn write(leases: &Leases, read: Option<&[u8]>, before: u64, now: u64, answer: Answer) -> Plan {
    Plan::Write {
        value: encode_leases(leases),
        expires_at: leases.expires_at(),
        was_live: read.is_some() && before > now + LIVE_MARGIN,
        answer,
    }
}

/// Counts a release in flight while it lives.
struct Releasing<'a>(&'a AtomicUsize);

impl<'a> Releasing<'a> {
    fn start(count: &'a AtomicUsize) -> Releasing<'a> {
        count.fetch_add(1, Ordering::AcqRel);
        Releasing(count)
    }
}

impl Drop for Releasing<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The compare-and-swap step of [`Inner::judge_leases`].
fn take_plan(
    keys: &Keys,
    quota: &Quota,
    now: u64,
    cost: u64,
    mode: Mode,
    lease: Option<u64>,
) -> PlanFn {
    let (quota, keys_owned) = (*quota, keys.clone());
    Box::new(move |value: Option<&[u8]>| {
        let mut leases = lease_set(&keys_owned, value)?;
        let before = leases.expires_at();
        let expired = leases.drop_expired(now);
        // Taking a lease the set already holds renews it (as the core's `acquire` does);
        // it is then not this hit's to give back.
        let renewing = lease.is_some_and(|id| leases.expiry(id, now).is_some());
        let (verdict, holds) = match (lease, mode) {
            (Some(id), Mode::Take | Mode::TakeOrCount) => {
                let verdict = concurrency::acquire(&quota, &mut leases, now, id);
                (verdict, verdict.allowed)
            }
            (Some(id), Mode::Force) => {
                let verdict = concurrency::verdict(&quota, &leases, now, cost);
                // A set is one memcached item: an `and` rule admitting past a full leaf
                // over and over stops adding leases there at the item's size.
                let holds = renewing || leases.len() < MAX_LEASE_ENTRIES;
                if holds {
                    concurrency::hold(&quota, &mut leases, now, id);
                }
                (verdict, holds)
            }
            // Read (an acquire's leaf past which the rule is settled), or recorded by a
            // hit that takes no lease: only the expired leases go.
            _ => (concurrency::verdict(&quota, &leases, now, cost), false),
        };
        let id = lease.unwrap_or_default();
        let judged = Judged {
            verdict,
            recorded: (holds && !renewing).then_some(Recorded::Lease { id }),
            after: None,
        };
        let answer = Answer::Leased { judged, expired };
        if !holds && expired == 0 {
            return Ok(Plan::Keep(answer));
        }
        Ok(write(&leases, value, before, now, answer))
    })
}

impl Inner {
    /// Judges concurrency leaf `keys` for a hit of `cost` at `now`, and takes lease `lease`
    /// in it as `mode` says: `Take` (and `TakeOrCount`: a denied hit holds no slot) when a
    /// slot is free, `Force` whatever it finds (the rule admitted the hit), `Peek` never.
    /// Without a lease (a check or a reservation), no slot is taken.
    #[allow(clippy::too_many_arguments)] // each argument is one plain fact of the hit
    pub(crate) async fn judge_leases(
        self: &Arc<Self>,
        keys: &Keys,
        quota: &Quota,
        now: u64,
        cost: u64,
        mode: Mode,
        lease: Option<u64>,
        deadline: Deadline,
    ) -> Result<Judged, MemcachedError> {
        // An acquire drops the expired leases of every concurrency leaf it reads, and a
        // recorded hit of every leaf it records, as the memory store does; a read that
        // changes nothing (a peek, a cost of 0) is one `get`.
        if cost == 0 || (mode == Mode::Peek && lease.is_none()) {
            let read = self
                .pool
                .get(keys.route(), &[keys.state()], deadline)
                .await?;
            let leases = lease_set(keys, read.values().next().map(Vec::as_slice))?;
            return Ok(Judged {
                verdict: concurrency::verdict(quota, &leases, now, cost),
                recorded: None,
                after: None,
            });
        }
        let take = matches!(mode, Mode::Take | Mode::TakeOrCount) && lease.is_some();
        let mut tries = 0;
        loop {
            tries += 1;
            let plan = take_plan(keys, quota, now, cost, mode, lease);
            let judged = match update(self, keys, now, deadline, plan).await? {
                Answer::Leased { judged, expired } => {
                    self.count_expired(expired);
                    judged
                }
                other => unreachable!("a lease update answers a judgement, not {other:?}"),
            };
            // A release on its way in this process (a lease dropped just before, released
            // in the background) and this acquire are concurrent: either order is a true
            // answer. A full leaf is judged once more, behind it, so a slot freed just
            // before is found (updates of one key run in the order they came).
            let releasing = self.releasing.load(Ordering::Acquire) > 0;
            if judged.verdict.allowed || !take || !releasing || tries > 1 {
                return Ok(judged);
            }
        }
    }

    /// Releases lease `id` from the set of `keys` (see [`concurrency::release`]).
    pub(crate) async fn release_lease(
        self: &Arc<Self>,
        keys: &Keys,
        now: u64,
        id: u64,
        deadline: Deadline,
    ) -> Result<Released, MemcachedError> {
        // Seen by acquires judged meanwhile (see `judge_leases`); undone however this ends.
        let _releasing = Releasing::start(&self.releasing);
        let keys_owned = keys.clone();
        let plan = Box::new(move |value: Option<&[u8]>| {
            if value.is_none() {
                return Ok(Plan::Keep(Answer::Released(Released::NotHeld)));
            }
            let mut leases = lease_set(&keys_owned, value)?;
            let before = leases.expires_at();
            let found = concurrency::release(&mut leases, now, id);
            let answer = Answer::Released(found);
            if found == Released::NotHeld {
                return Ok(Plan::Keep(answer));
            }
            Ok(write(&leases, value, before, now, answer))
        });
        match update(self, keys, now, deadline, plan).await? {
            Answer::Released(found) => Ok(found),
            other => unreachable!("a release answers what it found, not {other:?}"),
        }
    }

    /// Extends lease `id` in the set of `keys` to one lease time past `now`: its new expiry,
    /// or `None` when the set does not hold it (see [`concurrency::renew`]).
    pub(crate) async fn renew_lease(
        self: &Arc<Self>,
        keys: &Keys,
        quota: &Quota,
        now: u64,
        id: u64,
        deadline: Deadline,
    ) -> Result<Option<u64>, MemcachedError> {
        let (quota, keys_owned) = (*quota, keys.clone());
        let plan = Box::new(move |value: Option<&[u8]>| {
            if value.is_none() {
                return Ok(Plan::Keep(Answer::Renewed(None)));
            }
            let mut leases = lease_set(&keys_owned, value)?;
            let before = leases.expires_at();
            match concurrency::renew(&quota, &mut leases, now, id) {
                None => Ok(Plan::Keep(Answer::Renewed(None))),
                Some(expires_at) => Ok(write(
                    &leases,
                    value,
                    before,
                    now,
                    Answer::Renewed(Some(expires_at)),
                )),
            }
        });
        match update(self, keys, now, deadline, plan).await? {
            Answer::Renewed(expires_at) => Ok(expires_at),
            other => unreachable!("a renew answers an expiry, not {other:?}"),
        }
    }

    /// Counts leases that expired instead of being released.
    pub(crate) fn count_expired(&self, expired: u64) {
        if expired > 0 {
            let counters = &self.pool.counters;
            counters
                .leases_expired
                .fetch_add(expired, Ordering::Relaxed);
        }
    }
}
