//! How a vector's outcome through a script is compared with the core's: the decision as the
//! full script answers it, the keys' expiries, and states as they compare once expired.

use std::collections::BTreeMap;

use serde_json::Value as Json;
use sluice_core::algorithm::sliding_log::Log;
use sluice_core::{Decision, Denial, Quota, State};
use sluice_testkit::vectors::state_json;

use crate::UNTOUCHED_EXPIRY_MS;

/// Every key has an expiry; a key the script rewrote expires when its state does.
pub(super) fn check_expiry(
    what: &str,
    present: bool,
    expiry_ms: i64,
    rewritten: bool,
    (earliest, latest): (i64, i64),
) -> Option<String> {
    if !present {
        return None;
    }
    if expiry_ms <= 0 {
        return Some(format!(
            "{what}: key has no expiry (PEXPIRETIME {expiry_ms})"
        ));
    }
    if rewritten && expiry_ms == UNTOUCHED_EXPIRY_MS {
        return Some(format!("{what}: state changed but its expiry was not set"));
    }
    if expiry_ms != UNTOUCHED_EXPIRY_MS && !(earliest..=latest).contains(&expiry_ms) {
        return Some(format!(
            "{what}: expires at {expiry_ms} ms, expected within {earliest}..={latest}"
        ));
    }
    None
}

/// A decision as the full script's reply: `[allowed, limit, remaining, reset_after,
/// retry_after (-1 none), denial, leaf]`, times in microseconds.
pub(super) fn decision_reply(d: &Decision) -> Vec<i64> {
    let micros = |t: std::time::Duration| t.as_micros() as i64;
    let (retry, denial) = match d.denial {
        None => (-1, 0),
        Some(Denial::Limited { retry_after }) => (micros(retry_after), 1),
        Some(Denial::CostExceedsCapacity) => (-1, 2),
        Some(Denial::Penalized { retry_after }) => (micros(retry_after), 3),
        Some(other) => panic!("no reply code for {other:?}"),
    };
    vec![
        i64::from(d.allowed()),
        d.limit as i64,
        d.remaining as i64,
        micros(d.reset_after),
        retry,
        denial,
        d.leaf as i64,
    ]
}

/// Redis's clock in milliseconds.
pub(super) fn server_ms(con: &mut redis::Connection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(con).expect("TIME");
    secs * 1_000 + micros / 1_000
}

/// An expired state compares as fresh: Lua may drop what the core keeps until it is
/// overwritten. Logs compare as (time, total cost) pairs.
pub(super) fn canonical(quota: &Quota, state: &State, now: u64) -> Json {
    if quota.expires_at(state) <= now {
        return state_json(&quota.fresh_state());
    }
    match state {
        State::SlidingLog(log) => {
            let mut merged: BTreeMap<u64, u64> = BTreeMap::new();
            for (t, c) in log.hits() {
                *merged.entry(t).or_default() += c;
            }
            state_json(&State::SlidingLog(Log::from_hits(merged)))
        }
        other => state_json(other),
    }
}
