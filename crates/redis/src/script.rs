//! The decision script: how a hit becomes KEYS and ARGV, and a reply becomes a Decision.

use std::fmt::Write;
use std::sync::LazyLock;

use sluice_core::decision::ticks;
use sluice_core::{Algorithm, Decision, Denial, Quota, Recording, Retry, Shape, State, Verdict};
use sluice_limiter::Hit;

use crate::RedisError;
/// The Cluster slot of an identifier's key, for tests that spread keys over slots.
pub use crate::slot::slot_of;

/// Nanoseconds per tick in Redis: microseconds, the resolution of `TIME`, and small enough
/// that every time the script handles stays exact in a Lua double.
pub const TICK_NS: u64 = 1_000;

/// A script sent by its SHA1 (EVALSHA), or whole (EVAL) when the server has lost it; or,
/// when it is one of [`LIBRARY`]'s functions and the server has Functions, called by name
/// (FCALL).
pub struct Lua {
    pub source: &'static str,
    pub sha: String,
    /// Its name in [`LIBRARY`], if it is there.
    pub function: Option<String>,
}

impl Lua {
    fn new(source: &'static str) -> Lua {
        Lua {
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
            function: None,
        }
    }

    fn in_library(mut self, entry: &str) -> Lua {
        self.function = Some(format!("sluice_{entry}_{}", LIBRARY.tag));
        self
    }
}

/// The algorithms (shared with the test entry point) followed by the production entry,
/// which reads the time from Redis.
pub static DECIDE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/algorithms.lua"),
        include_str!("lua/leases.lua"),
        include_str!("lua/decide.lua")
    ))
    .in_library("decide")
});

/// The algorithms followed by the per-slot entry for rules spread over cluster slots.
pub static SPLIT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/algorithms.lua"),
        include_str!("lua/leases.lua"),
        include_str!("lua/split.lua")
    ))
    .in_library("split")
});

/// Takes a lease: the rule decided and the lease held in its concurrency leaves, in one
/// step (`acquire` in leases.lua).
pub static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/algorithms.lua"),
        include_str!("lua/leases.lua"),
        include_str!("lua/acquire.lua")
    ))
    .in_library("acquire")
});

/// Releases a lease in the lease sets of one slot (`release` in leases.lua).
pub static RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/algorithms.lua"),
        include_str!("lua/leases.lua"),
        include_str!("lua/release.lua")
    ))
    .in_library("release")
});

/// Renews a lease in the lease sets of one slot (`renew` in leases.lua).
pub static RENEW: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/algorithms.lua"),
        include_str!("lua/leases.lua"),
        include_str!("lua/renew.lua")
    ))
    .in_library("renew")
});

/// Decides a reservation and answers Redis's time of it (`reserve` in reservations.lua).
pub static RESERVE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/algorithms.lua"),
        include_str!("lua/leases.lua"),
        include_str!("lua/reservations.lua"),
        include_str!("lua/reserve.lua")
    ))
    .in_library("reserve")
});

/// Settles a reservation in the leaves of one slot (`settle` in reservations.lua).
pub static SETTLE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/algorithms.lua"),
        include_str!("lua/leases.lua"),
        include_str!("lua/reservations.lua"),
        include_str!("lua/settle.lua")
    ))
    .in_library("settle")
});

/// The library's shared text: the algorithms, leases and reservations.
const LIBRARY_BODY: &str = concat!(
    include_str!("lua/algorithms.lua"),
    include_str!("lua/leases.lua"),
    include_str!("lua/reservations.lua")
);

/// Each function of [`LIBRARY`]: its name and its entry's text.
const ENTRIES: [(&str, &str); 7] = [
    ("decide", include_str!("lua/decide.lua")),
    ("split", include_str!("lua/split.lua")),
    ("acquire", include_str!("lua/acquire.lua")),
    ("release", include_str!("lua/release.lua")),
    ("renew", include_str!("lua/renew.lua")),
    ("reserve", include_str!("lua/reserve.lua")),
    ("settle", include_str!("lua/settle.lua")),
];

