//! Optimistic updates of one `|s` key: `gets`, compute, then `cas` (or `add` when the key is
//! absent), again on a lost race, a bounded number of times.
//!
//! Within one process, updates of one key are *combined*: while one batch is in flight, the
//! updates that arrive queue up, and the next batch applies them all, one after the other,
//! to the value it read, then writes the result with one `cas`. Each update sees the state
//! every earlier one left, exactly as if they had run one at a time, so batching changes no
//! decision; it only saves round trips (many hits on one key cost two round trips per batch,
//! not per hit) and leaves the races to other processes. A batch that loses a race is applied
//! again to the new value after a short jittered pause that doubles with each try; when every
//! try is lost its updates fail with [`Contention`](crate::MemcachedError::Contention), a
//! transient error: the limiter's failure policy decides those hits.
//!
//! A batch that starts while no other batch of its key is running guesses that the key is
//! absent: its first try sends, behind the `gets`, the `add` of what the batch makes of a
//! fresh state. memcached stores it only if the key is absent when the `add` comes, so then
//! the guess is exactly what the updates would have done, and a key not yet stored (or
//! expired: a GCRA state lives only until its bucket is full again) costs one round trip.
//! A stored key makes the `add` fail, and the batch goes on with the value `gets` read, by
//! `cas`, as before (the guess costs only the `add`'s few bytes).
//!
//! A lone update runs in its caller's task; updates that queued behind it run on a task of
//! their own, so a caller that stops waiting (a timeout) strands no one queued behind it.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use smallvec::smallvec;
use tokio::sync::oneshot;

use crate::MemcachedError;
use crate::commands::StoreReply;
use crate::expiry::exptime;
use crate::key::Keys;
use crate::leaf::Judged;
use crate::pool::Deadline;
use crate::protocol::Verb;
use crate::reply::{self, Outcome, ReplyTo, Step, deliver, fail, take_late, wait};
use crate::stats::Counters;
use crate::store::Inner;

/// Default tries of one compare-and-swap update.
pub const DEFAULT_CAS_TRIES: u32 = 64;

/// What an update answers its caller.
#[derive(Debug)]
pub(crate) enum Answer {
    Judged(Judged),
    /// A concurrency leaf judged, and how many expired leases its set dropped.
    Leased {
        judged: Judged,
        expired: u64,
    },
    /// What a release found.
    Released(sluice_core::algorithm::concurrency::Released),
    /// A renewed lease's new expiry (ns), `None` when it was not held.
    Renewed(Option<u64>),
    /// A penalty strike: nanoseconds the key must wait.
    Wait(u64),
    Done,
    /// There was nothing to update.
    Absent,
}

/// What to do with the value read.
pub(crate) enum Plan {
    /// Write nothing.
    Keep(Answer),
    /// Write `value`, which is fresh again at `expires_at` (ns). `was_live`: the value read
    /// should not have disappeared by now (if it has, it was evicted).
    Write {
        value: Vec<u8>,
        expires_at: u64,
        was_live: bool,
        answer: Answer,
    },
}

/// An update: from the value read (if any), what to write and answer. It may run several
/// times (once per try), always on the value left by the updates before it.
pub(crate) type PlanFn = Box<dyn FnMut(Option<&[u8]>) -> Result<Plan, MemcachedError> + Send>;

struct Update {
    plan: PlanFn,
    now: u64,
    deadline: Deadline,
    /// Where its answer goes: `None` for the update whose caller runs the batch itself (a
    /// lone update, the common case), which takes its answer back directly.
    reply: ReplyTo<Answer>,
}

impl Step for Update {
    type Answer = Answer;

    fn deadline(&self) -> Deadline {
        self.deadline
    }

    fn answer(self, answer: Outcome<Answer>) -> Option<Outcome<Answer>> {
        deliver(self.reply, answer)
    }
}

type Batch = reply::Batch<Update>;

/// Updates waiting, by key; a key is present while a batch of it is being run.
type Waiting = HashMap<String, Vec<Update>, Hasher>;

/// foldhash, seeded per process, as in `combine.rs`: the key is hashed to pick a shard and
/// again by the map, on every update.
type Hasher = foldhash::fast::RandomState;

pub(crate) struct Combiner {
    shards: Box<[Mutex<Waiting>]>,
    hasher: Hasher,
}

