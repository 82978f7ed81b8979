//! The lean fixed-window batch script against the core, hit by hit: random batches of hits
//! on a few keys (a key often named several times in one batch, some costs above what is
//! left or above the limit, some hits counted when denied or never counted) must answer
//! exactly as sluice-core's fixed window deciding them one after the other at the batch's
//! `now`, leave each key holding the core's final state, and give a written key the expiry
//! of its window's end (the script writes a key once per batch, after its last hit).
//! Batches of many users' hits (one parameter set, no key twice) take the script's own loop
//! for them, and are checked the same way.

#[path = "lean/run.rs"]
mod lean;

use std::collections::BTreeMap;

use sluice_core::{
    Algorithm, Evaluation, Leaf, Quota, Rate, Recording, Shape, Span, State, Unit, evaluate,
};
use sluice_limiter::{Hit, Identifier};
use sluice_redis::script::{FIXED_BATCH_LUA, LeanFixed, distinct_batch_call, micro};
use sluice_testkit::RedisServer;
use sluice_testkit::vectors::Rng;

/// A fixed-window quota of `count` per `seconds`, as the limiter hands it to the store.
fn quota(count: u64, seconds: u64) -> Quota {
    let rate = Rate::new(count, Span::new(seconds, Unit::Second).unwrap()).unwrap();
    Quota::from_leaf(&Leaf::new(rate), Algorithm::FixedWindow).unwrap()
}

/// The hit of `quota`, `cost` and `recording` as the store sees it: its lean form.
fn lean(quota: Quota, cost: u64, recording: Recording) -> LeanFixed {
    let id = [Identifier::new("k")];
    let hit = Hit {
        identifiers: &id,
        evaluation: Evaluation {
            shape: &Shape::Leaf(0),
            quotas: &[quota],
            cost,
            recording,
            penalty: None,
        },
        penalty_identifier: None,
    };
    LeanFixed::of(&hit).unwrap().expect("a lean hit")
}

/// The count a state holds in the window of `now` (a passed window holds none).
fn current_count(state: &State, length: u64, now: u64) -> u64 {
    match *state {
        State::FixedWindow { window, count } if window == now / length => count,
        State::FixedWindow { .. } => 0,
        _ => unreachable!("a fixed-window state"),
    }
}

