//! The audit trail in a running service: a sink that cannot keep up never slows decisions
//! (a FIFO nobody reads, `/dev/full`, a PostgreSQL server that is down), drops are
//! counted; PostgreSQL rows arrive in batches; Envoy gRPC refusals are audited once; a
//! reload moves the trail; the PostgreSQL sink speaks TLS.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use sluice_testkit::PostgresServer;
use sluice_testkit::http::{curl, json};
use support::{ENVOY, Server, envoy, one};

const POLICY: &str = "[policies.api]\nrule = \"ip:1/h\"\n";

/// A counter's value in `/metrics` (`series` is the name with its labels).
fn metric(server: &Server, series: &str) -> u64 {
    let (_, text) = curl("GET", &format!("{}/metrics", server.base), None);
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in {text}"))
}

/// Waits until `series` reaches `at_least` (10 s at most).
fn wait_metric(server: &Server, series: &str, at_least: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let value = metric(server, series);
        if value >= at_least {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{series} stayed at {value} < {at_least}"
        );
        std::thread::yield_now();
    }
}

struct Timings {
    median: Duration,
    p99: Duration,
    total: Duration,
}

/// `n` denials of `api` (each client's second hit), decided in process; their timings.
fn denials(server: &Server, prefix: &str, n: usize) -> Timings {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let service = server.service.clone();
    runtime.block_on(async move {
        let mut times = Vec::with_capacity(n);
        let started = Instant::now();
        for i in 0..n {
            let ip = format!("{prefix}-{i}");
            let first = service.check("api", &[("ip", &ip)], 1).await.unwrap();
            assert!(first.decision.allowed());
            let at = Instant::now();
            let second = service.check("api", &[("ip", &ip)], 1).await.unwrap();
            times.push(at.elapsed());
            assert!(!second.decision.allowed());
        }
        let total = started.elapsed();
        times.sort();
        Timings {
            median: times[n / 2],
            p99: times[n * 99 / 100],
            total,
        }
    })
}

fn report(name: &str, t: &Timings) {
    eprintln!(
        "{name}: median {:?}, p99 {:?}, denials in {:?}",
        t.median, t.p99, t.total
    );
}

const N: usize = 20_000;
/// What a decision on the memory store may take on a busy 2-core machine, sink or not; a
/// decision that waited on a stuck sink would never finish.
const P99_BOUND: Duration = Duration::from_millis(5);

