//! Sliding-window hits on one counter, combined within a process.
//!
//! Hits that take (record only if admitted) the same identifier's counter in the same
//! sub-window at the same moment are combined: the first reads the window, hits on the same
//! counter that come while that read is out join its batch, and the batch closes when the
//! read is back (later hits start one of their own, so no hit waits for another batch's
//! round trips; the read only screens out hits that cannot fit, the total `incr` returns
//! decides). The batch reads the window once (one multi-key `get` of all its sub-windows), judges the
//! hits one after the other against it (each counting those before it that fit), adds the
//! cost of those that fit with one `incr`, and judges them again, in order, on the total
//! `incr` returns: hits that no longer fit give their cost back with one `decr`. The outcome
//! is that of the hits run one at a time (each later hit sees the earlier admitted ones; a
//! hit denied at the second judgement is as if it gave its cost back before the next one
//! counted), so combining changes no decision and keeps the limit exact across processes
//! and concurrent batches; it saves round trips and system calls: a batch of hits on one
//! counter costs two round trips, not two per hit, and one when the counter is new: a batch
//! of a counter this process has not seen lately sends the `add` that creates it behind the
//! read (stored only if it is absent; see [`read_window`]). A counter seen lately is read
//! first, so a flood of refusals writes nothing.
//!
//! A lone hit runs in its caller's task; a batch of several runs on a task of its own, so
//! a caller that stops waiting (a timeout) strands no one. Hits within the clock-skew
//! margin of a sub-window boundary, peeks and forced records are not combined (see
//! [`crate::leaf`]).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use parking_lot::Mutex;
use sluice_core::algorithm::sliding_window::Counters as Windows;
use sluice_core::{Quota, State};
use tokio::sync::oneshot;

use crate::MemcachedError;
use crate::key::Keys;
use crate::leaf::{Judged, Recorded};
use crate::pool::Deadline;
use crate::reply::{self, Outcome, ReplyTo, Step, deliver, fail, take_late, wait};
use crate::stats::Counters;
use crate::store::Inner;
use crate::window::{Counted, Guess, Known, Window, read_window};

/// One hit waiting for its batch.
struct Pending {
    now: u64,
    cost: u64,
    deadline: Deadline,
    /// Where its answer goes: `None` for a batch's first hit while its caller runs the batch
    /// itself (a lone hit, the common case), which then takes the answer back directly.
    reply: ReplyTo<Judged>,
}

impl Step for Pending {
    type Answer = Judged;

    fn deadline(&self) -> Deadline {
        self.deadline
    }

    fn answer(self, answer: Outcome<Judged>) -> Option<Outcome<Judged>> {
        deliver(self.reply, answer)
    }
}

type Batch = reply::Batch<Pending>;

/// The identifier's keys, the quota and the sub-window a batch counts in.
#[derive(Clone)]
struct Counter {
    keys: Keys,
    quota: Quota,
    current: u64,
    /// Of the batch's key, for [`Known::remember`].
    hash: u64,
}

/// Hits waiting, by counter (identifier, sub-window, quota); a counter is present while a
/// batch of it gathers.
type Waiting = HashMap<(Keys, u64, Quota), Vec<Pending>, Hasher>;

/// foldhash, seeded per process: the key is hashed once to pick a shard and again by the
/// map, on every hit; SipHash was 1-2% of the client's CPU on a sliding window.
type Hasher = foldhash::fast::RandomState;

pub(crate) struct Combiner {
    shards: Box<[Mutex<Waiting>]>,
    hasher: Hasher,
    /// How this process last saw each counter, for the guess sent with a batch's read.
    pub(crate) known: Known,
}

impl Combiner {
    pub fn new(shards: usize) -> Combiner {
        Combiner {
            shards: (0..shards)
                .map(|_| Mutex::new(Waiting::default()))
                .collect(),
            hasher: Hasher::default(),
            known: Known::new(),
        }
    }

    fn hash(&self, key: &(Keys, u64, Quota)) -> u64 {
        self.hasher.hash_one(key)
    }

    fn shard(&self, hash: u64) -> &Mutex<Waiting> {
        &self.shards[hash as usize % self.shards.len()]
    }
}

