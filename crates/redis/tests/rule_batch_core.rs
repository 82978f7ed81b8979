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

use std::collections::BTreeMap;
use std::time::Duration;

use sluice_core::algorithm::sliding_log::Log;
use sluice_core::algorithm::sliding_window::Counters;
use sluice_core::{
    Algorithm, Denial, Evaluation, Leaf, Penalty, PenaltyState, Quota, Rate, Recording, Shape,
    Span, State, Unit, evaluate,
};
use sluice_limiter::{Hit, Identifier};
use sluice_redis::script::{LeanRule, RULE_BATCH_LUA, TICK_NS, micro, rule_batch_call};
use sluice_testkit::RedisServer;
use sluice_testkit::vectors::Rng;

/// A GCRA quota of `count` per `seconds` with a burst of `burst`, as the limiter hands it
/// to the store.
fn quota(count: u64, seconds: u64, burst: u64) -> Quota {
    let rate = Rate::new(count, Span::new(seconds, Unit::Second).unwrap()).unwrap();
    let mut leaf = Leaf::new(rate);
    leaf.options.burst = Some(burst);
    Quota::from_leaf(&leaf, Algorithm::Gcra).unwrap()
}

/// A fixed-window quota of `count` per `seconds`.
fn fixed(count: u64, seconds: u64) -> Quota {
    let rate = Rate::new(count, Span::new(seconds, Unit::Second).unwrap()).unwrap();
    Quota::from_leaf(&Leaf::new(rate), Algorithm::FixedWindow).unwrap()
}

/// A sliding-window quota of `count` per `seconds` in `windows` sub-windows.
fn sliding(count: u64, seconds: u64, windows: u32) -> Quota {
    let rate = Rate::new(count, Span::new(seconds, Unit::Second).unwrap()).unwrap();
    let mut leaf = Leaf::new(rate);
    leaf.options.windows = Some(windows);
    Quota::from_leaf(&leaf, Algorithm::SlidingWindow).unwrap()
}

/// A sliding-log quota of `count` per `seconds`.
fn log(count: u64, seconds: u64) -> Quota {
    let rate = Rate::new(count, Span::new(seconds, Unit::Second).unwrap()).unwrap();
    Quota::from_leaf(&Leaf::new(rate), Algorithm::SlidingLog).unwrap()
}

/// Whether the test's key `key` is a sliding log's: rule 6's first leaf, rule 7's two.
fn is_log(key: &str) -> bool {
    (key.starts_with("r6:") && key.ends_with(":0"))
        || (key.starts_with("r7:") && !key.ends_with(":penalty"))
}

/// The units of a log inside its window at `now`, oldest first: one time per unit.
fn units(q: &Quota, state: &State, now: u64) -> Vec<u64> {
    let State::SlidingLog(log) = state else {
        unreachable!("{state:?}")
    };
    log.hits()
        .filter(|(at, _)| at + q.window_ticks() > now)
        .flat_map(|(at, cost)| std::iter::repeat_n(at, cost as usize))
        .collect()
}

