//! The lean GCRA batch script against the core, hit by hit: random batches of hits on a few
//! keys (a key often named several times in one batch, some costs above what is left, some
//! hits counted when denied or never counted) must answer exactly as sluice-core's GCRA
//! deciding them one after the other at the batch's `now`, leave each key holding the
//! core's final TAT, and give a written key the expiry of that final TAT (the script writes
//! a key once per batch, after its last hit). Batches of many users' hits (one parameter
//! set, no key twice) take the script's own loop for them, and are checked the same way.

#[path = "lean/run.rs"]
mod lean;

use std::collections::BTreeMap;

use sluice_core::{
    Algorithm, Evaluation, Leaf, Quota, Rate, Recording, Shape, Span, State, Unit, evaluate,
};
use sluice_limiter::{Hit, Identifier};
use sluice_redis::script::{GCRA_BATCH_LUA, LeanGcra, distinct_batch_call, micro};
use sluice_testkit::RedisServer;

/// xorshift64*, so every run replays the same hits.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// A GCRA quota of `count` per `seconds`, as the limiter hands it to the store.
fn quota(count: u64, seconds: u64) -> Quota {
    let rate = Rate::new(count, Span::new(seconds, Unit::Second).unwrap()).unwrap();
    Quota::from_leaf(&Leaf::new(rate), Algorithm::Gcra).unwrap()
}

/// The script's five arguments for a hit, as the store builds them.
fn lean_arguments(quota: Quota, cost: u64, recording: Recording) -> [u64; 5] {
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
    LeanGcra::of(&hit).unwrap().expect("a lean hit").arguments()
}

#[test]
fn batches_with_repeated_keys_decide_and_store_as_the_core() {
    let server = RedisServer::start().expect("redis-server");
    let client = redis::Client::open(server.url()).unwrap();
    let mut con = client.get_connection().expect("connect");
    let source = lean::source(GCRA_BATCH_LUA);

    let quotas = [quota(5, 1), quota(3, 60), quota(100, 10)];
    let recordings = [Recording::Admitted, Recording::Always, Recording::Never];
    // Hits on their own pick among the first three keys, each with its quota; a batch of
    // many users picks distinct keys among all eight, with one quota.
    let keys = ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"];
    // The core's TAT of each key (absent: a full bucket).
    let mut core: BTreeMap<&str, u64> = BTreeMap::new();
    let (mut rng, mut now, mut hits, mut denied, mut repeats) = (0x5eed_u64, 1_000_000, 0, 0, 0);
    // Batches sent as one key with a count of hits, and as distinct keys of one set (see
    // `distinct_batch_call`).
    let (mut one_key_calls, mut distinct_calls) = (0u64, 0u64);

    for batch in 0..800 {
        // Time moves by up to 0.4 s between batches: buckets refill partly, rarely whole.
        now += next(&mut rng) % 400_000;
        let size = 1 + (next(&mut rng) % 12) as usize;
        let mut sent = Vec::new();
        // One batch in four is a hot key's: every hit the same key, cost and recording. One
        // in four is many users': every hit the first's quota, cost and recording, each on a
        // key of its own.
        let (hot, users) = (batch % 4 == 0, batch % 4 == 1);
        let mut free: Vec<usize> = (0..keys.len()).collect();
        for _ in 0..if users { size.min(keys.len()) } else { size } {
            let mut key = (next(&mut rng) % 3) as usize;
            if users {
                key = free.swap_remove((next(&mut rng) % free.len() as u64) as usize);
            }
            let q = quotas[key % 3];
            let cost = [1, 1, 1, 2, 0][(next(&mut rng) % 5) as usize];
            let recording = recordings[[0, 0, 0, 0, 1, 2][(next(&mut rng) % 6) as usize]];
            sent.push(match sent.first() {
                Some(&first) if hot => first,
                Some(&(_, q, cost, recording)) if users => (keys[key], q, cost, recording),
                _ => (keys[key], q, cost, recording),
            });
        }
        let (call_keys, args) = distinct_batch_call(
            sent.iter()
                .map(|&(key, q, cost, recording)| (key, lean_arguments(q, cost, recording))),
        );
        one_key_calls += u64::from(call_keys.len() == 1 && sent.len() > 1);
        distinct_calls += u64::from(args[0] == 0);
        if users {
            assert_eq!(
                args[0], 0,
                "batch {batch}: many users' hits go as distinct keys"
            );
        }
        let (debts, stored) =
            lean::run_and_read(&mut con, &source, (&call_keys, &args, now), &keys, |key| {
                redis::cmd("GET").arg(key).clone()
            });
        assert_eq!(debts.len(), sent.len());

        let mut last_write: BTreeMap<&str, u64> = BTreeMap::new();
        for (i, &(key, q, cost, recording)) in sent.iter().enumerate() {
            let tat = core.get(key).copied().unwrap_or(0);
            assert_eq!(
                debts[i] as u64,
                tat.max(now) - now,
                "batch {batch}, hit {i} on {key}: the debt before the hit"
            );
            let mut states = [State::Gcra { tat }];
            let outcome = evaluate(
                &Evaluation {
                    shape: &Shape::Leaf(0),
                    // The core decides in the script's unit, microseconds.
                    quotas: &[micro(&q).unwrap()],
                    cost,
                    recording,
                    penalty: None,
                },
                &mut states,
                None,
                now,
            );
            hits += 1;
            denied += u64::from(!outcome.decision.allowed());
            let State::Gcra { tat: after } = states[0] else {
                unreachable!("a GCRA state")
            };
            if outcome.changed {
                repeats += u64::from(last_write.contains_key(key));
                last_write.insert(key, after);
            }
            core.insert(key, after);
        }

        for (key, (value, ttl)) in keys.iter().zip(stored) {
            let stored: Option<u64> = redis::from_redis_value(value).unwrap();
            let expected = core.get(key).copied().unwrap_or(0);
            assert_eq!(
                stored.unwrap_or(0).max(now),
                expected.max(now),
                "batch {batch}: {key} holds the core's final TAT"
            );
            if let Some(&tat) = last_write.get(key)
                && tat > now
            {
                let px = (tat - now).div_ceil(1_000).max(1) as i64;
                assert!(
                    ttl <= px && ttl > px - 1_000,
                    "batch {batch}: {key} expires in {ttl} ms, its final TAT in {px}"
                );
            }
        }
    }
    assert!(denied * 10 > hits, "only {denied} of {hits} hits denied");
    assert!(repeats > 200, "only {repeats} repeated writes in a batch");
    assert!(
        one_key_calls > 50,
        "only {one_key_calls} batches sent as one key"
    );
    assert!(
        distinct_calls > 200,
        "only {distinct_calls} batches sent as distinct keys of one set"
    );
}
