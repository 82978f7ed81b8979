//! The near cache: remembers, in this process, identifiers known to be denied until a time,
//! and answers them without a round trip to the store.
//!
//! Sound because time only helps: with nothing else arriving, a hit denied with
//! `retry_after = d` stays denied for `d`, and a larger cost is denied at least as long.
//! Only a reset can admit it sooner; resets through this limiter clear the entry, and a reset
//! made elsewhere is seen at most `max_ttl` late.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use hashbrown::HashTable;
use parking_lot::Mutex;
use sluice_core::Decision;

use crate::identifier::Identifier;

const SHARDS: usize = 16;

struct Entry {
    hash: u64,
    /// The policy's name and the hit's identifiers, joined by newlines (neither holds one).
    /// The policy is part of the key: policies sharing counters may still decide apart.
    key: Box<str>,
    decided_at: u64,
    until: u64,
    cost: u64,
    decision: Decision,
}

pub(crate) struct NearCache {
    shards: Box<[Mutex<HashTable<Entry>>]>,
    hasher: foldhash::fast::RandomState,
    max_entries_per_shard: usize,
    max_ttl: u64,
}

impl NearCache {
    pub(crate) fn new(max_entries: usize, max_ttl: Duration) -> NearCache {
        NearCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashTable::new())).collect(),
            hasher: foldhash::fast::RandomState::default(),
            max_entries_per_shard: (max_entries / SHARDS).max(1),
            max_ttl: max_ttl.as_nanos() as u64,
        }
    }

    fn hash(&self, policy: &str, ids: &[Identifier]) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(policy.as_bytes());
        h.write_u8(b'\n');
        for id in ids {
            h.write(id.as_bytes());
            h.write_u8(b'\n');
        }
        h.finish()
    }

    fn matches(key: &str, policy: &str, ids: &[Identifier]) -> bool {
        let mut parts = key.split('\n');
        parts.next() == Some(policy)
            && ids.iter().all(|id| parts.next() == Some(id.as_str()))
            && parts.next().is_none()
    }

    /// A cached denial for these identifiers at `now`, if one covers a hit of `cost`.
    pub(crate) fn get(
        &self,
        policy: &str,
        ids: &[Identifier],
        cost: u64,
        now: u64,
    ) -> Option<Decision> {
        let hash = self.hash(policy, ids);
        let shard = self.shards[hash as usize % SHARDS].lock();
        let entry = shard.find(hash, |e| {
            e.hash == hash && Self::matches(&e.key, policy, ids)
        })?;
        if now >= entry.until || cost < entry.cost {
            return None;
        }
        let elapsed = Duration::from_nanos(now.saturating_sub(entry.decided_at));
        Some(entry.decision.aged(elapsed))
    }

    /// Remembers a denial decided at `now`.
    pub(crate) fn remember(
        &self,
        policy: &str,
        ids: &[Identifier],
        cost: u64,
        decision: &Decision,
        now: u64,
    ) {
        let Some(retry) = decision.retry_after() else {
            return;
        };
        let ttl = (retry.as_nanos() as u64).min(self.max_ttl);
        if ttl == 0 {
            return;
        }
        let hash = self.hash(policy, ids);
        let mut shard = self.shards[hash as usize % SHARDS].lock();
        if let Some(entry) = shard.find_mut(hash, |e| {
            e.hash == hash && Self::matches(&e.key, policy, ids)
        }) {
            entry.decided_at = now;
            entry.until = now + ttl;
            entry.cost = cost;
            entry.decision = decision.clone();
            return;
        }
        if shard.len() >= self.max_entries_per_shard {
            shard.retain(|e| e.until > now);
            if shard.len() >= self.max_entries_per_shard {
                return; // full of live denials: the store still answers correctly
            }
        }
        let entry = Entry {
            hash,
            key: std::iter::once(policy)
                .chain(ids.iter().map(Identifier::as_str))
                .collect::<Vec<_>>()
                .join("\n")
                .into(),
            decided_at: now,
            until: now + ttl,
            cost,
            decision: decision.clone(),
        };
        shard.insert_unique(hash, entry, |e| e.hash);
    }

    /// Forgets every entry (after a reset whose identifiers are only part of some entries).
    pub(crate) fn clear(&self) {
        for shard in self.shards.iter() {
            shard.lock().clear();
        }
    }
}
