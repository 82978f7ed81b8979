//! Hot identifiers (`prefetch=N`): blocks of admissions taken from a remote store in one
//! call and spent in this process.
//!
//! A leaf every server hits (`10000/s` for a whole API) would otherwise cost the store one
//! call per decision, all on one key. With `prefetch=N`, a hit that finds no block here asks
//! the store for `N` admissions at once (its own plus `N - 1` to keep); the next hits spend
//! the kept ones without a call, until they run out or the block expires.
//!
//! What it guarantees, and what it costs:
//! - Every admission was charged to the store before it was spent, so the store's count
//!   never exceeds the limit: from an idle counter, the hits all servers admit over any time
//!   are at most what the leaf admits without prefetch.
//! - A kept admission may be spent up to the block's lifetime after the store charged it.
//!   A fixed window's block ends with its window, so each window stays exact. A GCRA
//!   block lives for the rate's span, at most one second; over an interval that starts
//!   while blocks are held, the servers may admit up to the admissions they hold (at most
//!   `servers × (N − 1)`) beyond what the bucket would admit in that interval.
//! - Admissions kept but not spent are lost when their block expires (they are not
//!   returned to the store): at most `N − 1` per server per block lifetime go unused, so
//!   near the limit the servers together may admit up to `servers × (N − 1)` fewer than
//!   the limit in a lifetime.
//! - A refused block stands here as a refusal until the store said a block would fit
//!   (its `retry_after`): the hits meanwhile are refused without a call. A bucket refills
//!   while they wait, so nothing is lost; a fixed window does not, so near its end a
//!   server takes what is left of the window instead of a whole block.
//!
//! The table is bounded: at most [`MAX_BLOCKS`] identifiers hold a block at once; past it,
//! hits on new identifiers ask the store as if prefetch were off.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use event_listener::{Event, EventListener};
use parking_lot::Mutex;
use sluice_core::{Algorithm, Decision, Quota, Recording};

use super::Limiter;
use crate::failure::Counters;
use crate::policy::CompiledPolicy;
use crate::store::{Hit, Store, StoreError};

/// Most identifiers holding a block at once, over all shards.
pub const MAX_BLOCKS: usize = 16_384;
const SHARDS: usize = 16;
/// The longest a GCRA block lives.
const MAX_LIFETIME: Duration = Duration::from_secs(1);
/// A block being fetched for longer than this is taken for lost (its fetch can only have
/// leaked: a fetch ends, or is dropped, within the store's timeout).
const FETCH_STALE: Duration = Duration::from_secs(60);

/// What a prefetching hit got.
pub(super) enum Prefetched {
    /// Answered here: spent from a block, or refused while a refusal stands.
    Here(Decision),
    /// The store's answer to this hit's own block (or to the hit alone).
    Asked(Result<Decision, StoreError>),
    /// Waited for another hit's block, and the store failed meanwhile.
    Paused,
}

impl Limiter {
    /// How many admissions this hit takes from the store when its policy prefetches
    /// (`prefetch=N`), and the leaf's span: only ordinary checks on a remote store do (a
    /// store in this process is as cheap as a block).
    pub(super) fn prefetch(
        &self,
        policy: &CompiledPolicy,
        cost: u64,
        recording: Recording,
    ) -> Option<(u64, Duration)> {
        let (block, span) = policy.prefetch?;
        (recording == Recording::Admitted && cost > 0 && self.store.is_remote())
            .then_some((block.max(cost), span))
    }

    /// Decides `hit` from this process's block of its identifier, or takes a block of
    /// `take` from the store. One hit at a time fetches an identifier's block; the others
    /// wait for it rather than each taking a block of its own.
    pub(super) async fn prefetched(
        &self,
        policy: &CompiledPolicy,
        hit: &Hit<'_>,
        take: u64,
        span: Duration,
    ) -> Prefetched {
        let id = hit.identifiers[0].as_str();
        let cost = hit.evaluation.cost;
        let fetch = loop {
            let now = self.clock.now();
            match self.blocks.answer(id, cost, now) {
                Answer::Decided(decision) => {
                    if decision.allowed() {
                        Counters::bump(&self.counters.prefetch_spent);
                    }
                    return Prefetched::Here(decision);
                }
                Answer::Wait(listener) => {
                    listener.await;
                    let until = self.counters.store_paused_until.load(Ordering::Relaxed);
                    if until != 0 && until > self.clock.now() {
                        return Prefetched::Paused;
                    }
                }
                Answer::Fetch(fetch) => break fetch,
            }
        };
        let now = self.clock.now();
        let mut block = *hit;
        block.evaluation.cost = take;
        let mut result = self.store.decide(&block).await;
        // Near a fixed window's end a whole block may no longer fit: take what is left, or
        // the window's last admissions would be lost. (A bucket refills: a refused block
        // waits until it fits, below, and loses nothing.)
        if let Ok(refused) = &result
            && policy.quotas[0].algorithm() == Algorithm::FixedWindow
            && !refused.allowed()
            && refused.remaining >= cost
            && refused.remaining < take
        {
            block.evaluation.cost = refused.remaining;
            result = self.store.decide(&block).await;
        }
        let result = match result {
            Ok(decision) if decision.allowed() => {
                Counters::bump(&self.counters.prefetch_blocks);
                let kept = block.evaluation.cost - cost;
                let lifetime = lifetime(&policy.quotas[0], span, &decision);
                self.blocks.keep(id, kept, lifetime, &decision, now);
                Ok(Decision {
                    remaining: decision.remaining.saturating_add(kept),
                    ..decision
                })
            }
            Ok(refused) => {
                self.blocks.refuse(id, &refused, now);
                Ok(refused)
            }
            error => error,
        };
        drop(fetch);
        Prefetched::Asked(result)
    }
}