/// Runs the hits that joined a leader whose caller stopped waiting before it took them.
struct Collecting<'a> {
    inner: &'a Arc<Inner>,
    counter: &'a Counter,
    key: Option<(Keys, u64, Quota)>,
    hash: u64,
}

impl Collecting<'_> {
    /// Takes the hits that joined, closing the batch: later hits start a batch of their own.
    fn take(&mut self) -> Vec<Pending> {
        let Some(key) = self.key.take() else {
            return Vec::new();
        };
        self.inner
            .windows
            .shard(self.hash)
            .lock()
            .remove(&key)
            .unwrap_or_default()
    }
}

impl Drop for Collecting<'_> {
    fn drop(&mut self) {
        let joined = self.take();
        if !joined.is_empty() {
            let (inner, counter) = (Arc::clone(self.inner), self.counter.clone());
            tokio::spawn(async move { run_batch(&inner, &counter, Batch::from_vec(joined)).await });
        }
    }
}

impl Inner {
    /// Takes a hit of `cost` at `now` on sliding-window leaf `keys` in sub-window `current`,
    /// combined with the other hits on it (see the module documentation).
    pub(crate) async fn take_combined(
        self: &Arc<Self>,
        keys: &Keys,
        quota: &Quota,
        now: u64,
        cost: u64,
        deadline: Deadline,
    ) -> Result<Judged, MemcachedError> {
        let current = now / quota.sub_window_ticks();
        let key = (keys.clone(), current, *quota);
        let hash = self.windows.hash(&key);
        let joined = {
            let mut waiting = self.windows.shard(hash).lock();
            match waiting.get_mut(&key) {
                Some(queue) => {
                    let (reply, answer) = oneshot::channel();
                    queue.push(Pending {
                        now,
                        cost,
                        deadline,
                        reply: Some(reply),
                    });
                    Some(answer)
                }
                None => {
                    waiting.insert(key.clone(), Vec::new());
                    None
                }
            }
        };
        if let Some(answer) = joined {
            return wait(answer, keys, deadline, "hit").await;
        }
        let counter = Counter {
            keys: keys.clone(),
            quota: *quota,
            current,
            hash,
        };
        let mut collecting = Collecting {
            inner: self,
            counter: &counter,
            key: Some(key),
            hash,
        };
        // Hits on this counter that come while the window is read join the batch; it
        // closes when the read is back. The read guesses from how this process last saw the
        // counter (see `read_window`).
        let guess = match self.windows.known.guess(hash, now, cost) {
            (_, empty) if cost > quota.limit() => (Guess::Read, empty),
            guess => guess,
        };
        let at = (keys, quota, current, now);
        let read = read_window(self, at, guess, deadline).await;
        let joined = collecting.take();
        let mut lead = Pending {
            now,
            cost,
            deadline,
            reply: None,
        };
        if joined.is_empty() {
            // Alone: this caller settles its own hit, no channel needed.
            let read = read?;
            let answer = settle(self, &counter, read, smallvec::smallvec![lead]).await;
            return answer.expect("a batch answers its caller's own hit");
        }
        let (reply, answer) = oneshot::channel();
        lead.reply = Some(reply);
        let mut batch = Batch::with_capacity(joined.len() + 1);
        batch.push(lead);
        batch.extend(joined);
        match read {
            Err(error) => {
                fail(batch, &error);
            }
            Ok(read) => {
                // On a task of its own, so the hits that joined are answered even if this
                // caller stops waiting.
                let (inner, counter) = (Arc::clone(self), counter.clone());
                tokio::spawn(async move { settle(&inner, &counter, read, batch).await });
            }
        }
        wait(answer, keys, deadline, "hit").await
    }
}

/// Reads the window, then judges `hits` on it.
async fn run_batch(inner: &Arc<Inner>, counter: &Counter, hits: Batch) {
    let Some(deadline) = hits.iter().map(|h| h.deadline).max_by_key(|d| d.at) else {
        return;
    };
    let now = hits.iter().map(|h| h.now).min().unwrap_or_default();
    let at = (&counter.keys, &counter.quota, counter.current, now);
    match read_window(inner, at, (Guess::Read, 0), deadline).await {
        Ok(read) => settle(inner, counter, read, hits).await,
        Err(error) => fail(hits, &error),
    };
}