/// Every script above as one Redis 7 Function library, loaded once per server
/// (`FUNCTION LOAD`) and called by name (`FCALL`). EVALSHA runs a script's whole text on
/// every call, so the library of algorithms was defined anew for each decision; a function
/// defines it once, at load. Measured in `benches/throughput.rs`: about 3.5 µs less Redis
/// CPU per call of the full script (12.5 against 16.0 µs at pipeline depth 16).
///
/// The text is the shared Lua and the entries unchanged: `run` and the entries read
/// `KEYS` and `ARGV`, which a function receives as arguments, so the library declares them
/// as locals that each function sets before it runs. Names carry a hash of the text, so
/// servers shared by several sluice versions hold each version's library side by side.
pub static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
    let mut all = LIBRARY_BODY.to_owned();
    for (_, entry) in ENTRIES {
        all.push_str(entry);
    }
    let hash = redis::Script::new(&all).get_hash().to_owned();
    let tag = hash[..16].to_owned();
    let mut source = format!(
        "#!lua name=sluice_{tag}\n\
         -- sluice's scripts as functions; KEYS and ARGV are set by each call.\n\
         local KEYS, ARGV\n\
         {LIBRARY_BODY}\n"
    );
    for (name, entry) in ENTRIES {
        let _ = write!(
            source,
            "redis.register_function('sluice_{name}_{tag}', function(keys, args)\n\
             KEYS, ARGV = keys, args\n\
             {entry}\n\
             end)\n"
        );
    }
    Library { tag, source }
});

/// A Redis Function library: its text for `FUNCTION LOAD`.
pub struct Library {
    /// The hash in its name and its functions' names.
    pub tag: String,
    pub source: String,
}

/// The Lua library alone, for test entry points that pass `now` themselves.
pub const ALGORITHMS_LUA: &str = include_str!("lua/algorithms.lua");

/// The algorithms with leases and reservations, for test entry points that pass `now`
/// themselves (`acquire(now, lease)`, `release(now)`, `renew(now)`, `settle(now)`).
pub const LEASES_LUA: &str = LIBRARY_BODY;

/// The lean script for one GCRA leaf without a penalty, the most common hit, deciding a
/// batch of such hits in order: the writes of [`DECIDE`] for that shape without rebuilding
/// the library on every call, and one integer per hit for reply (see [`LeanGcra`]).
pub static GCRA_BATCH: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/redis_now.lua"),
        include_str!("lua/decimal.lua"),
        include_str!("lua/gcra_batch.lua")
    ))
});

/// The lean script's body alone, for test entry points that define `now` themselves.
pub const GCRA_BATCH_LUA: &str = concat!(
    include_str!("lua/decimal.lua"),
    include_str!("lua/gcra_batch.lua")
);

/// The lean script for one fixed-window leaf without a penalty, deciding a batch of such
/// hits in order, as [`GCRA_BATCH`] does for GCRA: the writes of [`DECIDE`] for that shape,
/// and two integers per hit for reply (see [`LeanFixed`]).
pub static FIXED_BATCH: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/redis_now.lua"),
        include_str!("lua/fixed_batch.lua")
    ))
});

/// The lean fixed-window script's body alone, for test entry points that define `now`.
pub const FIXED_BATCH_LUA: &str = include_str!("lua/fixed_batch.lua");

/// The lean script for one sliding-window leaf without a penalty, deciding a batch of such
/// hits in order, as [`GCRA_BATCH`] does for GCRA: the writes and the decision of [`DECIDE`]
/// for that shape, three integers per hit for reply (see [`LeanSliding`]).
pub static SLIDING_BATCH: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/redis_now.lua"),
        include_str!("lua/sliding_batch.lua")
    ))
});

/// The lean sliding-window script's body alone, for test entry points that define `now`.
pub const SLIDING_BATCH_LUA: &str = include_str!("lua/sliding_batch.lua");

