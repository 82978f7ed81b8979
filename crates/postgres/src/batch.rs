//! Lean decisions (one GCRA leaf, no penalty) batched: the decisions that queued while the
//! connections were busy go together in one call of `gcra_many`, one round trip and one
//! transaction for up to [`MAX_BATCH`] of them.
//!
//! A decision joins the queue and wakes one of the store's senders, tasks as many as the
//! pool's connections. A sender takes a connection, then whatever is queued (up to
//! [`MAX_BATCH`]), and sends it at once: a decision alone goes alone (through `gcra_one`),
//! without a timer; batches only form while calls are in flight. A caller that gives up (its
//! timeout) never cancels the others' decisions; a decision whose caller is gone before its
//! batch leaves is dropped, never counted. A batch that fails (a lost connection, the
//! store's timeout) fails every decision in it with the same error: none is admitted
//! silently.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use sluice_core::Decision;
use tokio::sync::{Notify, oneshot};

use crate::PostgresError;
use crate::call::decision;
use crate::error::is_transient_postgres;

/// The most decisions one call carries.
pub const MAX_BATCH: usize = 64;

/// One decision's reply: `[allowed, limit, remaining, reset_after, retry_after, denial,
/// leaf]`, or why the call failed.
type Reply = Result<Vec<i64>, PostgresError>;

/// A decision waiting for a connection.
struct Waiting {
    id: String,
    /// cost, recording, interval, burst, window.
    args: [i64; 5],
    reply: oneshot::Sender<Reply>,
}

/// The queue of lean decisions, its senders' statements, and their stop signal.
struct Queue {
    waiting: Mutex<VecDeque<Waiting>>,
    /// Wakes a sender when a decision arrives, every sender when the store is dropped.
    wake: Notify,
    closed: AtomicBool,
    /// `gcra_one` for a batch of one.
    one_sql: String,
    /// `gcra_many` for more.
    many_sql: String,
    /// How long a batch's call may take; past it every decision in it times out.
    timeout: Duration,
}

/// The store's handle on the queue; dropping it stops the senders.
pub struct Batcher {
    queue: Arc<Queue>,
}

impl Drop for Batcher {
    fn drop(&mut self) {
        self.queue.closed.store(true, Ordering::Release);
        self.queue.wake.notify_waiters();
    }
}

impl Batcher {
    /// Starts `senders` tasks (on the current Tokio runtime) sending on `pool`'s
    /// connections.
    pub fn start(pool: &Arc<Pool>, schema: &str, timeout: Duration, senders: usize) -> Batcher {
        let queue = Arc::new(Queue {
            waiting: Mutex::new(VecDeque::new()),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
            one_sql: format!(
                "SELECT {schema}.gcra_one($1::text, $2::bigint, $3::bigint, $4::bigint, \
                 $5::bigint, $6::bigint)"
            ),
            many_sql: format!(
                "SELECT {schema}.gcra_many($1::text[], $2::bigint[], $3::bigint[], \
                 $4::bigint[], $5::bigint[], $6::bigint[])"
            ),
            timeout,
        });
        for _ in 0..senders.max(1) {
            let (queue, pool) = (Arc::clone(&queue), Arc::clone(pool));
            tokio::spawn(async move { queue.send_loop(&pool).await });
        }
        Batcher { queue }
    }

    /// Decides one lean hit on `id` with `args` (cost, recording, interval, burst, window),
    /// alone or with the decisions queued beside it.
    pub async fn decide(&self, id: &str, args: [i64; 5]) -> Result<Decision, PostgresError> {
        let (reply, answer) = oneshot::channel();
        self.queue.lock().push_back(Waiting {
            id: id.to_owned(),
            args,
            reply,
        });
        self.queue.wake.notify_one();
        match answer.await {
            Ok(reply) => decision(&reply?),
            // Only a panic in a sender drops a reply unsent.
            Err(_) => Err(PostgresError::Pool(
                "the call carrying this decision ended without an answer".into(),
            )),
        }
    }
}

