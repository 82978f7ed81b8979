//! The lean sliding-window batch script against the core, hit by hit: random batches of
//! hits on a few keys (a key often named several times in one batch, some costs above what
//! is left or above the limit, some hits counted when denied or never counted, one key
//! shared by two quotas of different sub-window counts) must answer exactly as sluice-core's
//! sliding window deciding them one after the other at the batch's `now`, leave each key
//! holding the core's state, and give a written key the expiry the core gives its state
//! (the script writes a key once per batch, after its last hit). Batches of many users'
//! hits (one parameter set, no key twice) take the script's own loop for them, and are
//! checked the same way.

#[path = "lean/run.rs"]
mod lean;

use std::collections::BTreeMap;

use sluice_core::{
    Algorithm, Evaluation, Leaf, Quota, Rate, Recording, Shape, Span, State, Unit, evaluate,
};
use sluice_limiter::{Hit, Identifier};
use sluice_redis::script::{LeanSliding, SLIDING_BATCH_LUA, distinct_batch_call, micro};
use sluice_testkit::RedisServer;
use sluice_testkit::vectors::Rng;

/// Reads a key's state as Redis holds it: msgpack [newest, c_0 .. c_{G-1}], unpacked by
/// Redis's own cmsgpack.
const READ: &str = "local v = redis.call('GET', KEYS[1]) if not v then return false end \
                    return cmsgpack.unpack(v)";

/// A sliding-window quota of `count` per `seconds` in `windows` sub-windows, as the limiter
/// hands it to the store.
fn quota(count: u64, seconds: u64, windows: u32) -> Quota {
    let rate = Rate::new(count, Span::new(seconds, Unit::Second).unwrap()).unwrap();
    let mut leaf = Leaf::new(rate);
    leaf.options.windows = Some(windows);
    Quota::from_leaf(&leaf, Algorithm::SlidingWindow).unwrap()
}

/// The hit of `quota`, `cost` and `recording` as the store sees it: its lean form.
fn lean(quota: Quota, cost: u64, recording: Recording) -> LeanSliding {
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
    LeanSliding::of(&hit).unwrap().expect("a lean hit")
}

/// The counts a state holds for the `G` sub-windows counted at `now` (none once it has
/// expired), with its `G`: what every later hit can see of it.
fn counted(q: &Quota, state: &State, now: u64) -> Option<(u32, Vec<u64>)> {
    let State::SlidingWindow(counters) = state else {
        unreachable!("a sliding-window state");
    };
    if q.expires_at(state) <= now {
        return None;
    }
    let g = u64::from(counters.len());
    let current = now / q.sub_window_ticks();
    let counts = (current + 1).saturating_sub(g)..=current;
    Some((counters.len(), counts.map(|n| counters.count(n)).collect()))
}