/// What [`Blocks::answer`] says to do.
pub(crate) enum Answer<'a> {
    Decided(Decision),
    /// Another hit is fetching this identifier's block: wait for it, then ask again.
    Wait(EventListener),
    /// Fetch the block (the guard, when held, lets the waiters go once dropped).
    Fetch(Option<Fetching<'a>>),
}

/// This hit is fetching an identifier's block: on drop (the fetch done, failed or
/// cancelled), the mark goes and the hits waiting for it ask again.
pub(crate) struct Fetching<'a> {
    blocks: &'a Blocks,
    id: Box<str>,
    done: Arc<Event>,
}

impl Drop for Fetching<'_> {
    fn drop(&mut self) {
        let mut shard = self.blocks.shard(&self.id).lock();
        if let Some(Held::Fetching { done, .. }) = shard.get(&*self.id)
            && Arc::ptr_eq(done, &self.done)
        {
            shard.remove(&*self.id);
        }
        drop(shard);
        self.done.notify(usize::MAX);
    }
}

/// Admissions taken from the store and not yet spent, or a refusal standing, per
/// identifier.
#[derive(Debug)]
pub(crate) struct Blocks {
    shards: Box<[Shard]>,
}

/// One lock's share of the identifiers.
type Shard = Mutex<HashMap<Box<str>, Held>>;

#[derive(Debug, Clone)]
enum Held {
    Block {
        /// Admissions left to spend.
        units: u64,
        /// Local-clock nanoseconds after which none of them may be spent.
        expires: u64,
        /// The store's limit when the block was taken.
        limit: u64,
        /// What the store had left beyond the block when it was taken.
        beyond: u64,
        /// Local-clock nanoseconds at which the leaf's counter was due to reset then.
        resets: u64,
    },
    /// The store refused a block (and what was left) at `at`: until `until`, when a block
    /// fits again, hits are refused here without asking.
    Refused {
        until: u64,
        at: u64,
        decision: Decision,
    },
    /// A hit is fetching a block since `since`; the others wait for `done`.
    Fetching { since: u64, done: Arc<Event> },
}

impl Held {
    fn alive(&self, now: u64) -> bool {
        match self {
            Held::Block { expires, .. } => *expires > now,
            Held::Refused { until, .. } => *until > now,
            Held::Fetching { since, .. } => {
                since.saturating_add(FETCH_STALE.as_nanos() as u64) > now
            }
        }
    }
}

impl Default for Blocks {
    fn default() -> Self {
        Blocks {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

impl Blocks {
    fn shard(&self, id: &str) -> &Shard {
        use std::hash::BuildHasher;
        let hash = foldhash::fast::FixedState::with_seed(0).hash_one(id);
        &self.shards[(hash as usize) % SHARDS]
    }

    /// Answers a hit of `cost` on `id` here, if it can: admitted from a live block holding
    /// that many (the decision says what is left of it), or refused while a refusal
    /// stands. Otherwise the hit fetches a block, or waits for the one being fetched.
    pub(crate) fn answer(&self, id: &str, cost: u64, now: u64) -> Answer<'_> {
        let mut shard = self.shard(id).lock();
        let held = match shard.get_mut(id) {
            Some(held) if held.alive(now) => held,
            _ => return self.fetch(&mut shard, id, now),
        };
        match held {
            Held::Block {
                units,
                limit,
                beyond,
                resets,
                ..
            } if *units >= cost => {
                *units -= cost;
                Answer::Decided(Decision::admitted(
                    *limit,
                    units.saturating_add(*beyond),
                    Duration::from_nanos(resets.saturating_sub(now)),
                    0,
                ))
            }
            // Fewer left than this hit costs: fetch a new block (the few left are lost).
            Held::Block { .. } => self.fetch(&mut shard, id, now),
            Held::Refused { at, decision, .. } => {
                Answer::Decided(decision.aged(Duration::from_nanos(now.saturating_sub(*at))))
            }
            Held::Fetching { done, .. } => Answer::Wait(done.listen()),
        }
    }

    /// Marks `id` as being fetched by this hit.
    fn fetch<'a>(&'a self, shard: &mut HashMap<Box<str>, Held>, id: &str, now: u64) -> Answer<'a> {
        let done = Arc::new(Event::new());
        let marked = Held::Fetching {
            since: now,
            done: done.clone(),
        };
        if !Self::insert(shard, id, marked, now) {
            // The table is full: fetch without letting others wait on it.
            return Answer::Fetch(None);
        }
        Answer::Fetch(Some(Fetching {
            blocks: self,
            id: id.into(),
            done,
        }))
    }