/// The lean script for the lease steps of rules of one concurrency leaf (acquire, release,
/// renew), taking a batch of them in order, each as its single-step entry would: see
/// `src/lease_batch.rs`.
pub static LEASE_BATCH: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/redis_now.lua"),
        include_str!("lua/decimal.lua"),
        include_str!("lua/lease_batch.lua")
    ))
});

/// The lean lease script's body alone, for test entry points that define `now` themselves.
pub const LEASE_BATCH_LUA: &str = concat!(
    include_str!("lua/decimal.lua"),
    include_str!("lua/lease_batch.lua")
);

pub use crate::lease_batch::{LeaseAnswer, LeaseStep, lease_batch_answers, lease_batch_call};

/// The script's number for `algorithm`. An algorithm the script does not know is an error,
/// never another algorithm's decision.
pub(crate) fn algorithm_code(algorithm: Algorithm) -> Result<u8, RedisError> {
    match algorithm {
        Algorithm::Gcra => Ok(1),
        Algorithm::SlidingWindow => Ok(2),
        Algorithm::SlidingLog => Ok(3),
        Algorithm::FixedWindow => Ok(4),
        Algorithm::Concurrency => Ok(5),
        other => Err(RedisError::Unsupported(format!(
            "the Redis store has no script for algorithm `{other}`"
        ))),
    }
}

/// Writes `shape` as prefix tokens: `o<n>`, `a<n>`, `l<i>`.
pub fn shape_text(shape: &Shape, out: &mut String) {
    match shape {
        Shape::Leaf(i) => {
            let _ = write!(out, "l{i} ");
        }
        Shape::Or(children) | Shape::And(children) => {
            let kind = if matches!(shape, Shape::Or(_)) {
                'o'
            } else {
                'a'
            };
            let _ = write!(out, "{kind}{} ", children.len());
            for child in children {
                shape_text(child, out);
            }
        }
    }
}

/// The scripts' number for a recording mode.
fn recording_code(recording: Recording) -> u8 {
    match recording {
        Recording::Admitted => 0,
        Recording::Always => 1,
        _ => 2,
    }
}

/// The quota of `hit` when it has a lean script's shape: one leaf of `algorithm`, one
/// identifier, no penalty.
fn lean_quota<'h>(hit: &'h Hit<'_>, algorithm: Algorithm) -> Option<&'h Quota> {
    let ev = &hit.evaluation;
    match (ev.quotas, hit.identifiers, ev.shape, ev.penalty) {
        ([quota], [_], Shape::Leaf(0), None) if quota.algorithm() == algorithm => Some(quota),
        _ => None,
    }
}

/// A hit of the lean script's shape (one leaf, GCRA, no penalty): its ARGV for
/// [`GCRA_BATCH`], and its decision from the script's one-integer reply.
#[derive(Debug, Clone, Copy)]
pub struct LeanGcra {
    /// The quota counted in microseconds.
    quota: Quota,
    cost: u64,
    recording: Recording,
}

impl LeanGcra {
    /// `Some` when `hit` has the lean script's shape; `None` sends it to [`DECIDE`].
    pub fn of(hit: &Hit<'_>) -> Result<Option<LeanGcra>, RedisError> {
        let Some(quota) = lean_quota(hit, Algorithm::Gcra) else {
            return Ok(None);
        };
        Ok(Some(LeanGcra {
            quota: micro(quota)?,
            cost: hit.evaluation.cost,
            recording: hit.evaluation.recording,
        }))
    }

