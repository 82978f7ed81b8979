//! Batching of lease steps: the acquires, releases and renews of rules of one concurrency
//! leaf waiting at once go to Redis as one call of [`LEASE_BATCH`], which takes each in
//! order of arrival, each atomic and answered as its own call would be (see
//! `src/lua/lease_batch.lua`). Queued and sent as the lean GCRA hits are (`src/batch.rs`):
//! one writer task per store, at most [`MAX_BATCH`](crate::batch::MAX_BATCH) steps a call,
//! no timer (a lone step goes at once), split by slot on a Cluster; a call that fails fails
//! every step in it. Redis's `TIME` is read once per call.
//!
//! Within a call, what the script learns of a lease set (its size, its latest lease, that its
//! expired leases are gone) spares asking Redis again, so on a busy set an acquire costs
//! about one `ZADD` and a release one `ZREM`; the first acquire on an empty set (most
//! per-user sets, most of the time) asks only its size. Measured with `cargo bench -p sluice-redis
//! --bench leases` (50 callers, one key of 64 slots, medians of 3 rounds, a loaded 2-core
//! machine, three runs): an acquire + release took 7.9 to 8.3 µs of Redis CPU beside 4.6 to
//! 5.0 µs for a batched GCRA rate check, 1.64 to 1.71 rate checks (20.6 to 21.3 µs, 4.1 to
//! 4.9 rate checks, when each step was its own script call); about 16 steps shared a call,
//! and a pair made 1 `ZADD`, 1 `ZREM` and about 0.1 of each other command.
//! In instructions (`benches/lua_instructions.sh`, callgrind on redis-server) a pair costs
//! 5.0 rate checks on one set and 2.3 on 1,000,000 sets (the rate check got cheaper too);
//! 1.9 on 1,000,000 sets once a release its holder knows unexpired
//! ([`LeaseStep::ReleaseUnexpired`]) skipped asking the lease's expiry. Naming each set's
//! key once and packing the steps in one argument ([`lease_batch_call`]), with the script's
//! common path making no calls into `math`, then took a step from 24,405 to 22,050
//! instructions on one set and from 27,810 to 26,433 on 1,000,000 (2,000 calls of 16 steps).
//! An acquire on a set no other step of its call names (kind 4) keeps nothing of the set
//! for later steps, so it makes no tables: a step on 1,000,000 sets 26,373 to 22,996.
//!
//! A set of one lease (most per-user sets, most of the time) is kept as a string,
//! `<id>:<expiry>`: an acquire alone on a set with no key writes it with one `SET NX`
//! (kind 4), and a release alone on its set takes it with one `GETDEL` (kinds 5 and 6),
//! where the sorted set took a `ZCARD`, a `ZADD`, a `PEXPIRE` and a `ZREM`. Any other step
//! turns it into the sorted set first. `lua_instructions.sh` (2,000 calls, the build before
//! and after): a step on 1,000,000 sets 22,758 to 18,467 instructions, a pair 2.38 rate
//! checks to **1.93**; on one busy set (a sorted set throughout) 21,665 to 22,549, 4% more,
//! as each call's first command on a set checks its type. By Redis CPU (`cargo bench
//! --bench leases`, two alternating runs): 1.69 and 1.70 rate checks a pair on 1,000,000
//! sets, from 1.82 and 1.94; one key unchanged (7.24 µs a pair against 7.28).

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use sluice_core::Decision;
use sluice_core::algorithm::concurrency::Released;

use crate::RedisError;
use crate::batch::{Answer, Batched};
use crate::script::{LEASE_BATCH, decision};
use crate::store::RedisStore;

/// One lease step of a rule of one concurrency leaf, as the batched script takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseStep {
    /// Take the lease on a set of `limit` slots whose leases last `lease` ticks.
    Acquire { limit: u64, lease: u64 },
    /// Give the lease back.
    Release,
    /// Give back a lease its holder knows has not expired (see
    /// [`LeaseKeys::held_for`](sluice_limiter::LeaseKeys::held_for)): the removal alone
    /// answers, so on a sorted set the release is one `ZREM` instead of a `ZSCORE` and a
    /// `ZREM` (answers `Released` or `NotHeld`, never `Expired`). On a set of one lease kept
    /// as a string either release is one `GETDEL`.
    ReleaseUnexpired,
    /// Push the lease to `lease` ticks past now.
    Renew { lease: u64 },
}

/// What a step answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseAnswer {
    /// The acquire's decision (as the single-step script's reply reads), and how many expired
    /// leases it dropped from the set first.
    Acquired { decision: Decision, dropped: u64 },
    /// What the release found.
    Released(Released),
    /// Ticks left on the renewed lease; `None` when it is not held.
    Renewed(Option<u64>),
}

