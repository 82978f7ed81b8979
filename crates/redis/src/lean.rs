//! The lean shapes: hits the Redis store decides through a lean batched script instead of
//! the whole decision script (one GCRA, fixed-window, sliding-window or sliding-log leaf
//! without a penalty), their arguments, their decisions from each script's reply, and the
//! KEYS and ARGV of a batch of them.

use sluice_core::{Algorithm, Decision, Quota, Recording, Retry, Shape, State, Verdict};
use sluice_limiter::Hit;

use crate::RedisError;
use crate::script::{TICK_NS, micro, recording_code};

/// What every lean single-leaf hit carries: its quota counted in microseconds, its cost and
/// its recording.
#[derive(Debug, Clone, Copy)]
struct Leaf {
    quota: Quota,
    cost: u64,
    recording: Recording,
}

impl Leaf {
    /// `Some` when `hit` has a lean script's shape: one leaf of `algorithm`, one identifier,
    /// no penalty.
    fn of(hit: &Hit<'_>, algorithm: Algorithm) -> Result<Option<Leaf>, RedisError> {
        let ev = &hit.evaluation;
        match (ev.quotas, hit.identifiers, ev.shape, ev.penalty) {
            ([quota], [_], Shape::Leaf(0), None) if quota.algorithm() == algorithm => {
                Ok(Some(Leaf {
                    quota: micro(quota)?,
                    cost: ev.cost,
                    recording: ev.recording,
                }))
            }
            _ => Ok(None),
        }
    }

    /// Cost, recording, limit and window length (microseconds): a fixed window's and a
    /// sliding log's arguments.
    fn limit_and_window(&self) -> [u64; 4] {
        [
            self.cost,
            u64::from(recording_code(self.recording)),
            self.quota.limit(),
            self.quota.window_ticks(),
        ]
    }
}

/// A hit of the lean script's shape (one leaf, GCRA, no penalty): its ARGV for
/// [`GCRA_BATCH`], and its decision from the script's one-integer reply.
///
/// [`GCRA_BATCH`]: crate::script::GCRA_BATCH
#[derive(Debug, Clone, Copy)]
pub struct LeanGcra(Leaf);

impl LeanGcra {
    /// `Some` when `hit` has the lean script's shape; `None` sends it to [`DECIDE`].
    ///
    /// [`DECIDE`]: crate::script::DECIDE
    pub fn of(hit: &Hit<'_>) -> Result<Option<LeanGcra>, RedisError> {
        Ok(Leaf::of(hit, Algorithm::Gcra)?.map(LeanGcra))
    }

    /// The hit's five arguments: cost, recording, interval, burst, window (microseconds).
    pub fn arguments(&self) -> [u64; 5] {
        let q = &self.0.quota;
        [
            self.0.cost,
            u64::from(recording_code(self.0.recording)),
            q.interval_ticks(),
            q.burst(),
            q.window_ticks(),
        ]
    }

    /// The decision from the hit's reply, its debt before the hit (`max(tat, now) - now`).
    /// GCRA's verdict depends on the TAT and `now` only through the debt, so the core's
    /// GCRA at `now = 0` with `tat = debt` decides as the full script does; a denial counted
    /// anyway (recording `always`) answers with the recorded state's verdict, as there.
    pub fn decision(&self, debt: i64) -> Result<Decision, RedisError> {
        let debt =
            u64::try_from(debt).map_err(|_| RedisError::Reply(format!("negative debt {debt}")))?;
        let (q, cost) = (&self.0.quota, self.0.cost);
        let mut verdict = q.gcra_verdict(debt, 0, cost);
        if !verdict.allowed
            && verdict.retry != Retry::Never
            && recording_code(self.0.recording) == 1
        {
            verdict = q.gcra_verdict(q.gcra_record(debt, 0, cost), 0, cost);
        }
        Ok(Decision::from_verdict(&verdict, 0, TICK_NS))
    }
}

/// A hit of the lean fixed-window script's shape (one leaf, fixed window, no penalty): its
/// ARGV for [`FIXED_BATCH`], and its decision from the script's two-integer reply.
///
/// [`FIXED_BATCH`]: crate::script::FIXED_BATCH
#[derive(Debug, Clone, Copy)]
pub struct LeanFixed(Leaf);

impl LeanFixed {
    /// `Some` when `hit` has the lean fixed-window shape; `None` sends it elsewhere.
    pub fn of(hit: &Hit<'_>) -> Result<Option<LeanFixed>, RedisError> {
        Ok(Leaf::of(hit, Algorithm::FixedWindow)?.map(LeanFixed))
    }