impl Combiner {
    pub fn new(shards: usize) -> Combiner {
        Combiner {
            shards: (0..shards)
                .map(|_| Mutex::new(Waiting::default()))
                .collect(),
            hasher: Hasher::default(),
        }
    }

    fn shard(&self, key: &str) -> &Mutex<Waiting> {
        &self.shards[self.hasher.hash_one(key) as usize % self.shards.len()]
    }
}

/// Waits a little before trying again: at once for the first two tries, then a random
/// pause of up to 0.4 ms, 0.8 ms, ... 12.8 ms.
async fn backoff(attempt: u32) {
    if attempt < 2 {
        tokio::task::yield_now().await;
        return;
    }
    let cap = 100u64 << attempt.min(7);
    let micros = std::hash::RandomState::new().hash_one(attempt) % cap + 1;
    tokio::time::sleep(Duration::from_micros(micros)).await;
}

/// Applies `plan` to `keys.state()` (see the module documentation).
pub(crate) async fn update(
    inner: &Arc<Inner>,
    keys: &Keys,
    now: u64,
    deadline: Deadline,
    plan: PlanFn,
) -> Result<Answer, MemcachedError> {
    let key = keys.state();
    let mut update = Update {
        plan,
        now,
        deadline,
        reply: None,
    };
    let queued = {
        let mut waiting = inner.combiner.shard(&key).lock();
        match waiting.get_mut(&key) {
            Some(queue) => {
                let (reply, answer) = oneshot::channel();
                update.reply = Some(reply);
                queue.push(update);
                Ok(answer)
            }
            None => {
                waiting.insert(key.clone(), Vec::new());
                Err(update)
            }
        }
    };
    let update = match queued {
        Ok(answer) => return wait(answer, keys, deadline, "update").await,
        Err(update) => update,
    };
    // A lone update runs in its caller's task, which takes its answer back directly; what
    // queued meanwhile is handed over.
    let handover = Handover {
        inner: Arc::clone(inner),
        keys: keys.clone(),
        key,
    };
    let own = run_batch(inner, keys, &handover.key, smallvec![update], true).await;
    own.expect("a batch answers its caller's own update")
}

/// Hands the updates that queued behind a caller's own batch to a task of their own, or
/// forgets the key when none did; also when that caller stops waiting mid-batch.
struct Handover {
    inner: Arc<Inner>,
    keys: Keys,
    key: String,
}

impl Drop for Handover {
    fn drop(&mut self) {
        let more = {
            let mut waiting = self.inner.combiner.shard(&self.key).lock();
            match waiting.get(&self.key) {
                Some(queue) if !queue.is_empty() => true,
                _ => {
                    waiting.remove(&self.key);
                    false
                }
            }
        };
        if more {
            let (inner, keys) = (Arc::clone(&self.inner), self.keys.clone());
            tokio::spawn(run_batches(inner, keys, self.key.clone()));
        }
    }
}

/// Runs batches of `key` until none is waiting.
async fn run_batches(inner: Arc<Inner>, keys: Keys, key: String) {
    loop {
        let batch = {
            let mut waiting = inner.combiner.shard(&key).lock();
            match waiting.get_mut(&key) {
                Some(queue) if !queue.is_empty() => std::mem::take(queue),
                _ => {
                    waiting.remove(&key);
                    return;
                }
            }
        };
        // The batch before just read or wrote the key: no guess that it is absent.
        run_batch(&inner, &keys, &key, Batch::from_vec(batch), false).await;
    }
}

/// The updates of a batch applied in order to `value` (what the key holds, `None` when
/// absent): their answers, the value to write (with its expiry and the time of the update
/// that wrote last), and whether the value read should still have been live.
struct Applied {
    answers: Vec<Result<Answer, MemcachedError>>,
    write: Option<(Vec<u8>, u64, u64)>,
    was_live: bool,
}

fn apply(updates: &mut [Update], mut value: Option<Vec<u8>>) -> Applied {
    let mut answers = Vec::with_capacity(updates.len());
    let mut write = None;
    let mut was_live = false;
    for update in updates.iter_mut() {
        match (update.plan)(value.as_deref()) {
            Ok(Plan::Keep(answer)) => answers.push(Ok(answer)),
            Ok(Plan::Write {
                value: next,
                expires_at,
                was_live: live,
                answer,
            }) => {
                if write.is_none() {
                    was_live = live;
                }
                value = Some(next);
                write = Some((expires_at, update.now));
                answers.push(Ok(answer));
            }
            Err(error) => answers.push(Err(error)),
        }
    }
    Applied {
        answers,
        write: write
            .zip(value)
            .map(|((expires_at, now), value)| (value, expires_at, now)),
        was_live,
    }
}