/// KEYS and ARGV for one call of [`LEASE_BATCH`] taking `steps` (each a lease set's key, a
/// step and its lease id) in order. KEYS names each lease set once, however many steps it
/// has. ARGV is the number of distinct quota sets S, S pairs (limit, lease time), then every
/// step packed in one string: four bytes (kind: 1 acquire, 2 release, 0 release of a lease
/// its holder knows unexpired, 3 renew, and 4, 6 and 5 for 1, 2 and 0 on a key no other
/// step of the call names; its quota set from 1, 0 for a release; its key's place in KEYS
/// from 1; the id's length) and the lease id in decimal, followed by `:` for kinds 5 and 6
/// (the start of the one lease a set kept as a string holds, see
/// `src/lua/lease_batch.lua`). One string rather than two arguments a step: Redis makes a
/// string and a Lua table slot of every argument, and on a busy set that was more than a
/// tenth of a step's cost (`benches/lua_instructions.sh`). More than 255 keys or quota sets
/// in one call (the store sends at most 64 steps) is an error.
pub fn lease_batch_call<'a>(
    steps: impl IntoIterator<Item = (&'a str, LeaseStep, u64)>,
) -> Result<(Vec<&'a str>, Vec<Vec<u8>>), RedisError> {
    let steps: Vec<(&str, LeaseStep, u64)> = steps.into_iter().collect();
    let too_many = |what: &str| {
        RedisError::Unsupported(format!("more than 255 {what} in one batch of lease steps"))
    };
    // Each key's place, in the order first named, and how many steps name it.
    let mut keys: Vec<&str> = Vec::new();
    let mut places: HashMap<&str, (u8, usize)> = HashMap::new();
    for (key, _, _) in &steps {
        match places.get_mut(key) {
            Some((_, named)) => *named += 1,
            None => {
                keys.push(key);
                let place = u8::try_from(keys.len()).map_err(|_| too_many("lease sets"))?;
                places.insert(key, (place, 1));
            }
        }
    }
    let mut sets: Vec<(u64, u64)> = Vec::new();
    let mut packed = Vec::new();
    for (key, step, id) in steps {
        let (place, named) = places[key];
        let alone = named == 1;
        let (kind, set) = match step {
            LeaseStep::Acquire { limit, lease } => {
                (if alone { 4 } else { 1 }, Some((limit, lease)))
            }
            LeaseStep::Release => (if alone { 6 } else { 2 }, None),
            LeaseStep::ReleaseUnexpired => (if alone { 5 } else { 0 }, None),
            // A renew reads only the lease time: any set with it serves.
            LeaseStep::Renew { lease } => (
                3,
                Some(
                    sets.iter()
                        .find(|set| set.1 == lease)
                        .copied()
                        .unwrap_or((0, lease)),
                ),
            ),
        };
        let set = match set {
            None => 0,
            Some(set) => match sets.iter().position(|s| *s == set) {
                Some(i) => i + 1,
                None => {
                    sets.push(set);
                    sets.len()
                }
            },
        };
        let set = u8::try_from(set).map_err(|_| too_many("quota sets"))?;
        let mut digits = itoa::Buffer::new();
        let id = digits.format(id).as_bytes();
        // A u64 has at most 20 digits, and a `:` follows for kinds 5 and 6.
        let colon = matches!(kind, 5 | 6);
        packed.extend_from_slice(&[kind, set, place, id.len() as u8 + u8::from(colon)]);
        packed.extend_from_slice(id);
        if colon {
            packed.push(b':');
        }
    }
    let mut args = Vec::with_capacity(2 + sets.len() * 2);
    args.push(sets.len().to_string().into_bytes());
    for (limit, lease) in sets {
        args.push(limit.to_string().into_bytes());
        args.push(lease.to_string().into_bytes());
    }
    args.push(packed);
    Ok((keys, args))
}

