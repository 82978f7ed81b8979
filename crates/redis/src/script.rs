//! The decision script: how a hit becomes KEYS and ARGV, and a reply becomes a Decision.

use std::fmt::Write;
use std::sync::LazyLock;

use sluice_core::decision::ticks;
use sluice_core::{Algorithm, Decision, Denial, Quota, Recording, Shape};
use sluice_limiter::Hit;

use crate::RedisError;

/// Nanoseconds per tick in Redis: microseconds, the resolution of `TIME`, and small enough
/// that every time the script handles stays exact in a Lua double.
pub const TICK_NS: u64 = 1_000;

/// A script sent by its SHA1 (EVALSHA), or whole (EVAL) when the server has lost it.
pub struct Lua {
    pub source: &'static str,
    pub sha: String,
}

impl Lua {
    fn new(source: &'static str) -> Lua {
        Lua {
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
        }
    }
}

/// The algorithms (shared with the test entry point) followed by the production entry,
/// which reads the time from Redis.
pub static DECIDE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/algorithms.lua"),
        include_str!("lua/decide.lua")
    ))
});

/// The algorithms followed by the per-slot entry for rules spread over cluster slots.
pub static SPLIT: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/algorithms.lua"),
        include_str!("lua/split.lua")
    ))
});

/// The Lua library alone, for test entry points that pass `now` themselves.
pub const ALGORITHMS_LUA: &str = include_str!("lua/algorithms.lua");

/// The lean script for one GCRA leaf without a penalty, the most common hit: the decision of
/// [`DECIDE`] for that shape without rebuilding the library on every call (see
/// [`gcra_one_arguments`]).
pub static GCRA_ONE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("lua/redis_now.lua"),
        include_str!("lua/gcra_one.lua")
    ))
});

/// The lean script's body alone, for test entry points that define `now` themselves.
pub const GCRA_ONE_LUA: &str = include_str!("lua/gcra_one.lua");

/// The script's number for `algorithm`. An algorithm the script does not know is an error,
/// never another algorithm's decision.
pub(crate) fn algorithm_code(algorithm: Algorithm) -> Result<u8, RedisError> {
    match algorithm {
        Algorithm::Gcra => Ok(1),
        Algorithm::SlidingWindow => Ok(2),
        Algorithm::SlidingLog => Ok(3),
        Algorithm::FixedWindow => Ok(4),
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

/// ARGV for [`GCRA_ONE`] (cost, recording, interval, burst, window, in microseconds) when
/// `hit` has its shape: one leaf, GCRA, no penalty; `None` sends it to [`DECIDE`].
pub fn gcra_one_arguments(hit: &Hit<'_>) -> Result<Option<Vec<String>>, RedisError> {
    let ev = &hit.evaluation;
    let ([quota], [_], Shape::Leaf(0), None) = (ev.quotas, hit.identifiers, ev.shape, ev.penalty)
    else {
        return Ok(None);
    };
    if quota.algorithm() != Algorithm::Gcra {
        return Ok(None);
    }
    let q = micro(quota)?;
    Ok(Some(vec![
        ev.cost.to_string(),
        recording_code(ev.recording).to_string(),
        q.interval_ticks().to_string(),
        q.burst().to_string(),
        q.window_ticks().to_string(),
    ]))
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
