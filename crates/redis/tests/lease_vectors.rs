//! The shared concurrency vectors (crates/core/tests/concurrency_vectors.json, outcomes of
//! the core's concurrency steps) replayed through the Lua translation on a real Redis: each
//! case's acquire, release and renew steps run on one fresh lease set at the vector's `now`,
//! and every answer, the unexpired leases left and the key's expiry must be the core's.
//! Twice: through the single-step entries (acquire.lua, release.lua, renew.lua), and through
//! the batched script (lease_batch.lua) as the store sends a rule of one leaf.

use redis::Value;
use serde_json::Value as Json;
use sluice_core::{Algorithm, Evaluation, Leaf, Quota, Recording, Shape, Span, Unit};
use sluice_limiter::{Hit, Identifier};
use sluice_redis::script::{
    LEASE_BATCH_LUA, LEASES_LUA, LeaseAnswer, LeaseStep, TICK_NS, arguments, decision,
    lease_batch_answers, lease_batch_call, lease_set,
};
use sluice_testkit::RedisServer;

const FILE_TEXT: &str = include_str!("../../core/tests/concurrency_vectors.json");

/// Test entries: as the production ones (acquire.lua, release.lua, renew.lua), with `now`
/// the last argument instead of Redis's clock.
const ACQUIRE: &str = "\nreturn acquire(tonumber(ARGV[#ARGV]), ARGV[#ARGV - 1])";
const RELEASE: &str = "\nreturn release(tonumber(ARGV[#ARGV]))";
const RENEW: &str = "\nreturn renew(tonumber(ARGV[#ARGV]))";

fn quota(limit: u64, lease_us: u64) -> Quota {
    assert_eq!(lease_us % 1_000_000, 0, "leases are whole seconds");
    let lease = Span::new(lease_us / 1_000_000, Unit::Second).unwrap();
    Quota::from_leaf(
        &Leaf::concurrent(limit, Some(lease)).unwrap(),
        Algorithm::Gcra,
    )
    .unwrap()
}

fn int(v: &Json) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("not an integer: {v}"))
}

/// Runs `entry` on `key` with `args` then `now`.
fn call(
    con: &mut redis::Connection,
    lib: &str,
    entry: &str,
    key: &str,
    args: &[impl redis::ToRedisArgs],
    now: i64,
) -> Value {
    redis::cmd("EVAL")
        .arg(format!("{lib}{entry}"))
        .arg(1)
        .arg(key)
        .arg(args)
        .arg(now)
        .query(con)
        .unwrap_or_else(|e| panic!("script failed: {e}"))
}

/// The batched script's test entry: `now` is the last argument.
fn batch_entry() -> String {
    format!("local now = tonumber(ARGV[#ARGV])\n{LEASE_BATCH_LUA}")
}

/// Runs `step` alone through the batched script on `key` at `now`: its answer.
fn call_batched(
    con: &mut redis::Connection,
    key: &str,
    step: LeaseStep,
    id: i64,
    now: i64,
) -> LeaseAnswer {
    let (_, args) = lease_batch_call([(key, step, id as u64)]).unwrap();
    let reply = ints(&call(con, &batch_entry(), "", key, &args, now));
    let mut answers = lease_batch_answers(&[step], &reply).unwrap_or_else(|e| panic!("{e}"));
    answers.pop().expect("one answer")
}

fn ints(value: &Value) -> Vec<i64> {
    match value {
        Value::Array(items) => items.iter().flat_map(ints).collect(),
        Value::Int(n) => vec![*n],
        other => panic!("not integers: {other:?}"),
    }
}