/// Reads [`LEASE_BATCH`]'s flat reply to `steps`: each step's answer, in order. A reply of
/// another length or with a code the script never answers is an error for the whole batch.
pub fn lease_batch_answers(
    steps: &[LeaseStep],
    reply: &[i64],
) -> Result<Vec<LeaseAnswer>, RedisError> {
    let mut rest = reply;
    let mut answers = Vec::with_capacity(steps.len());
    let short = || {
        RedisError::Reply(format!(
            "{} integers for {} lease steps",
            reply.len(),
            steps.len()
        ))
    };
    for step in steps {
        let answer = match *step {
            LeaseStep::Acquire { limit, lease } => {
                let number = |n: u64| {
                    i64::try_from(n).map_err(|_| RedisError::Reply(format!("quota number {n}")))
                };
                let (limit, lease) = (number(limit)?, number(lease)?);
                // The common answer is one integer: admitted, that many slots left, reset
                // after one lease time, nothing dropped.
                let (code, remaining, reset, retry, dropped) = match rest {
                    [-1, code, remaining, reset, retry, dropped, tail @ ..] => {
                        rest = tail;
                        (*code, *remaining, *reset, *retry, *dropped)
                    }
                    [remaining, tail @ ..] if *remaining >= 0 => {
                        rest = tail;
                        (0, *remaining, lease, 0, 0)
                    }
                    _ => return Err(short()),
                };
                let (allowed, retry, denial) = match code {
                    0 => (1, -1, 0),
                    1 => (0, retry, 1),
                    2 => (0, -1, 2),
                    other => {
                        return Err(RedisError::Reply(format!("acquire answered code {other}")));
                    }
                };
                let reply = [allowed, limit, remaining, reset, retry, denial, 0];
                LeaseAnswer::Acquired {
                    decision: decision(&reply)?,
                    dropped: u64::try_from(dropped)
                        .map_err(|_| RedisError::Reply(format!("dropped {dropped}")))?,
                }
            }
            LeaseStep::Release | LeaseStep::ReleaseUnexpired => {
                let [code, tail @ ..] = rest else {
                    return Err(short());
                };
                rest = tail;
                LeaseAnswer::Released(match code {
                    1 => Released::Released,
                    2 if *step == LeaseStep::Release => Released::Expired,
                    0 => Released::NotHeld,
                    other => return Err(RedisError::Reply(format!("release answered {other}"))),
                })
            }
            LeaseStep::Renew { .. } => {
                let [left, tail @ ..] = rest else {
                    return Err(short());
                };
                rest = tail;
                LeaseAnswer::Renewed(match left {
                    -1 => None,
                    n => Some(
                        u64::try_from(*n)
                            .map_err(|_| RedisError::Reply(format!("renew answered {n}")))?,
                    ),
                })
            }
        };
        answers.push(answer);
    }
    if !rest.is_empty() {
        return Err(short());
    }
    Ok(answers)
}

/// The leases a lease set holds, as `(id, expires_at)` (microseconds), read straight from
/// Redis: a sorted set (member the id, score the expiry), or a set of one lease kept as the
/// string `<id>:<expires_at>` (see `src/lua/lease_batch.lua`); none when the key is gone.
/// For tests and tools; a key of another shape is an error naming what it found.
pub fn lease_set(
    con: &mut impl redis::ConnectionLike,
    key: &str,
) -> Result<Vec<(u64, u64)>, RedisError> {
    let kind: String = redis::cmd("TYPE").arg(key).query(con)?;
    match kind.as_str() {
        "none" => Ok(Vec::new()),
        "zset" => Ok(redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(con)?),
        "string" => {
            let value: String = redis::cmd("GET").arg(key).query(con)?;
            let lease = value
                .split_once(':')
                .and_then(|(id, at)| Some((id.parse().ok()?, at.parse().ok()?)));
            match lease {
                Some(lease) => Ok(vec![lease]),
                None => Err(RedisError::Reply(format!(
                    "{key} holds {value:?}, not a lease"
                ))),
            }
        }
        other => Err(RedisError::Reply(format!(
            "{key} is a {other}, not a lease set"
        ))),
    }
}

/// One queued lease step: its key, what to do, the lease, its slot (Cluster) and where its
/// answer goes.
pub(crate) struct LeasePending {
    pub key: String,
    pub step: LeaseStep,
    pub id: u64,
    pub slot: u16,
    pub reply: Answer<LeaseAnswer>,
}

impl Batched for LeasePending {
    fn slot(&self) -> u16 {
        self.slot
    }

    /// An acquire or renew nobody waits for is left out (a lease nobody knows of would hold
    /// its slot until it expired); a release still goes, as giving the slot back is what
    /// its caller wanted, answer or not.
    fn abandoned(&self) -> bool {
        !matches!(self.step, LeaseStep::Release | LeaseStep::ReleaseUnexpired)
            && self.reply.is_closed()
    }

    async fn send(store: RedisStore, batch: Vec<Self>) {
        send(&store, batch).await;
    }
}

