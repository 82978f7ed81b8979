//! Batching: lean GCRA decisions waiting for the same connection go to Redis as one call of
//! [`GCRA_BATCH`], which decides each in order (each atomic, each its own answer); lean
//! fixed-window, sliding-window and sliding-log hits (`src/lean_batch.rs`) and single-leaf lease steps
//! (`src/lease_batch.rs`) go the same way, each kind in its own queue.
//!
//! There is no timer. A hit that finds nothing waiting and a call slot free is sent at once,
//! alone, by its caller's own task (no hop through another task, so a lone decision waits
//! only for its round trip). Hits that arrive while [`IN_FLIGHT`] calls are already out are
//! queued; one writer task per store and kind takes the first, waits for a call slot, then
//! takes what else is queued, at most [`MAX_BATCH`] hits, and sends them together. So
//! batching adds no latency at low load, and at high load one script call, one reply and one
//! round of syscalls serve many decisions.
//!
//! On a Cluster a script call's keys must share a slot: a batch is split by slot, and its
//! per-slot calls go out together (the cluster connection pipelines those bound for one
//! node). With keys spread over many slots most such calls hold one hit, so a Cluster gains
//! less than one server does; [`IN_FLIGHT_CLUSTER`] lets more batches out at once so it
//! never waits behind its own queue.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Weak};

use sluice_core::Decision;
use sluice_limiter::{Hit, Identifier};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::RedisError;
use crate::lean_batch::{FixedPending, LeanPending, LogPending, SlidingPending};
use crate::lease_batch::LeasePending;
use crate::rule_batch::RulePending;
use crate::script::distinct_batch_call;
use crate::script::{
    FIXED_BATCH, GCRA_BATCH, LOG_BATCH, LeanFixed, LeanGcra, LeanLog, LeanSliding, Lua,
    SLIDING_BATCH,
};
use crate::slot::{key, slot_of};
use crate::store::{Inner, RedisStore};

/// Most hits in one call: 64 keys and about as many small numbers, a few kilobytes, and a
/// script run of a few hundred microseconds at most, so no call holds Redis up for long.
pub(crate) const MAX_BATCH: usize = 64;

/// Calls out at once on one server: a second lets Redis work while the client reads the
/// first's reply and queues the next. Measured with 50 callers (`benches/throughput.rs`,
/// three alternating runs of one and two on a quiet machine, medians): on 1,000,000 keys two
/// made 140,478 decisions a second at 4.93 µs of Redis CPU each (13 per call), one 124,534 at
/// 4.76 µs (25 per call); on one key 216,109 at 2.40 µs against 210,523 at 2.08 µs. Four
/// made 105,984 at 6.32 µs on 1,000,000 keys in one run: smaller batches, each dearer.
pub(crate) const IN_FLIGHT: usize = 2;

/// Calls out at once on a Cluster, where most per-slot calls hold one hit.
pub(crate) const IN_FLIGHT_CLUSTER: usize = 16;

/// Where a queued step's answer goes: its caller, waiting.
pub(crate) type Answer<T> = oneshot::Sender<Result<T, RedisError>>;

/// One queued hit: its key, its five arguments, its slot (Cluster) and where its reply goes.
pub(crate) struct Pending {
    pub key: String,
    pub arguments: [u64; 5],
    pub slot: u16,
    pub reply: Answer<i64>,
}

/// One kind of queued step that goes to Redis in batches.
pub(crate) trait Batched: Send + Sized + 'static {
    /// Its key's Cluster slot (0 on a standalone server).
    fn slot(&self) -> u16;
    /// Whether to leave it out of the batch: its caller stopped waiting (its timeout passed)
    /// and sending it would change what nobody learns about.
    fn abandoned(&self) -> bool;
    /// Sends `batch` (keys of one slot on a Cluster) as one script call and answers each.
    fn send(store: RedisStore, batch: Vec<Self>) -> impl Future<Output = ()> + Send;
}

impl Batched for Pending {
    fn slot(&self) -> u16 {
        self.slot
    }

    fn abandoned(&self) -> bool {
        // Not sending a hit nobody waits for keeps it from counting.
        self.reply.is_closed()
    }

    async fn send(store: RedisStore, batch: Vec<Self>) {
        send(&store, batch).await;
    }
}

