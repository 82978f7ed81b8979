//! The lean `or` batch script (rules of several GCRA leaves joined by `;`) against the core,
//! hit by hit: random batches of hits of two rules over a few users, every hit also naming
//! one key all share (a limit every caller hits, so a key named many times in one batch),
//! some costs above what is left or above a leaf's burst, some hits counted when denied or
//! never counted, must answer exactly as sluice-core's evaluation of the rule deciding them
//! one after the other at the batch's `now`, leave each key holding the core's final TAT,
//! and give a written key the expiry of that TAT (the script writes a key once per batch).

use std::collections::BTreeMap;

use sluice_core::{
    Algorithm, Evaluation, Leaf, Quota, Rate, Recording, Shape, Span, State, Unit, evaluate,
};
use sluice_limiter::{Hit, Identifier};
use sluice_redis::script::{GCRA_OR_BATCH_LUA, LeanGcraOr, micro, or_batch_call};
use sluice_testkit::RedisServer;
use sluice_testkit::vectors::Rng;

/// The lean script's test entry: `now` from the last argument instead of Redis's clock,
/// taken off `ARGV` so the script sees the arguments the store sends.
const TEST_ENTRY: &str = "local now = tonumber(table.remove(ARGV))\n";

/// A GCRA quota of `count` per `seconds` with a burst of `burst`, as the limiter hands it
/// to the store.
fn quota(count: u64, seconds: u64, burst: u64) -> Quota {
    let rate = Rate::new(count, Span::new(seconds, Unit::Second).unwrap()).unwrap();
    let mut leaf = Leaf::new(rate);
    leaf.options.burst = Some(burst);
    Quota::from_leaf(&leaf, Algorithm::Gcra).unwrap()
}

/// A rule: its leaves' quotas, the last of them the shared one.
struct Rule {
    quotas: Vec<Quota>,
    shape: Shape,
}

impl Rule {
    fn new(quotas: Vec<Quota>) -> Rule {
        let shape = Shape::Or((0..quotas.len()).rev().map(Shape::Leaf).collect());
        Rule { quotas, shape }
    }

    /// The hit as the store sees it: its lean form.
    fn lean(&self, cost: u64, recording: Recording) -> LeanGcraOr {
        let ids: Vec<Identifier> = (0..self.quotas.len())
            .map(|i| Identifier::new(format!("k{i}")))
            .collect();
        let hit = Hit {
            identifiers: &ids,
            evaluation: Evaluation {
                shape: &self.shape,
                quotas: &self.quotas,
                cost,
                recording,
                penalty: None,
            },
            penalty_identifier: None,
        };
        LeanGcraOr::of(&hit).unwrap().expect("a lean hit")
    }
}

