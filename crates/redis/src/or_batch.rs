//! Batching of rules of several GCRA leaves joined by `;` without a penalty (`user:10/s;
//! user:1000/h`, `apikey:100/m; 1000/s`: the usual way to state more than one limit), as
//! single-leaf hits are batched (`src/batch.rs`): each hit decided in order by
//! `lua/gcra_or_batch.lua`, each atomic and its own answer, each key written once per call;
//! a call that fails fails every hit in it. Without it every such decision was one call of
//! the whole script.
//!
//! The script answers each leaf's debt; the core's rule evaluation, on those debts at time 0,
//! makes the decision, as the whole script's would be at `now` (a GCRA verdict depends on
//! the TAT and `now` only through the debt).

use sluice_core::{Algorithm, Decision, Evaluation, Quota, Recording, Shape, State, evaluate};
use sluice_limiter::Hit;

use crate::RedisError;
use crate::batch::{Answer, Batched};
use crate::script::{GCRA_OR_BATCH, micro, recording_code};
use crate::slot::key;
use crate::store::RedisStore;

/// Most leaves of a rule the lean script takes; larger rules run the whole script.
pub const MAX_OR_LEAVES: usize = 8;

/// A hit of the lean `or` script's shape: an `or` of 2 to [`MAX_OR_LEAVES`] GCRA leaves,
/// each once, one identifier each, no penalty. Its ARGV for the script, and its decision
/// from the script's reply.
#[derive(Debug, Clone)]
pub struct LeanGcraOr {
    /// The quotas counted in microseconds, in leaf order.
    quotas: Vec<Quota>,
    shape: Shape,
    cost: u64,
    recording: Recording,
}

impl LeanGcraOr {
    /// `Some` when `hit` has the lean `or` shape; `None` sends it elsewhere.
    pub fn of(hit: &Hit<'_>) -> Result<Option<LeanGcraOr>, RedisError> {
        let ev = &hit.evaluation;
        let Shape::Or(children) = ev.shape else {
            return Ok(None);
        };
        let leaves = ev.quotas.len();
        if ev.penalty.is_some()
            || !(2..=MAX_OR_LEAVES).contains(&leaves)
            || hit.identifiers.len() != leaves
            || children.len() != leaves
            || ev.quotas.iter().any(|q| q.algorithm() != Algorithm::Gcra)
        {
            return Ok(None);
        }
        let mut seen = [false; MAX_OR_LEAVES];
        for child in children {
            match child {
                Shape::Leaf(i) if *i < leaves && !seen[*i] => seen[*i] = true,
                _ => return Ok(None),
            }
        }
        Ok(Some(LeanGcraOr {
            quotas: ev.quotas.iter().map(micro).collect::<Result<_, _>>()?,
            shape: ev.shape.clone(),
            cost: ev.cost,
            recording: ev.recording,
        }))
    }

    /// The hit's parameter set: cost, recording, the number of leaves, then each leaf's
    /// interval, burst and window (microseconds).
    pub fn arguments(&self) -> Vec<u64> {
        let mut arguments = Vec::with_capacity(3 + 3 * self.quotas.len());
        arguments.extend([
            self.cost,
            u64::from(recording_code(self.recording)),
            self.quotas.len() as u64,
        ]);
        for q in &self.quotas {
            arguments.extend([q.interval_ticks(), q.burst(), q.window_ticks()]);
        }
        arguments
    }

    /// The decision from the hit's reply, each leaf's debt before the hit: the core's
    /// evaluation of the rule on TATs equal to the debts at time 0, recording as the hit
    /// does (a denial counted anyway answers with the recorded states' wait, as in the whole
    /// script). A reply of another length or a negative debt is an error.
    pub fn decision(&self, debts: &[i64]) -> Result<Decision, RedisError> {
        if debts.len() != self.quotas.len() {
            return Err(RedisError::Reply(format!(
                "{} debts for a rule of {} leaves",
                debts.len(),
                self.quotas.len()
            )));
        }
        let mut states = debts
            .iter()
            .map(|&debt| {
                u64::try_from(debt)
                    .map(|tat| State::Gcra { tat })
                    .map_err(|_| RedisError::Reply(format!("negative debt {debt}")))
            })
            .collect::<Result<Vec<State>, RedisError>>()?;
        let evaluation = Evaluation {
            shape: &self.shape,
            quotas: &self.quotas,
            cost: self.cost,
            recording: self.recording,
            penalty: None,
        };
        Ok(evaluate(&evaluation, &mut states, None, 0).decision)
    }
}

/// KEYS and ARGV for the lean `or` script deciding `hits` (each its leaves' keys and its
/// [`LeanGcraOr::arguments`]) in order: every hit's keys, then the distinct parameter sets
/// and each hit's set number (left out when there is one set).
pub fn or_batch_call<'k>(
    hits: impl IntoIterator<Item = (Vec<&'k str>, Vec<u64>)>,
) -> (Vec<&'k str>, Vec<u64>) {
    let mut keys = Vec::new();
    let mut sets: Vec<Vec<u64>> = Vec::new();
    let mut numbers = Vec::new();
    for (hit_keys, set) in hits {
        keys.extend(hit_keys);
        let number = match sets.iter().position(|known| *known == set) {
            Some(i) => i,
            None => {
                sets.push(set);
                sets.len() - 1
            }
        };
        numbers.push(number as u64 + 1);
    }
    let mut arguments = vec![sets.len() as u64];
    let one = sets.len() == 1;
    arguments.extend(sets.into_iter().flatten());
    if !one {
        arguments.extend(numbers);
    }
    (keys, arguments)
}

/// One queued `or` hit: its leaves' keys, its parameter set, its slot (Cluster: every key
/// is in it) and where its debts go.
pub(crate) struct OrPending {
    pub keys: Vec<String>,
    pub arguments: Vec<u64>,
    pub slot: u16,
    pub reply: Answer<Vec<i64>>,
}

impl Batched for OrPending {
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

/// Sends `batch` as one script call and answers each hit: its debts, or the call's error
/// (a call that failed decided nothing that anyone is told was admitted).
async fn send(store: &RedisStore, batch: Vec<OrPending>) {
    let (keys, arguments) = or_batch_call(batch.iter().map(|pending| {
        let keys = pending.keys.iter().map(String::as_str).collect();
        (keys, pending.arguments.clone())
    }));
    let result: Result<Vec<i64>, RedisError> = store.eval(&GCRA_OR_BATCH, &keys, &arguments).await;
    match result {
        Ok(debts) if debts.len() == keys.len() => {
            let mut debts = debts.into_iter();
            for pending in batch {
                let mine = debts.by_ref().take(pending.keys.len()).collect();
                let _ = pending.reply.send(Ok(mine));
            }
        }
        Ok(debts) => {
            let wrong = format!("{} debts for a batch of {} keys", debts.len(), keys.len());
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

impl RedisStore {
    /// Queues a lean `or` hit for the next batch and waits, within the store's timeout, for
    /// its leaves' debts, which the core's evaluation turns into the decision.
    pub(crate) async fn decide_or(
        &self,
        hit: &Hit<'_>,
        lean: LeanGcraOr,
    ) -> Result<Decision, RedisError> {
        let batcher = self.or_batcher();
        let debts = self
            .batched(batcher, &hit.identifiers[0], |_, slot, reply| OrPending {
                keys: hit.identifiers.iter().map(key).collect(),
                arguments: lean.arguments(),
                slot,
                reply,
            })
            .await?;
        lean.decision(&debts)
    }
}
