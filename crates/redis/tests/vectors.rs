//! The shared test vectors (crates/core/tests/vectors.json, outcomes from the Rust core) run
//! through the Lua translation on a real Redis: each vector's states are written into fresh
//! keys in the layout algorithms.lua documents, the script decides at the vector's `now`, and
//! the reply and the keys it leaves behind must say what the core says.

use std::collections::BTreeMap;
use std::time::Duration;

use redis::Value;
use serde_json::{Value as Json, json};
use sluice_core::algorithm::sliding_log::Log;
use sluice_core::algorithm::sliding_window::Counters;
use sluice_core::{
    Algorithm, Evaluation, Leaf, Penalty, PenaltyState, Quota, Rate, Recording, Shape, Span, State,
    Unit,
};
use sluice_limiter::{Hit, Identifier};
use sluice_redis::script::{ALGORITHMS_LUA, TICK_NS, arguments};
use sluice_redis::testing::RedisServer;

const VECTORS: &str = include_str!("../../core/tests/vectors.json");

/// The test entry point: the production one (decide.lua) reads Redis's clock and never takes
/// the time from its caller; this one takes `now` as the last argument.
const TEST_ENTRY: &str = "\nreturn run(tonumber(ARGV[#ARGV]))";

/// Expiry of the keys this test writes (2100-01-01, in ms): a key still carrying it was not
/// rewritten by the script.
const UNTOUCHED_EXPIRY_MS: i64 = 4_102_444_800_000;

#[test]
fn lua_reproduces_every_vector() {
    let file: Json = serde_json::from_str(VECTORS).expect("vectors.json is JSON");
    assert_eq!(
        file["tick_ns"],
        json!(TICK_NS),
        "vectors count in Redis ticks"
    );
    let vectors = file["vectors"].as_array().unwrap();
    assert!(vectors.len() >= 300, "only {} vectors", vectors.len());

    let server = RedisServer::start().expect("redis-server");
    let client = redis::Client::open(server.url()).unwrap();
    let mut con = client.get_connection().expect("connect");
    let script = format!("{ALGORITHMS_LUA}{TEST_ENTRY}");

    let mut failures = Vec::new();
    for (index, vector) in vectors.iter().enumerate() {
        let problems = check(&mut con, &script, index, vector);
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

/// Runs one vector; returns what differs from the core's outcome.
fn check(con: &mut redis::Connection, script: &str, index: usize, vector: &Json) -> Vec<String> {
    let case = Case::from_json(vector);
    let keys: Vec<String> = (0..case.leaves.len())
        .map(|leaf| format!("v{index}:leaf{leaf}"))
        .collect();
    let penalty_key = format!("v{index}:penalty");
    let micro: Vec<Quota> = case
        .quotas
        .iter()
        .map(|q| q.with_tick(TICK_NS).unwrap())
        .collect();
    let penalty_micro = case.penalty.map(|p| p.with_tick(TICK_NS));

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
            quotas: &case.quotas,
            cost: case.cost,
            recording: case.recording,
            penalty: case.penalty.as_ref(),
        },
        penalty_identifier: case.penalty.is_some().then_some(&penalty_id),
    };
    let mut args = arguments(&hit, index as u64).expect("arguments");
    args.push(case.now.to_string());

    // The script and the read-back in one transaction: time is frozen inside it, so a key
    // the script gives a 1 ms expiry is still there to be read.
    let before_ms = server_ms(con);
    let mut run = redis::pipe();
    run.atomic().cmd("EVAL").arg(script);
    let all_keys: Vec<&str> = keys
        .iter()
        .map(String::as_str)
        .chain(case.penalty.is_some().then_some(penalty_key.as_str()))
        .collect();
    run.arg(all_keys.len()).arg(&all_keys).arg(&args);
    for (key, quota) in keys.iter().zip(&case.quotas) {
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
        Err(e) => return vec![format!("the script failed: {e}")],
    };
    let after_ms = server_ms(con);

    let mut problems = Vec::new();
    let mut replies = replies.into_iter();
    let reply = ints(&replies.next().unwrap());
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
            Err(e) => return [problems, vec![format!("penalty: {e}")]].concat(),
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
    problems
}

