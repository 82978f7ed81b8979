//! The lean rule batch script (GCRA, fixed-window, sliding-window and sliding-log leaves
//! joined by `;` or in any tree of `or` and `and`, or one leaf with a penalty) against the
//! core, hit by hit: random batches of hits of nine rules over a few users (one mixes a
//! fixed window among GCRA leaves, one is a fixed window with a penalty, one an `and` within
//! an `or`, one a sliding window and a GCRA leaf with a penalty, one a sliding log and a
//! GCRA leaf with a penalty, one two sliding logs, one a sliding window of 120 sub-windows
//! and a fixed window),
//! two of them also naming one key all share (a limit every caller hits, so a key named
//! many times in one batch), one with a penalty that boxes a user denied again and again,
//! some costs above what is left or above a leaf's burst, some hits counted when denied or
//! never counted, must answer exactly as sluice-core's evaluation of the rule deciding them
//! one after the other at the batch's `now`, leave each key holding the core's final state,
//! and give a written key the expiry of that state (the script writes a key once a batch).

#[path = "lean/run.rs"]
mod lean;
#[path = "lean/rule_answers.rs"]
mod rule_answers;
#[path = "lean/rules.rs"]
mod rules;

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_core::algorithm::sliding_log::Log;
use sluice_core::algorithm::sliding_window::Counters;
use sluice_core::{
    Algorithm, Denial, Evaluation, Penalty, PenaltyState, Quota, Recording, State, evaluate,
};
use sluice_redis::script::{RULE_BATCH_LUA, TICK_NS, micro, rule_batch_call};
use sluice_testkit::RedisServer;
use sluice_testkit::vectors::Rng;

use rules::{Rule, fixed, log, log_answer, quota, sliding, units, window_answer};

/// Whether the test's key `key` is a sliding log's: rule 6's first leaf, rule 7's two.
fn is_log(key: &str) -> bool {
    (key.starts_with("r6:") && key.ends_with(":0"))
        || (key.starts_with("r7:") && !key.ends_with(":penalty"))
}

/// Reads a sliding window's state as Redis holds it, msgpack [newest, c_0 .. c_{G-1}],
/// unpacked by Redis's own cmsgpack.
const READ_SLIDING: &str = "local v = redis.call('GET', KEYS[1]) if not v then return false end \
                            return cmsgpack.unpack(v)";

/// A sliding window's state from its newest sub-window and its counts by sub-window number
/// modulo G, as the script stores and answers it.
fn counters(newest: u64, ring: &[u64]) -> State {
    let g = ring.len() as u64;
    let oldest_first: Vec<u64> = (0..g)
        .map(|offset| ring[((newest + 1 + offset) % g) as usize])
        .collect();
    State::SlidingWindow(Counters::from_parts(newest, &oldest_first))
}

/// What a leaf's state shows a hit at `now`: a GCRA leaf's debt, a fixed window's count in
/// its current window, a sliding window's counts of the sub-windows counted at `now`.
fn observed(q: &Quota, state: &State, now: u64) -> Vec<u64> {
    match state {
        State::Gcra { tat } => vec![(*tat).max(now) - now],
        State::FixedWindow { window, count } => {
            vec![if *window == now / q.window_ticks() {
                *count
            } else {
                0
            }]
        }
        State::SlidingWindow(c) => {
            let (g, current) = (u64::from(c.len()), now / q.sub_window_ticks());
            ((current + 1).saturating_sub(g)..=current)
                .map(|n| c.count(n))
                .collect()
        }
        other => unreachable!("{other:?}"),
    }
}

/// A leaf's state from its part of the script's reply: a debt or a count in the current
/// window.
fn from_reply(q: &Quota, part: &[u64], now: u64) -> State {
    match (q.algorithm(), part) {
        (Algorithm::Gcra, &[debt]) => State::Gcra { tat: now + debt },
        (Algorithm::FixedWindow, &[count]) => State::FixedWindow {
            window: now / q.window_ticks(),
            count,
        },
        other => panic!("no leaf answers {other:?}"),
    }
}

/// The core's state of one key: a GCRA leaf's TAT, a fixed window's number and count, a
/// sliding window's state, or a penalty record.
#[derive(Clone, Debug, PartialEq)]
enum Kept {
    Tat(u64),
    Window(u64, u64),
    Slid(State),
    Record(PenaltyState),
}

