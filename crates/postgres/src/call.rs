//! How a hit becomes the decision function's arguments, and its reply a Decision (the
//! encoding `decide` in sql/decide.sql documents).

use std::fmt::Write;

use sluice_core::decision::ticks;
use sluice_core::{Algorithm, Decision, Denial, Quota, Recording, Shape};
use sluice_limiter::Hit;

use crate::PostgresError;

/// Nanoseconds per tick in the functions: microseconds, the resolution of PostgreSQL's
/// clock (`clock_timestamp()`).
pub const TICK_NS: u64 = 1_000;

/// Numbers above this are refused: every sum and product the functions form from them stays
/// within a bigint.
const MAX_NUMBER: u64 = 1 << 61;

/// The functions' number for `algorithm`. An algorithm they do not know is an error, never
/// another algorithm's decision.
pub(crate) fn algorithm_code(algorithm: Algorithm) -> Result<i64, PostgresError> {
    match algorithm {
        Algorithm::Gcra => Ok(1),
        Algorithm::SlidingWindow => Ok(2),
        Algorithm::SlidingLog => Ok(3),
        Algorithm::FixedWindow => Ok(4),
        other => Err(PostgresError::Unsupported(format!(
            "the PostgreSQL store has no function for algorithm `{other}`"
        ))),
    }
}

fn recording_code(recording: Recording) -> i64 {
    match recording {
        Recording::Admitted => 0,
        Recording::Always => 1,
        _ => 2,
    }
}

pub(crate) fn number(n: u64, what: &str) -> Result<i64, PostgresError> {
    if n > MAX_NUMBER {
        return Err(PostgresError::Unsupported(format!(
            "{what} {n} is above 2^61"
        )));
    }
    Ok(n as i64)
}

/// A cost as a bigint: any cost above every capacity is decided alike, so the largest ones
/// are clamped rather than refused.
pub(crate) fn cost(cost: u64) -> i64 {
    i64::try_from(cost).unwrap_or(i64::MAX)
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

/// The quota counted in microseconds.
pub fn micro(quota: &Quota) -> Result<Quota, PostgresError> {
    quota
        .with_tick(TICK_NS)
        .map_err(|e| PostgresError::Unsupported(e.to_string()))
}

/// Arguments of `gcra_one` after the identifier (cost, recording, interval, burst, window)
/// when `hit` has its shape: one leaf, GCRA, no penalty; `None` sends it to `decide`.
pub fn gcra_one_arguments(hit: &Hit<'_>) -> Result<Option<[i64; 5]>, PostgresError> {
    let ev = &hit.evaluation;
    let ([quota], [_], Shape::Leaf(0), None) = (ev.quotas, hit.identifiers, ev.shape, ev.penalty)
    else {
        return Ok(None);
    };
    if quota.algorithm() != Algorithm::Gcra {
        return Ok(None);
    }
    let q = micro(quota)?;
    Ok(Some([
        cost(ev.cost),
        recording_code(ev.recording),
        number(q.interval_ticks(), "interval")?,
        number(q.burst(), "burst")?,
        number(q.window_ticks(), "window")?,
    ]))
}

/// `params` and `shape` of `decide`.
pub fn arguments(hit: &Hit<'_>) -> Result<(Vec<i64>, String), PostgresError> {
    arguments_coded(hit, algorithm_code)
}

/// `params` and `shape` as `decide` takes them, each leaf's algorithm numbered by `code`
/// (`acquire` also knows concurrency).
pub(crate) fn arguments_coded(
    hit: &Hit<'_>,
    code: fn(Algorithm) -> Result<i64, PostgresError>,
) -> Result<(Vec<i64>, String), PostgresError> {
    let ev = &hit.evaluation;
    let mut shape = String::new();
    shape_text(ev.shape, &mut shape);
    let mut params = Vec::with_capacity(3 + ev.quotas.len() * 6 + 4);
    params.push(cost(ev.cost));
    params.push(recording_code(ev.recording));
    params.push(ev.quotas.len() as i64);
    for quota in ev.quotas {
        let q = micro(quota)?;
        params.push(code(q.algorithm())?);
        params.push(number(q.limit(), "limit")?);
        params.push(number(q.window_ticks(), "window")?);
        params.push(number(q.interval_ticks(), "interval")?);
        params.push(number(q.burst(), "burst")?);
        params.push(i64::from(q.windows()));
    }
    if let Some(penalty) = ev.penalty {
        let (base, factor, max, forget) = penalty.with_tick(TICK_NS).ticks();
        params.push(number(base, "penalty base")?);
        params.push(i64::from(factor));
        params.push(number(max, "penalty max")?);
        params.push(number(forget, "penalty forget_after")?);
    }
    Ok((params, shape))
}

/// A reply `[allowed, limit, remaining, reset_after, retry_after, denial, leaf]`.
pub fn decision(reply: &[i64]) -> Result<Decision, PostgresError> {
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
        return Err(PostgresError::Reply(format!(
            "expected 7 integers, got {reply:?}"
        )));
    };
    let count = |n: &i64| {
        u64::try_from(*n).map_err(|_| PostgresError::Reply(format!("negative value {n}")))
    };
    let retry = || count(retry_after).map(|n| ticks(n, TICK_NS));
    // Only the combinations the functions make are accepted: a reply that contradicts itself
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
            return Err(PostgresError::Reply(format!(
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