/// Every key has an expiry; a key the script rewrote expires when its state does.
fn check_expiry(
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

/// Redis's clock in milliseconds.
fn server_ms(con: &mut redis::Connection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(con).expect("TIME");
    secs * 1_000 + micros / 1_000
}

/// An expired state compares as fresh: Lua may drop what the core keeps until it is
/// overwritten. Logs compare as (time, total cost) pairs.
fn canonical(quota: &Quota, state: &State, now: u64) -> Json {
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

// Redis's layout (see the header of algorithms.lua) --------------------------------------------

fn write_state(pipe: &mut redis::Pipeline, key: &str, state: &State) {
    match state {
        State::Gcra { tat } => {
            pipe.cmd("SET").arg(key).arg(tat.to_string());
        }
        State::FixedWindow { window, count } => {
            pipe.cmd("SET").arg(key).arg(format!("{window}:{count}"));
        }
        State::SlidingWindow(counters) => {
            let (newest, by_slot) = ring(counters);
            let mut items = vec![newest];
            items.extend(by_slot);
            pipe.cmd("SET").arg(key).arg(msgpack::pack(&items));
        }
        State::SlidingLog(log) => {
            let mut members = Vec::new();
            for (t, cost) in log.hits() {
                for n in 1..=cost {
                    members.push((t, format!("{t}:init:{key}:{n}")));
                }
            }
            if members.is_empty() {
                return;
            }
            pipe.cmd("ZADD").arg(key).arg(members);
        }
        other => panic!("no Redis layout for {other:?}"),
    }
    pipe.cmd("PEXPIREAT").arg(key).arg(UNTOUCHED_EXPIRY_MS);
}

/// The newest sub-window number and the counts by sub-window number mod G.
fn ring(counters: &Counters) -> (u64, Vec<u64>) {
    let g = u64::from(counters.len());
    let newest = counters.newest();
    let mut slots = vec![0; g as usize];
    for back in 0..g.min(newest + 1) {
        let number = newest - back;
        slots[(number % g) as usize] = counters.count(number);
    }
    (newest, slots)
}

/// A leaf's key as the core's state; `None` when there is no key.
fn read_state(quota: &Quota, raw: &Value) -> Result<Option<State>, String> {
    if matches!(raw, Value::Nil) {
        return Ok(None);
    }
    let text = || match raw {
        Value::BulkString(bytes) => Ok(bytes.clone()),
        other => Err(format!("unexpected reply {other:?}")),
    };
    let number = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| format!("`{s}` is not an integer"))
    };
    let state = match quota.algorithm() {
        Algorithm::Gcra => State::Gcra {
            tat: number(&String::from_utf8_lossy(&text()?))?,
        },
        Algorithm::FixedWindow => {
            let text = String::from_utf8_lossy(&text()?).into_owned();
            let (window, count) = text
                .split_once(':')
                .ok_or(format!("`{text}` is not <window>:<count>"))?;
            State::FixedWindow {
                window: number(window)?,
                count: number(count)?,
            }
        }
        Algorithm::SlidingWindow => {
            let items = msgpack::unpack(&text()?)?;
            let g = u64::from(quota.windows());
            if items.len() as u64 != g + 1 {
                return Err(format!("{} items, expected {}", items.len(), g + 1));
            }
            let newest = items[0];
            let oldest_first: Vec<u64> = (0..g)
                .map(|offset| {
                    let number = newest + 1 + offset; // + G: sub-window newest - G + 1 + offset
                    if number < g {
                        0
                    } else {
                        items[1 + (number % g) as usize]
                    }
                })
                .collect();
            State::SlidingWindow(Counters::from_parts(newest, &oldest_first))
        }
        Algorithm::SlidingLog => {
            let Value::Array(flat) = raw else {
                return Err(format!("unexpected reply {raw:?}"));
            };
            if flat.is_empty() {
                return Ok(None);
            }
            let mut merged: BTreeMap<u64, u64> = BTreeMap::new();
            for pair in flat.chunks(2) {
                let score = match &pair[1] {
                    Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    Value::Double(d) => d.to_string(),
                    other => return Err(format!("unexpected score {other:?}")),
                };
                let t: f64 = score.parse().map_err(|_| format!("bad score {score}"))?;
                if t.fract() != 0.0 || t < 0.0 {
                    return Err(format!("score {score} is not a whole tick"));
                }
                *merged.entry(t as u64).or_default() += 1;
            }
            State::SlidingLog(Log::from_hits(merged))
        }
        other => return Err(format!("no Redis layout for {other}")),
    };
    Ok(Some(state))
}