#[test]
fn batches_with_repeated_keys_decide_and_store_as_the_core() {
    let server = RedisServer::start().expect("redis-server");
    let client = redis::Client::open(server.url()).unwrap();
    let mut con = client.get_connection().expect("connect");
    let source = lean::source(SLIDING_BATCH_LUA);

    // The last two share key k3 with different sub-window counts: each takes the other's
    // state as fresh. The 2-a-second ones often see a cost above their limit.
    // Hits on their own pick among those five; a batch of many users picks distinct keys
    // among the eight after them, which share one quota (2 a second, in 4 sub-windows).
    let mut quotas = vec![
        quota(5, 1, 4),
        quota(3, 60, 10),
        quota(100, 10, 1),
        quota(2, 1, 3),
        quota(2, 1, 5),
    ];
    quotas.extend([quota(2, 1, 4); 8]);
    let key_of = [0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10, 11];
    // The core decides in the script's unit, microseconds.
    let micros: Vec<Quota> = quotas.iter().map(|q| micro(q).unwrap()).collect();
    let recordings = [Recording::Admitted, Recording::Always, Recording::Never];
    let keys = [
        "k0", "k1", "k2", "k3", "u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7",
    ];
    // Each key fresh, held by the first quota on it.
    let mut core: BTreeMap<&str, (usize, State)> = keys
        .iter()
        .enumerate()
        .map(|(k, key)| {
            let which = key_of.iter().position(|&of| of == k).unwrap();
            (*key, (which, micros[which].fresh_state()))
        })
        .collect();
    // Seeded, so every run replays the same hits.
    let mut rng = Rng(0x51d3);
    let (mut now, mut hits, mut denied, mut repeats) = (1_000_000, 0, 0, 0);
    let (mut never, mut switched, mut retries, mut back) = (0u64, 0u64, 0u64, 0u64);
    let (mut one_key_calls, mut distinct_calls) = (0u64, 0u64);

    for batch in 0..800 {
        // Time moves by up to 0.4 s between batches: sub-windows of 0.2-0.33 s end often,
        // whole 1 s windows now and then. One batch in ten steps back up to 0.6 s, as
        // Redis's clock can after a failover: a state's newest sub-window is then ahead.
        if batch % 10 == 7 {
            now -= rng.next_u64() % 600_000;
            back += 1;
        } else {
            now += rng.next_u64() % 400_000;
        }
        let size = 1 + (rng.next_u64() % 12) as usize;
        let mut sent = Vec::new();
        // One batch in four is a hot key's: every hit the same key, cost and recording. One
        // in four is many users': every hit the first's cost and recording, each on a key of
        // its own.
        let (hot, users) = (batch % 4 == 0, batch % 4 == 1);
        let mut free: Vec<usize> = (5..quotas.len()).collect();
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
        // As the store sends them: a hot key's batch as the key once and a count of hits,
        // many users' as distinct keys of one set.
        let (call_keys, args) =
            distinct_batch_call(sent.iter().map(|&(which, cost, recording)| {
                let arguments = lean(quotas[which], cost, recording).arguments();
                (keys[key_of[which]], arguments)
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
                redis::cmd("EVAL").arg(READ).arg(1).arg(key).clone()
            });
        assert_eq!(reply.len(), 3 * sent.len());

        let mut written: BTreeMap<&str, (usize, State)> = BTreeMap::new();
        for (i, &(which, cost, recording)) in sent.iter().enumerate() {
            let name = keys[key_of[which]];
            let q = micros[which];
            let (holder, state) = core[name].clone();
            switched += u64::from(holder != which);
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
            let verdict = [reply[3 * i], reply[3 * i + 1], reply[3 * i + 2]];
            let decision = lean(quotas[which], cost, recording)
                .decision(verdict)
                .unwrap();
            assert_eq!(
                decision, outcome.decision,
                "batch {batch}, hit {i} on {name}: the decision from the verdict {verdict:?}"
            );
            hits += 1;
            denied += u64::from(!outcome.decision.allowed());
            retries += u64::from(verdict[2] > 0);
            never += u64::from(cost > q.limit() && recording == Recording::Always);
            let [after] = states;
            if outcome.changed {
                repeats += u64::from(written.contains_key(name));
                written.insert(name, (which, after.clone()));
                core.insert(name, (which, after));
            }
        }

        // The script deletes a key it writes whose state has expired, as the full script
        // does; the store's state is then a fresh one, which differs from the expired one
        // once time steps back.
        for (key, (holder, after)) in &written {
            let q = &micros[*holder];
            if q.expires_at(after) <= now {
                core.insert(key, (*holder, q.fresh_state()));
            }
        }
        for (key, (value, ttl)) in keys.iter().zip(stored) {
            let (holder, state) = &core[key];
            let q = &micros[*holder];
            let items: Option<Vec<u64>> = redis::from_redis_value(value).unwrap();
            let stored = items.map(|items| {
                let g = items.len() as u64 - 1;
                assert_eq!(g, u64::from(q.windows()), "batch {batch}: {key}'s G");
                let newest = items[0];
                // Sub-windows newest - G + 1 ..= newest, oldest first (none before 0).
                let oldest_first: Vec<u64> = (newest + 1..=newest + g)
                    .map(|n| {
                        if n < g {
                            0
                        } else {
                            items[1 + (n % g) as usize]
                        }
                    })
                    .collect();
                State::SlidingWindow(
                    sluice_core::algorithm::sliding_window::Counters::from_parts(
                        newest,
                        &oldest_first,
                    ),
                )
            });
            let stored_counts = stored.as_ref().and_then(|s| counted(q, s, now));
            assert_eq!(
                stored_counts,
                counted(q, state, now),
                "batch {batch}: {key} holds the core's counts"
            );
            if let Some((_, after)) = written.get(key)
                && q.expires_at(after) > now
            {
                let px = (q.expires_at(after) - now).div_ceil(1_000).max(1) as i64;
                assert!(
                    ttl <= px && ttl > px - 1_000,
                    "batch {batch}: {key} expires in {ttl} ms, its state in {px}"
                );
            }
        }
    }
    assert!(denied * 10 > hits, "only {denied} of {hits} hits denied");
    assert!(retries > 100, "only {retries} denials with a time to wait");
    assert!(repeats > 200, "only {repeats} repeated writes in a batch");
    assert!(
        switched > 50,
        "only {switched} hits on a state of another G"
    );
    assert!(never > 20, "only {never} counted hits above their limit");
    assert!(back >= 40, "time stepped back only {back} times");
    assert!(one_key_calls > 50, "only {one_key_calls} calls of one key");
    assert!(
        distinct_calls > 200,
        "only {distinct_calls} calls of distinct keys of one set"
    );
}

/// A reply no verdict of the quota can give (a wrong script, a wrong server) is an error,
/// never a decision, and never an admission.
#[test]
fn a_reply_no_verdict_can_give_is_an_error() {
    let hit = lean(quota(5, 1, 4), 1, Recording::Admitted);
    for wrong in lean::WRONG_VERDICTS {
        assert!(hit.decision(wrong).is_err(), "{wrong:?} decided");
    }
    assert!(hit.decision([4, 250_000, -1]).unwrap().allowed());
    assert!(!hit.decision([0, 250_000, -2]).unwrap().allowed());
    assert!(!hit.decision([0, 250_000, 1_000]).unwrap().allowed());
}