#[test]
fn batches_with_repeated_keys_decide_and_store_as_the_core() {
    let server = RedisServer::start().expect("redis-server");
    let client = redis::Client::open(server.url()).unwrap();
    let mut con = client.get_connection().expect("connect");
    let source = lean::source(FIXED_BATCH_LUA);

    // The fourth, 2 a second, often sees a cost above its limit in a window of its own.
    // Hits on their own pick among the first four keys; a batch of many users picks
    // distinct keys among the last eight, which share one quota (1 in 10 s, so that hits
    // counted when denied reach the count's cap of twice the limit).
    let mut quotas = vec![quota(5, 1), quota(3, 60), quota(100, 10), quota(2, 1)];
    quotas.extend([quota(1, 10); 8]);
    // The core decides in the script's unit, microseconds.
    let micros: Vec<Quota> = quotas.iter().map(|q| micro(q).unwrap()).collect();
    let recordings = [Recording::Admitted, Recording::Always, Recording::Never];
    let keys = [
        "k0", "k1", "k2", "k3", "u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7",
    ];
    let mut core: BTreeMap<&str, State> = keys
        .iter()
        .zip(&micros)
        .map(|(key, q)| (*key, q.fresh_state()))
        .collect();
    // Seeded, so every run replays the same hits.
    let mut rng = Rng(0x5eed);
    let (mut now, mut hits, mut denied, mut repeats) = (1_000_000, 0, 0, 0);
    let (mut new_windows, mut never, mut one_key_calls) = (0u64, 0u64, 0u64);
    let mut distinct_calls = 0u64;

    for batch in 0..800 {
        // Time moves by up to 0.4 s between batches: 1 s windows end often, 10 s ones now
        // and then.
        let before = now;
        now += rng.next_u64() % 400_000;
        new_windows += u64::from(now / 1_000_000 != before / 1_000_000);
        let size = 1 + (rng.next_u64() % 12) as usize;
        let mut sent = Vec::new();
        // One batch in four is a hot key's: every hit the same key, cost and recording. One
        // in four is many users': every hit the first's cost and recording, each on a key of
        // its own.
        let (hot, users) = (batch % 4 == 0, batch % 4 == 1);
        let mut free: Vec<usize> = (4..keys.len()).collect();
        for _ in 0..if users { size.min(free.len()) } else { size } {
            let mut key = (rng.next_u64() % 4) as usize;
            if users {
                key = free.swap_remove((rng.next_u64() % free.len() as u64) as usize);
            }
            let cost = [1, 1, 1, 2, 0, 4][(rng.next_u64() % 6) as usize];
            let recording = recordings[[0, 0, 0, 0, 1, 2][(rng.next_u64() % 6) as usize]];
            sent.push(match sent.first() {
                Some(&first) if hot => first,
                Some(&(_, cost, recording)) if users => (key, cost, recording),
                _ => (key, cost, recording),
            });
        }
        // As the store sends them: a hot key's batch as the key once and a count of hits,
        // many users' as distinct keys of one set.
        let (call_keys, args) = distinct_batch_call(sent.iter().map(|&(key, cost, recording)| {
            (keys[key], lean(quotas[key], cost, recording).arguments())
        }));
        one_key_calls += u64::from(call_keys.len() == 1 && sent.len() > 1);
        distinct_calls += u64::from(args[0] == 0);
        if users {
            assert_eq!(
                args[0], 0,
                "batch {batch}: many users' hits go as distinct keys"
            );
        }
        let (reply, stored) =
            lean::run_and_read(&mut con, &source, (&call_keys, &args, now), &keys, |key| {
                redis::cmd("GET").arg(key).clone()
            });
        assert_eq!(reply.len(), 2 * sent.len());

        let mut last_write: BTreeMap<&str, State> = BTreeMap::new();
        for (i, &(key, cost, recording)) in sent.iter().enumerate() {
            let name = keys[key];
            let q = micros[key];
            let length = q.window_ticks();
            let state = core[name].clone();
            assert_eq!(
                (reply[2 * i] as u64, reply[2 * i + 1] as u64),
                (
                    current_count(&state, length, now),
                    (now / length + 1) * length - now
                ),
                "batch {batch}, hit {i} on {name}: the count before the hit, the time left"
            );
            let mut states = [state];
            let outcome = evaluate(
                &Evaluation {
                    shape: &Shape::Leaf(0),
                    quotas: &[q],
                    cost,
                    recording,
                    penalty: None,
                },
                &mut states,
                None,
                now,
            );
            let decision = lean(quotas[key], cost, recording)
                .decision(reply[2 * i], reply[2 * i + 1])
                .unwrap();
            assert_eq!(
                decision, outcome.decision,
                "batch {batch}, hit {i} on {name}: the decision"
            );
            hits += 1;
            denied += u64::from(!outcome.decision.allowed());
            never += u64::from(cost > q.limit() && recording == Recording::Always);
            let [after] = states;
            if outcome.changed {
                repeats += u64::from(last_write.contains_key(name));
                last_write.insert(name, after.clone());
            }
            core.insert(name, after);
        }

        for ((key, q), (value, ttl)) in keys.iter().zip(&micros).zip(stored) {
            let length = q.window_ticks();
            let stored: Option<String> = redis::from_redis_value(value).unwrap();
            let stored = match stored {
                None => q.fresh_state(),
                Some(text) => {
                    let (window, count) = text.split_once(':').expect("window:count");
                    State::FixedWindow {
                        window: window.parse().unwrap(),
                        count: count.parse().unwrap(),
                    }
                }
            };
            assert_eq!(
                current_count(&stored, length, now),
                current_count(&core[key], length, now),
                "batch {batch}: {key} holds the core's count"
            );
            if let Some(State::FixedWindow { window, count }) = last_write.get(key)
                && *count > 0
            {
                let px = ((window + 1) * length - now).div_ceil(1_000).max(1) as i64;
                assert!(
                    ttl <= px && ttl > px - 1_000,
                    "batch {batch}: {key} expires in {ttl} ms, its window in {px}"
                );
            }
        }
    }
    assert!(denied * 10 > hits, "only {denied} of {hits} hits denied");
    assert!(repeats > 200, "only {repeats} repeated writes in a batch");
    assert!(new_windows > 50, "only {new_windows} new 1 s windows");
    assert!(never > 20, "only {never} counted hits above their limit");
    assert!(one_key_calls > 50, "only {one_key_calls} calls of one key");
    assert!(
        distinct_calls > 200,
        "only {distinct_calls} calls of distinct keys of one set"
    );
}