fn read_penalty(raw: &Value) -> Result<Option<PenaltyState>, String> {
    let text = match raw {
        Value::Nil => return Ok(None),
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        other => return Err(format!("unexpected reply {other:?}")),
    };
    let parts: Vec<&str> = text.split(':').collect();
    let bad = || format!("`{text}` is not <strikes>:<until>:<last_strike>");
    let [strikes, until, last] = parts[..] else {
        return Err(bad());
    };
    Ok(Some(PenaltyState {
        strikes: strikes.parse().map_err(|_| bad())?,
        until: until.parse().map_err(|_| bad())?,
        last_strike: last.parse().map_err(|_| bad())?,
    }))
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        other => panic!("expected an integer reply, got {other:?}"),
    }
}

fn ints(v: &Value) -> Vec<i64> {
    match v {
        Value::Array(items) => items.iter().map(int).collect(),
        other => panic!("expected an array reply, got {other:?}"),
    }
}

/// The seven integers algorithms.lua replies with.
fn expected_reply(d: &Json) -> Vec<i64> {
    let i = |v: &Json| v.as_i64().unwrap();
    vec![
        i64::from(d["allowed"].as_bool().unwrap()),
        i(&d["limit"]),
        i(&d["remaining"]),
        i(&d["reset_after_ticks"]),
        i(&d["retry_after_ticks"]),
        i(&d["denial"]),
        i(&d["leaf"]),
    ]
}

/// The few MessagePack encodings a sliding-window key uses: arrays of non-negative integers.
mod msgpack {
    pub fn pack(items: &[u64]) -> Vec<u8> {
        let mut out = Vec::new();
        match items.len() {
            n @ 0..=15 => out.push(0x90 | n as u8),
            n @ 16..=0xffff => {
                out.push(0xdc);
                out.extend((n as u16).to_be_bytes());
            }
            n => {
                out.push(0xdd);
                out.extend((n as u32).to_be_bytes());
            }
        }
        for &n in items {
            match n {
                0..=0x7f => out.push(n as u8),
                0x80..=0xff => out.extend([0xcc, n as u8]),
                0x100..=0xffff => {
                    out.push(0xcd);
                    out.extend((n as u16).to_be_bytes());
                }
                0x1_0000..=0xffff_ffff => {
                    out.push(0xce);
                    out.extend((n as u32).to_be_bytes());
                }
                _ => {
                    out.push(0xcf);
                    out.extend(n.to_be_bytes());
                }
            }
        }
        out
    }

    /// Reads an array of non-negative integers (doubles must hold whole numbers).
    pub fn unpack(bytes: &[u8]) -> Result<Vec<u64>, String> {
        let mut at = 0;
        let mut take = |n: usize| -> Result<u64, String> {
            let chunk = bytes.get(at..at + n).ok_or("truncated msgpack")?;
            at += n;
            Ok(chunk.iter().fold(0u64, |acc, &b| acc << 8 | u64::from(b)))
        };
        let len = match take(1)? as u8 {
            b @ 0x90..=0x9f => u64::from(b & 0x0f),
            0xdc => take(2)?,
            0xdd => take(4)?,
            b => return Err(format!("expected an array, found byte {b:#x}")),
        };
        (0..len)
            .map(|_| match take(1)? as u8 {
                b @ 0..=0x7f => Ok(u64::from(b)),
                0xcc => take(1),
                0xcd => take(2),
                0xce => take(4),
                0xcf => take(8),
                0xcb => {
                    let d = f64::from_bits(take(8)?);
                    if d.fract() == 0.0 && d >= 0.0 {
                        Ok(d as u64)
                    } else {
                        Err(format!("count {d} is not a whole non-negative number"))
                    }
                }
                b => Err(format!("unexpected msgpack byte {b:#x} in a counter")),
            })
            .collect()
    }
}

// The vectors, read (as in crates/core/tests/vectors.rs) ----------------------------------------

struct Case {
    shape: Shape,
    /// Nanosecond quotas, as the limiter hands them to the store.
    quotas: Vec<Quota>,
    leaves: Vec<Algorithm>,
    /// States in microsecond ticks.
    states: Vec<State>,
    now: u64,
    cost: u64,
    recording: Recording,
    penalty: Option<Penalty>,
    penalty_record: Option<PenaltyState>,
}

