//! sql/leases.sql against the memory store, step by step: the same random sequences of
//! acquire, release and renew on rules mixing concurrency and rate leaves under `or` and
//! `and` (with and without a penalty, counting denials or not), and of reserve and settle on
//! rate rules, run on a `MemoryStore` with a manual clock and through the functions at the
//! same times (microseconds; production reads `clock_timestamp()`). Every answer must be the
//! memory store's.

use std::time::Duration;

use sluice_core::{Algorithm, Decision, Evaluation, Penalty, Quota, Recording, Rule, Shape};
use sluice_limiter::{Hit, Identifier, LeaseKeys, ManualClock, MemoryStore, Released, Settlement};
use sluice_postgres::call::{TICK_NS, arguments, decision};
use sluice_postgres::leases::{
    acquire_arguments, acquired, lease_times, released, settle_arguments,
};
use sluice_testkit::PostgresServer;
use sluice_testkit::vectors::Rng;
use tokio_postgres::{Client, NoTls};

/// 2025-11-13 in microseconds.
const EPOCH_US: u64 = 1_763_000_000_000_000;

/// One rule's leaves as a store sees them.
struct Case {
    ids: Vec<Identifier>,
    quotas: Vec<Quota>,
    shape: Shape,
    penalty: Option<Penalty>,
    penalty_id: Identifier,
    recording: Recording,
    /// The concurrency leaves' identifiers and quotas (what a lease holds).
    lease_ids: Vec<Identifier>,
    lease_quotas: Vec<Quota>,
}

impl Case {
    fn new(n: usize, text: &str, penalty: bool, recording: Recording) -> Case {
        let rule: Rule = text.parse().unwrap();
        let quotas: Vec<Quota> = rule
            .leaves()
            .iter()
            .map(|leaf| Quota::from_leaf(leaf, Algorithm::Gcra).unwrap())
            .collect();
        let ids: Vec<Identifier> = (0..quotas.len())
            .map(|i| Identifier::new(format!("rule{n}:leaf{i}")))
            .collect();
        let (lease_ids, lease_quotas) = ids
            .iter()
            .zip(&quotas)
            .filter(|(_, q)| q.algorithm() == Algorithm::Concurrency)
            .map(|(id, q)| (id.clone(), *q))
            .unzip();
        let s = Duration::from_secs;
        Case {
            ids,
            quotas,
            shape: rule.shape(),
            penalty: penalty.then(|| Penalty::new(s(2), 2, s(20), s(30)).unwrap()),
            penalty_id: Identifier::new(format!("rule{n}:penalty")),
            recording,
            lease_ids,
            lease_quotas,
        }
    }

    fn hit(&self, cost: u64) -> Hit<'_> {
        Hit {
            identifiers: &self.ids,
            evaluation: Evaluation {
                shape: &self.shape,
                quotas: &self.quotas,
                cost,
                recording: self.recording,
                penalty: self.penalty.as_ref(),
            },
            penalty_identifier: self.penalty.is_some().then_some(&self.penalty_id),
        }
    }

    fn keys(&self) -> LeaseKeys<'_> {
        LeaseKeys {
            identifiers: &self.lease_ids,
            quotas: &self.lease_quotas,
            held_for: None,
        }
    }
}

fn strs(ids: &[Identifier]) -> Vec<&str> {
    ids.iter().map(Identifier::as_str).collect()
}

async fn sql_acquire(client: &Client, case: &Case, lease: u64, now: i64) -> Decision {
    let hit = case.hit(1);
    let (params, shape) = acquire_arguments(&hit).unwrap();
    let penalty = hit.penalty_identifier.map(Identifier::as_str);
    let row = client
        .query_one(
            "SELECT sluice.acquire($1, $2, $3, $4, $5, $6)",
            &[
                &strs(&case.ids),
                &penalty,
                &params,
                &shape,
                &(lease as i64),
                &now,
            ],
        )
        .await
        .unwrap();
    acquired(&hit, &row.get::<_, Vec<i64>>(0)).unwrap()
}

async fn sql_release(client: &Client, case: &Case, lease: u64, now: i64) -> Released {
    let row = client
        .query_one(
            "SELECT sluice.release($1, $2, $3)",
            &[&strs(&case.lease_ids), &(lease as i64), &now],
        )
        .await
        .unwrap();
    released(row.get(0)).unwrap()
}

async fn sql_renew(client: &Client, case: &Case, lease: u64, now: i64) -> Option<Duration> {
    let times = lease_times(&case.keys()).unwrap();
    let row = client
        .query_one(
            "SELECT sluice.renew($1, $2, $3, $4)",
            &[&strs(&case.lease_ids), &times, &(lease as i64), &now],
        )
        .await
        .unwrap();
    row.get::<_, Option<i64>>(0)
        .map(|us| Duration::from_micros(us as u64))
}

async fn sql_reserve(client: &Client, case: &Case, cost: u64, now: i64) -> (Decision, u64) {
    let hit = case.hit(cost);
    let (params, shape) = arguments(&hit).unwrap();
    let penalty = hit.penalty_identifier.map(Identifier::as_str);
    let row = client
        .query_one(
            "SELECT sluice.reserve($1, $2, $3, $4, $5)",
            &[&strs(&case.ids), &penalty, &params, &shape, &now],
        )
        .await
        .unwrap();
    let reply: Vec<i64> = row.get(0);
    (decision(&reply[..7]).unwrap(), reply[7] as u64 * TICK_NS)
}