/// One step: what differs from the core's outcome.
fn check_step(
    con: &mut redis::Connection,
    lib: &str,
    key: &str,
    quota: &Quota,
    step: &Json,
    batched: bool,
) -> Vec<String> {
    let (op, id, now) = (
        step["op"].as_str().unwrap(),
        int(&step["id"]),
        int(&step["now"]),
    );
    let mut problems = Vec::new();
    match op {
        "acquire" if batched => {
            let lease = LeaseStep::Acquire {
                limit: quota.limit(),
                lease: quota.window_ticks() / TICK_NS,
            };
            let want = decision(&acquire_reply(quota, step)).unwrap();
            match call_batched(con, key, lease, id, now) {
                LeaseAnswer::Acquired { decision, .. } if decision == want => {}
                other => problems.push(format!("acquire answered {other:?}, core {want:?}")),
            }
        }
        "release" if batched => {
            let found = call_batched(con, key, LeaseStep::Release, id, now);
            let name = match found {
                LeaseAnswer::Released(found) => found.name(),
                _ => "?",
            };
            if name != step["released"].as_str().unwrap() {
                problems.push(format!("release answered {found:?}"));
            }
        }
        "renew" if batched => {
            let lease = LeaseStep::Renew {
                lease: quota.window_ticks() / TICK_NS,
            };
            let want = match &step["expires_at"] {
                Json::Null => None,
                at => Some((int(at) - now) as u64),
            };
            let left = call_batched(con, key, lease, id, now);
            if left != LeaseAnswer::Renewed(want) {
                problems.push(format!("renew answered {left:?}, core {want:?}"));
            }
        }
        "acquire" => {
            // ARGV exactly as the production path builds it, then the lease and `now`.
            let ids = [Identifier::new(key)];
            let hit = Hit {
                identifiers: &ids,
                evaluation: Evaluation {
                    shape: &Shape::Leaf(0),
                    quotas: std::slice::from_ref(quota),
                    cost: 1,
                    recording: Recording::Admitted,
                    penalty: None,
                },
                penalty_identifier: None,
            };
            let mut args = arguments(&hit, 7).unwrap();
            args.push(id.to_string());
            let reply = ints(&call(con, lib, ACQUIRE, key, &args, now));
            let want = acquire_reply(quota, step);
            if reply != want {
                problems.push(format!("acquire answered {reply:?}, core {want:?}"));
            }
        }
        "release" => {
            let code = ints(&call(con, lib, RELEASE, key, &[id.to_string()], now));
            let name = match code.as_slice() {
                [1] => "released",
                [2] => "expired",
                [0] => "not_held",
                _ => "?",
            };
            if name != step["released"].as_str().unwrap() {
                problems.push(format!("release answered {code:?} ({name})"));
            }
        }
        _ => {
            let lease = (quota.window_ticks() / TICK_NS).to_string();
            let left = ints(&call(con, lib, RENEW, key, &[id.to_string(), lease], now));
            let want = match &step["expires_at"] {
                Json::Null => -1,
                at => int(at) - now,
            };
            if left != [want] {
                problems.push(format!("renew answered {left:?}, core {want}"));
            }
        }
    }
    // The unexpired leases left, and the key's expiry: the latest of them (never sooner).
    let mut held: Vec<(i64, i64)> = lease_set(con, key)
        .unwrap()
        .into_iter()
        .map(|(id, at)| (id as i64, at as i64))
        .filter(|(_, at)| *at > now)
        .collect();
    held.sort_unstable();
    let want: Vec<(i64, i64)> = step["held"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| (int(&pair[0]), int(&pair[1])))
        .collect();
    if held != want {
        problems.push(format!("holds {held:?}, core {want:?}"));
    }
    if let Some(last) = held.iter().map(|(_, at)| *at).max() {
        let pttl: i64 = redis::cmd("PTTL").arg(key).query(con).unwrap();
        let wanted_ms = (last - now + 999) / 1_000;
        // An admitted acquire and a successful renew set the expiry to the last lease's;
        // the other steps leave it, so it may be later (a released lease's), within one
        // lease time. Real time passes between the script and PTTL: allow a second less.
        let lease_ms = (quota.window_ticks() / TICK_NS / 1_000) as i64;
        let set = (op == "acquire" && step["allowed"] == Json::Bool(true))
            || (op == "renew" && !step["expires_at"].is_null());
        let most = if set { wanted_ms } else { lease_ms };
        if pttl > most || pttl < wanted_ms - 1_000 {
            problems.push(format!(
                "expires in {pttl} ms, the last lease in {wanted_ms} ms ({op})"
            ));
        }
    }
    problems
}

/// The single-step script's reply for the core's outcome of an acquire step.
fn acquire_reply(quota: &Quota, step: &Json) -> [i64; 7] {
    let allowed = step["allowed"].as_bool().unwrap();
    let (retry, denial) = match &step["retry_us"] {
        Json::Null => (-1, 0),
        n if int(n) == -1 => (-1, 2),
        n => (int(n), 1),
    };
    [
        i64::from(allowed),
        quota.limit() as i64,
        int(&step["remaining"]),
        int(&step["reset_us"]),
        retry,
        denial,
        0,
    ]
}

#[test]
fn lua_reproduces_every_concurrency_vector() {
    replay_vectors(|_| false);
}

#[test]
fn the_batched_lua_reproduces_every_concurrency_vector() {
    replay_vectors(|_| true);
}

/// Steps taken in turn by the batched script and the single-step entries: a set of one
/// lease the batched script kept as a string is met by the entries, which turn it into the
/// sorted set, and the other way round.
#[test]
fn the_two_scripts_taking_turns_reproduce_every_concurrency_vector() {
    replay_vectors(|n| n % 2 == 0);
    replay_vectors(|n| n % 2 == 1);
}

/// Every vector step through the single-step entries, or alone through the batched script
/// where `batched` says so of its number in its case.
fn replay_vectors(batched: fn(usize) -> bool) {
    let cases: Json = serde_json::from_str(FILE_TEXT).unwrap();
    let cases = cases.as_array().unwrap();
    assert!(cases.len() >= 20, "only {} cases", cases.len());
    let server = RedisServer::start().expect("redis-server");
    let client = redis::Client::open(server.url()).unwrap();
    let mut con = client.get_connection().expect("connect");

    let (mut steps, mut failures) = (0, Vec::new());
    let lib = LEASES_LUA;
    for (index, case) in cases.iter().enumerate() {
        let quota = quota(
            case["limit"].as_u64().unwrap(),
            case["lease_us"].as_u64().unwrap(),
        );
        let key = format!("lease-vector:{index}");
        for (n, step) in case["steps"].as_array().unwrap().iter().enumerate() {
            steps += 1;
            let problems = check_step(&mut con, lib, &key, &quota, step, batched(n));
            if !problems.is_empty() {
                failures.push(format!(
                    "case {index} step {n}:\n  {}\n  step: {step}",
                    problems.join("\n  ")
                ));
            }
        }
    }
    assert!(steps >= 400, "only {steps} steps");
    assert!(
        failures.is_empty(),
        "the Lua disagrees with the core on {} of {steps} steps:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