impl Case {
    fn from_json(v: &Json) -> Case {
        let leaves: Vec<&Json> = v["leaves"].as_array().unwrap().iter().collect();
        let algorithms: Vec<Algorithm> = leaves
            .iter()
            .map(|l| Algorithm::from_name(l["algorithm"].as_str().unwrap()).unwrap())
            .collect();
        let quotas = leaves
            .iter()
            .zip(&algorithms)
            .map(|(l, &algorithm)| {
                let span = Span::new(u(&l["span_seconds"]), Unit::Second).unwrap();
                let mut leaf = Leaf::new(Rate::new(u(&l["count"]), span).unwrap());
                leaf.options.algorithm = Some(algorithm);
                leaf.options.burst = l.get("burst").map(u);
                leaf.options.windows = l.get("windows").map(|w| u(w) as u32);
                Quota::from_leaf(&leaf, Algorithm::Gcra).unwrap()
            })
            .collect();
        let states = v["states"]
            .as_array()
            .unwrap()
            .iter()
            .zip(&algorithms)
            .map(|(s, &algorithm)| state_from(algorithm, s))
            .collect();
        let penalty = (!v["penalty"].is_null()).then(|| {
            let p = &v["penalty"];
            Penalty::new(
                Duration::from_secs(u(&p["base_seconds"])),
                u(&p["factor"]) as u32,
                Duration::from_secs(u(&p["max_seconds"])),
                Duration::from_secs(u(&p["forget_seconds"])),
            )
            .unwrap()
        });
        Case {
            shape: shape_from(&v["shape"]),
            quotas,
            leaves: algorithms,
            states,
            now: u(&v["now"]),
            cost: u(&v["cost"]),
            recording: match v["recording"].as_str().unwrap() {
                "admitted" => Recording::Admitted,
                "always" => Recording::Always,
                "never" => Recording::Never,
                other => panic!("unknown recording {other}"),
            },
            penalty,
            penalty_record: (!v["penalty_record"].is_null())
                .then(|| penalty_record_from(&v["penalty_record"])),
        }
    }
}

fn u(v: &Json) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("expected an unsigned integer, got {v}"))
}

fn shape_from(v: &Json) -> Shape {
    if let Some(i) = v.as_u64() {
        return Shape::Leaf(i as usize);
    }
    let children = |c: &Json| c.as_array().unwrap().iter().map(shape_from).collect();
    match (v.get("or"), v.get("and")) {
        (Some(c), None) => Shape::Or(children(c)),
        (None, Some(c)) => Shape::And(children(c)),
        _ => panic!("bad shape {v}"),
    }
}

fn state_from(algorithm: Algorithm, v: &Json) -> State {
    match algorithm {
        Algorithm::Gcra => State::Gcra { tat: u(&v["tat"]) },
        Algorithm::FixedWindow => State::FixedWindow {
            window: u(&v["window"]),
            count: u(&v["count"]),
        },
        Algorithm::SlidingWindow => {
            let counts: Vec<u64> = v["counts_oldest_first"]
                .as_array()
                .unwrap()
                .iter()
                .map(u)
                .collect();
            State::SlidingWindow(Counters::from_parts(u(&v["newest"]), &counts))
        }
        Algorithm::SlidingLog => State::SlidingLog(Log::from_hits(
            v["hits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|hit| (u(&hit[0]), u(&hit[1]))),
        )),
        other => panic!("no vector form for {other}"),
    }
}

fn state_json(state: &State) -> Json {
    match state {
        State::Gcra { tat } => json!({"tat": tat}),
        State::FixedWindow { window, count } => json!({"window": window, "count": count}),
        State::SlidingWindow(counters) => {
            let g = u64::from(counters.len());
            let newest = counters.newest();
            let counts: Vec<u64> = (0..g)
                .map(|offset| {
                    (newest + 1 + offset)
                        .checked_sub(g)
                        .map_or(0, |n| counters.count(n))
                })
                .collect();
            json!({"newest": newest, "counts_oldest_first": counts})
        }
        State::SlidingLog(log) => {
            json!({"hits": log.hits().map(|(t, c)| json!([t, c])).collect::<Vec<_>>()})
        }
        other => panic!("no vector form for {other:?}"),
    }
}

fn penalty_record_from(v: &Json) -> PenaltyState {
    PenaltyState {
        strikes: u(&v["strikes"]) as u32,
        until: u(&v["until"]),
        last_strike: u(&v["last_strike"]),
    }
}

fn without_expected(vector: &Json) -> Json {
    let mut v = vector.clone();
    v.as_object_mut().unwrap().remove("expected");
    v
}