/// A store's queues, one per kind of batched step.
pub(crate) struct Queues {
    /// Lean GCRA hits.
    pub gcra: Batcher,
    /// Lean fixed-window hits.
    pub fixed: Batcher<FixedPending>,
    /// Lean sliding-window hits.
    pub sliding: Batcher<SlidingPending>,
    /// Lean sliding-log hits.
    pub log: Batcher<LogPending>,
    /// Lean GCRA rules (leaves joined by `;`, penalties).
    pub rule: Batcher<RulePending>,
    /// Single-leaf lease steps.
    pub lease: Batcher<LeasePending>,
}

impl Queues {
    /// Starts every queue's writer task (see [`Batcher::start`]).
    pub(crate) fn start(store: &Weak<Inner>, cluster: bool) -> Queues {
        Queues {
            gcra: Batcher::start(store.clone(), cluster),
            fixed: Batcher::start(store.clone(), cluster),
            sliding: Batcher::start(store.clone(), cluster),
            log: Batcher::start(store.clone(), cluster),
            rule: Batcher::start(store.clone(), cluster),
            lease: Batcher::start(store.clone(), cluster),
        }
    }
}

/// The queue of a store's steps of one kind; its writer task ends when the store is dropped.
pub(crate) struct Batcher<P: Batched = Pending> {
    queue: mpsc::UnboundedSender<P>,
    /// Call slots: at most this many calls out at once, sent alone or batched.
    slots: Arc<Semaphore>,
    /// Steps queued and not yet sent (in the queue, or taken by the writer and waiting for
    /// a slot): a step goes alone only when this is 0, so a batch is never overtaken for long.
    waiting: Arc<AtomicUsize>,
}

impl<P: Batched> Batcher<P> {
    /// Starts the writer task on the current runtime (the one the connection's own tasks
    /// run on). `store` is weak so that the task does not keep the store alive.
    pub(crate) fn start(store: Weak<Inner>, cluster: bool) -> Batcher<P> {
        let (queue, steps) = mpsc::unbounded_channel();
        let slots = Arc::new(Semaphore::new(if cluster {
            IN_FLIGHT_CLUSTER
        } else {
            IN_FLIGHT
        }));
        let waiting = Arc::new(AtomicUsize::new(0));
        tokio::spawn(write(store, steps, slots.clone(), waiting.clone(), cluster));
        Batcher {
            queue,
            slots,
            waiting,
        }
    }

    /// Sends `pending` alone when nothing waits and a call slot is free (the returned
    /// future sends it and answers it: the caller awaits it, under its timeout, before its
    /// answer); queues it for the writer otherwise (`None`). An error when the writer task
    /// is gone (its runtime shut down).
    ///
    /// The future is boxed: unboxed, the whole Redis call's future became part of every
    /// caller's, deep enough to pass the compiler's layout depth limit in a caller that
    /// nests it further (this crate's lease benchmark did). A lone call waits a round trip,
    /// so its one allocation does not show.
    pub(crate) fn submit(
        &self,
        store: &RedisStore,
        pending: P,
    ) -> Result<Option<Alone>, RedisError> {
        if self.waiting.load(Ordering::Acquire) == 0
            && let Ok(slot) = self.slots.clone().try_acquire_owned()
        {
            return Ok(Some(Box::pin(send_alone(store.clone(), pending, slot))));
        }
        self.waiting.fetch_add(1, Ordering::AcqRel);
        self.queue.send(pending).map_err(|_| {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            gone()
        })?;
        Ok(None)
    }
}

/// A step's call made by its caller (see [`Batcher::submit`]).
pub(crate) type Alone = std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// One step sent by its caller, holding a call slot until its reply.
async fn send_alone<P: Batched>(store: RedisStore, pending: P, slot: OwnedSemaphorePermit) {
    P::send(store, vec![pending]).await;
    drop(slot);
}

/// The error of a hit whose call cannot be made: transient, like a dropped connection.
pub(crate) fn gone() -> RedisError {
    RedisError::Redis(redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::BrokenPipe,
        "the Redis store's batching task has stopped",
    )))
}