    /// Keeps `units` admissions for `id`, charged to the store at `now` with `decision`.
    /// A live block already there (taken by a concurrent hit) keeps its admissions too,
    /// with the earlier of the two expiries.
    pub(crate) fn keep(
        &self,
        id: &str,
        units: u64,
        lifetime: Duration,
        decision: &Decision,
        now: u64,
    ) {
        if units == 0 {
            return;
        }
        let expires = now.saturating_add(lifetime.as_nanos() as u64);
        let block = Held::Block {
            units,
            expires,
            limit: decision.limit,
            beyond: decision.remaining,
            resets: now.saturating_add(decision.reset_after.as_nanos() as u64),
        };
        let mut shard = self.shard(id).lock();
        if let Some(held) = shard.get_mut(id) {
            match held {
                Held::Block {
                    units: held_units,
                    expires: held_expires,
                    beyond,
                    ..
                } if *held_expires > now => {
                    *held_units += units;
                    *held_expires = (*held_expires).min(expires);
                    *beyond = decision.remaining;
                }
                _ => *held = block,
            }
            return;
        }
        Self::insert(&mut shard, id, block, now);
    }

    /// Refuses hits on `id` here until the store's `decision` (a refusal at `now`) says a
    /// block may fit again. A block a concurrent hit has taken meanwhile is kept.
    pub(crate) fn refuse(&self, id: &str, decision: &Decision, now: u64) {
        let Some(wait) = decision.retry_after().filter(|w| !w.is_zero()) else {
            return;
        };
        let refused = Held::Refused {
            until: now.saturating_add(wait.as_nanos() as u64),
            at: now,
            decision: decision.clone(),
        };
        let mut shard = self.shard(id).lock();
        match shard.get_mut(id) {
            Some(held @ Held::Block { units: 1.., .. }) if held.alive(now) => {}
            Some(held) => *held = refused,
            None => {
                Self::insert(&mut shard, id, refused, now);
            }
        }
    }

    /// Puts `held` for `id`, unless the shard is full of live entries for other
    /// identifiers; whether it was put.
    fn insert(shard: &mut HashMap<Box<str>, Held>, id: &str, held: Held, now: u64) -> bool {
        if let Some(slot) = shard.get_mut(id) {
            *slot = held;
            return true;
        }
        if shard.len() >= MAX_BLOCKS / SHARDS {
            shard.retain(|_, h| h.alive(now));
            if shard.len() >= MAX_BLOCKS / SHARDS {
                return false;
            }
        }
        shard.insert(id.into(), held);
        true
    }

    /// Admissions held, over every identifier (expired blocks included until touched).
    #[cfg(test)]
    pub(crate) fn held(&self) -> u64 {
        self.shards
            .iter()
            .flat_map(|s| {
                s.lock()
                    .values()
                    .map(|h| match h {
                        Held::Block { units, .. } => *units,
                        _ => 0,
                    })
                    .collect::<Vec<_>>()
            })
            .sum()
    }
}