impl Kept {
    fn of(state: &State) -> Kept {
        match state {
            State::Gcra { tat } => Kept::Tat(*tat),
            State::FixedWindow { window, count } => Kept::Window(*window, *count),
            State::SlidingWindow(_) | State::SlidingLog(_) => Kept::Slid(state.clone()),
            other => unreachable!("{other:?}"),
        }
    }
}

#[test]
fn batches_of_rules_sharing_keys_decide_and_store_as_the_core() {
    let server = RedisServer::start().expect("redis-server");
    let client = redis::Client::open(server.url()).unwrap();
    let mut con = client.get_connection().expect("connect");
    let source = lean::source(RULE_BATCH_LUA);

    // The shared leaf, 10 a second, is reached by busy batches; the per-user ones by a
    // user's own hits. A cost of 4 exceeds the second rule's first leaf's burst of 3. The
    // third, a login form's, boxes a user for 0.3 s, doubling up to 2 s, forgotten after
    // 3 s without a strike.
    let seconds = Duration::from_millis;
    let penalty = Penalty::new(seconds(300), 2, seconds(2_000), seconds(3_000)).unwrap();
    let rules = [
        Rule::new(vec![quota(5, 1, 5), quota(10, 1, 10)], None),
        Rule::new(vec![quota(3, 1, 3), fixed(6, 2), quota(10, 1, 10)], None),
        Rule::new(vec![quota(2, 1, 2)], Some(penalty)),
        Rule::new(vec![fixed(2, 1)], Some(penalty)),
        Rule::or_of_and(vec![quota(2, 1, 2), fixed(4, 1), quota(6, 1, 6)]),
        Rule::new(vec![sliding(3, 1, 4), quota(6, 1, 6)], Some(penalty)),
        Rule::new(vec![log(4, 1), quota(6, 1, 6)], Some(penalty)),
        Rule::new(vec![log(3, 1), log(8, 4)], None),
        Rule::new(vec![sliding(5, 3, 120), fixed(8, 2)], None),
    ];
    let users = ["alice", "bob", "carol"];
    // The keys of rule `r`'s hit for `user`: its leaves' (the last of the first two rules'
    // the shared one), then its penalty record's.
    let keys_of = |r: usize, user: &str| -> Vec<String> {
        let leaves = rules[r].quotas.len();
        let mut keys: Vec<String> = (0..leaves)
            .map(|leaf| format!("r{r}:{user}:{leaf}"))
            .collect();
        if r < 2 {
            keys[leaves - 1] = "shared".to_owned();
        }
        if rules[r].penalty.is_some() {
            keys.push(format!("r{r}:{user}:penalty"));
        }
        keys
    };
    let mut all_keys: Vec<String> = (0..rules.len())
        .flat_map(|r| users.map(|u| keys_of(r, u)))
        .flatten()
        .collect();
    all_keys.sort();
    all_keys.dedup();
    let recordings = [Recording::Admitted, Recording::Always, Recording::Never];
    let penalty_micro = penalty.with_tick(TICK_NS);
    let mut core: BTreeMap<String, Kept> = BTreeMap::new();
    let mut rng = Rng(0x0a5e);
    let (mut now, mut hits, mut denied, mut repeats, mut never) = (1_000_000, 0, 0, 0, 0);
    let (mut shared_denials, mut boxed, mut struck, mut edges) = (0u64, 0u64, 0u64, 0u64);
    let (mut fixed_denials, mut and_spills, mut sliding_hits) = (0u64, 0u64, 0u64);
    let (mut sliding_denials, mut log_denials, mut log_waits) = (0u64, 0u64, 0u64);
    let (mut window_waits, mut fine_denials) = (0u64, 0u64);

    for batch in 0..600 {
        // Time moves by up to 0.2 s between batches: buckets refill partly, rarely whole.
        // Every twentieth batch (a hot one) comes two minutes later, on full buckets, so
        // its hits reach a leaf's burst exactly.
        now += rng.next_u64() % 200_000;
        if batch % 20 == 0 {
            now += 120_000_000;
        }
        // Some batches come at a penalty's edges: a microsecond before a box ends, as it
        // ends, and as a record's strikes are forgotten.
        let records = || {
            core.values().filter_map(|kept| match kept {
                Kept::Record(record) if record.strikes > 0 => Some(*record),
                _ => None,
            })
        };
        let forget = penalty_micro.ticks().3;
        let edge = match batch % 10 {
            5 => records()
                .map(|r| r.until.saturating_sub(1))
                .filter(|&t| t > now)
                .min(),
            6 => records().map(|r| r.until).filter(|&t| t >= now).min(),
            7 => records()
                .map(|r| r.last_strike + forget)
                .filter(|&t| t > now)
                .min(),
            _ => None,
        };
        if let Some(at) = edge {
            now = at;
            edges += 1;
        }
        let size = 1 + (rng.next_u64() % 16) as usize;
        let mut sent = Vec::new();
        // One batch in four is one user's of one rule, every hit alike.
        let hot = batch % 4 == 0;
        for _ in 0..size {
            let r = (rng.next_u64() % rules.len() as u64) as usize;
            let user = users[(rng.next_u64() % users.len() as u64) as usize];
            let cost = [1, 1, 1, 2, 0, 4][(rng.next_u64() % 6) as usize];
            let recording = recordings[[0, 0, 0, 0, 1, 2][(rng.next_u64() % 6) as usize]];
            match sent.first() {
                Some(&first) if hot => sent.push(first),
                _ => sent.push((r, user, cost, recording)),
            }
        }
        let hit_keys: Vec<Vec<String>> =
            sent.iter().map(|&(r, user, ..)| keys_of(r, user)).collect();
        let (call_keys, args) = rule_batch_call(
            sent.iter()
                .zip(&hit_keys)
                .map(|(&(r, _, cost, recording), keys)| {
                    let keys = keys.iter().map(String::as_str).collect();
                    (keys, rules[r].lean(cost, recording).arguments())
                }),
            batch,
        );
        let watched: Vec<&str> = all_keys.iter().map(String::as_str).collect();
        let (reply, stored) = lean::run_and_read(
            &mut con,
            &source,
            (&call_keys, &args, now),
            &watched,
            |key| {
                if (key.starts_with("r5:") || key.starts_with("r8:")) && key.ends_with(":0") {
                    redis::cmd("EVAL").arg(READ_SLIDING).arg(1).arg(key).clone()
                } else if is_log(key) {
                    redis::cmd("ZRANGE")
                        .arg(key)
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES")
                        .clone()
                } else {
                    redis::cmd("GET").arg(key).clone()
                }
            },
        );
        assert_eq!(reply[0] as u64, now, "the reply starts with the call's now");

        let mut last_write: BTreeMap<&str, Kept> = BTreeMap::new();
        let mut at = 1;
        for (i, (&(r, user, cost, recording), keys)) in sent.iter().zip(&hit_keys).enumerate() {
            let rule = &rules[r];
            let lean = rule.lean(cost, recording);
            let mine = &reply[at..at + lean.reply_len()];
            at += lean.reply_len();
            let leaves = rule.quotas.len();
            let micros: Vec<Quota> = rule.quotas.iter().map(|q| micro(q).unwrap()).collect();
            let mut states: Vec<State> = keys[..leaves]
                .iter()
                .zip(&micros)
                .map(|(key, q)| match core.get(key) {
                    Some(Kept::Tat(tat)) => State::Gcra { tat: *tat },
                    Some(Kept::Window(window, count)) => State::FixedWindow {
                        window: *window,
                        count: *count,
                    },
                    Some(Kept::Slid(state)) => state.clone(),
                    _ => q.fresh_state(),
                })
                .collect();
            let mut record = rule.penalty.map(|_| match core.get(&keys[leaves]) {
                Some(Kept::Record(record)) => *record,
                _ => PenaltyState::default(),
            });
            // What each leaf's state shows the hit, in the core and as the script answered
            // it (a sliding window's as its counted sub-windows: the script may hold a
            // fresh state where the core keeps one whose counts have all left the window).
            let answered: Vec<u64> = mine.iter().map(|x| *x as u64).collect();
            let (mut rest, mut seen, mut found) = (&answered[..], Vec::new(), Vec::new());
            for (state, q) in states.iter().zip(&micros) {
                let len = match q.algorithm() {
                    Algorithm::SlidingWindow => 6,
                    Algorithm::SlidingLog => 4,
                    _ => 1,
                };
                let (part, tail) = rest.split_at(len);
                rest = tail;
                if q.algorithm() == Algorithm::SlidingLog {
                    log_waits += u64::from(part[3] != 0);
                    seen.push(part.to_vec());
                    found.push(log_answer(q, state, now, cost, recording));
                } else if q.algorithm() == Algorithm::SlidingWindow {
                    window_waits += u64::from(part[4] != 0);
                    seen.push(part.to_vec());
                    found.push(window_answer(q, state, now, cost, recording));
                } else {
                    seen.push(observed(q, &from_reply(q, part, now), now));
                    found.push(observed(q, state, now));
                }
            }
            if let Some(p) = &record {
                found.push(vec![u64::from(p.strikes), p.until, p.last_strike]);
                seen.push(rest.to_vec());
            }
            assert_eq!(
                seen, found,
                "batch {batch}, hit {i} ({user}, rule {r}): what the leaves and record showed"
            );
            sliding_hits += u64::from(r == 5);
            let evaluation = Evaluation {
                shape: &rule.shape,
                quotas: &micros,
                cost,
                recording,
                penalty: rule.penalty.as_ref().map(|_| &penalty_micro),
            };
            // The `and`'s leaves, one reached and the other not: the rule still admits.
            let spills = r == 4 && {
                let reached = |l: usize| !micros[l].verdict(&states[l], now, cost).allowed;
                reached(0) != reached(1)
            };
            let outcome = evaluate(&evaluation, &mut states, record.as_mut(), now);
            and_spills += u64::from(spills && outcome.decision.allowed());
            let decision = lean.decision(reply[0], mine).unwrap();
            assert_eq!(
                decision, outcome.decision,
                "batch {batch}, hit {i} ({user}, rule {r}): the decision from {mine:?}"
            );
            hits += 1;
            denied += u64::from(!decision.allowed());
            shared_denials += u64::from(!decision.allowed() && r < 2 && decision.leaf == 0);
            boxed += u64::from(matches!(decision.denial, Some(Denial::Penalized { .. })));
            sliding_denials += u64::from(
                matches!(decision.denial, Some(Denial::Limited { .. }))
                    && r == 5
                    && decision.leaf == 0,
            );
            fine_denials += u64::from(
                matches!(decision.denial, Some(Denial::Limited { .. }))
                    && r == 8
                    && decision.leaf == 0,
            );
            log_denials += u64::from(
                matches!(decision.denial, Some(Denial::Limited { .. }))
                    && ((r == 6 && decision.leaf == 0) || r == 7),
            );
            fixed_denials += u64::from(
                matches!(decision.denial, Some(Denial::Limited { .. }))
                    && ((r == 1 && decision.leaf == 1) || r == 3),
            );
            never += u64::from(recording == Recording::Always && r == 1 && cost > 3);
            if outcome.changed {
                let kept = states.iter().map(Kept::of).chain(record.map(Kept::Record));
                for (key, kept) in keys.iter().zip(kept) {
                    if core.get(key) != Some(&kept) {
                        repeats += u64::from(last_write.contains_key(key.as_str()));
                        struck += u64::from(matches!(kept, Kept::Record(r) if r.strikes > 0));
                        last_write.insert(key, kept.clone());
                    }
                    core.insert(key.clone(), kept);
                }
            }
        }
        assert_eq!(
            at,
            reply.len(),
            "batch {batch}: every integer of the reply read"
        );

        for (key, (value, ttl)) in all_keys.iter().zip(stored) {
            let expected = core.get(key).cloned();
            if is_log(key) {
                // A log is read as its members and scores: the units in its window, oldest
                // first, must be the core's; its expiry, its newest unit's end of window.
                let members: Vec<(String, f64)> = redis::from_redis_value(value).unwrap();
                let q = match key.split(':').nth(2) {
                    Some("1") => micro(&log(8, 4)).unwrap(),
                    _ if key.starts_with("r6:") => micro(&log(4, 1)).unwrap(),
                    _ => micro(&log(3, 1)).unwrap(),
                };
                let stored: Vec<u64> = members
                    .iter()
                    .map(|(_, score)| *score as u64)
                    .filter(|at| at + q.window_ticks() > now)
                    .collect();
                let kept = match &expected {
                    Some(Kept::Slid(state)) => state.clone(),
                    _ => State::SlidingLog(Log::default()),
                };
                assert_eq!(
                    stored,
                    units(&q, &kept, now),
                    "batch {batch}: {key} holds the core's units"
                );
                let expires_at = q.expires_at(&kept);
                if last_write.contains_key(key.as_str()) && expires_at > now {
                    let px = (expires_at - now).div_ceil(1_000).max(1) as i64;
                    assert!(
                        ttl <= px && ttl > px - 1_000,
                        "batch {batch}: {key} expires in {ttl} ms, its log in {px}"
                    );
                }
                continue;
            }
            // A sliding window's state is read as an array, every other as text.
            let (stored, array): (Option<String>, Option<Vec<u64>>) =
                if matches!(expected, Some(Kept::Slid(_))) {
                    (None, redis::from_redis_value(value).unwrap())
                } else {
                    (redis::from_redis_value(value).unwrap(), None)
                };
            let expires_at = match expected {
                Some(Kept::Record(record)) => {
                    let stored = stored.as_deref().map(|text| {
                        let parts: Vec<u64> =
                            text.split(':').map(|part| part.parse().unwrap()).collect();
                        PenaltyState {
                            strikes: parts[0] as u32,
                            until: parts[1],
                            last_strike: parts[2],
                        }
                    });
                    let at = penalty_micro.expires_at(&record);
                    if at > now {
                        assert_eq!(stored, Some(record), "batch {batch}: {key}'s record");
                    }
                    at
                }
                Some(Kept::Tat(tat)) => {
                    let stored: u64 = stored.map_or(0, |text| text.parse().unwrap());
                    assert_eq!(
                        stored.max(now),
                        tat.max(now),
                        "batch {batch}: {key} holds the core's final TAT"
                    );
                    tat
                }
                Some(Kept::Window(window, count)) => {
                    // The second and ninth rules' fixed windows are 2 s, the others' 1 s.
                    let length = if key.starts_with("r1:") || key.starts_with("r8:") {
                        2_000_000
                    } else {
                        1_000_000
                    };
                    let current = now / length;
                    let held = |w: u64, c: u64| if w == current { c } else { 0 };
                    let stored = stored.map_or((0, 0), |text| {
                        let (w, c) = text.split_once(':').unwrap();
                        (w.parse().unwrap(), c.parse().unwrap())
                    });
                    assert_eq!(
                        held(stored.0, stored.1),
                        held(window, count),
                        "batch {batch}: {key} holds the core's count in the current window"
                    );
                    if count > 0 { (window + 1) * length } else { 0 }
                }
                Some(Kept::Slid(state)) => {
                    let q = if key.starts_with("r8:") {
                        micro(&sliding(5, 3, 120)).unwrap()
                    } else {
                        micro(&sliding(3, 1, 4)).unwrap()
                    };
                    let held = array
                        .map_or_else(|| q.fresh_state(), |items| counters(items[0], &items[1..]));
                    assert_eq!(
                        observed(&q, &held, now),
                        observed(&q, &state, now),
                        "batch {batch}: {key} holds the core's counts"
                    );
                    q.expires_at(&state)
                }
                None => {
                    assert_eq!(stored, None, "batch {batch}: {key} was never written");
                    0
                }
            };
            if last_write.contains_key(key.as_str()) && expires_at > now {
                let px = (expires_at - now).div_ceil(1_000).max(1) as i64;
                assert!(
                    ttl <= px && ttl > px - 1_000,
                    "batch {batch}: {key} expires in {ttl} ms, its state in {px}"
                );
            }
        }
    }
    assert!(denied * 10 > hits, "only {denied} of {hits} hits denied");
    assert!(
        shared_denials > 20,
        "the shared leaf denied only {shared_denials} hits"
    );
    assert!(repeats > 300, "only {repeats} repeated writes in a batch");
    assert!(never > 10, "only {never} counted hits above a burst");
    assert!(boxed > 50, "only {boxed} hits found their key boxed");
    assert!(
        fixed_denials > 20,
        "fixed windows denied only {fixed_denials} hits"
    );
    assert!(
        sliding_denials > 20,
        "the sliding window denied only {sliding_denials} of {sliding_hits} hits"
    );
    assert!(
        log_denials > 20,
        "sliding logs denied only {log_denials} hits"
    );
    assert!(
        fine_denials > 20,
        "the window of 120 sub-windows denied only {fine_denials} hits"
    );
    assert!(
        window_waits > 4,
        "only {window_waits} counted denials asked a sliding window's later wait"
    );
    assert!(
        log_waits > 10,
        "only {log_waits} counted denials asked a log's later wait"
    );
    assert!(
        and_spills > 20,
        "only {and_spills} hits admitted with one leaf of the `and` reached"
    );
    assert!(struck > 50, "only {struck} strikes");
    assert!(edges > 60, "only {edges} batches at a penalty's edges");
}