    /// The hit's four arguments: cost, recording, limit, window length (microseconds).
    pub fn arguments(&self) -> [u64; 4] {
        self.0.limit_and_window()
    }

    /// The decision from the hit's reply: the count its window held before it (`used`) and
    /// the time to the window's end (`left`, in `(0, length]`). The core's fixed window
    /// depends on the time only through that, so it decides at `length - left` in window 0
    /// as the full script does at `now`; a denial counted anyway (recording `always`)
    /// answers with the recorded state's verdict, as there.
    pub fn decision(&self, used: i64, left: i64) -> Result<Decision, RedisError> {
        let (q, cost) = (&self.0.quota, self.0.cost);
        let length = q.window_ticks();
        let (used, left) = match (u64::try_from(used), u64::try_from(left)) {
            (Ok(used), Ok(left)) if left > 0 && left <= length => (used, left),
            _ => {
                return Err(RedisError::Reply(format!(
                    "fixed window reply {used}, {left} for a window of {length}"
                )));
            }
        };
        let now = length - left;
        let mut state = State::FixedWindow {
            window: 0,
            count: used,
        };
        let mut verdict = q.verdict(&state, now, cost);
        if !verdict.allowed
            && verdict.retry != Retry::Never
            && recording_code(self.0.recording) == 1
        {
            q.record(&mut state, now, cost);
            let after = q.verdict(&state, now, cost);
            if !after.allowed {
                verdict = after;
            }
        }
        Ok(Decision::from_verdict(&verdict, 0, TICK_NS))
    }
}

/// A hit of the lean sliding-window script's shape (one leaf, sliding window, no penalty):
/// its ARGV for [`SLIDING_BATCH`], and its decision from the script's three-integer reply.
///
/// [`SLIDING_BATCH`]: crate::script::SLIDING_BATCH
#[derive(Debug, Clone, Copy)]
pub struct LeanSliding(Leaf);

impl LeanSliding {
    /// `Some` when `hit` has the lean sliding-window shape; `None` sends it elsewhere.
    pub fn of(hit: &Hit<'_>) -> Result<Option<LeanSliding>, RedisError> {
        Ok(Leaf::of(hit, Algorithm::SlidingWindow)?.map(LeanSliding))
    }

    /// The hit's five arguments: cost, recording, limit, sub-window length (microseconds),
    /// sub-windows.
    pub fn arguments(&self) -> [u64; 5] {
        let q = &self.0.quota;
        [
            self.0.cost,
            u64::from(recording_code(self.0.recording)),
            q.limit(),
            q.sub_window_ticks(),
            u64::from(q.windows()),
        ]
    }

    /// The decision from the hit's reply, the script's verdict (see [`verdict_decision`]).
    pub fn decision(&self, reply: [i64; 3]) -> Result<Decision, RedisError> {
        verdict_decision(self.0.quota.limit(), reply, "sliding window")
    }
}

/// A hit of the lean sliding-log script's shape (one leaf, sliding log, no penalty): its
/// ARGV for [`LOG_BATCH`], and its decision from the script's three-integer reply.
///
/// [`LOG_BATCH`]: crate::script::LOG_BATCH
#[derive(Debug, Clone, Copy)]
pub struct LeanLog(Leaf);

impl LeanLog {
    /// `Some` when `hit` has the lean sliding-log shape; `None` sends it elsewhere.
    pub fn of(hit: &Hit<'_>) -> Result<Option<LeanLog>, RedisError> {
        Ok(Leaf::of(hit, Algorithm::SlidingLog)?.map(LeanLog))
    }

    /// The hit's four arguments: cost, recording, limit, window length (microseconds).
    pub fn arguments(&self) -> [u64; 4] {
        self.0.limit_and_window()
    }

    /// The decision from the hit's reply, the script's verdict (see [`verdict_decision`]).
    pub fn decision(&self, reply: [i64; 3]) -> Result<Decision, RedisError> {
        verdict_decision(self.0.quota.limit(), reply, "sliding log")
    }
}

