//! The lean sliding-log batch script against the full decision script, hit by hit: random
//! batches of hits on a few keys (a key often named several times in one batch, costs
//! above what is left or above the limit, hits counted when denied or never counted, one key
//! shared by two quotas of different windows, a hot key's batch sent as the key once) must
//! answer as the full script deciding them one after the other at the same `now`, and leave
//! each key holding the same log (its members' times) with the same expiry. Batches of many
//! users' hits (one parameter set, no key twice) take the lean script's own loop for them,
//! and are checked the same way.
//!
//! The full script is the reference here, not the core: the shared vectors check both
//! scripts against the core, and where Redis's clock steps back (after a failover; one batch
//! in ten here) the Lua log orders its members by time where the core keeps them in the
//! order they came, and the lean script must keep the full script's behaviour.

#[path = "lean/run.rs"]
mod lean;

use redis::Value;
use sluice_core::{Algorithm, Evaluation, Leaf, Quota, Rate, Recording, Shape, Span, Unit};
use sluice_limiter::{Hit, Identifier};
use sluice_redis::script::decision as full_decision;
use sluice_redis::script::{
    ALGORITHMS_LUA, LOG_BATCH_LUA, LeanLog, arguments, distinct_batch_call,
};
use sluice_testkit::RedisServer;
use sluice_testkit::vectors::Rng;

/// The full script's test entry: `now` from the last argument.
const FULL_ENTRY: &str = "\nreturn run(tonumber(ARGV[#ARGV]))";

/// A sliding-log quota of `count` per `seconds`, as the limiter hands it to the store.
fn quota(count: u64, seconds: u64) -> Quota {
    let rate = Rate::new(count, Span::new(seconds, Unit::Second).unwrap()).unwrap();
    Quota::from_leaf(&Leaf::new(rate), Algorithm::SlidingLog).unwrap()
}

/// Runs `f` on the hit of `quota`, `cost` and `recording` as the store sees it.
fn with_hit<T>(quota: Quota, cost: u64, recording: Recording, f: impl FnOnce(&Hit) -> T) -> T {
    let id = [Identifier::new("k")];
    let quotas = [quota];
    let hit = Hit {
        identifiers: &id,
        evaluation: Evaluation {
            shape: &Shape::Leaf(0),
            quotas: &quotas,
            cost,
            recording,
            penalty: None,
        },
        penalty_identifier: None,
    };
    f(&hit)
}

fn lean_of(quota: Quota, cost: u64, recording: Recording) -> LeanLog {
    with_hit(quota, cost, recording, |hit| {
        LeanLog::of(hit).unwrap().expect("a lean hit")
    })
}

/// A log's member times, oldest first, and its expiry (PEXPIRETIME), from a `ZRANGE ...
/// WITHSCORES` reply and a `PEXPIRETIME` reply.
fn log_of(members: &Value, expiry: &Value) -> (Vec<String>, i64) {
    let Value::Array(flat) = members else {
        panic!("not a ZRANGE reply: {members:?}");
    };
    let times = flat
        .chunks(2)
        .map(|pair| match &pair[1] {
            Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
            Value::Double(d) => d.to_string(),
            other => panic!("a score {other:?}"),
        })
        .collect();
    let Value::Int(expiry) = expiry else {
        panic!("not a PEXPIRETIME reply: {expiry:?}");
    };
    (times, *expiry)
}

/// Redis's clock in milliseconds.
fn server_ms(con: &mut redis::Connection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(con).expect("TIME");
    secs * 1_000 + micros / 1_000
}

