//! Batching of rules of GCRA, fixed-window, sliding-window or sliding-log leaves joined by `;`
//! (`user:10/s; user:1000/h`, `apikey:100/m; 1000/s`: the usual way to state more than one
//! limit) or in any tree of `or` and `and`, with or without a penalty, and of one such leaf
//! with a penalty (`ip:5/m` on a login form, boxing repeat offenders), as single-leaf hits
//! are batched (`src/batch.rs`): each hit decided in order by `lua/rule_batch.lua`, each
//! atomic and its own answer, each key written once per call; a call that fails fails every
//! hit in it. Without it every such decision was one call of the whole script.
//!
//! The script answers Redis's `now`, each leaf's debt (GCRA), count in the current window
//! (fixed window) or what a decision reads of its sub-windows or its log (sliding window,
//! sliding log: see [`answered_window`] and [`answered_log`]), and the penalty record each
//! hit found; the core's rule evaluation at `now`, on TATs of `now` plus the debts, windows
//! holding those counts, windows and logs that answer as the ones read and that record,
//! makes the decision, as the whole script's would be (a GCRA verdict depends on the TAT
//! only through the debt, and a TAT not after `now` decides as a fresh one; a fixed
//! window's only through its count in the current window).

use sluice_core::algorithm::sliding_log::Log;
use sluice_core::algorithm::sliding_window::Counters;
use sluice_core::{
    Algorithm, Decision, Evaluation, Penalty, PenaltyState, Quota, Recording, Shape, State,
    evaluate,
};
use sluice_limiter::Hit;

use crate::RedisError;
use crate::batch::{Answer, Batched, answer_each};
use crate::script::{RULE_BATCH, TICK_NS, batch_arguments, micro, recording_code};
use crate::slot::key;
use crate::store::RedisStore;

/// Most leaves of a rule the lean script takes; larger rules run the whole script.
pub const MAX_RULE_LEAVES: usize = 8;

/// A hit of the lean rule script's shape: 1 to [`MAX_RULE_LEAVES`] GCRA, fixed-window,
/// sliding-window or sliding-log leaves under any tree of `or` and `and` (or one leaf),
/// each once, one identifier each, with or without a penalty. Its ARGV for the script, and
/// its decision from the script's reply.
#[derive(Debug, Clone)]
pub struct LeanRule {
    /// The quotas counted in microseconds, in leaf order.
    quotas: Vec<Quota>,
    shape: Shape,
    /// The shape as the script reads it (see [`tree_code`]), empty for one leaf or an `or`
    /// of every leaf.
    tree: Vec<u64>,
    cost: u64,
    recording: Recording,
    /// The penalty counted in microseconds.
    penalty: Option<Penalty>,
}

impl LeanRule {
    /// `Some` when `hit` has the lean rule shape; `None` sends it elsewhere.
    pub fn of(hit: &Hit<'_>) -> Result<Option<LeanRule>, RedisError> {
        let ev = &hit.evaluation;
        let leaves = ev.quotas.len();
        // One leaf, or an `or` of every leaf (the script's own fold), needs no tree: the
        // shape is only checked, and nothing is allocated for it.
        let flat = match ev.shape {
            Shape::Leaf(_) => true,
            Shape::Or(children) => children.iter().all(|c| matches!(c, Shape::Leaf(_))),
            Shape::And(_) => false,
        };
        let mut seen = [false; MAX_RULE_LEAVES];
        let mut tree = Vec::new();
        if !tree_code(ev.shape, leaves, &mut seen, (!flat).then_some(&mut tree))
            || seen[..leaves.min(MAX_RULE_LEAVES)].contains(&false)
            || !(1..=MAX_RULE_LEAVES).contains(&leaves)
            || hit.identifiers.len() != leaves
            || ev.penalty.is_some() != hit.penalty_identifier.is_some()
            || ev.quotas.iter().any(|q| leaf_kind(q).is_none())
        {
            return Ok(None);
        }
        Ok(Some(LeanRule {
            quotas: ev.quotas.iter().map(micro).collect::<Result<_, _>>()?,
            shape: ev.shape.clone(),
            tree,
            cost: ev.cost,
            recording: ev.recording,
            penalty: ev.penalty.map(|p| p.with_tick(TICK_NS)),
        }))
    }