/// The writer: waits for a step, then for a call slot, takes what else is queued (up to
/// [`MAX_BATCH`]) and sends it in a task of its own, so the next batch can form meanwhile.
async fn write<P: Batched>(
    store: Weak<Inner>,
    mut steps: mpsc::UnboundedReceiver<P>,
    slots: Arc<Semaphore>,
    waiting: Arc<AtomicUsize>,
    cluster: bool,
) {
    loop {
        let Some(first) = steps.recv().await else {
            return;
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut batch = Vec::with_capacity(MAX_BATCH);
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match steps.try_recv() {
                Ok(pending) => batch.push(pending),
                Err(_) => break,
            }
        }
        waiting.fetch_sub(batch.len(), Ordering::AcqRel);
        // A caller that stopped waiting (its timeout passed) gets no answer.
        batch.retain(|pending| !pending.abandoned());
        if batch.is_empty() {
            continue;
        }
        let Some(inner) = store.upgrade() else {
            return;
        };
        let store = RedisStore::from_inner(inner);
        tokio::spawn(async move {
            if cluster {
                send_by_slot(&store, batch).await;
            } else {
                P::send(store, batch).await;
            }
            drop(slot);
        });
    }
}

/// Sends a Cluster batch as one call per slot, all at once.
/// The sort is stable: the steps of one slot keep their order of arrival.
async fn send_by_slot<P: Batched>(store: &RedisStore, mut batch: Vec<P>) {
    batch.sort_by_key(P::slot);
    let mut calls = tokio::task::JoinSet::new();
    while let Some(last) = batch.last() {
        let slot = last.slot();
        let at = batch.partition_point(|pending| pending.slot() < slot);
        let group = batch.split_off(at);
        calls.spawn(P::send(store.clone(), group));
    }
    while calls.join_next().await.is_some() {}
}

/// Sends `batch` as one script call and answers each hit: its debt, or the call's error
/// (a call that failed decided nothing that anyone is told was admitted).
async fn send(store: &RedisStore, batch: Vec<Pending>) {
    let (keys, arguments) = distinct_batch_call(
        batch
            .iter()
            .map(|pending| (pending.key.as_str(), pending.arguments)),
    );
    let result = store.eval(&GCRA_BATCH, &keys, &arguments).await;
    answer_each(
        batch,
        result,
        0,
        |_| 1,
        |pending, answer| {
            let _ = pending.reply.send(answer.map(|(_, debt)| debt[0]));
        },
    );
}

/// Answers each step of a batch from its call's `result`: a reply of `head` integers that
/// every step shares (Redis's `now`), then each step's own `len` integers, in order. Each
/// step gets (head, its own), or the call's error; a reply of another length is an error
/// for every step (a call that failed decided nothing that anyone is told was admitted).
pub(crate) fn answer_each<P>(
    batch: Vec<P>,
    result: Result<Vec<i64>, RedisError>,
    head: usize,
    len: impl Fn(&P) -> usize,
    answer: impl Fn(P, Result<(&[i64], &[i64]), RedisError>),
) {
    let wanted = head + batch.iter().map(&len).sum::<usize>();
    match result {
        Ok(reply) if reply.len() == wanted => {
            let (shared, mut rest) = reply.split_at(head);
            for step in batch {
                let (own, next) = rest.split_at(len(&step));
                rest = next;
                answer(step, Ok((shared, own)));
            }
        }
        Ok(reply) => {
            let wrong = format!("{} integers in reply, {wanted} expected", reply.len());
            for step in batch {
                answer(step, Err(RedisError::Reply(wrong.clone())));
            }
        }
        Err(e) => {
            for step in batch {
                answer(step, Err(e.clone()));
            }
        }
    }
}

impl RedisStore {
    /// Queues a lean hit for the next batch and waits, within the store's timeout, for its
    /// debt, which the core's GCRA turns into the decision.
    pub(crate) async fn decide_lean(
        &self,
        hit: &Hit<'_>,
        lean: LeanGcra,
    ) -> Result<Decision, RedisError> {
        let batcher = &self.queues().gcra;
        let debt = self
            .batched(batcher, &hit.identifiers[0], |key, slot, reply| Pending {
                key,
                arguments: lean.arguments(),
                slot,
                reply,
            })
            .await?;
        lean.decision(debt)
    }

