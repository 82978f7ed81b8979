//! The shared test vectors (crates/core/tests/vectors.json, outcomes from the Rust core) run
//! through the PL/pgSQL translation on a real PostgreSQL: each vector's states are written
//! into rows in the layout sql/algorithms.sql documents, the function decides at the
//! vector's `now` (passed explicitly; production reads `clock_timestamp()`), and the reply
//! and the rows it leaves behind must say what the core says.

use std::collections::BTreeMap;

use serde_json::Value as Json;
use sluice_core::algorithm::sliding_log::Log;
use sluice_core::algorithm::sliding_window::Counters;
use sluice_core::{Algorithm, Evaluation, PenaltyState, Quota, State};
use sluice_limiter::{Hit, Identifier};
use sluice_postgres::call::{TICK_NS, arguments, gcra_one_arguments};
use sluice_testkit::PostgresServer;
use sluice_testkit::vectors::{
    self, LeafSpec, case_from, penalty_record_from, state_from, state_json, without_expected,
};
use tokio_postgres::{Client, NoTls};

/// Which function a vector runs through.
#[derive(Clone, Copy, PartialEq)]
enum Function {
    /// `decide`: every vector.
    Full,
    /// `gcra_one`: the vectors of one GCRA leaf without a penalty.
    Lean,
    /// `gcra_many`, a batch of one: the same vectors.
    Batch,
}

#[test]
fn plpgsql_reproduces_every_vector() {
    run(Function::Full, 300);
}

#[test]
fn lean_function_reproduces_every_single_leaf_gcra_vector() {
    run(Function::Lean, 30);
}

#[test]
fn batch_function_reproduces_every_single_leaf_gcra_vector() {
    run(Function::Batch, 30);
}