    /// The keys the hit names: one per leaf, then its penalty record's.
    pub fn keys(hit: &Hit<'_>) -> Vec<String> {
        hit.identifiers
            .iter()
            .chain(hit.penalty_identifier)
            .map(key)
            .collect()
    }

    /// The integers of the hit's reply: a debt or a count per leaf (a sliding window's six,
    /// a sliding log's four), and the penalty record's three.
    pub fn reply_len(&self) -> usize {
        let leaves: usize = self.quotas.iter().map(leaf_reply_len).sum();
        leaves + if self.penalty.is_some() { 3 } else { 0 }
    }

    /// The hit's parameter set: cost, recording, the number of leaves, each leaf's kind and
    /// three numbers (GCRA: 1, interval, burst, window; fixed window: 4, limit, window
    /// length, 0; sliding window: 2, limit, sub-window length, sub-windows; sliding log: 3,
    /// limit, window, 0), the shape (0 for one leaf or an `or` of every leaf, else its
    /// length and [`tree_code`]), then 0, or 1 and the penalty's base, factor, max and
    /// forget_after (microseconds).
    pub fn arguments(&self) -> Vec<u64> {
        let mut arguments = Vec::with_capacity(8 + 4 * self.quotas.len());
        arguments.extend([
            self.cost,
            u64::from(recording_code(self.recording)),
            self.quotas.len() as u64,
        ]);
        for q in &self.quotas {
            match leaf_kind(q) {
                Some(GCRA) => {
                    arguments.extend([GCRA, q.interval_ticks(), q.burst(), q.window_ticks()]);
                }
                Some(SLIDING_WINDOW) => arguments.extend([
                    SLIDING_WINDOW,
                    q.limit(),
                    q.sub_window_ticks(),
                    u64::from(q.windows()),
                ]),
                Some(SLIDING_LOG) => {
                    arguments.extend([SLIDING_LOG, q.limit(), q.window_ticks(), 0])
                }
                _ => arguments.extend([FIXED_WINDOW, q.limit(), q.window_ticks(), 0]),
            }
        }
        arguments.push(self.tree.len() as u64);
        arguments.extend_from_slice(&self.tree);
        match &self.penalty {
            None => arguments.push(0),
            Some(p) => {
                let (base, factor, max, forget) = p.ticks();
                arguments.extend([1, base, u64::from(factor), max, forget]);
            }
        }
        arguments
    }

    /// The decision from the call's `now` and the hit's reply ([`LeanRule::reply_len`]
    /// integers): the core's evaluation of the rule at `now`, on TATs of `now` plus each
    /// GCRA leaf's debt, fixed windows holding each one's count in the window of `now`,
    /// windows and logs that answer as the sliding windows and logs read
    /// ([`answered_window`], [`answered_log`]), and the penalty record it found, recording
    /// as the hit does (a denial counted anyway answers with the recorded states' wait, a
    /// boxed key the box's). A reply of another length, a negative number, or an answer no
    /// window or log can give is an error.
    pub fn decision(&self, now: i64, reply: &[i64]) -> Result<Decision, RedisError> {
        let wrong = || {
            RedisError::Reply(format!(
                "{reply:?} at {now} for a rule of {} leaves",
                self.quotas.len()
            ))
        };
        if reply.len() != self.reply_len() {
            return Err(wrong());
        }
        let number = |x: i64| u64::try_from(x).map_err(|_| wrong());
        let now = number(now)?;
        let leaf_len: usize = self.quotas.iter().map(leaf_reply_len).sum();
        let (mut leaves, record) = reply.split_at(leaf_len);
        let mut states = Vec::with_capacity(self.quotas.len());
        for q in &self.quotas {
            let (own, rest) = leaves.split_at(leaf_reply_len(q));
            leaves = rest;
            states.push(match (q.algorithm(), own) {
                (Algorithm::FixedWindow, &[count]) => State::FixedWindow {
                    window: now / q.window_ticks(),
                    count: number(count)?,
                },
                (Algorithm::SlidingWindow, own) => {
                    let mut read = [0; 6];
                    for (slot, x) in read.iter_mut().zip(own) {
                        *slot = number(*x)?;
                    }
                    State::SlidingWindow(
                        answered_window(q, now, self.cost, self.recording, read)
                            .ok_or_else(wrong)?,
                    )
                }
                (Algorithm::SlidingLog, &[used, top, kth, next]) => {
                    let read = [number(used)?, number(top)?, number(kth)?, number(next)?];
                    State::SlidingLog(
                        answered_log(q, self.cost, self.recording, read).ok_or_else(wrong)?,
                    )
                }
                (_, &[debt]) => State::Gcra {
                    tat: now.checked_add(number(debt)?).ok_or_else(wrong)?,
                },
                _ => return Err(wrong()),
            });
        }
        let mut record = match record {
            [strikes, until, last] => Some(PenaltyState {
                strikes: u32::try_from(*strikes).map_err(|_| wrong())?,
                until: number(*until)?,
                last_strike: number(*last)?,
            }),
            _ => None,
        };
        let evaluation = Evaluation {
            shape: &self.shape,
            quotas: &self.quotas,
            cost: self.cost,
            recording: self.recording,
            penalty: self.penalty.as_ref(),
        };
        Ok(evaluate(&evaluation, &mut states, record.as_mut(), now).decision)
    }
}

