//! The concurrency vectors (crates/core/tests/concurrency_vectors.json, outcomes from the
//! Rust core) replayed through sql/leases.sql on a real PostgreSQL, each step at the vector's
//! `now` (passed explicitly; production reads `clock_timestamp()`): every answer, and the
//! leases the row holds after each step, must be the core's. Then settling reservations:
//! `settle` against the core's `Quota::settle` on states the core recorded.

use serde_json::{Value as Json, json};
use sluice_core::{Algorithm, Evaluation, Leaf, Quota, Recording, Rule, Shape, Span, State, Unit};
use sluice_limiter::{Hit, Identifier};
use sluice_postgres::call::TICK_NS;
use sluice_postgres::leases::{acquire_arguments, released};
use sluice_testkit::PostgresServer;
use sluice_testkit::vectors::Rng;
use tokio_postgres::{Client, NoTls};

const VECTORS: &str = include_str!("../../core/tests/concurrency_vectors.json");

async fn connect(server: &PostgresServer) -> Client {
    let (mut client, connection) = tokio_postgres::connect(&server.url(), NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    sluice_postgres::migrate::migrate(&mut client, "sluice", false)
        .await
        .expect("schema");
    client
}

/// The unexpired leases in `key`'s row at `now`, as sorted `[id, expires_at]` pairs.
async fn held(client: &Client, key: &str, now: i64) -> Json {
    let row = client
        .query_opt("SELECT v FROM sluice.counters WHERE id = $1", &[&key])
        .await
        .unwrap();
    let v: Vec<i64> = row.map(|r| r.get(0)).unwrap_or_default();
    assert_eq!(v.len() % 2, 0, "{key}: {v:?} is not (id, expires_at) pairs");
    let mut pairs: Vec<(u64, u64)> = v
        .chunks(2)
        .filter(|p| p[1] > now)
        .map(|p| (p[0] as u64, p[1] as u64))
        .collect();
    pairs.sort_unstable();
    json!(pairs)
}

/// One step through the functions; its outcome in the vectors' format.
async fn step(client: &Client, key: &str, quota: &Quota, expected: &Json) -> Json {
    let (op, id, now) = (
        expected["op"].as_str().unwrap(),
        expected["id"].as_u64().unwrap() as i64,
        expected["now"].as_u64().unwrap() as i64,
    );
    let mut out = json!({ "op": op, "id": id, "now": now });
    let keys = vec![key.to_owned()];
    match op {
        "acquire" => {
            let ids = [Identifier::new(key.to_owned())];
            let quotas = [*quota];
            let shape = Shape::Leaf(0);
            let hit = Hit {
                identifiers: &ids,
                evaluation: Evaluation {
                    shape: &shape,
                    quotas: &quotas,
                    cost: 1,
                    recording: Recording::Admitted,
                    penalty: None,
                },
                penalty_identifier: None,
            };
            let (params, shape) = acquire_arguments(&hit).unwrap();
            let row = client
                .query_one(
                    "SELECT sluice.acquire($1, NULL, $2, $3, $4, $5)",
                    &[&keys, &params, &shape, &id, &now],
                )
                .await
                .unwrap();
            let reply: Vec<i64> = row.get(0);
            let allowed = reply[0] == 1;
            out["allowed"] = json!(allowed);
            out["remaining"] = json!(reply[2]);
            out["reset_us"] = json!(reply[3]);
            out["retry_us"] = match (allowed, reply[5]) {
                (true, _) => Json::Null,
                (false, 2) => json!(-1),
                (false, _) => json!(reply[4]),
            };
        }
        "release" => {
            let row = client
                .query_one("SELECT sluice.release($1, $2, $3)", &[&keys, &id, &now])
                .await
                .unwrap();
            out["released"] = json!(released(row.get(0)).unwrap().name());
        }
        _ => {
            let lease = vec![quota.with_tick(TICK_NS).unwrap().window_ticks() as i64];
            let row = client
                .query_one(
                    "SELECT sluice.renew($1, $2, $3, $4)",
                    &[&keys, &lease, &id, &now],
                )
                .await
                .unwrap();
            let left: Option<i64> = row.get(0);
            out["expires_at"] = json!(left.map(|left| now + left));
        }
    }
    out["held"] = held(client, key, now).await;
    out
}

#[test]
fn plpgsql_reproduces_every_concurrency_vector() {
    let cases: Json = serde_json::from_str(VECTORS).expect("concurrency_vectors.json");
    let server = PostgresServer::start().expect("postgres");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = connect(&server).await;
        let (mut ran, mut failures) = (0, Vec::new());
        for (index, case) in cases.as_array().unwrap().iter().enumerate() {
            let lease = Span::new(case["lease_us"].as_u64().unwrap() / 1_000_000, Unit::Second);
            let leaf = Leaf::concurrent(case["limit"].as_u64().unwrap(), Some(lease.unwrap()));
            let quota = Quota::from_leaf(&leaf.unwrap(), Algorithm::Gcra).unwrap();
            let key = format!("case{index}:concurrent");
            for expected in case["steps"].as_array().unwrap() {
                let got = step(&client, &key, &quota, expected).await;
                ran += 1;
                if got != *expected {
                    failures.push(format!("case {index}:\n  core {expected}\n  sql  {got}"));
                    break;
                }
            }
        }
        assert!(
            failures.is_empty(),
            "the PL/pgSQL disagrees with the core in {} cases:\n{}",
            failures.len(),
            failures.join("\n")
        );
        assert!(ran >= 400, "only {ran} steps ran");
    });
}

