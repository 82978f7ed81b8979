//! The shared test vectors (crates/core/tests/vectors.json, outcomes from the Rust core) run
//! through the Lua translation on a real Redis: each vector's states are written into fresh
//! keys in the layout algorithms.lua documents, the script decides at the vector's `now`, and
//! the reply and the keys it leaves behind must say what the core says.

#[path = "vectors/compare.rs"]
mod compare;
#[path = "vectors/layout.rs"]
mod layout;

use compare::{canonical, check_expiry, decision_reply, server_ms};
use layout::{expected_reply, int, ints, read_penalty, read_state, write_state};
use redis::Value;
use serde_json::Value as Json;
use sluice_core::{Algorithm, Evaluation, PenaltyState, Quota};
use sluice_core::{Rate, Span, Unit};
use sluice_limiter::{Hit, Identifier};
use sluice_redis::script::{
    ALGORITHMS_LUA, FIXED_BATCH_LUA, GCRA_BATCH_LUA, LOG_BATCH_LUA, LeanFixed, LeanGcra, LeanLog,
    LeanRule, LeanSliding, RULE_BATCH_LUA, SLIDING_BATCH_LUA, TICK_NS, arguments, batch_arguments,
    distinct_batch_call, rule_batch_call,
};
use sluice_testkit::RedisServer;
use sluice_testkit::vectors::{
    self, LeafSpec, case_from, penalty_record_from, state_from, state_json, without_expected,
};

/// The test entry point: the production one (decide.lua) reads Redis's clock and never takes
/// the time from its caller; this one takes `now` as the last argument.
const TEST_ENTRY: &str = "\nreturn run(tonumber(ARGV[#ARGV]))";

/// The lean script's test entry: its production entry (redis_now.lua) sets `now` from
/// Redis's clock; this one from the last argument, which it takes off `ARGV` so the script
/// sees the arguments the store sends.
const LEAN_TEST_ENTRY: &str = "local now = tonumber(table.remove(ARGV))\n";

/// Which script a vector runs through.
#[derive(Clone, Copy, PartialEq)]
enum Script {
    /// The library and `run`: every vector.
    Full,
    /// gcra_batch.lua: the vectors of one GCRA leaf without a penalty, each in the middle
    /// of a batch of three (a fresh key before and after it), its decision made in Rust from
    /// the script's one-integer reply.
    Lean,
    /// gcra_batch.lua again, each of those vectors alone in its call, as the store sends a
    /// lone hit (`distinct_batch_call`): the script's loop for hits of one set on distinct
    /// keys.
    LeanAlone,
    /// fixed_batch.lua: the vectors of one fixed-window leaf without a penalty, the same way,
    /// the decision made from the script's two integers.
    LeanFixed,
    /// fixed_batch.lua again, each of those vectors alone in its call, as `LeanAlone`.
    LeanFixedAlone,
    /// sliding_batch.lua: the vectors of one sliding-window leaf without a penalty, the same
    /// way, the decision made from the script's three-integer verdict.
    LeanSliding,
    /// sliding_batch.lua again, each of those vectors alone in its call, as `LeanAlone`.
    LeanSlidingAlone,
    /// log_batch.lua: the vectors of one sliding-log leaf without a penalty, the same way
    /// (a token for the call's members last but one), the decision made from the script's
    /// three-integer verdict.
    LeanLog,
    /// log_batch.lua again, each of those vectors alone in its call, as `LeanAlone`.
    LeanLogAlone,
    /// rule_batch.lua: the vectors of one GCRA, fixed-window or sliding-window leaf or a
    /// tree of `or` and `and` over such leaves, with or without a penalty, each hit alone in its call, the decision made from the script's
    /// debt per leaf and the penalty record the hit found.
    LeanRule,
}

/// A lean script's hit, of any kind.
#[derive(Clone)]
enum Lean {
    Gcra(LeanGcra),
    Fixed(LeanFixed),
    Sliding(LeanSliding),
    Log(LeanLog),
    Rule(LeanRule),
}