/// A leaf's kind in the script's arguments: algorithms.lua's codes.
const GCRA: u64 = 1;
const FIXED_WINDOW: u64 = 4;
const SLIDING_WINDOW: u64 = 2;
const SLIDING_LOG: u64 = 3;

/// The kind of a leaf the lean rule script takes, `None` for the algorithms it does not.
fn leaf_kind(quota: &Quota) -> Option<u64> {
    match quota.algorithm() {
        Algorithm::Gcra => Some(GCRA),
        Algorithm::FixedWindow => Some(FIXED_WINDOW),
        Algorithm::SlidingWindow => Some(SLIDING_WINDOW),
        Algorithm::SlidingLog => Some(SLIDING_LOG),
        _ => None,
    }
}

/// The integers a leaf answers in the lean rule script's reply: a debt or a count, a
/// sliding window's six or a sliding log's four.
fn leaf_reply_len(quota: &Quota) -> usize {
    match quota.algorithm() {
        Algorithm::SlidingWindow => 6,
        Algorithm::SlidingLog => 4,
        _ => 1,
    }
}

/// Sub-windows that decide and record a hit of `cost` at `now` as the sliding window the
/// script read, from what the script answered of it: `[used, cur, prev, first, second,
/// ahead]`, the units counted at `now`, those of the current sub-window, and as
/// sub-windows back from the current one (0: none, or in the current one) the newest
/// earlier one holding units, the one where the k-th oldest unit lies (k = used + cost -
/// limit, asked when the cost fits the limit) and, with recording `always`, the k2-th's (k2
/// the same once recorded); then how many sub-windows after the current one the state's
/// newest is (Redis's clock stepped back), or 0.
///
/// A decision on a sliding window reads only the units counted at `now`, the newest
/// sub-window holding some (its reset) and, denied, the sub-window where the k-th oldest
/// lies (its wait: the window clears when that one slides out). Recorded, the cost goes to
/// the current sub-window (at most twice the limit), or to the state's newest when that is
/// after now (where nothing counts it), and a denial is judged again with k2. So a window
/// holding the k-th and k2-th units' counts up to them where they lie, the rest of the
/// earlier units in the newest earlier sub-window holding any, and the current sub-window's
/// count, its newest sub-window the state's, answers and records alike. `None` for an
/// answer no window can give.
fn answered_window(
    quota: &Quota,
    now: u64,
    cost: u64,
    recording: Recording,
    read: [u64; 6],
) -> Option<Counters> {
    let [used, cur, prev, first, second, ahead] = read;
    let (g, limit) = (u64::from(quota.windows()), quota.limit());
    let current = now / quota.sub_window_ticks();
    let newest = current.checked_add(ahead)?;
    // The counted sub-windows the state can hold: from max(current, newest) - G + 1 on.
    let oldest = (newest + 1).saturating_sub(g);
    let most_back = current.saturating_sub(oldest);
    let before = used.checked_sub(cur)?;
    let recorded = if ahead > 0 {
        used
    } else {
        before.checked_add(cur.saturating_add(cost).min(limit.saturating_mul(2)))?
    };
    let fits = cost <= limit;
    let (k, k2) = (
        i128::from(used) + i128::from(cost) - i128::from(limit),
        i128::from(recorded) + i128::from(cost) - i128::from(limit),
    );
    let asked = |k: i128| fits && k >= 1 && k <= i128::from(before);
    let want2 = recording == Recording::Always && asked(k2);
    if (first != 0) != asked(k) || (second != 0) != want2 || (prev != 0) != (before > 0) {
        return None;
    }
    if oldest > current && used > 0 {
        return None;
    }
    // The oldest-first counts of sub-windows newest - G + 1 ..= newest.
    let mut counts = vec![0u64; g as usize];
    let mut add = |back: u64, count: u64| -> Option<()> {
        let number = current.checked_sub(back)?;
        if back > most_back || number < oldest {
            return None;
        }
        // Oldest first from sub-window newest - G + 1 (which may be before the epoch).
        let slot = &mut counts[(number + g - 1 - newest) as usize];
        *slot = slot.checked_add(count)?;
        Some(())
    };
    // The k-th and k2-th units where they lie, the smaller first.
    let (mut wanted, mut asked_for) = ([(0u64, 0u64); 2], 0);
    if first != 0 {
        wanted[asked_for] = (u64::try_from(k).ok()?, first);
        asked_for += 1;
    }
    if second != 0 {
        wanted[asked_for] = (u64::try_from(k2).ok()?, second);
        asked_for += 1;
    }
    wanted[..asked_for].sort_unstable();
    let (mut placed, mut last_back) = (0u64, None);
    for &(target, back) in &wanted[..asked_for] {
        if back == 0 || last_back.is_some_and(|last| back > last) {
            return None;
        }
        if target > placed {
            add(back, target - placed)?;
            placed = target;
        }
        last_back = Some(back);
    }
    let rest = before.checked_sub(placed)?;
    if rest > 0 {
        if last_back.is_some_and(|last| prev > last) {
            return None;
        }
        add(prev, rest)?;
    } else if before > 0 && last_back != Some(prev) {
        return None;
    }
    if cur > 0 {
        add(0, cur)?;
    }
    Some(Counters::from_parts(newest, &counts))
}

