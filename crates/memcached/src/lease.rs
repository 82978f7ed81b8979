//! Leases for `and` rules: one rule's hits decide one at a time across every process.
//!
//! A rule with `and` cannot be decided leaf by leaf without a gap: a hit admitted by one
//! child reaches the other child a moment later, and a hit that relies on that other child
//! in between sees its count without the first hit (Redis Cluster refuses such rules across
//! slots for the same reason). memcached has no transaction over two keys, so the hits of
//! `and` rules on one operation (`namespace:key`) take a lease: a key created with `add`
//! (which only one client can create), deleted when the hit is decided, and expiring by
//! itself should its holder die. Rules without `and` never take one.
//!
//! Within a process, hits waiting for the same lease queue up, and a holder hands the lease
//! to the next one in its queue for up to [`HAND_OVER`] before letting other processes have
//! it, so a burst costs one `add` and one `delete`, not one of each per hit. A process that
//! finds the lease taken tries again after a short pause, until its deadline: contention on
//! one operation shows as timeouts, and the failure policy decides those hits.

use std::hash::{BuildHasher, RandomState};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Mutex, MutexGuard};
use tokio::time::Instant;

use crate::MemcachedError;
use crate::commands::StoreReply;
use crate::key::Keys;
use crate::pool::{Deadline, Pool};
use crate::protocol::Verb;

/// Longest a process keeps a lease for its own queue.
pub const HAND_OVER: Duration = Duration::from_millis(20);

/// A lease this process holds: which one, and since when.
struct Held {
    keys: Keys,
    since: Instant,
}

struct Stripe {
    holder: Mutex<Option<Held>>,
    waiting: AtomicUsize,
}

/// The leases of one store, by operation.
pub struct Leases {
    stripes: Box<[Stripe]>,
    hasher: RandomState,
}

/// The lease's memcached key for the hit whose first identifier is `identifier`: its
/// `namespace:key` part, which every leaf of a policy shares.
pub fn lease_keys(identifier: &str) -> Keys {
    let mut parts = identifier.splitn(3, ':');
    let operation = match (parts.next(), parts.next()) {
        (Some(namespace), Some(key)) => format!("{namespace}:{key}:lease"),
        _ => format!("{identifier}:lease"),
    };
    Keys::new(&operation)
}

/// A lease taken: give it back with [`Leases::release`].
pub struct Lease<'a> {
    holder: MutexGuard<'a, Option<Held>>,
    stripe: &'a Stripe,
}

impl Leases {
    pub fn new(stripes: usize) -> Leases {
        Leases {
            stripes: (0..stripes)
                .map(|_| Stripe {
                    holder: Mutex::new(None),
                    waiting: AtomicUsize::new(0),
                })
                .collect(),
            hasher: RandomState::new(),
        }
    }

    /// Takes the lease `keys` names (waiting for this process's turn, then for other
    /// processes), within `deadline`; `life` bounds how long it may be held.
    pub async fn acquire<'a>(
        &'a self,
        pool: &Pool,
        keys: &Keys,
        life: Duration,
        deadline: Deadline,
    ) -> Result<Lease<'a>, MemcachedError> {
        let stripe =
            &self.stripes[self.hasher.hash_one(keys.route()) as usize % self.stripes.len()];
        stripe.waiting.fetch_add(1, Ordering::Relaxed);
        let holder = tokio::time::timeout_at(deadline.at, stripe.holder.lock()).await;
        stripe.waiting.fetch_sub(1, Ordering::Relaxed);
        let mut holder = holder.map_err(|_| MemcachedError::Timeout(deadline.budget))?;
        match holder.take() {
            Some(held) if held.keys == *keys && held.since.elapsed() < HAND_OVER => {
                *holder = Some(held);
                return Ok(Lease { holder, stripe });
            }
            // Another operation's lease, or an old one, kept for a hit that did not come (or
            // left by a hit that was cancelled): let it go.
            Some(held) => {
                let other = held.keys;
                pool.delete(other.route(), &[other.state()], deadline)
                    .await?;
            }
            None => {}
        }
        // Who holds it, for whoever looks: this process and a random number.
        let token = format!(
            "{}-{:x}",
            std::process::id(),
            RandomState::new().hash_one(keys.route())
        );
        let seconds = life.as_secs() as u32 + 2;
        let mut pause = 200u64;
        loop {
            let key = keys.state();
            let stored = pool
                .store(
                    keys.route(),
                    Verb::Add,
                    &key,
                    seconds,
                    token.as_bytes(),
                    deadline,
                )
                .await?;
            if stored == StoreReply::Stored {
                *holder = Some(Held {
                    keys: keys.clone(),
                    since: Instant::now(),
                });
                return Ok(Lease { holder, stripe });
            }
            let jitter = RandomState::new().hash_one(pause) % pause;
            let wake = Instant::now() + Duration::from_micros(pause / 2 + jitter);
            if wake >= deadline.at {
                return Err(MemcachedError::Timeout(deadline.budget));
            }
            tokio::time::sleep_until(wake).await;
            pause = (pause * 2).min(4_000);
        }
    }

    /// Ends a hit under `lease`: hands it to the next hit of this process if one waits and
    /// the lease is young, otherwise deletes it.
    pub async fn release(
        &self,
        pool: &Pool,
        keys: &Keys,
        mut lease: Lease<'_>,
        deadline: Deadline,
    ) -> Result<(), MemcachedError> {
        let young = lease
            .holder
            .as_ref()
            .is_some_and(|held| held.since.elapsed() < HAND_OVER);
        if young && lease.stripe.waiting.load(Ordering::Relaxed) > 0 {
            return Ok(());
        }
        if lease.holder.take().is_none() {
            return Ok(());
        }
        pool.delete(keys.route(), &[keys.state()], deadline).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_lease_per_operation() {
        let a = lease_keys("ns:login:user:alice:5/m");
        let b = lease_keys("ns:login:*:{ns:login}:100/h");
        assert_eq!(a, b);
        assert_eq!(a.route(), "ns:login:lease");
        assert_ne!(a, lease_keys("ns:api:user:alice:5/m"));
    }
}