    /// The hit's five arguments: cost, recording, interval, burst, window (microseconds).
    pub fn arguments(&self) -> [u64; 5] {
        let q = &self.quota;
        [
            self.cost,
            u64::from(recording_code(self.recording)),
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
        let (q, cost) = (&self.quota, self.cost);
        let mut verdict = q.gcra_verdict(debt, 0, cost);
        if !verdict.allowed && verdict.retry != Retry::Never && recording_code(self.recording) == 1
        {
            verdict = q.gcra_verdict(q.gcra_record(debt, 0, cost), 0, cost);
        }
        Ok(Decision::from_verdict(&verdict, 0, TICK_NS))
    }
}

/// A hit of the lean fixed-window script's shape (one leaf, fixed window, no penalty): its
/// ARGV for [`FIXED_BATCH`], and its decision from the script's two-integer reply.
#[derive(Debug, Clone, Copy)]
pub struct LeanFixed {
    /// The quota counted in microseconds.
    quota: Quota,
    cost: u64,
    recording: Recording,
}

impl LeanFixed {
    /// `Some` when `hit` has the lean fixed-window shape; `None` sends it elsewhere.
    pub fn of(hit: &Hit<'_>) -> Result<Option<LeanFixed>, RedisError> {
        let Some(quota) = lean_quota(hit, Algorithm::FixedWindow) else {
            return Ok(None);
        };
        Ok(Some(LeanFixed {
            quota: micro(quota)?,
            cost: hit.evaluation.cost,
            recording: hit.evaluation.recording,
        }))
    }

    /// The hit's four arguments: cost, recording, limit, window length (microseconds).
    pub fn arguments(&self) -> [u64; 4] {
        [
            self.cost,
            u64::from(recording_code(self.recording)),
            self.quota.limit(),
            self.quota.window_ticks(),
        ]
    }