/// A log that decides a hit of `cost` as the sliding log the script read, and, recorded
/// (`quota.record`), decides again as that log recorded, from what the script answered of
/// it: `[used, top, kth, next]`, the units in its window, the newest one's time (0 when
/// none), the time of the k-th oldest, k = used + cost - limit (0 unless 1 <= k and the cost
/// fits the limit), and with recording `always` the time of the (k + cost)-th oldest (0
/// when it does not exist).
///
/// A decision on a log reads only its used units, its newest time and, denied, the time
/// of the k-th oldest unit (the wait). Recorded, the log loses its max(k, 0) oldest units
/// and gains `cost` units of `now`, and a denial is judged again: with k' = k + cost -
/// max(k, 0) units to lose, the wait is then the time of the original (k + cost)-th
/// oldest, or `now` when there are not that many. So a log of at most three entries, the
/// max(k, 0) oldest units at the k-th's time, the units up to the (k + cost)-th at its
/// time, the rest at the newest's, answers and records alike (all inside the window: the
/// core's record drops none as expired, and cuts exactly the first entry). Where Redis's
/// clock stepped back behind the log's newest unit, the units of `now` sort among the old
/// ones in Redis, and a counted denial's wait can differ from the full script's by at most
/// the step (the admission and the writes do not). `None` for an answer no log can give.
fn answered_log(quota: &Quota, cost: u64, recording: Recording, read: [u64; 4]) -> Option<Log> {
    let [used, top, kth, next] = read;
    if used == 0 {
        return (top == 0 && kth == 0 && next == 0).then(Log::default);
    }
    let fits = cost <= quota.limit();
    // k as a signed count: a log with room for the cost has none to lose.
    let k = i128::from(used) + i128::from(cost) - i128::from(quota.limit());
    let then = k + i128::from(cost);
    let kth_asked = fits && k >= 1;
    let next_asked = fits && recording == Recording::Always && then >= 1 && then <= used.into();
    if top == 0 || (kth != 0) != kth_asked || (next != 0) != next_asked {
        return None;
    }
    let mut hits = Vec::with_capacity(3);
    let mut placed = 0u64;
    if kth_asked {
        placed = u64::try_from(k).ok()?;
        hits.push((kth, placed));
    }
    if next_asked {
        let upto = u64::try_from(then).ok()?;
        if upto > placed {
            hits.push((next, upto - placed));
            placed = upto;
        }
    }
    if used > placed {
        hits.push((top, used - placed));
    }
    // Oldest first, as a log is (Redis keeps its members ordered by time).
    if hits.windows(2).any(|pair| pair[0].0 > pair[1].0) {
        return None;
    }
    Some(Log::from_hits(hits))
}