#[test]
fn batches_decide_and_store_as_the_full_script() {
    let server = RedisServer::start().expect("redis-server");
    let client = redis::Client::open(server.url()).unwrap();
    let mut con = client.get_connection().expect("connect");
    let lean_source = lean::source(LOG_BATCH_LUA);
    let full_source = format!("{ALGORITHMS_LUA}{FULL_ENTRY}");

    // The last two share key k3 with windows of 1 s and 2 s. The 2-a-second ones often see
    // a cost above their limit.
    // Hits on their own pick among those five; a batch of many users picks distinct keys
    // among the eight after them, which share one quota (2 a second).
    let mut quotas = vec![
        quota(5, 1),
        quota(3, 60),
        quota(40, 10),
        quota(2, 1),
        quota(3, 2),
    ];
    quotas.extend([quota(2, 1); 8]);
    let key_of = [0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10, 11];
    let names = [
        "k0", "k1", "k2", "k3", "u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7",
    ];
    let recordings = [Recording::Admitted, Recording::Always, Recording::Never];
    // Seeded, so every run replays the same hits.
    let mut rng = Rng(0x109b);
    let (mut now, mut hits, mut denied, mut retries) = (1_000_000u64, 0u64, 0u64, 0u64);
    let (mut never, mut switched, mut back, mut one_key_calls) = (0u64, 0u64, 0u64, 0u64);
    let mut last_window = [usize::MAX; 12];
    let mut distinct_calls = 0u64;

    for batch in 0..600u64 {
        // Time moves by up to 0.4 s between batches; one batch in ten steps back up to
        // 0.6 s, as Redis's clock can after a failover.
        if batch % 10 == 7 {
            now -= rng.next_u64() % 600_000;
            back += 1;
        } else {
            now += rng.next_u64() % 400_000;
        }
        let size = 1 + (rng.next_u64() % 12) as usize;
        // One batch in four is a hot key's: every hit the same key, cost and recording. One
        // in four is many users': every hit the first's cost and recording, each on a key of
        // its own.
        let (hot, users) = (batch % 4 == 0, batch % 4 == 1);
        let mut free: Vec<usize> = (5..quotas.len()).collect();
        let mut sent: Vec<(usize, u64, Recording)> = Vec::new();
        for _ in 0..if users { size.min(free.len()) } else { size } {
            let mut which = (rng.next_u64() % 5) as usize;
            if users {
                which = free.swap_remove((rng.next_u64() % free.len() as u64) as usize);
            }
            let cost = [1, 1, 1, 2, 0, 4][(rng.next_u64() % 6) as usize];
            let recording = recordings[[0, 0, 0, 0, 1, 2][(rng.next_u64() % 6) as usize]];
            sent.push(match sent.first() {
                Some(&first) if hot => first,
                Some(&(_, cost, recording)) if users => (which, cost, recording),
                _ => (which, cost, recording),
            });
        }
        let lean_keys: Vec<String> = names.iter().map(|k| format!("lean:{k}")).collect();
        let full_keys: Vec<String> = names.iter().map(|k| format!("full:{k}")).collect();
        // As the store sends them (a hot key's batch as the key once and a count of hits,
        // many users' as distinct keys of one set), then the call's token.
        let (call_keys, mut args) =
            distinct_batch_call(sent.iter().map(|&(which, cost, recording)| {
                let arguments = lean_of(quotas[which], cost, recording).arguments();
                (lean_keys[key_of[which]].as_str(), arguments)
            }));
        one_key_calls += u64::from(call_keys.len() == 1 && sent.len() > 1);
        distinct_calls += u64::from(args[0] == 0);
        if users {
            assert_eq!(
                args[0], 0,
                "batch {batch}: many users' hits go as distinct keys"
            );
        }
        args.push(batch);

        // The lean call, the full script's calls and the read-back in one transaction. Each
        // script's expiries count from its own start on Redis's clock, so the two sides'
        // may differ by the transaction's length, measured around it.
        let before_ms = server_ms(&mut con);
        let mut pipe = redis::pipe();
        pipe.atomic();
        pipe.cmd("EVAL")
            .arg(&lean_source)
            .arg(call_keys.len())
            .arg(&call_keys)
            .arg(args.iter().chain([&now]).collect::<Vec<_>>());
        for (i, &(which, cost, recording)) in sent.iter().enumerate() {
            let mut full_args = with_hit(quotas[which], cost, recording, |hit| {
                arguments(hit, batch * 100 + i as u64).unwrap()
            });
            full_args.push(now.to_string());
            pipe.cmd("EVAL")
                .arg(&full_source)
                .arg(1)
                .arg(&full_keys[key_of[which]])
                .arg(full_args);
        }
        for key in lean_keys.iter().chain(&full_keys) {
            pipe.cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES");
            pipe.cmd("PEXPIRETIME").arg(key);
            // The test's time is not Redis's: a key kept for the next batch must not expire
            // by Redis's clock meanwhile (its expiry is compared below).
            pipe.cmd("PERSIST").arg(key).ignore();
        }
        let replies: Vec<Value> = pipe.query(&mut con).expect("the batch runs");
        let slack = server_ms(&mut con) - before_ms;
        let mut replies = replies.into_iter();
        let verdicts: Vec<i64> = redis::from_redis_value(replies.next().unwrap()).unwrap();
        assert_eq!(verdicts.len(), 3 * sent.len());

        for (i, &(which, cost, recording)) in sent.iter().enumerate() {
            let full: Vec<i64> = redis::from_redis_value(replies.next().unwrap()).unwrap();
            let want = full_decision(&full).unwrap();
            let verdict = [verdicts[3 * i], verdicts[3 * i + 1], verdicts[3 * i + 2]];
            let got = lean_of(quotas[which], cost, recording)
                .decision(verdict)
                .unwrap();
            assert_eq!(
                got, want,
                "batch {batch}, hit {i} ({which}, cost {cost}, {recording:?}): the verdict \
                 {verdict:?} against the full script's {full:?}"
            );
            hits += 1;
            denied += u64::from(!want.allowed());
            retries += u64::from(verdict[2] > 0);
            never += u64::from(cost > quotas[which].limit() && recording == Recording::Always);
            let key = key_of[which];
            switched += u64::from(last_window[key] != which && last_window[key] != usize::MAX);
            last_window[key] = which;
        }
        let logs: Vec<(Vec<String>, i64)> = (0..2 * names.len())
            .map(|_| {
                let members = replies.next().unwrap();
                log_of(&members, &replies.next().unwrap())
            })
            .collect();
        for (k, name) in names.iter().enumerate() {
            let ((lean_log, lean_expiry), (full_log, full_expiry)) =
                (&logs[k], &logs[names.len() + k]);
            assert_eq!(
                lean_log, full_log,
                "batch {batch}: {name}'s log, lean then full"
            );
            assert!(
                (*lean_expiry < 0 && lean_expiry == full_expiry)
                    || (*lean_expiry > 0 && (lean_expiry - full_expiry).abs() <= slack),
                "batch {batch}: {name} expires at {lean_expiry} (lean) and {full_expiry} \
                 (full), {slack} ms apart at most"
            );
        }
    }
    assert!(denied * 5 > hits, "only {denied} of {hits} hits denied");
    assert!(retries > 100, "only {retries} denials with a time to wait");
    assert!(switched > 50, "only {switched} hits after another quota's");
    assert!(never > 20, "only {never} counted hits above their limit");
    assert!(back >= 40, "time stepped back only {back} times");
    assert!(one_key_calls > 50, "only {one_key_calls} calls of one key");
    assert!(
        distinct_calls > 150,
        "only {distinct_calls} calls of distinct keys of one set"
    );
}

/// A reply no verdict of the quota can give (a wrong script, a wrong server) is an error,
/// never a decision, and never an admission.
#[test]
fn a_reply_no_verdict_can_give_is_an_error() {
    let hit = lean_of(quota(5, 1), 1, Recording::Admitted);
    for wrong in lean::WRONG_VERDICTS {
        assert!(hit.decision(wrong).is_err(), "{wrong:?} decided");
    }
    assert!(hit.decision([4, 1_000_000, -1]).unwrap().allowed());
    assert!(!hit.decision([0, 1_000_000, -2]).unwrap().allowed());
    assert!(!hit.decision([0, 1_000_000, 1_000]).unwrap().allowed());
}