/// Sends `batch` as one script call and answers each step: its answer, or the call's error.
/// Counts the leases found expired (dropped by an acquire, or released after expiring) here,
/// where Redis's answer arrives, so a step whose caller stopped waiting counts too.
async fn send(store: &RedisStore, batch: Vec<LeasePending>) {
    let steps: Vec<LeaseStep> = batch.iter().map(|pending| pending.step).collect();
    let call = lease_batch_call(batch.iter().map(|p| (p.key.as_str(), p.step, p.id)));
    let answers = match call {
        Ok((keys, arguments)) => {
            let result: Result<Vec<i64>, RedisError> =
                store.eval(&LEASE_BATCH, &keys, &arguments).await;
            result.and_then(|reply| lease_batch_answers(&steps, &reply))
        }
        Err(e) => Err(e),
    };
    match answers {
        Ok(answers) => {
            let expired: u64 = answers
                .iter()
                .map(|answer| match answer {
                    LeaseAnswer::Acquired { dropped, .. } => *dropped,
                    LeaseAnswer::Released(Released::Expired) => 1,
                    _ => 0,
                })
                .sum();
            store.count_expired(expired);
            for (pending, answer) in batch.into_iter().zip(answers) {
                let _ = pending.reply.send(Ok(answer));
            }
        }
        Err(e) => {
            for pending in batch {
                let _ = pending.reply.send(Err(e.clone()));
            }
        }
    }
}

impl RedisStore {
    /// Queues one lease step for the next batch and waits, within the store's timeout, for
    /// its answer.
    pub(crate) async fn lease_step(
        &self,
        identifier: &sluice_limiter::Identifier,
        step: LeaseStep,
        id: u64,
    ) -> Result<LeaseAnswer, RedisError> {
        self.batched(&self.queues().lease, identifier, |key, slot, reply| {
            LeasePending {
                key,
                step,
                id,
                slot,
                reply,
            }
        })
        .await
    }

    /// Adds `expired` to [`RedisStore::leases_expired`].
    pub(crate) fn count_expired(&self, expired: u64) {
        if expired > 0 {
            self.expired_counter().fetch_add(expired, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{LeaseStep, lease_batch_call};

    /// Each key once, in the order first named; quota sets shared by equal limits and lease
    /// times (a renew takes any set of its lease time), the sets read up front first; every
    /// step's four bytes and id.
    #[test]
    fn a_call_names_each_key_once_and_packs_every_step() {
        let acquire = LeaseStep::Acquire {
            limit: 3,
            lease: 60,
        };
        let (keys, args) = lease_batch_call([
            ("a", acquire, 7),
            (
                "b",
                LeaseStep::Acquire {
                    limit: 5,
                    lease: 60,
                },
                1234,
            ),
            ("a", LeaseStep::ReleaseUnexpired, 7),
            ("b", LeaseStep::Release, 18_446_744_073_709_551_615),
            ("a", LeaseStep::Renew { lease: 60 }, 7),
            ("c", acquire, 0),
            ("d", LeaseStep::ReleaseUnexpired, 9),
            ("e", LeaseStep::Release, 8),
            ("f", LeaseStep::Renew { lease: 60 }, 6),
        ])
        .unwrap();
        assert_eq!(keys, ["a", "b", "c", "d", "e", "f"]);
        let mut steps = vec![1, 1, 1, 1, b'7', 1, 2, 2, 4];
        steps.extend(b"1234");
        steps.extend([0, 0, 1, 1, b'7', 2, 0, 2, 20]);
        steps.extend(b"18446744073709551615");
        // Kinds 4, 5 and 6 for the steps alone on their keys, an id and ':' for 5 and 6.
        steps.extend([3, 1, 1, 1, b'7', 4, 1, 3, 1, b'0']);
        steps.extend([
            5, 0, 4, 2, b'9', b':', 6, 0, 5, 2, b'8', b':', 3, 1, 6, 1, b'6',
        ]);
        let want: Vec<Vec<u8>> = vec![
            b"2".to_vec(),
            b"3".to_vec(),
            b"60".to_vec(),
            b"5".to_vec(),
            b"60".to_vec(),
            steps,
        ];
        assert_eq!(args, want);
    }

    /// A key's place is one byte: a 256th key is refused, not wrapped onto the first.
    #[test]
    fn more_than_255_keys_is_an_error() {
        let names: Vec<String> = (0..256).map(|i| format!("k{i}")).collect();
        let steps = |n: usize| {
            names[..n]
                .iter()
                .map(|name| (name.as_str(), LeaseStep::Release, 1))
                .collect::<Vec<_>>()
        };
        assert_eq!(lease_batch_call(steps(255)).unwrap().0.len(), 255);
        let error = lease_batch_call(steps(256)).unwrap_err();
        assert!(error.to_string().contains("more than 255"), "{error}");
    }
}
