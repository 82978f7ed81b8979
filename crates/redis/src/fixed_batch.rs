//! Batching of lean fixed-window hits: one fixed-window leaf without a penalty, the
//! algorithm Envoy-style configurations use by default, decided in batches of [`FIXED_BATCH`]
//! calls as lean GCRA hits are (`src/batch.rs`): in order, each atomic and its own answer,
//! each key written once per call; a call that fails fails every hit in it. Without it
//! every such decision was one call of the whole script, about 130,000 Redis instructions
//! (`benches/lua_instructions.sh`, `full-fixed-1`).

use crate::RedisError;
use crate::batch::{Answer, Batched};
use crate::script::{FIXED_BATCH, batch_arguments};
use crate::store::RedisStore;

/// One queued fixed-window hit: its key, its four arguments, its slot (Cluster) and where
/// its reply (the count its window held before it, the time to the window's end) goes.
pub(crate) struct FixedPending {
    pub key: String,
    pub arguments: [u64; 4],
    pub slot: u16,
    pub reply: Answer<(i64, i64)>,
}

impl Batched for FixedPending {
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

/// Sends `batch` as one script call and answers each hit: its two integers, or the call's
/// error (a call that failed decided nothing that anyone is told was admitted).
async fn send(store: &RedisStore, batch: Vec<FixedPending>) {
    let keys: Vec<&str> = batch.iter().map(|pending| pending.key.as_str()).collect();
    let arguments = batch_arguments(batch.iter().map(|pending| pending.arguments));
    let result: Result<Vec<i64>, RedisError> = store.eval(&FIXED_BATCH, &keys, &arguments).await;
    match result {
        Ok(replies) if replies.len() == 2 * batch.len() => {
            for (pending, pair) in batch.into_iter().zip(replies.chunks_exact(2)) {
                let _ = pending.reply.send(Ok((pair[0], pair[1])));
            }
        }
        Ok(replies) => {
            let wrong = format!(
                "{} integers in reply to a batch of {} fixed-window hits",
                replies.len(),
                batch.len()
            );
            for pending in batch {
                let _ = pending.reply.send(Err(RedisError::Reply(wrong.clone())));
            }
        }
        Err(e) => {
            for pending in batch {
                let _ = pending.reply.send(Err(e.clone()));
            }
        }
    }
}