#[test]
fn batches_of_rules_sharing_a_key_decide_and_store_as_the_core() {
    let server = RedisServer::start().expect("redis-server");
    let client = redis::Client::open(server.url()).unwrap();
    let mut con = client.get_connection().expect("connect");
    let script = redis::Script::new(&format!("{TEST_ENTRY}{GCRA_OR_BATCH_LUA}"));

    // The shared leaf, 10 a second, is reached by busy batches; the per-user ones by a
    // user's own hits. A cost of 4 exceeds the second rule's first leaf's burst of 3.
    let rules = [
        Rule::new(vec![quota(5, 1, 5), quota(10, 1, 10)]),
        Rule::new(vec![quota(3, 1, 3), quota(30, 60, 10), quota(10, 1, 10)]),
    ];
    let users = ["alice", "bob", "carol"];
    // The keys of rule `r`'s leaves for `user`: its own, then the shared one.
    let keys_of = |r: usize, user: &str| -> Vec<String> {
        let leaves = rules[r].quotas.len();
        (0..leaves - 1)
            .map(|leaf| format!("r{r}:{user}:{leaf}"))
            .chain(["shared".to_owned()])
            .collect()
    };
    let mut all_keys: Vec<String> = vec!["shared".to_owned()];
    for (r, user) in (0..rules.len()).flat_map(|r| users.map(|u| (r, u))) {
        let keys = keys_of(r, user);
        all_keys.extend(keys[..keys.len() - 1].iter().cloned());
    }
    let recordings = [Recording::Admitted, Recording::Always, Recording::Never];
    // The core's TAT of each key (absent: a full bucket).
    let mut core: BTreeMap<String, u64> = BTreeMap::new();
    let mut rng = Rng(0x0a5e);
    let (mut now, mut hits, mut denied, mut repeats, mut never) = (1_000_000, 0, 0, 0, 0);
    let mut shared_denials = 0u64;

    for batch in 0..300 {
        // Time moves by up to 0.2 s between batches: buckets refill partly, rarely whole.
        // Every twentieth batch (a hot one) comes two minutes later, on full buckets, so
        // its hits reach a leaf's burst exactly.
        now += rng.next_u64() % 200_000;
        if batch % 20 == 0 {
            now += 120_000_000;
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
        let (call_keys, mut args) = or_batch_call(sent.iter().zip(&hit_keys).map(
            |(&(r, _, cost, recording), keys)| {
                let keys = keys.iter().map(String::as_str).collect();
                (keys, rules[r].lean(cost, recording).arguments())
            },
        ));
        args.push(now);
        let mut invocation = script.prepare_invoke();
        for key in &call_keys {
            invocation.key(*key);
        }
        for arg in &args {
            invocation.arg(*arg);
        }
        let debts: Vec<i64> = invocation.invoke(&mut con).expect("the batch runs");
        assert_eq!(debts.len(), call_keys.len());

        let mut last_write: BTreeMap<&str, u64> = BTreeMap::new();
        let mut at = 0;
        for (i, (&(r, user, cost, recording), keys)) in sent.iter().zip(&hit_keys).enumerate() {
            let rule = &rules[r];
            let micros: Vec<Quota> = rule.quotas.iter().map(|q| micro(q).unwrap()).collect();
            let mine = &debts[at..at + keys.len()];
            at += keys.len();
            let mut states: Vec<State> = keys
                .iter()
                .map(|key| State::Gcra {
                    tat: core.get(key).copied().unwrap_or(0),
                })
                .collect();
            for (key, (state, debt)) in keys.iter().zip(states.iter().zip(mine)) {
                let State::Gcra { tat } = state else {
                    unreachable!()
                };
                assert_eq!(
                    *debt as u64,
                    (*tat).max(now) - now,
                    "batch {batch}, hit {i} ({user}, rule {r}) on {key}: the debt"
                );
            }
            let outcome = evaluate(
                &Evaluation {
                    shape: &rule.shape,
                    quotas: &micros,
                    cost,
                    recording,
                    penalty: None,
                },
                &mut states,
                None,
                now,
            );
            let decision = rule.lean(cost, recording).decision(mine).unwrap();
            assert_eq!(
                decision, outcome.decision,
                "batch {batch}, hit {i} ({user}, rule {r}): the decision from {mine:?}"
            );
            hits += 1;
            denied += u64::from(!decision.allowed());
            shared_denials += u64::from(!decision.allowed() && decision.leaf == keys.len() - 1);
            never += u64::from(recording == Recording::Always && r == 1 && cost > 3);
            if outcome.changed {
                for (key, state) in keys.iter().zip(&states) {
                    let State::Gcra { tat } = *state else {
                        unreachable!()
                    };
                    repeats += u64::from(last_write.contains_key(key.as_str()));
                    last_write.insert(key, tat);
                    core.insert(key.clone(), tat);
                }
            }
        }

        for key in &all_keys {
            let stored: Option<u64> = redis::cmd("GET").arg(key).query(&mut con).unwrap();
            let expected = core.get(key).copied().unwrap_or(0);
            assert_eq!(
                stored.unwrap_or(0).max(now),
                expected.max(now),
                "batch {batch}: {key} holds the core's final TAT"
            );
            if let Some(&tat) = last_write.get(key.as_str())
                && tat > now
            {
                let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut con).unwrap();
                let px = (tat - now).div_ceil(1_000).max(1) as i64;
                assert!(
                    ttl <= px && ttl > px - 1_000,
                    "batch {batch}: {key} expires in {ttl} ms, its final TAT in {px}"
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
}

/// A reply of another length than the rule's leaves, or a negative debt, is an error,
/// never a decision.
#[test]
fn a_reply_of_the_wrong_shape_is_an_error() {
    let rule = Rule::new(vec![quota(5, 1, 5), quota(10, 1, 10)]);
    let lean = rule.lean(1, Recording::Admitted);
    assert!(lean.decision(&[0]).is_err());
    assert!(lean.decision(&[0, 0, 0]).is_err());
    assert!(lean.decision(&[0, -1]).is_err());
    assert!(lean.decision(&[0, 0]).unwrap().allowed());
}