/// What the script answers of a sliding log holding `state` for a hit of `cost`: its used
/// units, the newest one's time, the k-th oldest's (k = used + cost - limit, the wait of a
/// denial) and, recording `always`, the (k + cost)-th oldest's (0 for each one not asked or
/// not there).
fn log_answer(q: &Quota, state: &State, now: u64, cost: u64, recording: Recording) -> Vec<u64> {
    let units = units(q, state, now);
    let used = units.len() as i64;
    let k = used + cost as i64 - q.limit() as i64;
    let fits = cost <= q.limit();
    let at = |n: i64| {
        if fits && n >= 1 && n <= used {
            units[n as usize - 1]
        } else {
            0
        }
    };
    let next = if recording == Recording::Always {
        at(k + cost as i64)
    } else {
        0
    };
    vec![used as u64, units.last().copied().unwrap_or(0), at(k), next]
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

/// What the script answers of a sliding window holding `state` for a hit of `cost`: the
/// units counted at `now`, the current sub-window's, and as sub-windows back from the
/// current one the newest earlier one holding units, where the k-th oldest unit lies (k =
/// used + cost - limit) and, recording `always`, the k2-th (k2 the same once recorded),
/// each 0 when not asked or in the current one; then how far after now the state's newest
/// sub-window is.
fn window_answer(q: &Quota, state: &State, now: u64, cost: u64, recording: Recording) -> Vec<u64> {
    let State::SlidingWindow(c) = state else {
        unreachable!("{state:?}")
    };
    let (g, limit) = (u64::from(q.windows()), q.limit());
    let current = now / q.sub_window_ticks();
    let counted: Vec<(u64, u64)> = ((current + 1).saturating_sub(g)..=current)
        .map(|n| (n, c.count(n)))
        .collect();
    let used: u64 = counted.iter().map(|(_, count)| count).sum();
    let cur = c.count(current);
    let before = used - cur;
    let prev = counted
        .iter()
        .rev()
        .find(|&&(n, count)| n < current && count > 0)
        .map_or(0, |(n, _)| current - n);
    let ahead = c.newest().saturating_sub(current);
    let recorded = if ahead > 0 {
        used
    } else {
        before + (cur + cost).min(2 * limit)
    };
    let at = |k: i64| -> u64 {
        if cost > limit || k < 1 || k > before as i64 {
            return 0;
        }
        let mut sum = 0;
        for &(n, count) in &counted {
            sum += count;
            if sum as i64 >= k {
                return current - n;
            }
        }
        unreachable!("k is within the units before the current sub-window")
    };
    let k = used as i64 + cost as i64 - limit as i64;
    let k2 = recorded as i64 + cost as i64 - limit as i64;
    let second = if recording == Recording::Always {
        at(k2)
    } else {
        0
    };
    vec![used, cur, prev, at(k), second, ahead]
}

/// A rule: its leaves' quotas (joined by `;` when more than one), its penalty.
struct Rule {
    quotas: Vec<Quota>,
    shape: Shape,
    penalty: Option<Penalty>,
}

impl Rule {
    fn new(quotas: Vec<Quota>, penalty: Option<Penalty>) -> Rule {
        let shape = match quotas.len() {
            1 => Shape::Leaf(0),
            n => Shape::Or((0..n).rev().map(Shape::Leaf).collect()),
        };
        Rule {
            quotas,
            shape,
            penalty,
        }
    }

    /// `or(and(leaf 0, leaf 1), leaf 2)`: leaf 2 always counts, and leaves 0 and 1 only
    /// deny together.
    fn or_of_and(quotas: Vec<Quota>) -> Rule {
        let shape = Shape::Or(vec![
            Shape::And(vec![Shape::Leaf(0), Shape::Leaf(1)]),
            Shape::Leaf(2),
        ]);
        Rule {
            quotas,
            shape,
            penalty: None,
        }
    }

    fn evaluation(&self, cost: u64, recording: Recording) -> Evaluation<'_> {
        Evaluation {
            shape: &self.shape,
            quotas: &self.quotas,
            cost,
            recording,
            penalty: self.penalty.as_ref(),
        }
    }

    /// The hit as the store sees it: its lean form.
    fn lean(&self, cost: u64, recording: Recording) -> LeanRule {
        let ids: Vec<Identifier> = (0..self.quotas.len())
            .map(|i| Identifier::new(format!("k{i}")))
            .collect();
        let penalty_id = Identifier::new("p");
        let hit = Hit {
            identifiers: &ids,
            evaluation: self.evaluation(cost, recording),
            penalty_identifier: self.penalty.is_some().then_some(&penalty_id),
        };
        LeanRule::of(&hit).unwrap().expect("a lean hit")
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

/// A reply of another length than the rule's, or a negative number, is an error, never a
/// decision.
#[test]
fn a_reply_of_the_wrong_shape_is_an_error() {
    let rule = Rule::new(vec![quota(5, 1, 5), quota(40, 1, 40)], None);
    let lean = rule.lean(1, Recording::Admitted);
    assert!(lean.decision(1_000, &[0]).is_err());
    assert!(lean.decision(1_000, &[0, 0, 0]).is_err());
    assert!(lean.decision(1_000, &[0, -1]).is_err());
    assert!(lean.decision(-1, &[0, 0]).is_err());
    assert!(lean.decision(1_000, &[0, 0]).unwrap().allowed());
    let seconds = Duration::from_secs;
    let penalty = Penalty::new(seconds(1), 2, seconds(60), seconds(600)).unwrap();
    let login = Rule::new(vec![quota(5, 60, 5)], Some(penalty)).lean(1, Recording::Always);
    assert!(login.decision(1_000, &[0]).is_err(), "no record");
    assert!(login.decision(1_000, &[0, -1, 0, 0]).is_err());
    assert!(login.decision(1_000, &[0, 0, 0, 0]).unwrap().allowed());
    let boxed = login.decision(1_000, &[0, 1, 5_000, 900]).unwrap();
    assert!(matches!(boxed.denial, Some(Denial::Penalized { .. })));

    // A sliding log answers its used units, newest time, the k-th oldest's and the
    // (k + cost)-th oldest's; an answer no log can give is an error. Two logs of 3 and 8
    // units, a hit of 2 counted even if denied: with 2 units used of 3, k is 1.
    let logs = Rule::new(vec![log(3, 1), log(8, 4)], None).lean(2, Recording::Always);
    let (now, fresh) = (10_000_000, [0, 0, 0, 0]);
    assert!(
        logs.decision(now, &[fresh, fresh].concat())
            .unwrap()
            .allowed()
    );
    let full = [2, 9_900_000, 9_500_000, 0];
    let denied = logs.decision(now, &[full, fresh].concat()).unwrap();
    // Found, the log would clear at 9.5 s + 1 s; recorded, it loses its oldest unit and
    // gains two of now, and the second oldest left is one of now: the wait is the window.
    assert_eq!(
        denied.denial,
        Some(Denial::Limited {
            retry_after: Duration::from_secs(1)
        })
    );
    for wrong in [
        [2, 0, 9_500_000, 0],         // units, but no newest
        [2, 9_900_000, 0, 0],         // denied, but no k-th oldest
        [1, 9_900_000, 9_500_000, 0], // room for the cost, yet a k-th oldest
        [2, 9_500_000, 9_900_000, 0], // the k-th oldest after the newest
        [0, 9_900_000, 0, 0],         // a newest unit in an empty log
        [2, 9_900_000, -1, 0],
    ] {
        assert!(
            logs.decision(now, &[wrong, fresh].concat()).is_err(),
            "{wrong:?}"
        );
    }
    // With 3 units used, k is 2 and the (k + cost)-th oldest would be past the newest: none.
    assert!(
        logs.decision(now, &[[3, 9_900_000, 9_600_000, 9_700_000], fresh].concat())
            .is_err()
    );
    assert!(
        logs.decision(now, &[[3, 9_900_000, 9_600_000, 0], fresh].concat())
            .is_ok()
    );
    // 3 units used of 8 by a hit of 2: k = 3 + 2 - 8 = -3, and k + cost = -1: nothing asked.
    assert!(
        logs.decision(now, &[fresh, [3, 9_900_000, 0, 0]].concat())
            .is_ok()
    );
    assert!(
        logs.decision(now, &[fresh, [3, 9_900_000, 0, 9_800_000]].concat())
            .is_err()
    );

    // A sliding window (3 in 4 sub-windows of 0.25 s) answers its units counted, the
    // current sub-window's, and as sub-windows back the newest earlier one holding units,
    // the k-th oldest's and the k2-th's, then how far ahead its newest is. At 10 s (the
    // current sub-window is the 40th), a hit of 1 counted when admitted.
    let window = Rule::new(vec![sliding(3, 1, 4)], None).lean(1, Recording::Admitted);
    assert!(window.decision(now, &[0, 0, 0, 0, 0, 0]).unwrap().allowed());
    // 3 units, 2 of them 2 sub-windows back: denied until that one slides out.
    let denied = window.decision(now, &[3, 1, 2, 2, 0, 0]).unwrap();
    assert_eq!(
        denied.denial,
        Some(Denial::Limited {
            retry_after: Duration::from_millis(500)
        })
    );
    for wrong in [
        [3, 1, 0, 2, 0, 0], // earlier units, but no earlier sub-window holding them
        [3, 1, 2, 0, 0, 0], // denied, but no sub-window to wait for
        [2, 1, 2, 2, 0, 0], // room for the hit, yet a sub-window to wait for
        [3, 1, 2, 2, 2, 0], // a recorded wait asked of a hit counted only when admitted
        [3, 1, 4, 4, 0, 0], // a sub-window the window no longer counts
        [3, 1, 3, 2, 0, 0], // the units to wait for after the newest earlier ones
        [1, 2, 0, 0, 0, 0], // more in the current sub-window than in all
        [3, 1, 2, -2, 0, 0],
    ] {
        assert!(window.decision(now, &wrong).is_err(), "{wrong:?}");
    }
}

/// The sub-windows the store rebuilds from a sliding window's answer decide and record as
/// the window the answer was read from: random windows (sub-windows stale, current, and
/// newer than now, as after Redis's clock stepped back; times near the epoch), costs and
/// recordings, the window joined by `;` to a GCRA leaf, each answered as the script answers
/// ([`window_answer`]) and decided by the store against the core on the window itself.
#[test]
fn windows_rebuilt_from_answers_decide_as_the_windows_read() {
    let mut rng = Rng(0x51d3);
    let recordings = [Recording::Admitted, Recording::Always, Recording::Never];
    let (mut ahead, mut waits, mut denied, mut limited_waits) = (0, 0, 0, 0);
    for case in 0..20_000 {
        // One window in ten of 120 sub-windows, the rest of 1 to 12.
        let g = match rng.next_u64() % 10 {
            0 => 120,
            _ => 1 + rng.next_u64() % 12,
        };
        let limit = 1 + rng.next_u64() % 12;
        // Sub-windows of 1 s.
        let rule = Rule::new(vec![sliding(limit, g, g as u32), quota(5, 1, 5)], None);
        let micros: Vec<Quota> = rule.quotas.iter().map(|q| micro(q).unwrap()).collect();
        let sub = micros[0].sub_window_ticks();
        let current = rng.next_u64() % 40;
        let now = current * sub + rng.next_u64() % sub;
        let newest = (current + rng.next_u64() % 8).saturating_sub(5);
        // Counts up to twice the limit (denials counted anyway stop there), some above it (a
        // window counted under a larger limit), and the current sub-window often full.
        let mut counts: Vec<u64> = (0..g)
            .map(|_| match rng.next_u64() % 4 {
                0 => 0,
                1 => rng.next_u64() % (3 * limit + 1),
                _ => rng.next_u64() % (2 * limit + 1),
            })
            .collect();
        if newest == current && rng.next_u64() % 3 == 0 {
            counts[g as usize - 1] = 2 * limit - rng.next_u64() % 2;
        }
        let window = State::SlidingWindow(Counters::from_parts(newest, &counts));
        let tat = now + rng.next_u64() % 2_000_000;
        let cost = [0, 1, 1, 2, limit, limit + 1][(rng.next_u64() % 6) as usize];
        let recording = recordings[(rng.next_u64() % 3) as usize];
        let mut reply = window_answer(&micros[0], &window, now, cost, recording);
        ahead += u64::from(reply[5] > 0);
        waits += u64::from(reply[4] > 0);
        reply.push(tat - now);
        let reply: Vec<i64> = reply.iter().map(|&x| x as i64).collect();
        let decision = rule
            .lean(cost, recording)
            .decision(now as i64, &reply)
            .unwrap_or_else(|e| panic!("case {case}: {e}"));
        let mut states = vec![window.clone(), State::Gcra { tat }];
        let evaluation = Evaluation {
            shape: &rule.shape,
            quotas: &micros,
            cost,
            recording,
            penalty: None,
        };
        let outcome = evaluate(&evaluation, &mut states, None, now);
        assert_eq!(
            decision, outcome.decision,
            "case {case}: {window:?} at {now}, cost {cost}, {recording:?}, answered {reply:?}"
        );
        denied += u64::from(!decision.allowed());
        limited_waits += u64::from(
            matches!(decision.denial, Some(Denial::Limited { .. }))
                && decision.leaf == 0
                && reply[3] > 0,
        );
    }
    assert!(ahead > 1_000, "only {ahead} windows newer than now");
    assert!(
        waits > 500,
        "only {waits} answers of a recorded window's wait"
    );
    assert!(denied > 3_000, "only {denied} denials");
    assert!(
        limited_waits > 1_000,
        "only {limited_waits} waits read from an earlier sub-window"
    );
}