fn run(function: Function, at_least: usize) {
    assert_eq!(TICK_NS, vectors::TICK_NS, "vectors count in microseconds");
    let vectors = vectors::parse(vectors::FILE_TEXT);
    let server = PostgresServer::start().expect("postgres");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (mut client, connection) = tokio_postgres::connect(&server.url(), NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        sluice_postgres::migrate::migrate(&mut client, "sluice", false)
            .await
            .expect("schema");
        let (mut ran, mut failures) = (0, Vec::new());
        for (index, vector) in vectors.iter().enumerate() {
            let Some(problems) = check(&client, function, index, vector).await else {
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
        assert!(ran >= at_least, "only {ran} vectors ran");
        assert!(
            failures.is_empty(),
            "the PL/pgSQL disagrees with the core on {} of {ran} vectors:\n{}",
            failures.len(),
            failures.join("\n")
        );
    });
}

/// A state in its row layout.
fn layout(state: &State) -> Vec<i64> {
    let v: Vec<u64> = match state {
        State::Gcra { tat } => vec![*tat],
        State::FixedWindow { window, count } => vec![*window, *count],
        State::SlidingWindow(counters) => {
            let g = u64::from(counters.len());
            let newest = counters.newest();
            let mut v = vec![newest];
            v.extend(std::iter::repeat_n(0, g as usize));
            for back in 0..g.min(newest + 1) {
                let number = newest - back;
                v[1 + (number % g) as usize] = counters.count(number);
            }
            v
        }
        State::SlidingLog(log) => log.hits().flat_map(|(t, c)| [t, c]).collect(),
        other => panic!("no layout for {other:?}"),
    };
    v.into_iter().map(|n| n as i64).collect()
}

/// A row's state; an empty array is the fresh state (a row made only to be locked).
fn read_state(quota: &Quota, v: &[i64]) -> Result<State, String> {
    let v: Vec<u64> = v.iter().map(|&n| n as u64).collect();
    if v.is_empty() {
        return Ok(quota.fresh_state());
    }
    Ok(match quota.algorithm() {
        Algorithm::Gcra => State::Gcra { tat: v[0] },
        Algorithm::FixedWindow => {
            let [window, count] = v[..] else {
                return Err(format!("{v:?} is not {{window, count}}"));
            };
            State::FixedWindow { window, count }
        }
        Algorithm::SlidingWindow => {
            let g = u64::from(quota.windows());
            if v.len() as u64 != g + 1 {
                return Err(format!("{} numbers, expected {}", v.len(), g + 1));
            }
            let newest = v[0];
            let oldest_first: Vec<u64> = (0..g)
                .map(|offset| {
                    let number = newest + 1 + offset;
                    if number < g {
                        0
                    } else {
                        v[1 + (number % g) as usize]
                    }
                })
                .collect();
            State::SlidingWindow(Counters::from_parts(newest, &oldest_first))
        }
        Algorithm::SlidingLog => {
            if v.len() % 2 != 0 {
                return Err(format!("{v:?} is not (time, cost) pairs"));
            }
            State::SlidingLog(Log::from_hits(v.chunks(2).map(|p| (p[0], p[1]))))
        }
        other => return Err(format!("no layout for {other}")),
    })
}

/// Runs one vector; returns what differs from the core's outcome, or `None` when the
/// vector is not of the function's shape.
async fn check(
    client: &Client,
    function: Function,
    index: usize,
    vector: &Json,
) -> Option<Vec<String>> {
    let case = case_from(vector);
    let quotas: Vec<Quota> = case.leaves.iter().map(LeafSpec::quota_ns).collect();
    let penalty = case.penalty.map(|p| p.penalty_ns());
    let micro: Vec<Quota> = quotas
        .iter()
        .map(|q| q.with_tick(TICK_NS).unwrap())
        .collect();
    let penalty_micro = penalty.map(|p| p.with_tick(TICK_NS));
    let keys: Vec<String> = (0..case.leaves.len())
        .map(|l| format!("v{index}:leaf{l}"))
        .collect();
    let penalty_key = format!("v{index}:penalty");

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
    let lean = match function {
        Function::Lean | Function::Batch => Some(gcra_one_arguments(&hit).expect("arguments")?),
        Function::Full => None,
    };

    // The initial states, in rows, expiring when the core says they do.
    let insert = "INSERT INTO sluice.counters (id, v, expires_at) VALUES ($1, $2, $3)";
    for ((key, quota), state) in keys.iter().zip(&micro).zip(&case.states) {
        if *state != quota.fresh_state() {
            let expires = quota.expires_at(state) as i64;
            client
                .execute(insert, &[key, &layout(state), &expires])
                .await
                .unwrap();
        }
    }
    if let (Some(record), Some(p)) = (case.penalty_record, penalty_micro) {
        let v = vec![
            i64::from(record.strikes),
            record.until as i64,
            record.last_strike as i64,
        ];
        let expires = p.expires_at(&record) as i64;
        client
            .execute(insert, &[&penalty_key, &v, &expires])
            .await
            .unwrap();
    }

    let now = case.now as i64;
    let result = match lean {
        Some([cost, recording, interval, burst, window]) if function == Function::Batch => {
            client
                .query_one(
                    "SELECT sluice.gcra_many(ARRAY[$1::text], ARRAY[$2::bigint], \
                     ARRAY[$3::bigint], ARRAY[$4::bigint], ARRAY[$5::bigint], \
                     ARRAY[$6::bigint], $7)",
                    &[
                        &keys[0], &cost, &recording, &interval, &burst, &window, &now,
                    ],
                )
                .await
        }
        Some([cost, recording, interval, burst, window]) => {
            client
                .query_one(
                    "SELECT sluice.gcra_one($1, $2, $3, $4, $5, $6, $7)",
                    &[
                        &keys[0], &cost, &recording, &interval, &burst, &window, &now,
                    ],
                )
                .await
        }
        None => {
            let (params, shape) = arguments(&hit).expect("arguments");
            let id_strs: Vec<&str> = keys.iter().map(String::as_str).collect();
            let pid = penalty.is_some().then_some(penalty_key.as_str());
            client
                .query_one(
                    "SELECT sluice.decide($1, $2, $3, $4, $5)",
                    &[&id_strs, &pid, &params, &shape, &now],
                )
                .await
        }
    };
    let reply: Vec<i64> = match result {
        Ok(row) => row.get(0),
        Err(e) => return Some(vec![format!("the function failed: {e:?}")]),
    };

    let mut problems = Vec::new();
    let expected = expected_reply(&vector["expected"]["decision"]);
    if reply != expected {
        problems.push(format!(
            "decision [allowed, limit, remaining, reset_after, retry_after, denial, leaf]\n    \
             core: {expected:?}\n    sql:  {reply:?}"
        ));
    }

    let rows: BTreeMap<String, (Vec<i64>, i64)> = client
        .query(
            "SELECT id, v, expires_at FROM sluice.counters WHERE id LIKE $1",
            &[&format!("v{index}:%")],
        )
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    for (leaf, quota) in micro.iter().enumerate() {
        let algorithm = quota.algorithm();
        let wanted = state_from(algorithm, &vector["expected"]["states"][leaf]);
        let want = canonical(quota, &wanted, case.now);
        let Some((v, expires)) = rows.get(&keys[leaf]) else {
            if want != canonical(quota, &quota.fresh_state(), case.now) {
                problems.push(format!(
                    "leaf {leaf} ({algorithm}): no row, core keeps {want}"
                ));
            }
            continue;
        };
        let stored = match read_state(quota, v) {
            Ok(stored) => stored,
            Err(e) => {
                problems.push(format!("leaf {leaf}: {e}"));
                continue;
            }
        };
        // A row read as fresh once expired: compare as of now.
        let got = if (*expires as u64) <= case.now {
            canonical(quota, &quota.fresh_state(), case.now)
        } else {
            canonical(quota, &stored, case.now)
        };
        if got != want {
            problems.push(format!(
                "leaf {leaf} ({algorithm}) state\n    core: {}\n    sql:  {} expiring at {expires}",
                state_json(&wanted),
                state_json(&stored),
            ));
        }
        // A live row says when its state expires, exactly: never earlier (a fresh state read
        // too soon admits too much).
        if (*expires as u64) > case.now && *expires as u64 != quota.expires_at(&stored) {
            problems.push(format!(
                "leaf {leaf} ({algorithm}): expires_at {expires}, its state expires at {}",
                quota.expires_at(&stored)
            ));
        }
    }
    if let Some(p) = penalty_micro {
        let wanted = penalty_record_from(&vector["expected"]["penalty_record"]);
        let fresh = |r: PenaltyState| {
            if p.expires_at(&r) <= case.now {
                PenaltyState::default()
            } else {
                r
            }
        };
        let stored = rows.get(&penalty_key).and_then(|(v, expires)| match v[..] {
            [s, u, l] if (*expires as u64) > case.now => Some(PenaltyState {
                strikes: s as u32,
                until: u as u64,
                last_strike: l as u64,
            }),
            _ => None,
        });
        if fresh(stored.unwrap_or_default()) != fresh(wanted) {
            problems.push(format!(
                "penalty record\n    core: {wanted:?}\n    sql:  {stored:?}"
            ));
        }
        if let (Some(stored), Some((_, expires))) = (stored, rows.get(&penalty_key))
            && *expires as u64 != p.expires_at(&stored)
        {
            problems.push(format!(
                "penalty expires_at {expires}, its record {}",
                p.expires_at(&stored)
            ));
        }
    }
    Some(problems)
}

/// The seven integers the functions reply with.
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

/// An expired state compares as fresh.
fn canonical(quota: &Quota, state: &State, now: u64) -> Json {
    if quota.expires_at(state) <= now {
        return state_json(&quota.fresh_state());
    }
    state_json(state)
}