/// The decision from a lean script's verdict for a quota of `limit` (`what` names its
/// algorithm in an error): `remaining`, `reset_after` and `retry` (-1 now: admitted; -2
/// never; otherwise the ticks to wait). A reply no verdict of the quota can give is an
/// error, never an admission.
fn verdict_decision(
    limit: u64,
    [remaining, reset_after, retry]: [i64; 3],
    what: &str,
) -> Result<Decision, RedisError> {
    let wrong = || {
        RedisError::Reply(format!(
            "{what} reply {remaining}, {reset_after}, {retry} for a limit of {limit}"
        ))
    };
    let remaining = u64::try_from(remaining)
        .ok()
        .filter(|r| *r <= limit)
        .ok_or_else(wrong)?;
    let reset_after = u64::try_from(reset_after).map_err(|_| wrong())?;
    let retry = match retry {
        -1 => Retry::Now,
        -2 => Retry::Never,
        after => Retry::After(u64::try_from(after).map_err(|_| wrong())?),
    };
    let verdict = Verdict {
        allowed: retry == Retry::Now,
        limit,
        remaining,
        reset_after,
        retry,
    };
    Ok(Decision::from_verdict(&verdict, 0, TICK_NS))
}

/// ARGV for [`GCRA_BATCH`] deciding hits of these arguments ([`LeanGcra::arguments`]) in
/// order, or for [`FIXED_BATCH`] ([`LeanFixed::arguments`]): the distinct sets, then each
/// hit's set number, left out when there is one set (Redis then parses and the script reads
/// one argument a hit fewer).
///
/// [`GCRA_BATCH`]: crate::script::GCRA_BATCH
/// [`FIXED_BATCH`]: crate::script::FIXED_BATCH
pub fn batch_arguments<S: AsRef<[u64]> + PartialEq>(hits: impl IntoIterator<Item = S>) -> Vec<u64> {
    let mut sets: Vec<S> = Vec::new();
    let mut numbers = Vec::new();
    for hit in hits {
        let number = match sets.iter().position(|set| *set == hit) {
            Some(i) => i,
            None => {
                sets.push(hit);
                sets.len() - 1
            }
        };
        numbers.push(number as u64 + 1);
    }
    let mut args = vec![sets.len() as u64];
    let one = sets.len() == 1;
    for set in &sets {
        args.extend_from_slice(set.as_ref());
    }
    if !one {
        args.extend(numbers);
    }
    args
}

/// KEYS and ARGV for a lean script of one key a hit ([`GCRA_BATCH`], [`FIXED_BATCH`],
/// [`SLIDING_BATCH`]) deciding `hits` (each its key and its arguments) in order: one key
/// per hit and [`batch_arguments`]; or, when the hits share one key and one parameter set
/// (a limit every caller hits), the key once and the number of hits after the set, which
/// spares Redis a quarter of its instructions per hit (`benches/lua_instructions.sh`).
///
/// [`GCRA_BATCH`]: crate::script::GCRA_BATCH
/// [`FIXED_BATCH`]: crate::script::FIXED_BATCH
/// [`SLIDING_BATCH`]: crate::script::SLIDING_BATCH
pub fn batch_call<'k, const N: usize>(
    hits: impl IntoIterator<Item = (&'k str, [u64; N])>,
) -> (Vec<&'k str>, Vec<u64>) {
    let (keys, sets): (Vec<&str>, Vec<[u64; N]>) = hits.into_iter().unzip();
    let count = keys.len();
    let mut arguments = batch_arguments(sets);
    if count > 1 && arguments[0] == 1 && keys.iter().all(|key| *key == keys[0]) {
        arguments.push(count as u64);
        return (vec![keys[0]], arguments);
    }
    (keys, arguments)
}

/// KEYS and ARGV for a lean script with a loop of its own for many users' hits
/// ([`GCRA_BATCH`], [`FIXED_BATCH`], [`SLIDING_BATCH`], [`LOG_BATCH`]) deciding `hits` in
/// order: as [`batch_call`], except that hits of one parameter set whose keys are all
/// distinct (a lone hit, or a batch of many users' hits) send 0 for the number of sets,
/// which takes that loop: no table to find a key named again, each key written as it is
/// decided (`src/lua/gcra_batch.lua`; on many keys a fifth fewer Redis instructions a hit
/// for GCRA, a third for fixed windows, a half for sliding windows, a sixth for sliding
/// logs).
///
/// [`GCRA_BATCH`]: crate::script::GCRA_BATCH
/// [`FIXED_BATCH`]: crate::script::FIXED_BATCH
/// [`SLIDING_BATCH`]: crate::script::SLIDING_BATCH
/// [`LOG_BATCH`]: crate::script::LOG_BATCH
pub fn distinct_batch_call<'k, const N: usize>(
    hits: impl IntoIterator<Item = (&'k str, [u64; N])>,
) -> (Vec<&'k str>, Vec<u64>) {
    let (keys, mut arguments) = batch_call(hits);
    // One set and one key per hit (not the one-key form, which ends in the count).
    if arguments[0] == 1 && arguments.len() == 1 + N && distinct(&keys) {
        arguments[0] = 0;
    }
    (keys, arguments)
}