    /// Queues a lean fixed-window hit for the next batch and waits, within the store's
    /// timeout, for its two integers, which the core's fixed window turns into the decision.
    pub(crate) async fn decide_fixed(
        &self,
        hit: &Hit<'_>,
        lean: LeanFixed,
    ) -> Result<Decision, RedisError> {
        let queue = &self.queues().fixed;
        let [used, left] = self
            .lean_reply(queue, hit, lean.arguments(), &FIXED_BATCH, (false, true))
            .await?;
        lean.decision(used, left)
    }

    /// Queues a lean sliding-window hit for the next batch and waits, within the store's
    /// timeout, for its verdict (three integers), which makes the decision.
    pub(crate) async fn decide_sliding(
        &self,
        hit: &Hit<'_>,
        lean: LeanSliding,
    ) -> Result<Decision, RedisError> {
        let queue = &self.queues().sliding;
        let verdict = self
            .lean_reply(queue, hit, lean.arguments(), &SLIDING_BATCH, (false, true))
            .await?;
        lean.decision(verdict)
    }

    /// Queues a lean sliding-log hit for the next batch and waits, within the store's
    /// timeout, for its verdict (three integers), which makes the decision.
    pub(crate) async fn decide_log(
        &self,
        hit: &Hit<'_>,
        lean: LeanLog,
    ) -> Result<Decision, RedisError> {
        let queue = &self.queues().log;
        let verdict = self
            .lean_reply(queue, hit, lean.arguments(), &LOG_BATCH, (true, true))
            .await?;
        lean.decision(verdict)
    }

    /// Queues a lean hit of `A` arguments on `queue` for its next call of `script` (whose
    /// ARGV ends with a token unique to the call when `token`, and which has a loop for
    /// distinct keys of one set when `distinct`), and waits, within the store's timeout,
    /// for the hit's `R` integers.
    async fn lean_reply<const A: usize, const R: usize>(
        &self,
        queue: &Batcher<LeanPending<A, R>>,
        hit: &Hit<'_>,
        arguments: [u64; A],
        script: &'static LazyLock<Lua>,
        (token, distinct): (bool, bool),
    ) -> Result<[i64; R], RedisError> {
        self.batched(queue, &hit.identifiers[0], |key, slot, reply| LeanPending {
            key,
            arguments,
            slot,
            script,
            token,
            distinct,
            reply,
        })
        .await
    }

    /// Queues a step on `identifier`'s key for `batcher`'s next batch (`pending` makes it
    /// from the key, its Cluster slot and where its answer goes) and waits, within the
    /// store's timeout, for its answer.
    pub(crate) async fn batched<P: Batched, T>(
        &self,
        batcher: &Batcher<P>,
        identifier: &Identifier,
        pending: impl FnOnce(String, u16, Answer<T>) -> P,
    ) -> Result<T, RedisError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let slot = if self.is_cluster() {
            slot_of(identifier)
        } else {
            0
        };
        let alone = batcher.submit(self, pending(key(identifier), slot, reply))?;
        self.await_batched(alone, answer).await
    }
}

#[cfg(test)]
mod tests {
    use super::answer_each;
    use crate::RedisError;
    use std::cell::RefCell;

    /// Each step gets the shared head and its own part, in order; a reply of another length
    /// or a failed call is an error for every step, never a part of another's reply.
    #[test]
    fn each_step_gets_its_own_part_or_the_error() {
        let got = RefCell::new(Vec::new());
        let record = |step: usize, answer: Result<(&[i64], &[i64]), RedisError>| {
            let answer = answer.map(|(head, own)| (head.to_vec(), own.to_vec()));
            got.borrow_mut()
                .push((step, answer.map_err(|e| e.to_string())));
        };
        answer_each(vec![1, 3, 0], Ok(vec![9, 1, 2, 3, 4]), 1, |n| *n, record);
        assert_eq!(
            *got.borrow(),
            [
                (1, Ok((vec![9], vec![1]))),
                (3, Ok((vec![9], vec![2, 3, 4]))),
                (0, Ok((vec![9], vec![]))),
            ]
        );
        got.borrow_mut().clear();
        answer_each(vec![1, 3], Ok(vec![9, 1, 2, 3]), 1, |n| *n, record);
        answer_each(
            vec![2],
            Err(RedisError::Reply("down".into())),
            0,
            |n| *n,
            record,
        );
        let errors: Vec<bool> = got.borrow().iter().map(|(_, a)| a.is_err()).collect();
        assert_eq!(errors, [true, true, true]);
    }
}