/// Writes `shape` into `out`, when given, as the lean rule script reads a tree, in prefix
/// order: leaf `i` as `i + 1`, an `or` of n children as `100 + n`, an `and` as `200 + n`;
/// marks each leaf in `seen`. False when the script cannot take the shape: a leaf out of
/// range or named twice, or a group of 100 children or more.
fn tree_code(
    shape: &Shape,
    leaves: usize,
    seen: &mut [bool],
    mut out: Option<&mut Vec<u64>>,
) -> bool {
    match shape {
        Shape::Leaf(i) if *i < leaves.min(seen.len()) && !seen[*i] => {
            seen[*i] = true;
            if let Some(out) = out {
                out.push(*i as u64 + 1);
            }
            true
        }
        Shape::Leaf(_) => false,
        Shape::Or(children) | Shape::And(children) if children.len() < 100 => {
            let base = if matches!(shape, Shape::Or(_)) {
                100
            } else {
                200
            };
            if let Some(out) = out.as_deref_mut() {
                out.push(base + children.len() as u64);
            }
            children
                .iter()
                .all(|child| tree_code(child, leaves, seen, out.as_deref_mut()))
        }
        Shape::Or(_) | Shape::And(_) => false,
    }
}

/// KEYS and ARGV for the lean rule script deciding `hits` (each its keys, as
/// [`LeanRule::keys`], and its [`LeanRule::arguments`]) in order: every hit's keys,
/// then the distinct parameter sets and each hit's set number (left out when there is one
/// set), then `token`, unique to the call (the sliding logs' members carry it).
pub fn rule_batch_call<'k>(
    hits: impl IntoIterator<Item = (Vec<&'k str>, Vec<u64>)>,
    token: u64,
) -> (Vec<&'k str>, Vec<u64>) {
    let (keys, sets): (Vec<Vec<&str>>, Vec<Vec<u64>>) = hits.into_iter().unzip();
    let mut arguments = batch_arguments(sets);
    arguments.push(token);
    (keys.concat(), arguments)
}

/// One queued rule hit: its keys (one per leaf, then its penalty record's), its parameter
/// set, its slot (Cluster: every key is in it), how many integers its reply holds, and where
/// the call's `now` and those integers go.
pub(crate) struct RulePending {
    pub keys: Vec<String>,
    pub arguments: Vec<u64>,
    pub slot: u16,
    pub reply_len: usize,
    pub reply: Answer<(i64, Vec<i64>)>,
}

impl Batched for RulePending {
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

/// Sends `batch` as one script call and answers each hit: the call's `now` and its
/// integers, or the call's error (a call that failed decided nothing that anyone is told
/// was admitted).
async fn send(store: &RedisStore, batch: Vec<RulePending>) {
    let (keys, arguments) = rule_batch_call(
        batch.iter().map(|pending| {
            let keys = pending.keys.iter().map(String::as_str).collect();
            (keys, pending.arguments.clone())
        }),
        store.next_token(),
    );
    let result = store.eval(&RULE_BATCH, &keys, &arguments).await;
    answer_each(
        batch,
        result,
        1,
        |pending| pending.reply_len,
        |pending, answer| {
            let answer = answer.map(|(now, own)| (now[0], own.to_vec()));
            let _ = pending.reply.send(answer);
        },
    );
}

impl RedisStore {
    /// Queues a lean rule hit for the next batch and waits, within the store's timeout, for
    /// Redis's `now`, its leaves' debts and its penalty record, which the core's evaluation
    /// turns into the decision.
    pub(crate) async fn decide_rule(
        &self,
        hit: &Hit<'_>,
        lean: LeanRule,
    ) -> Result<Decision, RedisError> {
        let batcher = &self.queues().rule;
        let (now, reply) = self
            .batched(batcher, &hit.identifiers[0], |_, slot, reply| RulePending {
                keys: LeanRule::keys(hit),
                arguments: lean.arguments(),
                slot,
                reply_len: lean.reply_len(),
                reply,
            })
            .await?;
        lean.decision(now, &reply)
    }
}