/// Whether no key is named twice. Compares hashes, sorted, so that a batch of 64 keys costs
/// 64 hashes and not 2,016 comparisons of strings; equal hashes of different keys only send
/// the batch through the script's general loop, which is right for any batch.
fn distinct(keys: &[&str]) -> bool {
    use std::hash::BuildHasher;
    if keys.len() <= 4 {
        return keys
            .iter()
            .enumerate()
            .all(|(i, key)| !keys[..i].contains(key));
    }
    let state = foldhash::fast::FixedState::default();
    let mut hashes = [0u64; super::batch::MAX_BATCH];
    let Some(hashes) = hashes.get_mut(..keys.len()) else {
        return false;
    };
    for (hash, key) in hashes.iter_mut().zip(keys) {
        *hash = state.hash_one(key);
    }
    hashes.sort_unstable();
    hashes.windows(2).all(|pair| pair[0] != pair[1])
}

/// ARGV for [`GCRA_BATCH`] deciding `hit` alone, as text, as the store sends a lone hit
/// ([`distinct_batch_call`]); `None` when `hit` does not have the lean shape (see [`LeanGcra`]).
///
/// [`GCRA_BATCH`]: crate::script::GCRA_BATCH
pub fn gcra_one_arguments(hit: &Hit<'_>) -> Result<Option<Vec<String>>, RedisError> {
    Ok(LeanGcra::of(hit)?.map(|lean| {
        distinct_batch_call([("", lean.arguments())])
            .1
            .iter()
            .map(u64::to_string)
            .collect()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The set every hit below shares, and another.
    const SET: [u64; 5] = [1, 0, 10, 5, 0];
    const OTHER: [u64; 5] = [2, 0, 10, 5, 0];

    /// Hits of one set on distinct keys go as 0 sets, then the set; every other batch as
    /// `batch_call` sends it, so the script's general loop takes it.
    #[test]
    fn only_distinct_keys_of_one_set_go_as_zero_sets() {
        let call = |hits: &[(&'static str, [u64; 5])]| distinct_batch_call(hits.iter().copied());
        let one_set = [0, 1, 0, 10, 5, 0];
        assert_eq!(call(&[("a", SET)]), (vec!["a"], one_set.to_vec()));
        let (keys, args) = call(&[("a", SET), ("b", SET), ("c", SET)]);
        assert_eq!((keys, args), (vec!["a", "b", "c"], one_set.to_vec()));
        // A key named twice: the general loop, one set.
        let (keys, args) = call(&[("a", SET), ("b", SET), ("a", SET)]);
        assert_eq!(keys, ["a", "b", "a"]);
        assert_eq!(args[0], 1);
        // One key for every hit: the key once and the count.
        let (keys, args) = call(&[("a", SET), ("a", SET)]);
        assert_eq!((keys, args[0], args.len()), (vec!["a"], 1, 7));
        // Two sets: the general loop, each hit naming its set.
        let (_, args) = call(&[("a", SET), ("b", OTHER)]);
        assert_eq!(args, [2, 1, 0, 10, 5, 0, 2, 0, 10, 5, 0, 1, 2]);

        // Past four keys the check compares hashes: 64 distinct keys, then one twice.
        let names: Vec<String> = (0..64)
            .map(|i| format!("sluice:api:user:{i:08}:100/m"))
            .collect();
        let hits = |names: &[String]| -> (Vec<String>, Vec<u64>) {
            let (keys, args) = distinct_batch_call(names.iter().map(|n| (n.as_str(), SET)));
            (keys.into_iter().map(str::to_owned).collect(), args)
        };
        assert_eq!(hits(&names).1[0], 0);
        for twice in [1, 31, 63] {
            let mut names = names.clone();
            names[twice] = names[twice - 1].clone();
            assert_eq!(
                hits(&names).1[0],
                1,
                "key {twice} repeats the one before it"
            );
        }
        let mut names = names;
        names[63] = names[0].clone();
        assert_eq!(hits(&names).1[0], 1, "the last key repeats the first");
    }
}