    /// The decision from the hit's reply: the count its window held before it (`used`) and
    /// the time to the window's end (`left`, in `(0, length]`). The core's fixed window
    /// depends on the time only through that, so it decides at `length - left` in window 0
    /// as the full script does at `now`; a denial counted anyway (recording `always`)
    /// answers with the recorded state's verdict, as there.
    pub fn decision(&self, used: i64, left: i64) -> Result<Decision, RedisError> {
        let (q, cost) = (&self.quota, self.cost);
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
        if !verdict.allowed && verdict.retry != Retry::Never && recording_code(self.recording) == 1
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
#[derive(Debug, Clone, Copy)]
pub struct LeanSliding {
    /// The quota counted in microseconds.
    quota: Quota,
    cost: u64,
    recording: Recording,
}

impl LeanSliding {
    /// `Some` when `hit` has the lean sliding-window shape; `None` sends it elsewhere.
    pub fn of(hit: &Hit<'_>) -> Result<Option<LeanSliding>, RedisError> {
        let Some(quota) = lean_quota(hit, Algorithm::SlidingWindow) else {
            return Ok(None);
        };
        Ok(Some(LeanSliding {
            quota: micro(quota)?,
            cost: hit.evaluation.cost,
            recording: hit.evaluation.recording,
        }))
    }

    /// The hit's five arguments: cost, recording, limit, sub-window length (microseconds),
    /// sub-windows.
    pub fn arguments(&self) -> [u64; 5] {
        let q = &self.quota;
        [
            self.cost,
            u64::from(recording_code(self.recording)),
            q.limit(),
            q.sub_window_ticks(),
            u64::from(q.windows()),
        ]
    }

    /// The decision from the hit's reply, the script's verdict: `remaining`, `reset_after`
    /// and `retry` (-1 now: admitted; -2 never; otherwise the ticks to wait). A reply no
    /// verdict of this quota can give is an error, never an admission.
    pub fn decision(
        &self,
        [remaining, reset_after, retry]: [i64; 3],
    ) -> Result<Decision, RedisError> {
        let q = &self.quota;
        let limit = q.limit();
        let wrong = || {
            RedisError::Reply(format!(
                "sliding window reply {remaining}, {reset_after}, {retry} for a limit of {limit}"
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
}

/// ARGV for [`GCRA_BATCH`] deciding hits of these arguments ([`LeanGcra::arguments`]) in
/// order, or for [`FIXED_BATCH`] ([`LeanFixed::arguments`]): the distinct sets, then each
/// hit's set number, left out when there is one set (Redis then parses and the script reads
/// one argument a hit fewer).
pub fn batch_arguments<const N: usize>(hits: impl IntoIterator<Item = [u64; N]>) -> Vec<u64> {
    let mut sets: Vec<[u64; N]> = Vec::new();
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
    let mut args = Vec::with_capacity(1 + sets.len() * N + numbers.len());
    args.push(sets.len() as u64);
    let one = sets.len() == 1;
    args.extend(sets.into_iter().flatten());
    if !one {
        args.extend(numbers);
    }
    args
}

/// KEYS and ARGV for a lean script ([`GCRA_BATCH`], [`FIXED_BATCH`], [`SLIDING_BATCH`])
/// deciding `hits` (each its key and its arguments) in order: one key per hit and
/// [`batch_arguments`]; or, when the hits share one key and one parameter set (a limit
/// every caller hits), the key once and the number of hits after the set, which spares
/// Redis a quarter of its instructions per hit (`benches/lua_instructions.sh`).
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

/// ARGV for [`GCRA_BATCH`] deciding `hit` alone, as text; `None` when `hit` does not have
/// the lean shape (see [`LeanGcra`]).
pub fn gcra_one_arguments(hit: &Hit<'_>) -> Result<Option<Vec<String>>, RedisError> {
    Ok(LeanGcra::of(hit)?.map(|lean| {
        batch_arguments([lean.arguments()])
            .iter()
            .map(u64::to_string)
            .collect()
    }))
}

/// ARGV for a hit (see `run` in algorithms.lua), with quotas recounted in microseconds.
pub fn arguments(hit: &Hit<'_>, token: u64) -> Result<Vec<String>, RedisError> {
    let ev = &hit.evaluation;
    let recording = recording_code(ev.recording);
    let mut shape = String::new();
    shape_text(ev.shape, &mut shape);
    let mut args = Vec::with_capacity(5 + ev.quotas.len() * 6 + 4);
    args.push(ev.cost.to_string());
    args.push(recording.to_string());
    args.push(shape);
    args.push(format!("{token:x}"));
    args.push(ev.quotas.len().to_string());
    for quota in ev.quotas {
        let q = micro(quota)?;
        args.push(algorithm_code(q.algorithm())?.to_string());
        args.push(q.limit().to_string());
        args.push(q.window_ticks().to_string());
        args.push(q.interval_ticks().to_string());
        args.push(q.burst().to_string());
        args.push(q.windows().to_string());
    }
    if let Some(penalty) = ev.penalty {
        let (base, factor, max, forget) = penalty.with_tick(TICK_NS).ticks();
        args.extend([base, u64::from(factor), max, forget].map(|n| n.to_string()));
    }
    Ok(args)
}

/// The quota counted in microseconds.
pub fn micro(quota: &Quota) -> Result<Quota, RedisError> {
    quota
        .with_tick(TICK_NS)
        .map_err(|e| RedisError::Unsupported(e.to_string()))
}

/// A reply `[allowed, limit, remaining, reset_after, retry_after, denial, leaf]`.
pub fn decision(reply: &[i64]) -> Result<Decision, RedisError> {
    let [
        allowed,
        limit,
        remaining,
        reset_after,
        retry_after,
        denial,
        leaf,
    ] = reply
    else {
        return Err(RedisError::Reply(format!(
            "expected 7 integers, got {reply:?}"
        )));
    };
    let count =
        |n: &i64| u64::try_from(*n).map_err(|_| RedisError::Reply(format!("negative value {n}")));
    let retry = || count(retry_after).map(|n| ticks(n, TICK_NS));
    // Only the combinations the script makes are accepted: a reply that contradicts itself
    // is the store's fault, never an admission.
    let denial = match (allowed, denial) {
        (1, 0) => None,
        (0, 1) => Some(Denial::Limited {
            retry_after: retry()?,
        }),
        (0, 2) => Some(Denial::CostExceedsCapacity),
        (0, 3) => Some(Denial::Penalized {
            retry_after: retry()?,
        }),
        _ => {
            return Err(RedisError::Reply(format!(
                "allowed {allowed} with denial code {denial}"
            )));
        }
    };
    Ok(Decision {
        denial,
        limit: count(limit)?,
        remaining: count(remaining)?,
        reset_after: ticks(count(reset_after)?, TICK_NS),
        leaf: count(leaf)? as usize,
    })
}