/// Expiry of the keys this test writes (2100-01-01, in ms): a key still carrying it was not
/// rewritten by the script.
const UNTOUCHED_EXPIRY_MS: i64 = 4_102_444_800_000;

#[test]
fn lua_reproduces_every_vector() {
    assert_eq!(TICK_NS, vectors::TICK_NS, "vectors count in Redis ticks");
    let vectors = vectors::parse(vectors::FILE_TEXT);
    assert!(vectors.len() >= 300, "only {} vectors", vectors.len());

    let server = RedisServer::start().expect("redis-server");
    let client = redis::Client::open(server.url()).unwrap();
    let mut con = client.get_connection().expect("connect");
    let script = format!("{ALGORITHMS_LUA}{TEST_ENTRY}");

    let mut failures = Vec::new();
    for (index, vector) in vectors.iter().enumerate() {
        let problems = check(&mut con, &script, Script::Full, index, vector)
            .expect("the full script takes every vector");
        if !problems.is_empty() {
            failures.push(format!(
                "vector {index}:\n  {}\n  case: {}",
                problems.join("\n  "),
                without_expected(vector)
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "the Lua disagrees with the core on {} of {} vectors:\n{}",
        failures.len(),
        vectors.len(),
        failures.join("\n")
    );
}

#[test]
fn lean_script_reproduces_every_single_leaf_gcra_vector() {
    lean_script_reproduces_its_vectors(Script::Lean, GCRA_BATCH_LUA, "GCRA", 30);
}

#[test]
fn lean_script_alone_reproduces_every_single_leaf_gcra_vector() {
    lean_script_reproduces_its_vectors(Script::LeanAlone, GCRA_BATCH_LUA, "GCRA", 30);
}

#[test]
fn lean_fixed_window_script_alone_reproduces_every_single_leaf_fixed_window_vector() {
    lean_script_reproduces_its_vectors(Script::LeanFixedAlone, FIXED_BATCH_LUA, "fixed-window", 20);
}

#[test]
fn lean_fixed_window_script_reproduces_every_single_leaf_fixed_window_vector() {
    lean_script_reproduces_its_vectors(Script::LeanFixed, FIXED_BATCH_LUA, "fixed-window", 20);
}

#[test]
fn lean_rule_script_reproduces_every_vector() {
    // Every vector: GCRA, fixed-window, sliding-window and sliding-log leaves, alone or in
    // any `or` and `and` tree, with a penalty or not.
    lean_script_reproduces_its_vectors(Script::LeanRule, RULE_BATCH_LUA, "rule", 500);
}

#[test]
fn lean_sliding_window_script_alone_reproduces_every_single_leaf_sliding_window_vector() {
    lean_script_reproduces_its_vectors(
        Script::LeanSlidingAlone,
        SLIDING_BATCH_LUA,
        "sliding-window",
        20,
    );
}

#[test]
fn lean_sliding_window_script_reproduces_every_single_leaf_sliding_window_vector() {
    lean_script_reproduces_its_vectors(
        Script::LeanSliding,
        SLIDING_BATCH_LUA,
        "sliding-window",
        20,
    );
}

#[test]
fn lean_sliding_log_script_alone_reproduces_every_single_leaf_sliding_log_vector() {
    lean_script_reproduces_its_vectors(Script::LeanLogAlone, LOG_BATCH_LUA, "sliding-log", 20);
}

#[test]
fn lean_sliding_log_script_reproduces_every_single_leaf_sliding_log_vector() {
    lean_script_reproduces_its_vectors(Script::LeanLog, LOG_BATCH_LUA, "sliding-log", 20);
}

/// Runs every vector of `kind`'s shape through its lean script (`body`); at least `least`
/// must be of that shape.
fn lean_script_reproduces_its_vectors(kind: Script, body: &str, name: &str, least: usize) {
    let vectors = vectors::parse(vectors::FILE_TEXT);
    let server = RedisServer::start().expect("redis-server");
    let client = redis::Client::open(server.url()).unwrap();
    let mut con = client.get_connection().expect("connect");
    let script = format!("{LEAN_TEST_ENTRY}{body}");

    let (mut ran, mut failures) = (0, Vec::new());
    for (index, vector) in vectors.iter().enumerate() {
        let Some(problems) = check(&mut con, &script, kind, index, vector) else {
            continue;
        };
        ran += 1;
        if !problems.is_empty() {
            failures.push(format!(
                "vector {index}:\n  {}\n  case: {}",
                problems.join("\n  "),
                without_expected(vector)
            ));
        }
    }
    assert!(ran >= least, "only {ran} {name} vectors");
    assert!(
        failures.is_empty(),
        "the lean script disagrees with the core on {} of {ran} vectors:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Runs one vector through `script`; returns what differs from the core's outcome, or `None`
/// when the vector is not of the script's shape.
fn check(
    con: &mut redis::Connection,
    script: &str,
    kind: Script,
    index: usize,
    vector: &Json,
) -> Option<Vec<String>> {
    let case = case_from(vector);
    // Nanosecond quotas and penalty, as the limiter hands them to the store.
    let quotas: Vec<Quota> = case.leaves.iter().map(LeafSpec::quota_ns).collect();
    let penalty = case.penalty.map(|p| p.penalty_ns());
    let keys: Vec<String> = (0..case.leaves.len())
        .map(|leaf| format!("v{index}:leaf{leaf}"))
        .collect();
    let penalty_key = format!("v{index}:penalty");
    let micro: Vec<Quota> = quotas
        .iter()
        .map(|q| q.with_tick(TICK_NS).unwrap())
        .collect();
    let penalty_micro = penalty.map(|p| p.with_tick(TICK_NS));

    // The initial states, in Redis's layout.
    let mut setup = redis::pipe();
    for ((key, quota), state) in keys.iter().zip(&micro).zip(&case.states) {
        if *state != quota.fresh_state() {
            write_state(&mut setup, key, state);
        }
    }
    if let Some(record) = case.penalty_record {
        setup
            .cmd("SET")
            .arg(&penalty_key)
            .arg(format!(
                "{}:{}:{}",
                record.strikes, record.until, record.last_strike
            ))
            .cmd("PEXPIREAT")
            .arg(&penalty_key)
            .arg(UNTOUCHED_EXPIRY_MS);
    }
    if !setup.is_empty() {
        setup.exec(con).expect("write the initial states");
    }

    // ARGV exactly as the production path builds it, then `now`.
    let ids: Vec<Identifier> = keys.iter().map(|k| Identifier::new(k.clone())).collect();
    let penalty_id = Identifier::new(penalty_key.clone());
    let hit = Hit {
        identifiers: &ids,
        evaluation: Evaluation {
            shape: &case.shape,
            quotas: &quotas,
            cost: case.cost,
            recording: case.recording,
            penalty: penalty.as_ref(),
        },
        penalty_identifier: penalty.is_some().then_some(&penalty_id),
    };
    let lean = match kind {
        Script::Full => None,
        Script::Lean | Script::LeanAlone => {
            Some(Lean::Gcra(LeanGcra::of(&hit).expect("arguments")?))
        }
        Script::LeanFixed | Script::LeanFixedAlone => {
            Some(Lean::Fixed(LeanFixed::of(&hit).expect("arguments")?))
        }
        Script::LeanSliding | Script::LeanSlidingAlone => {
            Some(Lean::Sliding(LeanSliding::of(&hit).expect("arguments")?))
        }
        Script::LeanLog | Script::LeanLogAlone => {
            Some(Lean::Log(LeanLog::of(&hit).expect("arguments")?))
        }
        Script::LeanRule => Some(Lean::Rule(LeanRule::of(&hit).expect("arguments")?)),
    };
    // The batch's neighbours: fresh keys, admitted (nothing used before them) by a quota of
    // their own, of the same algorithm.
    let five_a_minute = Rate::new(5, Span::new(60, Unit::Second).unwrap()).unwrap();
    let algorithm = match &lean {
        Some(Lean::Fixed(_)) => Algorithm::FixedWindow,
        Some(Lean::Sliding(_)) => Algorithm::SlidingWindow,
        Some(Lean::Log(_)) => Algorithm::SlidingLog,
        _ => Algorithm::Gcra,
    };
    let neighbour_quota =
        [Quota::from_leaf(&sluice_core::Leaf::new(five_a_minute), algorithm).unwrap()];
    let neighbour_hit = Hit {
        identifiers: &ids[..1],
        evaluation: Evaluation {
            shape: &sluice_core::Shape::Leaf(0),
            quotas: &neighbour_quota,
            cost: 1,
            recording: sluice_core::Recording::Admitted,
            penalty: None,
        },
        penalty_identifier: None,
    };
    let (before_key, after_key) = (format!("v{index}:before"), format!("v{index}:after"));
    let text = |args: Vec<u64>| args.iter().map(u64::to_string).collect();
    let mut args: Vec<String> = match lean.clone() {
        None => arguments(&hit, index as u64).expect("arguments"),
        Some(Lean::Gcra(lean)) if kind == Script::LeanAlone => {
            let (_, args) = distinct_batch_call([(keys[0].as_str(), lean.arguments())]);
            assert_eq!(args[0], 0, "a lone hit goes as distinct keys of one set");
            text(args)
        }
        Some(Lean::Gcra(lean)) => {
            let neighbour = LeanGcra::of(&neighbour_hit).unwrap().expect("a lean hit");
            text(batch_arguments(
                [neighbour, lean, neighbour].map(|hit| hit.arguments()),
            ))
        }
        Some(Lean::Fixed(lean)) if kind == Script::LeanFixedAlone => {
            let (_, args) = distinct_batch_call([(keys[0].as_str(), lean.arguments())]);
            assert_eq!(args[0], 0, "a lone hit goes as distinct keys of one set");
            text(args)
        }
        Some(Lean::Fixed(lean)) => {
            let neighbour = LeanFixed::of(&neighbour_hit).unwrap().expect("a lean hit");
            text(batch_arguments(
                [neighbour, lean, neighbour].map(|hit| hit.arguments()),
            ))
        }
        Some(Lean::Sliding(lean)) if kind == Script::LeanSlidingAlone => {
            let (_, args) = distinct_batch_call([(keys[0].as_str(), lean.arguments())]);
            assert_eq!(args[0], 0, "a lone hit goes as distinct keys of one set");
            text(args)
        }
        Some(Lean::Sliding(lean)) => {
            let neighbour = LeanSliding::of(&neighbour_hit)
                .unwrap()
                .expect("a lean hit");
            text(batch_arguments(
                [neighbour, lean, neighbour].map(|hit| hit.arguments()),
            ))
        }
        Some(Lean::Log(lean)) if kind == Script::LeanLogAlone => {
            let (_, args) = distinct_batch_call([(keys[0].as_str(), lean.arguments())]);
            assert_eq!(args[0], 0, "a lone hit goes as distinct keys of one set");
            let mut args: Vec<String> = text(args);
            args.push(format!("t{index}"));
            args
        }
        Some(Lean::Log(lean)) => {
            let neighbour = LeanLog::of(&neighbour_hit).unwrap().expect("a lean hit");
            let mut args: Vec<String> = text(batch_arguments(
                [neighbour, lean, neighbour].map(|hit| hit.arguments()),
            ));
            args.push(format!("t{index}"));
            args
        }
        Some(Lean::Rule(lean)) => {
            let ids: Vec<&str> = keys
                .iter()
                .map(String::as_str)
                .chain(penalty.is_some().then_some(penalty_key.as_str()))
                .collect();
            text(rule_batch_call([(ids, lean.arguments())], index as u64).1)
        }
    };
    args.push(case.now.to_string());

    // The script and the read-back in one transaction: time is frozen inside it, so a key
    // the script gives a 1 ms expiry is still there to be read.
    let before_ms = server_ms(con);
    let mut run = redis::pipe();
    run.atomic().cmd("EVAL").arg(script);
    let mut all_keys: Vec<&str> = keys
        .iter()
        .map(String::as_str)
        .chain(penalty.is_some().then_some(penalty_key.as_str()))
        .collect();
    let alone = matches!(
        kind,
        Script::LeanAlone
            | Script::LeanFixedAlone
            | Script::LeanSlidingAlone
            | Script::LeanLogAlone
    );
    if !alone
        && matches!(
            lean,
            Some(Lean::Gcra(_) | Lean::Fixed(_) | Lean::Sliding(_) | Lean::Log(_))
        )
    {
        all_keys = vec![&before_key, all_keys[0], &after_key];
    }
    run.arg(all_keys.len()).arg(&all_keys).arg(&args);
    for (key, quota) in keys.iter().zip(&quotas) {
        if quota.algorithm() == Algorithm::SlidingLog {
            run.cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES");
        } else {
            run.cmd("GET").arg(key);
        }
        run.cmd("PEXPIRETIME").arg(key);
    }
    if hit.penalty_identifier.is_some() {
        run.cmd("GET").arg(&penalty_key);
        run.cmd("PEXPIRETIME").arg(&penalty_key);
    }
    let replies: Vec<Value> = match run.query(con) {
        Ok(replies) => replies,
        Err(e) => return Some(vec![format!("the script failed: {e}")]),
    };
    let after_ms = server_ms(con);

    let mut problems = Vec::new();
    let mut replies = replies.into_iter();
    let mut reply = ints(&replies.next().unwrap());
    match lean {
        None => {}
        Some(Lean::Rule(lean)) => {
            reply = match lean.decision(reply[0], &reply[1..]) {
                Ok(decision) => decision_reply(&decision),
                Err(e) => return Some(vec![format!("decision from the debts: {e}")]),
            };
        }
        Some(Lean::Gcra(lean)) if alone => {
            if reply.len() != 1 {
                return Some(vec![format!("reply {reply:?}: expected one debt")]);
            }
            reply = match lean.decision(reply[0]) {
                Ok(decision) => decision_reply(&decision),
                Err(e) => return Some(vec![format!("decision from the debt: {e}")]),
            };
        }
        Some(Lean::Gcra(lean)) => {
            // One debt per hit of the batch; the neighbours' keys were fresh.
            if reply.len() != 3 || reply[0] != 0 || reply[2] != 0 {
                return Some(vec![format!(
                    "batch reply {reply:?}: expected 3 debts, 0 around"
                )]);
            }
            reply = match lean.decision(reply[1]) {
                Ok(decision) => decision_reply(&decision),
                Err(e) => return Some(vec![format!("decision from the debt: {e}")]),
            };
        }
        Some(Lean::Fixed(lean)) if alone => {
            if reply.len() != 2 {
                return Some(vec![format!("reply {reply:?}: expected two integers")]);
            }
            reply = match lean.decision(reply[0], reply[1]) {
                Ok(decision) => decision_reply(&decision),
                Err(e) => return Some(vec![format!("decision from the reply: {e}")]),
            };
        }
        Some(Lean::Fixed(lean)) => {
            // Two integers per hit of the batch; the neighbours' keys were fresh.
            if reply.len() != 6 || reply[0] != 0 || reply[4] != 0 {
                return Some(vec![format!(
                    "batch reply {reply:?}: expected 3 pairs, nothing used around"
                )]);
            }
            reply = match lean.decision(reply[2], reply[3]) {
                Ok(decision) => decision_reply(&decision),
                Err(e) => return Some(vec![format!("decision from the reply: {e}")]),
            };
        }
        Some(lean @ (Lean::Sliding(_) | Lean::Log(_))) => {
            // Alone, one verdict. In a batch, a verdict per hit; the neighbours' keys were
            // fresh, so each was admitted with 4 of its 5 left.
            let verdict = if alone {
                if reply.len() != 3 {
                    return Some(vec![format!("reply {reply:?}: expected one verdict")]);
                }
                [reply[0], reply[1], reply[2]]
            } else {
                if reply.len() != 9
                    || reply[0] != 4
                    || reply[2] != -1
                    || reply[6..] != [4, reply[7], -1]
                {
                    return Some(vec![format!(
                        "batch reply {reply:?}: expected 3 verdicts, admitted around"
                    )]);
                }
                [reply[3], reply[4], reply[5]]
            };
            let decision = match lean {
                Lean::Sliding(lean) => lean.decision(verdict),
                Lean::Log(lean) => lean.decision(verdict),
                _ => unreachable!("matched above"),
            };
            reply = match decision {
                Ok(decision) => decision_reply(&decision),
                Err(e) => return Some(vec![format!("decision from the reply: {e}")]),
            };
        }
    }
    let expected = expected_reply(&vector["expected"]["decision"]);
    if reply != expected {
        problems.push(format!(
            "decision [allowed, limit, remaining, reset_after, retry_after, denial, leaf]\n    \
             core: {expected:?}\n    lua:  {reply:?}"
        ));
    }

    let expiry_window = |expires_at: u64| {
        // What `expire` in algorithms.lua sets: whole milliseconds, rounded up, at least 1.
        let ms = (expires_at.saturating_sub(case.now)).div_ceil(1_000).max(1) as i64;
        (before_ms + ms, after_ms + ms)
    };
    for (leaf, quota) in micro.iter().enumerate() {
        let raw = replies.next().unwrap();
        let expiry = int(&replies.next().unwrap());
        let stored = match read_state(quota, &raw) {
            Ok(stored) => stored,
            Err(e) => {
                problems.push(format!("leaf {leaf}: {e}"));
                continue;
            }
        };
        let algorithm = quota.algorithm();
        let initial = &case.states[leaf];
        let wanted = state_from(algorithm, &vector["expected"]["states"][leaf]);
        let stored_state = stored.clone().unwrap_or_else(|| quota.fresh_state());
        let (got, want) = (
            canonical(quota, &stored_state, case.now),
            canonical(quota, &wanted, case.now),
        );
        if got != want {
            problems.push(format!(
                "leaf {leaf} ({algorithm}) state\n    core: {}\n    lua:  {}{}",
                state_json(&wanted),
                stored
                    .as_ref()
                    .map_or("(no key)".into(), |s| state_json(s).to_string()),
                " (compared as of now: expired states count as fresh)"
            ));
        }
        let rewritten = canonical(quota, initial, case.now) != want;
        problems.extend(check_expiry(
            &format!("leaf {leaf} ({algorithm})"),
            stored.is_some(),
            expiry,
            rewritten,
            expiry_window(quota.expires_at(&wanted)),
        ));
    }
    if let Some(penalty) = penalty_micro {
        let raw = replies.next().unwrap();
        let expiry = int(&replies.next().unwrap());
        let stored = match read_penalty(&raw) {
            Ok(stored) => stored,
            Err(e) => return Some([problems, vec![format!("penalty: {e}")]].concat()),
        };
        let wanted = penalty_record_from(&vector["expected"]["penalty_record"]);
        let fresh = |r: PenaltyState| {
            if penalty.expires_at(&r) <= case.now {
                PenaltyState::default()
            } else {
                r
            }
        };
        if fresh(stored.unwrap_or_default()) != fresh(wanted) {
            problems.push(format!(
                "penalty record\n    core: {wanted:?}\n    lua:  {}",
                stored.map_or("(no key)".into(), |s| format!("{s:?}"))
            ));
        }
        let initial = case.penalty_record.unwrap_or_default();
        problems.extend(check_expiry(
            "penalty",
            stored.is_some(),
            expiry,
            fresh(initial) != fresh(wanted),
            expiry_window(penalty.expires_at(&wanted)),
        ));
    }
    Some(problems)
}