/// How long a block taken with `decision` under `quota` may be spent: until a fixed
/// window's end, or the rate's span (at most a second) for GCRA.
pub(crate) fn lifetime(quota: &Quota, span: Duration, decision: &Decision) -> Duration {
    match quota.algorithm() {
        Algorithm::FixedWindow => decision.reset_after.min(span),
        _ => span.min(MAX_LIFETIME),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taken() -> Decision {
        Decision::admitted(100, 50, Duration::from_secs(1), 0)
    }

    /// The decision given here, or `None` when the hit must ask the store (the fetch mark
    /// it took is dropped at once, as a failed fetch would drop it).
    fn here(blocks: &Blocks, id: &str, cost: u64, now: u64) -> Option<Decision> {
        match blocks.answer(id, cost, now) {
            Answer::Decided(decision) => Some(decision),
            Answer::Fetch(_) => None,
            Answer::Wait(_) => panic!("nobody is fetching"),
        }
    }

    #[test]
    fn a_block_is_spent_until_empty_then_asks_again() {
        let blocks = Blocks::default();
        blocks.keep("a", 3, Duration::from_secs(1), &taken(), 0);
        // What is left: the block's one, plus the 50 the store had left beyond it.
        assert_eq!(here(&blocks, "a", 2, 10).unwrap().remaining, 51);
        assert!(here(&blocks, "a", 2, 20).is_none(), "1 left, 2 asked");
        assert!(here(&blocks, "b", 1, 40).is_none(), "no block");
    }

    #[test]
    fn one_hit_fetches_the_others_wait_for_it() {
        let blocks = Blocks::default();
        let Answer::Fetch(Some(fetching)) = blocks.answer("a", 1, 0) else {
            panic!("the first hit fetches");
        };
        assert!(matches!(blocks.answer("a", 1, 1), Answer::Wait(_)));
        // The fetch brings a block: the waiters spend it.
        blocks.keep("a", 3, Duration::from_secs(1), &taken(), 2);
        drop(fetching);
        assert!(here(&blocks, "a", 1, 3).unwrap().allowed());
        // A fetch that fails (dropped without a block) lets the next hit fetch.
        let Answer::Fetch(Some(fetching)) = blocks.answer("b", 1, 0) else {
            panic!("the first hit fetches");
        };
        drop(fetching);
        assert!(matches!(blocks.answer("b", 1, 1), Answer::Fetch(Some(_))));
        // A mark left behind goes stale rather than blocking the identifier for ever.
        let Answer::Fetch(Some(fetching)) = blocks.answer("c", 1, 0) else {
            panic!("the first hit fetches");
        };
        std::mem::forget(fetching);
        let stale = FETCH_STALE.as_nanos() as u64;
        assert!(matches!(blocks.answer("c", 1, stale - 1), Answer::Wait(_)));
        assert!(matches!(
            blocks.answer("c", 1, stale),
            Answer::Fetch(Some(_))
        ));
    }

    #[test]
    fn a_refusal_stands_until_its_retry_after() {
        let blocks = Blocks::default();
        let refused = Decision {
            denial: Some(sluice_core::Denial::Limited {
                retry_after: Duration::from_nanos(100),
            }),
            ..taken()
        };
        blocks.refuse("a", &refused, 1_000);
        let answer = here(&blocks, "a", 1, 1_040).unwrap();
        assert_eq!(answer.retry_after(), Some(Duration::from_nanos(60)));
        assert!(
            here(&blocks, "a", 1, 1_100).is_none(),
            "over: ask the store"
        );
        // A block taken meanwhile is not overwritten by a refusal.
        blocks.keep("b", 2, Duration::from_secs(1), &taken(), 0);
        blocks.refuse("b", &refused, 10);
        assert!(here(&blocks, "b", 1, 20).unwrap().allowed());
    }

    #[test]
    fn an_expired_block_is_never_spent() {
        let blocks = Blocks::default();
        blocks.keep("a", 5, Duration::from_nanos(100), &taken(), 0);
        assert!(here(&blocks, "a", 1, 99).is_some());
        assert!(here(&blocks, "a", 1, 100).is_none());
        assert_eq!(blocks.held(), 0, "dropped once seen expired");
    }

    #[test]
    fn a_second_block_joins_the_first_with_the_earlier_expiry() {
        let blocks = Blocks::default();
        blocks.keep("a", 2, Duration::from_nanos(100), &taken(), 0);
        blocks.keep("a", 3, Duration::from_nanos(1_000), &taken(), 50);
        assert_eq!(blocks.held(), 5);
        assert!(here(&blocks, "a", 5, 99).is_some());
        blocks.keep("a", 3, Duration::from_nanos(1_000), &taken(), 60);
        assert!(
            here(&blocks, "a", 1, 100).is_none(),
            "the earlier expiry holds"
        );
    }

    #[test]
    fn the_table_is_bounded() {
        let blocks = Blocks::default();
        for i in 0..MAX_BLOCKS * 2 {
            blocks.keep(&format!("id{i}"), 1, Duration::from_secs(1), &taken(), 0);
        }
        let count: usize = blocks.shards.iter().map(|s| s.lock().len()).sum();
        assert!(count <= MAX_BLOCKS, "{count}");
        // Full of live blocks: a new identifier fetches without a mark.
        assert!(matches!(blocks.answer("new", 1, 1), Answer::Fetch(None)));
        // Once they expire, room is made for new identifiers.
        blocks.keep("late", 1, Duration::from_secs(1), &taken(), 2_000_000_000);
        assert!(here(&blocks, "late", 1, 2_000_000_001).is_some());
    }
}