/// Judges `hits` on the window `read` and answers each; the answer of the caller's own hit,
/// if it runs the batch.
async fn settle(
    inner: &Arc<Inner>,
    counter: &Counter,
    read: Window,
    mut hits: Batch,
) -> Option<Result<Judged, MemcachedError>> {
    let mut own = take_late(&mut hits);
    let Some(deadline) = hits.iter().map(|h| h.deadline).max_by_key(|d| d.at) else {
        if let Some(counted) = read.counted {
            // Every hit is late, the one the read counted too: give it back.
            let key = counter.keys.window(counter.current);
            let deadline = Deadline::after(inner.timeout);
            inner
                .decrement(&counter.keys, &key, counted.cost, deadline)
                .await;
        }
        return own;
    };
    let empty = read.empty;
    match judge_batch(inner, counter, read, &hits, deadline).await {
        Ok(judged) => {
            inner.windows.known.remember(counter.hash, empty);
            for (hit, judged) in hits.into_iter().zip(judged) {
                own = own.or(hit.answer(Ok(judged)));
            }
            own
        }
        Err(error) => own.or(fail(hits, &error)),
    }
}

/// Judges `hits` (in order) on the counter: see the module documentation.
async fn judge_batch(
    inner: &Arc<Inner>,
    counter: &Counter,
    read: Window,
    hits: &[Pending],
    deadline: Deadline,
) -> Result<Vec<Judged>, MemcachedError> {
    let Counter {
        keys,
        quota,
        current,
        ..
    } = counter;
    let (quota, current) = (*quota, *current);
    let ceiling = quota.limit().saturating_mul(2);
    let Window {
        mut counts,
        ahead,
        present,
        counted,
        ..
    } = read;
    // The next sub-window's hits are taken as this one's: never too few.
    let last = counts.len() - 1;
    let base = counts[last].saturating_add(ahead);
    let state = |counts: &[u64]| State::SlidingWindow(Windows::from_parts(current, counts));

    // First judgement, on the window as read: which hits would fit, one after the other.
    let mut judged = Vec::with_capacity(hits.len());
    let mut planned = 0u64;
    for &Pending { now, cost, .. } in hits {
        counts[last] = base.saturating_add(planned);
        let verdict = quota.sliding_window_verdict(current, &counts, now, cost);
        if verdict.allowed && cost > 0 {
            planned += cost;
        }
        judged.push(Judged {
            verdict,
            recorded: None,
            after: None,
        });
    }
    // What this batch has added to the counter, and the counter's total right after.
    let (added, total) = match counted {
        // The read counted enough already.
        Some(Counted { cost, total }) if cost >= planned => (cost, total),
        Some(Counted { cost, .. }) => {
            let now = hits[0].now;
            let more = planned - cost;
            let total = inner
                .increment(keys, current, &quota, now, more, true, deadline)
                .await?;
            (planned, total)
        }
        None if planned == 0 => return Ok(judged),
        None => {
            let now = hits[0].now;
            let total = inner
                .increment(keys, current, &quota, now, planned, present, deadline)
                .await?;
            (planned, total)
        }
    };
    // What others had counted when ours arrived.
    let others = if total < added {
        // Below what we just added: a wrapped or foreign value. Deny, and let it expire.
        Counters::bump(&inner.pool.counters.wrapped);
        ceiling
    } else {
        (total - added).min(ceiling)
    };

    // Second judgement, on the total: the hits kept so far count for the later ones.
    let mut kept = 0u64;
    for (j, &Pending { now, cost, .. }) in judged.iter_mut().zip(hits) {
        if !j.verdict.allowed || cost == 0 {
            continue;
        }
        counts[last] = others.saturating_add(kept).saturating_add(ahead);
        j.verdict = quota.sliding_window_verdict(current, &counts, now, cost);
        if j.verdict.allowed {
            kept += cost;
            counts[last] = others.saturating_add(kept).saturating_add(ahead);
            j.recorded = Some(Recorded::Counter {
                number: current,
                cost,
            });
            j.after = Some(state(&counts));
        }
    }
    if kept < added {
        let key = keys.window(current);
        inner.decrement(keys, &key, added - kept, deadline).await;
    }
    Ok(judged)
}