/// The file's reader never reads: the pipe fills, the writer thread blocks in `write`,
/// the queue fills, and every later denial is dropped at once and counted.
#[test]
fn a_stuck_file_sink_never_slows_decisions() {
    let baseline = Server::start(POLICY);
    let without = denials(&baseline, "base", N);
    drop(baseline);

    let dir = std::env::temp_dir().join(format!("sluice-audit-fifo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let fifo = dir.join("denials.fifo");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    // Opening a FIFO waits for the other end: the reader opens on a thread of its own,
    // while the service opens the writing end.
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::File::open(fifo).unwrap())
    };
    let config = format!(
        "{POLICY}[audit]\nfile = \"{}\"\nqueue = 64\n",
        fifo.display()
    );
    let server = Server::start(&config);
    let held = reader.join().unwrap();
    let with = denials(&server, "stuck", N);
    report("no audit", &without);
    report("audit stuck", &with);
    assert!(with.p99 < P99_BOUND, "p99 {:?}", with.p99);
    let full = metric(
        &server,
        "sluice_audit_dropped_total{sink=\"file\",reason=\"queue_full\"}",
    );
    // The pipe (64 KiB), the writer's batch and the queue hold a few thousand at most.
    assert!(full > (N / 2) as u64, "{full} dropped of {N}");
    drop(server); // the drain gives up on the stuck writer
    drop(held);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `/dev/full` refuses every write: each denial is counted as failed, none waits.
#[test]
fn a_full_disk_drops_and_counts() {
    let config = format!("{POLICY}[audit]\nfile = \"/dev/full\"\n");
    let server = Server::start(&config);
    let timings = denials(&server, "full", 2_000);
    report("audit on /dev/full", &timings);
    assert!(timings.p99 < P99_BOUND, "p99 {:?}", timings.p99);
    let failed = "sluice_audit_dropped_total{sink=\"file\",reason=\"write_failed\"}";
    wait_metric(&server, failed, 2_000);
    assert_eq!(
        metric(&server, "sluice_audit_written_total{sink=\"file\"}"),
        0
    );
}

/// Rows that wait in the queue go in multi-row inserts (rows of one insert share `xmin`);
/// with the database down, decisions keep their speed and the lost records are counted;
/// back up, the sink writes again by itself.
#[test]
fn postgres_rows_arrive_in_batches_and_a_stopped_database_costs_nothing() {
    let mut pg = PostgresServer::start().expect("start postgres");
    let config = format!(
        "{POLICY}[audit]\npostgres = \"{}\"\nschema = \"trail\"\nserver = \"test-1\"\nqueue = 5000\n",
        pg.url()
    );
    let server = Server::start(&config);
    let written = "sluice_audit_written_total{sink=\"postgres\"}";
    // The first denial makes the sink create its table.
    denials(&server, "warm", 1);
    wait_metric(&server, written, 1);
    // How many rows an insert takes depends on how many wait when it starts: with the
    // table locked, the sink's next insert waits on the lock and the rest of the denials
    // queue behind it, whatever the speed of this machine.
    let lock = pg
        .hold("LOCK TABLE trail.audit_denials IN ACCESS EXCLUSIVE MODE")
        .unwrap();
    let n = 3_000;
    denials(&server, "pg", n);
    let deadline = Instant::now() + Duration::from_secs(10);
    while pg
        .psql("SELECT count(*) FROM pg_locks WHERE NOT granted")
        .unwrap()
        .trim()
        == "0"
    {
        assert!(
            Instant::now() < deadline,
            "the sink never ran into the lock"
        );
        std::thread::yield_now();
    }
    lock.commit().unwrap();
    wait_metric(&server, written, 1 + n as u64);
    let rows = pg
        .psql("SELECT count(*), count(DISTINCT xmin::text), min(server), min(reason), min(leaf) FROM trail.audit_denials WHERE selectors->>'ip' LIKE 'pg-%'")
        .unwrap();
    let fields: Vec<&str> = rows.trim().split('|').collect();
    assert_eq!(fields[0], n.to_string(), "{rows}");
    let inserts: usize = fields[1].parse().unwrap();
    eprintln!("{n} rows in {inserts} inserts");
    // The insert that waited on the lock, then the queue in batches of 512.
    assert!(
        inserts <= 1 + n.div_ceil(512),
        "{inserts} inserts for {n} rows"
    );
    assert_eq!(&fields[2..], ["test-1", "limited", "ip:1/h"], "{rows}");
    let one = pg
        .psql("SELECT selectors->>'ip', retry_after > 0 FROM trail.audit_denials WHERE selectors->>'ip' = 'pg-7'")
        .unwrap();
    assert_eq!(one.trim(), "pg-7|t");

    pg.kill();
    let down = denials(&server, "down", N);
    report("audit on a stopped postgres", &down);
    assert!(down.p99 < P99_BOUND, "p99 {:?}", down.p99);
    let dropped = metric(
        &server,
        "sluice_audit_dropped_total{sink=\"postgres\",reason=\"queue_full\"}",
    ) + metric(
        &server,
        "sluice_audit_dropped_total{sink=\"postgres\",reason=\"write_failed\"}",
    );
    assert!(dropped > 0, "nothing counted as dropped");

    pg.restart().unwrap();
    let before = metric(&server, written);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut round = 0;
    // Denials keep coming until the sink, backing off, tries again and gets through.
    while metric(&server, written) == before {
        assert!(Instant::now() < deadline, "the sink never wrote again");
        denials(&server, &format!("back-{round}"), 10);
        round += 1;
    }
}

/// The PostgreSQL sink speaks TLS as the store does: `sslmode=require` with the server's CA
/// in `sslrootcert` writes its rows over TLS (and the connection the server sees is TLS).
#[test]
fn the_postgres_sink_writes_over_tls() {
    let (pg, ca) = PostgresServer::start_tls().expect("start postgres with TLS");
    let url = format!(
        "{}?sslmode=require&sslrootcert={}&application_name=sluice-audit-tls",
        pg.url(),
        ca.display()
    );
    let config = format!("{POLICY}[audit]\npostgres = \"{url}\"\nschema = \"tls_trail\"\n");
    let server = Server::start(&config);
    denials(&server, "tls", 50);
    wait_metric(&server, "sluice_audit_written_total{sink=\"postgres\"}", 50);
    let rows = pg
        .psql("SELECT count(*) FROM tls_trail.audit_denials")
        .unwrap();
    assert_eq!(rows.trim(), "50");
    let sessions = pg
        .psql(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl) \
             FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = 'sluice-audit-tls'",
        )
        .unwrap();
    assert_eq!(sessions.trim(), "1|0", "TLS and plain sessions of the sink");
}