impl Queue {
    /// A sender: waits for decisions, takes a connection, sends what is queued; until the
    /// store is dropped.
    async fn send_loop(&self, pool: &Pool) {
        loop {
            let woken = self.wake.notified();
            tokio::pin!(woken);
            // Registered before looking, so a wake between the look and the wait is kept.
            woken.as_mut().enable();
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            if self.lock().is_empty() {
                woken.await;
                continue;
            }
            match pool.get().await {
                Ok(client) => {
                    let batch = self.take();
                    if !batch.is_empty() {
                        self.run(client, batch).await;
                    }
                }
                Err(e) => {
                    let e = PostgresError::from(e);
                    fail(self.take(), &e.to_string(), e.is_transient());
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Waiting>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Up to [`MAX_BATCH`] queued decisions whose callers still wait, oldest first.
    fn take(&self) -> Vec<Waiting> {
        let mut queue = self.lock();
        let mut batch = Vec::new();
        while batch.len() < MAX_BATCH {
            let Some(waiting) = queue.pop_front() else {
                break;
            };
            if !waiting.reply.is_closed() {
                batch.push(waiting);
            }
        }
        batch
    }

    /// Sends `batch` on `client` and answers each of its decisions.
    async fn run(&self, client: Object, batch: Vec<Waiting>) {
        match tokio::time::timeout(self.timeout, self.call(&client, &batch)).await {
            Ok(Ok(replies)) => {
                for (waiting, reply) in batch.into_iter().zip(replies) {
                    let _ = waiting.reply.send(Ok(reply));
                }
            }
            Ok(Err(e)) => fail(batch, &e.to_string(), e.is_transient()),
            Err(_) => {
                // The call may still be running on the server: this connection is not given
                // back to the pool, whose next user would wait behind it.
                drop(Object::take(client));
                for waiting in batch {
                    let _ = waiting
                        .reply
                        .send(Err(PostgresError::Timeout(self.timeout)));
                }
            }
        }
    }

    /// One call deciding `batch`, its replies in the batch's order. A transaction
    /// PostgreSQL rolled back (deadlock, serialization failure) counted nothing, so it is
    /// tried again.
    async fn call(
        &self,
        client: &Object,
        batch: &[Waiting],
    ) -> Result<Vec<Vec<i64>>, PostgresError> {
        loop {
            let result = if let [one] = batch {
                let [cost, recording, interval, burst, window] = &one.args;
                let statement = client.prepare_cached(&self.one_sql).await?;
                client
                    .query_one(
                        &statement,
                        &[&one.id, cost, recording, interval, burst, window],
                    )
                    .await
            } else {
                let ids: Vec<&str> = batch.iter().map(|w| w.id.as_str()).collect();
                let column = |k: usize| batch.iter().map(|w| w.args[k]).collect::<Vec<i64>>();
                let statement = client.prepare_cached(&self.many_sql).await?;
                client
                    .query_one(
                        &statement,
                        &[
                            &ids,
                            &column(0),
                            &column(1),
                            &column(2),
                            &column(3),
                            &column(4),
                        ],
                    )
                    .await
            };
            match result {
                Ok(row) => {
                    let flat: Vec<i64> = row
                        .try_get(0)
                        .map_err(|e| PostgresError::Reply(e.to_string()))?;
                    if flat.len() != 7 * batch.len() {
                        return Err(PostgresError::Reply(format!(
                            "{} integers for {} decisions",
                            flat.len(),
                            batch.len()
                        )));
                    }
                    return Ok(flat.chunks(7).map(<[i64]>::to_vec).collect());
                }
                Err(e) if rolled_back(&e) => {
                    tracing::debug!(error = %e, "postgres rolled the decisions back; trying again");
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

/// Answers every decision of `batch` with the error of the call that carried them.
fn fail(batch: Vec<Waiting>, message: &str, transient: bool) {
    for waiting in batch {
        let _ = waiting.reply.send(Err(PostgresError::Batch {
            message: message.to_owned(),
            transient,
        }));
    }
}

/// Whether PostgreSQL rolled the transaction back for a reason a retry cures.
pub fn rolled_back(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| c.code().starts_with("40")) && is_transient_postgres(e)
}
