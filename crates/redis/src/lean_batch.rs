//! Batching of the lean hits that answer in more than one integer: one fixed-window leaf
//! without a penalty (the algorithm Envoy-style configurations use by default,
//! `lua/fixed_batch.lua`), one sliding-window leaf without a penalty
//! (`lua/sliding_batch.lua`) and one sliding-log leaf without a penalty
//! (`lua/log_batch.lua`), each kind in its own queue, decided in batches as lean GCRA
//! hits are (`src/batch.rs`): in order, each atomic and its own answer, each key written
//! once per call; a call that fails fails every hit in it. Without them every such decision
//! was one call of the whole script, about 130,000 Redis instructions
//! (`benches/lua_instructions.sh`, `full-fixed-1`).

use std::sync::LazyLock;

use crate::RedisError;
use crate::batch::{Answer, Batched, answer_each};
use crate::script::{Lua, batch_call, distinct_batch_call};
use crate::store::RedisStore;

/// One queued lean hit: its key, its `A` arguments, its slot (Cluster), the script that
/// decides its kind (whether its ARGV ends with a token unique to the call, and whether it
/// has a loop for distinct keys of one set: see [`distinct_batch_call`]), and where its
/// reply (`R` integers) goes.
pub(crate) struct LeanPending<const A: usize, const R: usize> {
    pub key: String,
    pub arguments: [u64; A],
    pub slot: u16,
    pub script: &'static LazyLock<Lua>,
    pub token: bool,
    pub distinct: bool,
    pub reply: Answer<[i64; R]>,
}

/// A lean fixed-window hit: four arguments, two integers for reply.
pub(crate) type FixedPending = LeanPending<4, 2>;
/// A lean sliding-window hit: five arguments, three integers for reply.
pub(crate) type SlidingPending = LeanPending<5, 3>;
/// A lean sliding-log hit: four arguments, three integers for reply.
pub(crate) type LogPending = LeanPending<4, 3>;

impl<const A: usize, const R: usize> Batched for LeanPending<A, R> {
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

/// Sends `batch` (of one kind, so of one script) as one script call and answers each hit:
/// its `R` integers, or the call's error (a call that failed decided nothing that anyone is
/// told was admitted).
async fn send<const A: usize, const R: usize>(store: &RedisStore, batch: Vec<LeanPending<A, R>>) {
    let Some(&LeanPending {
        script,
        token,
        distinct,
        ..
    }) = batch.first()
    else {
        return;
    };
    let hits = batch
        .iter()
        .map(|pending| (pending.key.as_str(), pending.arguments));
    let (keys, mut arguments) = if distinct {
        distinct_batch_call(hits)
    } else {
        batch_call(hits)
    };
    if token {
        arguments.push(store.next_token());
    }
    let result = store.eval(script, &keys, &arguments).await;
    answer_each(
        batch,
        result,
        0,
        |_| R,
        |pending, answer| {
            let answer = answer.and_then(|(_, own)| {
                <[i64; R]>::try_from(own)
                    .map_err(|_| RedisError::Reply(format!("{own:?}: not {R} integers")))
            });
            let _ = pending.reply.send(answer);
        },
    );
}