/// A changed `[audit]` table moves the trail at the next reload; one without it stops it.
#[test]
fn a_reload_moves_the_trail() {
    let server = Server::start(&format!("{POLICY}[audit]\nfile = \"first.jsonl\"\n"));
    let written = "sluice_audit_written_total{sink=\"file\"}";
    denials(&server, "a", 3);
    wait_metric(&server, written, 3);
    std::fs::write(
        server.dir.join("policies.toml"),
        format!("{POLICY}[audit]\nfile = \"second.jsonl\"\n"),
    )
    .unwrap();
    assert!(server.reload());
    denials(&server, "b", 2);
    wait_metric(&server, written, 5);
    let lines = |name: &str| {
        std::fs::read_to_string(server.dir.join(name))
            .unwrap()
            .lines()
            .count()
    };
    assert_eq!((lines("first.jsonl"), lines("second.jsonl")), (3, 2));

    // An `[audit]` table that cannot be used rejects the reload: the old trail goes on.
    std::fs::write(
        server.dir.join("policies.toml"),
        format!("{POLICY}[audit]\nfile = \"policies.toml/x\"\n"),
    )
    .unwrap();
    assert!(!server.reload());
    std::fs::write(server.dir.join("policies.toml"), POLICY).unwrap();
    assert!(server.reload());
    assert!(
        server.service.audit_sink().is_none(),
        "no trail after [audit] went"
    );
    denials(&server, "c", 2);
    assert_eq!(metric(&server, written), 5);
    assert_eq!(lines("second.jsonl"), 2);
}

/// Envoy's gRPC goes through the same path: its refusal is one record, named by the
/// descriptor's policy, with the descriptor's value.
#[test]
fn envoy_grpc_denials_are_audited_once() {
    let config = "[audit]\nfile = \"denials.jsonl\"\n";
    let server = Server::start_with(config, &[("config.yaml", ENVOY)], |b| b);
    let users = one("mongo_cps", &[("database", "users")]);
    let answers = envoy(&server, json!([users, users, users, users, users]));
    let over = answers
        .iter()
        .filter(|a| a["overall"] == "OVER_LIMIT")
        .count();
    assert_eq!(over, 2);
    wait_metric(&server, "sluice_audit_written_total{sink=\"file\"}", 2);
    let text = std::fs::read_to_string(server.dir.join("denials.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = text.lines().map(json).collect();
    assert_eq!(records.len(), 2, "{text}");
    for record in &records {
        assert_eq!(record["reason"], "limited", "{record}");
        assert_eq!(
            record["policy"], "envoy.mongo_cps.database=users",
            "{record}"
        );
        assert_eq!(record["leaf"], "descriptor:3/h", "{record}");
        assert_eq!(
            record["selectors"],
            json!({"descriptor": "database=users"}),
            "{record}"
        );
    }
}