async fn sql_settle(client: &Client, settlement: &Settlement<'_>, now: i64) {
    let (params, taken_at, reserved, actual) = settle_arguments(settlement).unwrap();
    client
        .execute(
            "SELECT sluice.settle($1, $2, $3, $4, $5, $6)",
            &[
                &strs(settlement.identifiers),
                &params,
                &taken_at,
                &reserved,
                &actual,
                &now,
            ],
        )
        .await
        .unwrap();
}

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

#[test]
fn acquire_release_renew_answer_as_the_memory_store() {
    let rules = [
        ("user:2 concurrent lease=10s", false, Recording::Admitted),
        (
            "user:3/m; user:2 concurrent lease=10s",
            false,
            Recording::Admitted,
        ),
        (
            "and(user:3/m, user:1 concurrent lease=10s)",
            false,
            Recording::Admitted,
        ),
        (
            "user:1 concurrent lease=5s; user:2 concurrent lease=20s",
            false,
            Recording::Admitted,
        ),
        (
            "and(user:1 concurrent lease=5s, user:2 concurrent lease=20s)",
            false,
            Recording::Always,
        ),
        (
            "user:4/10s algorithm=fixed-window; user:2 concurrent lease=8s",
            false,
            Recording::Always,
        ),
        (
            "user:3/m algorithm=sliding-log; user:2 concurrent lease=10s",
            true,
            Recording::Admitted,
        ),
        ("user:2 concurrent lease=10s", true, Recording::Admitted),
    ];
    let server = PostgresServer::start().expect("postgres");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = connect(&server).await;
        let mut rng = Rng(0x001e_a5e5_2026);
        let (mut steps, mut admitted, mut denied) = (0, 0, 0);
        for (n, (text, penalty, recording)) in rules.into_iter().enumerate() {
            let case = Case::new(n, text, penalty, recording);
            let clock = ManualClock::new(0);
            let memory = MemoryStore::builder().clock(clock.clone()).build();
            let mut now = EPOCH_US + rng.range(0, 1_000_000_000);
            for step in 0..80 {
                now += rng.range(0, 3_000_000);
                clock.set(now * TICK_NS);
                let lease = rng.range(1, 6);
                let at = now as i64;
                let what = format!("{text}: step {step} at {now}, lease {lease}");
                match rng.range(0, 9) {
                    0..=4 => {
                        let expected = memory.acquire_now(&case.hit(1), lease);
                        let got = sql_acquire(&client, &case, lease, at).await;
                        assert_eq!(got, expected, "{what}: acquire");
                        if expected.allowed() {
                            admitted += 1;
                        } else {
                            denied += 1;
                        }
                    }
                    5..=7 => {
                        let expected = memory.release_now(&case.keys(), lease);
                        let got = sql_release(&client, &case, lease, at).await;
                        assert_eq!(got, expected, "{what}: release");
                    }
                    _ => {
                        let expected = memory.renew_now(&case.keys(), lease);
                        let got = sql_renew(&client, &case, lease, at).await;
                        assert_eq!(got, expected, "{what}: renew");
                    }
                }
                steps += 1;
            }
        }
        assert_eq!(steps, 640);
        assert!(
            admitted > 50 && denied > 50,
            "{admitted} admitted, {denied} denied"
        );
    });
}

#[test]
fn reserve_and_settle_answer_as_the_memory_store() {
    let rules = [
        ("user:100/m", false),
        ("user:100/m burst=40; user:500/h", false),
        (
            "and(user:60/10s algorithm=fixed-window, user:1000/h)",
            false,
        ),
        ("user:100/m algorithm=sliding-window windows=6", false),
        ("user:100/m algorithm=sliding-log", true),
    ];
    let server = PostgresServer::start().expect("postgres");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let client = connect(&server).await;
        let mut rng = Rng(0x07e5_e17e_2026);
        let (mut admitted, mut settled) = (0, 0);
        for (n, (text, penalty)) in rules.into_iter().enumerate() {
            let case = Case::new(n, text, penalty, Recording::Admitted);
            let clock = ManualClock::new(0);
            let memory = MemoryStore::builder().clock(clock.clone()).build();
            let mut now = EPOCH_US + rng.range(0, 1_000_000_000);
            let mut open: Vec<(u64, u64)> = Vec::new();
            for step in 0..80 {
                now += rng.range(0, 4_000_000);
                clock.set(now * TICK_NS);
                let at = now as i64;
                let what = format!("{text}: step {step} at {now}");
                if open.is_empty() || rng.range(0, 2) == 0 {
                    let estimate = rng.range(1, 40);
                    let expected = memory.reserve_now(&case.hit(estimate));
                    let got = sql_reserve(&client, &case, estimate, at).await;
                    assert_eq!(got, expected, "{what}: reserve {estimate}");
                    if expected.0.allowed() {
                        admitted += 1;
                        open.push((expected.1, estimate));
                    }
                } else {
                    let (taken_at, reserved) =
                        open.swap_remove(rng.range(0, 9) as usize % open.len());
                    let actual = rng.range(0, reserved * 2);
                    let settlement = Settlement {
                        identifiers: &case.ids,
                        quotas: &case.quotas,
                        taken_at,
                        reserved,
                        actual,
                    };
                    memory.settle_now(&settlement);
                    sql_settle(&client, &settlement, at).await;
                    settled += 1;
                    // What is left after settling says whether both charged the same.
                    let expected = memory.reserve_now(&case.hit(0));
                    let got = sql_reserve(&client, &case, 0, at).await;
                    assert_eq!(got, expected, "{what}: settle {reserved} -> {actual}");
                }
            }
        }
        assert!(
            admitted > 100 && settled > 100,
            "{admitted} admitted, {settled} settled"
        );
    });
}