/// A state in its row layout (sql/algorithms.sql).
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

/// 2025-11-13 in microseconds, as the vectors.
const EPOCH_US: u64 = 1_763_000_000_000_000;

/// The quota's numbers as `settle` takes them: the leaf count, then six numbers.
fn settle_params(q: &Quota) -> Vec<i64> {
    let code = match q.algorithm() {
        Algorithm::Gcra => 1,
        Algorithm::SlidingWindow => 2,
        Algorithm::SlidingLog => 3,
        _ => 4,
    };
    let n = |x: u64| x as i64;
    vec![
        1,
        code,
        n(q.limit()),
        n(q.window_ticks()),
        n(q.interval_ticks()),
        n(q.burst()),
        i64::from(q.windows()),
    ]
}

#[test]
fn settle_does_what_the_core_does() {
    let rules = [
        "10/s",
        "100/m burst=20",
        "50/10s algorithm=fixed_window",
        "30/m algorithm=sliding_window",
        "30/m algorithm=sliding_window windows=6",
        "20/10s algorithm=sliding_log",
    ];
    let server = PostgresServer::start().expect("postgres");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = connect(&server).await;
        let mut rng = Rng(0x5e77_1e00_2026);
        let (mut changed, mut failures) = (0, Vec::new());
        for (r, text) in rules.iter().enumerate() {
            let rule: Rule = text.parse().unwrap();
            let quota = Quota::from_leaf(rule.leaves()[0], Algorithm::Gcra)
                .unwrap()
                .with_tick(TICK_NS)
                .unwrap();
            let window = quota.window_ticks();
            for case in 0..60 {
                // A few hits, the reservation among them, then a settlement a little later.
                let mut state = quota.fresh_state();
                let mut now = EPOCH_US + rng.range(0, 1_000_000_000);
                let mut taken_at = now;
                let reserved = rng.range(1, quota.capacity());
                for hit in 0..rng.range(1, 5) {
                    now += rng.range(0, window / 3);
                    let cost = if hit == 0 { reserved } else { rng.range(0, 3) };
                    if hit == 0 {
                        taken_at = now;
                    }
                    if quota.verdict(&state, now, cost).allowed {
                        quota.record(&mut state, now, cost);
                    }
                }
                now += rng.range(0, window + window / 4);
                let actual = match rng.range(0, 3) {
                    0 => reserved,
                    1 => rng.range(0, reserved),
                    _ => reserved + rng.range(1, quota.capacity() * 2),
                };
                let key = format!("settle{r}:{case}");
                let expires = quota.expires_at(&state) as i64;
                client
                    .execute(
                        "INSERT INTO sluice.counters (id, v, expires_at) VALUES ($1, $2, $3)",
                        &[&key, &layout(&state), &expires],
                    )
                    .await
                    .unwrap();
                let before = state.clone();
                changed += usize::from(quota.settle(&mut state, now, taken_at, reserved, actual));
                let (ids, params) = (vec![key.clone()], settle_params(&quota));
                let (t, e, a, n) = (taken_at as i64, reserved as i64, actual as i64, now as i64);
                client
                    .execute(
                        "SELECT sluice.settle($1, $2, $3, $4, $5, $6)",
                        &[&ids, &params, &t, &e, &a, &n],
                    )
                    .await
                    .unwrap();
                let row = client
                    .query_opt(
                        "SELECT v, expires_at FROM sluice.counters WHERE id = $1",
                        &[&key],
                    )
                    .await
                    .unwrap();
                // A row expired at `now` reads as fresh, as a state the core dropped.
                let live = quota.expires_at(&state) > now;
                let got = row
                    .map(|r| (r.get::<_, Vec<i64>>(0), r.get::<_, i64>(1)))
                    .filter(|(_, expires)| *expires > n);
                let agrees = match (&got, live) {
                    (Some((v, _)), true) => *v == layout(&state),
                    (None, false) => true,
                    _ => false,
                };
                if !agrees {
                    failures.push(format!(
                        "{text} case {case}: settle {reserved} -> {actual} taken at {taken_at} \
                         at {now}\n  before {before:?}\n  core {:?}\n  sql  {got:?}",
                        state
                    ));
                }
            }
        }
        assert!(changed >= 150, "only {changed} settlements changed a state");
        assert!(
            failures.is_empty(),
            "settle disagrees with the core in {} cases:\n{}",
            failures.len(),
            failures.join("\n")
        );
    });
}
