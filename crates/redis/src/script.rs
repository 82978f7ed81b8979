//! The decision script: how a hit becomes KEYS and ARGV, and a reply becomes a Decision.

use std::fmt::Write;
use std::sync::LazyLock;

use sluice_core::decision::ticks;
use sluice_core::{Algorithm, Decision, Denial, Quota, Recording, Shape};
use sluice_limiter::Hit;

use crate::RedisError;
/// The Cluster slot of an identifier's key, for tests that spread keys over slots.
pub use crate::lean::{
    LeanFixed, LeanGcra, LeanLog, LeanSliding, batch_arguments, batch_call, distinct_batch_call,
    gcra_one_arguments,
};
pub use crate::rule_batch::{LeanRule, MAX_RULE_LEAVES, rule_batch_call};
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
        include_str!("lua/lease_string.lua"),
        include_str!("lua/leases.lua"),
        include_str!("lua/decide.lua")
    ))
    .in_library("decide")
});

/// The algorithms followed by the per-slot entry for rules spread over cluster slots.
pub static SPLIT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/algorithms.lua"),
        include_str!("lua/lease_string.lua"),
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
        include_str!("lua/lease_string.lua"),
        include_str!("lua/leases.lua"),
        include_str!("lua/acquire.lua")
    ))
    .in_library("acquire")
});

/// Releases a lease in the lease sets of one slot (`release` in leases.lua).
pub static RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/algorithms.lua"),
        include_str!("lua/lease_string.lua"),
        include_str!("lua/leases.lua"),
        include_str!("lua/release.lua")
    ))
    .in_library("release")
});

/// Renews a lease in the lease sets of one slot (`renew` in leases.lua).
pub static RENEW: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/algorithms.lua"),
        include_str!("lua/lease_string.lua"),
        include_str!("lua/leases.lua"),
        include_str!("lua/renew.lua")
    ))
    .in_library("renew")
});

/// Decides a reservation and answers Redis's time of it (`reserve` in reservations.lua).
pub static RESERVE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/algorithms.lua"),
        include_str!("lua/lease_string.lua"),
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
        include_str!("lua/lease_string.lua"),
        include_str!("lua/leases.lua"),
        include_str!("lua/reservations.lua"),
        include_str!("lua/settle.lua")
    ))
    .in_library("settle")
});

/// The library's shared text: the algorithms, leases and reservations.
const LIBRARY_BODY: &str = concat!(
    include_str!("lua/algorithms.lua"),
    include_str!("lua/lease_string.lua"),
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

/// The lean script for one sliding-log leaf without a penalty, deciding a batch of such hits
/// in order, as [`GCRA_BATCH`] does for GCRA: the writes and the decision of [`DECIDE`] for
/// that shape, three integers per hit for reply (see [`LeanLog`]). Its ARGV ends with a
/// token unique to the call, which names the members it adds.
pub static LOG_BATCH: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/redis_now.lua"),
        include_str!("lua/log_batch.lua")
    ))
});

/// The lean sliding-log script's body alone, for test entry points that define `now`.
pub const LOG_BATCH_LUA: &str = include_str!("lua/log_batch.lua");

/// The lean script for rules of up to 8 GCRA, fixed-window, sliding-window and sliding-log
/// leaves joined by `;` (`user:10/s; user:1000/h`) or in any tree of `or` and `and`, or one
/// such leaf with a penalty, with or without a penalty, deciding a batch of such hits in
/// order: the writes of [`DECIDE`] for that shape, and for reply Redis's `now`, then what
/// each leaf's decision reads and the penalty record each hit found (see
/// `src/rule_batch.rs`).
pub static RULE_BATCH: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/redis_now.lua"),
        include_str!("lua/decimal.lua"),
        include_str!("lua/rule_batch.lua")
    ))
});

/// The lean rule script's body alone, for test entry points that define `now` themselves.
pub const RULE_BATCH_LUA: &str = concat!(
    include_str!("lua/decimal.lua"),
    include_str!("lua/rule_batch.lua")
);

/// The lean script for the lease steps of rules of one concurrency leaf (acquire, release,
/// renew), taking a batch of them in order, each as its single-step entry would: see
/// `src/lease_batch.rs`.
pub static LEASE_BATCH: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/redis_now.lua"),
        include_str!("lua/decimal.lua"),
        include_str!("lua/lease_string.lua"),
        include_str!("lua/lease_batch.lua")
    ))
});

/// The lean lease script's body alone, for test entry points that define `now` themselves.
pub const LEASE_BATCH_LUA: &str = concat!(
    include_str!("lua/decimal.lua"),
    include_str!("lua/lease_string.lua"),
    include_str!("lua/lease_batch.lua")
);

pub use crate::lease_batch::{
    LeaseAnswer, LeaseStep, lease_batch_answers, lease_batch_call, lease_set,
};

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
pub(crate) fn recording_code(recording: Recording) -> u8 {
    match recording {
        Recording::Admitted => 0,
        Recording::Always => 1,
        _ => 2,
    }
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