/// Answers each update; the answer of the caller's own, if it runs the batch.
fn answer(
    updates: Batch,
    answers: Vec<Result<Answer, MemcachedError>>,
) -> Option<Result<Answer, MemcachedError>> {
    let mut own = None;
    for (update, answer) in updates.into_iter().zip(answers) {
        own = own.or(update.answer(answer));
    }
    own
}

/// Runs one batch.
///
/// `guess_absent`: the first try applies the batch to a fresh state too and sends the result
/// as an `add` behind the `gets`, in the same round trip. A key not yet stored (or expired:
/// a GCRA state lives only until its bucket is full again) is then decided in one round
/// trip; a stored one makes the `add` fail and goes on by `cas` as before. The `add` only
/// stores when the key is absent as it arrives, so what it answers is what one-at-a-time
/// updates would answer.
async fn run_batch(
    inner: &Inner,
    keys: &Keys,
    key: &str,
    mut updates: Batch,
    guess_absent: bool,
) -> Option<Result<Answer, MemcachedError>> {
    let pool = &inner.pool;
    let route = keys.route();
    let mut own = None;
    for attempt in 0..inner.cas_tries {
        // Callers that gave up are answered (they no longer listen) and left out.
        own = own.or(take_late(&mut updates));
        let Some(deadline) = updates.iter().map(|u| u.deadline).max_by_key(|d| d.at) else {
            return own;
        };
        let guess = (attempt == 0 && guess_absent)
            .then(|| apply(&mut updates, None))
            .filter(|guess| guess.write.is_some());
        let current = match &guess {
            Some(Applied {
                write: Some((value, expires_at, now)),
                ..
            }) => {
                let expiry = exptime(*expires_at, *now);
                match pool.gets_and_add(route, key, expiry, value, deadline).await {
                    Ok((read, StoreReply::Stored)) => {
                        // Absent when the `add` came: the guess is the answer. A value read
                        // just before that should still have lived was evicted.
                        if let Some((value, _)) = read
                            && apply(&mut updates, Some(value)).was_live
                        {
                            Counters::bump(&pool.counters.evictions);
                        }
                        let answers = guess.map(|g| g.answers).unwrap_or_default();
                        return own.or(answer(updates, answers));
                    }
                    Ok((None, _)) => {
                        // Created by another client between our `gets` and `add`: read again.
                        Counters::bump(&pool.counters.contention_retries);
                        continue;
                    }
                    Ok((current, _)) => current,
                    Err(error) => return own.or(fail(updates, &error)),
                }
            }
            _ => match pool.gets(route, key, deadline).await {
                Ok(current) => current,
                Err(error) => return own.or(fail(updates, &error)),
            },
        };
        let Applied {
            answers,
            write,
            was_live,
        } = apply(&mut updates, current.as_ref().map(|(v, _)| v.clone()));
        let stored = match write {
            Some((value, expires_at, now)) => {
                let verb = match &current {
                    Some((_, unique)) => Verb::Cas(*unique),
                    None => Verb::Add,
                };
                let expiry = exptime(expires_at, now);
                pool.store(route, verb, key, expiry, &value, deadline).await
            }
            None => Ok(StoreReply::Stored),
        };
        match stored {
            Ok(StoreReply::Stored) => return own.or(answer(updates, answers)),
            Ok(StoreReply::NotFound) => {
                // Gone between our read and our write: apply the batch to a fresh state.
                if was_live {
                    Counters::bump(&pool.counters.evictions);
                }
            }
            Ok(StoreReply::Exists | StoreReply::NotStored) => {
                Counters::bump(&pool.counters.contention_retries);
                backoff(attempt).await;
            }
            Err(error) => return own.or(fail(updates, &error)),
        }
    }
    Counters::bump(&pool.counters.contention_exhausted);
    let error = MemcachedError::Contention {
        key: key.to_owned(),
        tries: inner.cas_tries,
    };
    own.or(fail(updates, &error))
}
