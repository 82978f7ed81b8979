//! Concurrency leases and reservations through the service: `/v1/acquire`, `/v1/release`,
//! `/v1/renew`, `/v1/reserve`, `/v1/settle` driven by curl, the `SLUICE.*` commands by
//! redis-cli, their bad inputs, and their metrics. The memory store runs on a manual clock,
//! so leases expire when a test says so.

mod support;

use std::time::Duration;

use serde_json::Value;
use sluice_limiter::{ManualClock, MemoryStore};
use sluice_testkit::http::{curl, json};
use support::Server;

const CONFIG: &str = r#"
[policies.jobs]
rule = "user:2 concurrent lease=30s"

[policies.other]
rule = "user:2 concurrent"

[policies.by_ip]
rule = "ip:1 concurrent"

[policies.tokens]
rule = "user:1000/m"
"#;

/// The service on `CONFIG` over a memory store on a manual clock.
fn start() -> (Server, ManualClock) {
    let clock = ManualClock::new(1_000_000_000_000);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    (Server::start_with(CONFIG, &[], |b| b.store(store)), clock)
}

fn post(server: &Server, path: &str, body: &str) -> (u16, Value) {
    let (status, body) = curl("POST", &format!("{}{path}", server.base), Some(body));
    (status, json(&body))
}

fn acquire(server: &Server, policy: &str, user: &str) -> Value {
    let body = format!(r#"{{"policy":"{policy}","selectors":{{"user":"{user}"}}}}"#);
    let (status, answer) = post(server, "/v1/acquire", &body);
    assert_eq!(status, 200, "{answer}");
    answer
}

fn lease_call(server: &Server, path: &str, policy: &str, token: &str) -> (u16, Value) {
    post(
        server,
        path,
        &format!(r#"{{"policy":"{policy}","lease":"{token}"}}"#),
    )
}

/// The value of one series of `/metrics`.
fn metric(server: &Server, series: &str) -> u64 {
    let (_, text) = curl("GET", &format!("{}/metrics", server.base), None);
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no series {series}"))
}

#[test]
fn leases_are_taken_renewed_and_given_back_over_http() {
    let (server, clock) = start();
    let first = acquire(&server, "jobs", "alice");
    assert_eq!(first["allowed"], true);
    assert_eq!(first["limit"], 2);
    assert_eq!(first["remaining"], 1);
    let token = first["lease"].as_str().expect("a lease token").to_owned();
    let second = acquire(&server, "jobs", "alice");
    assert!(second["lease"].is_string());
    let third = acquire(&server, "jobs", "alice");
    assert_eq!(third["allowed"], false);
    assert_eq!(third["denial"], "occupied");
    assert_eq!(third["lease"], Value::Null);
    assert_eq!(third["retry_after"], 30.0);
    // Another user's slots are their own.
    assert_eq!(acquire(&server, "jobs", "bob")["allowed"], true);

    clock.advance(Duration::from_secs(10));
    let (status, renewed) = lease_call(&server, "/v1/renew", "jobs", &token);
    assert_eq!(status, 200);
    assert_eq!(
        renewed,
        serde_json::json!({"renewed": true, "expires_in": 30.0})
    );

    let (status, released) = lease_call(&server, "/v1/release", "jobs", &token);
    assert_eq!((status, &released["released"]), (200, &"released".into()));
    assert_eq!(acquire(&server, "jobs", "alice")["allowed"], true);
    let (_, again) = lease_call(&server, "/v1/release", "jobs", &token);
    assert_eq!(again["released"], "not_held");
    let (_, renewed) = lease_call(&server, "/v1/renew", "jobs", &token);
    assert_eq!(renewed, serde_json::json!({"renewed": false}));

    // A holder that kept its lease past the lease time: the slot was free, the release
    // says so, and the metrics count it.
    let late = acquire(&server, "jobs", "carol")["lease"]
        .as_str()
        .unwrap()
        .to_owned();
    clock.advance(Duration::from_secs(31));
    let (_, released) = lease_call(&server, "/v1/release", "jobs", &late);
    assert_eq!(released["released"], "expired");

    for (result, count) in [
        ("acquired", 5),
        ("denied", 1),
        ("released", 1),
        ("expired", 2), // the late release, and the renew that found nothing
        ("not_held", 1),
        ("renewed", 1),
    ] {
        let series = format!("sluice_leases_total{{result=\"{result}\"}}");
        assert_eq!(metric(&server, &series), count, "{series}");
    }
    let series = "sluice_decisions_total{policy=\"jobs\",result=\"denied\"}";
    assert_eq!(metric(&server, series), 1);
}

/// `sluice_leases_held{policy}` counts the leases this server granted until it sees them
/// end: released (or found expired) through it. A renew keeps one counted; a denied
/// acquire, a second release and a release of another policy's token change nothing.
#[test]
fn leases_held_counts_what_this_server_granted_until_it_ends() {
    let (server, _clock) = start();
    let held = |policy: &str| {
        let series = format!("sluice_leases_held{{policy=\"{policy}\"}}");
        let (_, text) = curl("GET", &format!("{}/metrics", server.base), None);
        text.lines()
            .find_map(|l| {
                l.strip_prefix(series.as_str())?
                    .strip_prefix(' ')?
                    .parse()
                    .ok()
            })
            .unwrap_or(0u64)
    };
    assert_eq!(held("jobs"), 0);
    let tokens: Vec<String> = ["alice", "alice", "bob"]
        .iter()
        .map(|user| {
            acquire(&server, "jobs", user)["lease"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(acquire(&server, "jobs", "alice")["allowed"], false);
    let other = acquire(&server, "other", "alice")["lease"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!((held("jobs"), held("other")), (3, 1));

    let (status, _) = lease_call(&server, "/v1/renew", "jobs", &tokens[0]);
    assert_eq!(status, 200);
    assert_eq!(held("jobs"), 3);
    let (_, released) = lease_call(&server, "/v1/release", "jobs", &tokens[0]);
    assert_eq!(released["released"], "released");
    assert_eq!(held("jobs"), 2);
    let (_, again) = lease_call(&server, "/v1/release", "jobs", &tokens[0]);
    assert_eq!(again["released"], "not_held");
    assert_eq!(held("jobs"), 2);
    for token in &tokens[1..] {
        lease_call(&server, "/v1/release", "jobs", token);
    }
    assert_eq!((held("jobs"), held("other")), (0, 1));
    lease_call(&server, "/v1/release", "other", &other);
    assert_eq!(held("other"), 0);
}

/// A refused acquire or reservation is a refusal like a check's: it reaches the recent
/// refusals, the heavy hitters and the audit trail.
#[test]
fn refused_acquires_and_reservations_are_audited() {
    let trail =
        std::env::temp_dir().join(format!("sluice-lease-audit-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&trail);
    let config = format!("{CONFIG}\n[audit]\nfile = \"{}\"\n", trail.display());
    let clock = ManualClock::new(1_000_000_000_000);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let server = Server::start_with(&config, &[], |b| b.store(store));
    for _ in 0..2 {
        assert_eq!(acquire(&server, "jobs", "carol")["allowed"], true);
    }
    assert_eq!(acquire(&server, "jobs", "carol")["denial"], "occupied");
    let body = r#"{"policy":"tokens","selectors":{"user":"dave"},"estimate":5000}"#;
    let (status, answer) = post(&server, "/v1/reserve", body);
    assert_eq!(
        (status, answer["allowed"].clone()),
        (200, Value::Bool(false))
    );
    let (_, refusals) = curl("GET", &format!("{}/v1/refusals?n=10", server.base), None);
    let refusals = json(&refusals);
    let listed: Vec<(&str, &str)> = refusals["refusals"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| (r["policy"].as_str().unwrap(), r["denial"].as_str().unwrap()))
        .collect();
    assert!(listed.contains(&("jobs", "occupied")), "{refusals}");
    assert!(
        listed.contains(&("tokens", "cost_exceeds_capacity")),
        "{refusals}"
    );
    let (_, top) = curl("GET", &format!("{}/v1/top?policy=jobs", server.base), None);
    assert_eq!(json(&top)["refusals"], 1, "{top}");
    // The file sink's writer thread gets there soon: wait for the two lines, bounded.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let lines = loop {
        let text = std::fs::read_to_string(&trail).unwrap_or_default();
        if text.lines().count() >= 2 || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let reasons: Vec<String> = lines
        .lines()
        .map(|l| json(l)["reason"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(reasons, ["occupied", "cost_exceeds_capacity"], "{lines}");
    let _ = std::fs::remove_file(&trail);
}

#[test]
fn a_token_releases_only_its_own_lease() {
    let (server, _clock) = start();
    let token = acquire(&server, "jobs", "alice")["lease"]
        .as_str()
        .unwrap()
        .to_owned();
    acquire(&server, "other", "alice");
    // Same selector names, another policy: names no lease there.
    let (status, answer) = lease_call(&server, "/v1/release", "other", &token);
    assert_eq!((status, &answer["released"]), (200, &"not_held".into()));
    // Other selector names: refused as not this policy's.
    let (status, answer) = lease_call(&server, "/v1/release", "by_ip", &token);
    assert_eq!(status, 400);
    let message = answer["error"].as_str().unwrap();
    assert!(
        message.contains("not taken under policy `by_ip`"),
        "{message}"
    );
    // Both `other` slots: one held, one free; `jobs` still held once.
    assert_eq!(acquire(&server, "other", "alice")["remaining"], 0);
    assert_eq!(acquire(&server, "jobs", "alice")["remaining"], 0);
    // The id of one lease with another user's selectors: nothing of alice's is released.
    let (id, _) = token.split_once('.').unwrap();
    let bob = acquire(&server, "jobs", "bob")["lease"]
        .as_str()
        .unwrap()
        .to_owned();
    let (_, selectors) = bob.split_once('.').unwrap();
    let forged = format!("{id}.{selectors}");
    let (_, answer) = lease_call(&server, "/v1/release", "jobs", &forged);
    assert_eq!(answer["released"], "not_held");
    assert_eq!(acquire(&server, "jobs", "alice")["allowed"], false);
}

#[test]
fn reservations_are_charged_their_actual_cost_over_http() {
    let (server, _clock) = start();
    let body = r#"{"policy":"tokens","selectors":{"user":"alice"},"estimate":400}"#;
    let (status, reserved) = post(&server, "/v1/reserve", body);
    assert_eq!(status, 200, "{reserved}");
    assert_eq!(reserved["allowed"], true);
    assert_eq!(reserved["remaining"], 600);
    let token = reserved["reservation"].as_str().unwrap().to_owned();
    // The estimate as `cost`, as /v1/check's body has it: too much for what is left.
    let body = r#"{"policy":"tokens","selectors":{"user":"alice"},"cost":700}"#;
    let (_, refused) = post(&server, "/v1/reserve", body);
    assert_eq!(refused["allowed"], false);
    assert_eq!(refused["reservation"], Value::Null);

    let settle = format!(r#"{{"policy":"tokens","reservation":"{token}","actual":100}}"#);
    let (status, settled) = post(&server, "/v1/settle", &settle);
    assert_eq!(
        (status, settled),
        (200, serde_json::json!({"settled": true}))
    );
    let (_, peek) = post(
        &server,
        "/v1/peek",
        r#"{"policy":"tokens","selectors":{"user":"alice"}}"#,
    );
    assert_eq!(peek["remaining"], 899);
    assert_eq!(
        metric(&server, "sluice_reservations_total{result=\"reserved\"}"),
        1
    );
    assert_eq!(
        metric(&server, "sluice_reservations_total{result=\"denied\"}"),
        1
    );
    assert_eq!(
        metric(&server, "sluice_reservations_total{result=\"settled\"}"),
        1
    );
}

#[test]
fn bad_lease_and_reservation_requests_get_clear_errors() {
    let (server, _clock) = start();
    let held = acquire(&server, "jobs", "alice")["lease"]
        .as_str()
        .unwrap()
        .to_owned();
    let cases: &[(&str, &str, u16, &str)] = &[
        (
            "/v1/check",
            r#"{"policy":"jobs","selectors":{"user":"a"}}"#,
            400,
            "take a lease with `acquire`",
        ),
        (
            "/v1/acquire",
            r#"{"policy":"tokens","selectors":{"user":"a"}}"#,
            400,
            "no concurrency leaf",
        ),
        (
            "/v1/acquire",
            r#"{"policy":"jobs","selectors":{"user":"a"},"cost":2}"#,
            400,
            "one slot",
        ),
        (
            "/v1/acquire",
            r#"{"policy":"jobs","selectors":{"user":"a"},"lease":-5}"#,
            400,
            "unknown field `lease`",
        ),
        (
            "/v1/acquire",
            r#"{"policy":"jobs"}"#,
            400,
            "needs selector `user`",
        ),
        ("/v1/acquire", r#"{"policy":"nope"}"#, 404, "unknown policy"),
        (
            "/v1/release",
            r#"{"policy":"jobs","lease":"garbage"}"#,
            400,
            "is not a lease token",
        ),
        (
            "/v1/release",
            r#"{"policy":"jobs","lease":"00000000000000ff.!!"}"#,
            400,
            "not base64url",
        ),
        (
            "/v1/release",
            r#"{"policy":"jobs"}"#,
            400,
            "missing field `lease`",
        ),
        (
            "/v1/renew",
            r#"{"policy":"jobs","lease":"00000000000000ff","lease_time":-1}"#,
            400,
            "unknown field `lease_time`",
        ),
        (
            "/v1/renew",
            r#"{"policy":"nope","lease":"00000000000000ff"}"#,
            404,
            "unknown policy",
        ),
        (
            "/v1/reserve",
            r#"{"policy":"jobs","selectors":{"user":"a"},"estimate":5}"#,
            400,
            "reservations apply to rate leaves only",
        ),
        (
            "/v1/reserve",
            r#"{"policy":"tokens","selectors":{"user":"a"}}"#,
            400,
            "needs its `estimate`",
        ),
        (
            "/v1/reserve",
            r#"{"policy":"tokens","selectors":{"user":"a"},"estimate":-3}"#,
            400,
            "invalid value",
        ),
        (
            "/v1/settle",
            r#"{"policy":"tokens","reservation":"00000000000000ff.0000000000000005"}"#,
            400,
            "missing field `actual`",
        ),
        (
            "/v1/settle",
            r#"{"policy":"tokens","reservation":"00000000000000ff.0000000000000005","actual":-1}"#,
            400,
            "invalid value",
        ),
        (
            "/v1/settle",
            r#"{"policy":"tokens","reservation":"xyz","actual":1}"#,
            400,
            "is not a reservation token",
        ),
        (
            "/v1/acquire",
            r#"["jobs", {"user": "alice"}]"#,
            400,
            "the body must be a JSON object",
        ),
        (
            "/v1/release",
            " \"jobs\"",
            400,
            "the body must be a JSON object",
        ),
        ("/v1/settle", "", 400, "invalid request"),
    ];
    for (path, body, status, message) in cases {
        let (got, answer) = post(&server, path, body);
        let error = answer["error"].as_str().unwrap_or_default();
        assert_eq!(got, *status, "{path} {body}: {answer}");
        assert!(error.contains(message), "{path} {body}: {error}");
    }
    // None of them changed anything: alice's lease is still held, one slot left.
    assert_eq!(acquire(&server, "jobs", "alice")["remaining"], 0);
    let (_, released) = lease_call(&server, "/v1/release", "jobs", &held);
    assert_eq!(released["released"], "released");
}

#[test]
fn the_redis_protocol_takes_and_gives_back_leases() {
    let (server, clock) = start();
    let cli = |args: &[&str]| server.redis_cli(args);
    let first = cli(&["SLUICE.ACQUIRE", "jobs", "user", "alice"]);
    let lines: Vec<&str> = first.lines().collect();
    assert_eq!(lines[..5], ["0", "2", "1", "-1", "30"], "{first}");
    let token = lines[5].to_owned();
    assert!(token.len() > 17, "{first}");
    cli(&["SLUICE.ACQUIRE", "jobs", "user", "alice"]);
    let full = cli(&["SLUICE.ACQUIRE", "jobs", "user", "alice"]);
    let lines: Vec<&str> = full.lines().collect();
    assert_eq!(lines[..3], ["1", "2", "0"], "{full}");
    assert_eq!(lines[5], "", "{full}"); // nil: no lease

    clock.advance(Duration::from_secs(5));
    assert_eq!(cli(&["SLUICE.RENEW", "jobs", &token]).trim(), "30");
    assert_eq!(cli(&["SLUICE.RELEASE", "jobs", &token]).trim(), "released");
    assert_eq!(cli(&["SLUICE.RELEASE", "jobs", &token]).trim(), "not_held");
    assert_eq!(cli(&["SLUICE.RENEW", "jobs", &token]).trim(), "");

    let reserved = cli(&["SLUICE.RESERVE", "tokens", "400", "user", "bob"]);
    let lines: Vec<&str> = reserved.lines().collect();
    assert_eq!(lines[..3], ["0", "1000", "600"], "{reserved}");
    let token = lines[5];
    assert_eq!(cli(&["SLUICE.SETTLE", "tokens", token, "100"]).trim(), "OK");
    let checked = cli(&["SLUICE.CHECK", "tokens", "0", "user", "bob"]);
    assert_eq!(checked.lines().nth(2), Some("900"), "{checked}");

    for (args, message) in [
        (&["SLUICE.ACQUIRE"][..], "wrong number of arguments"),
        (
            &["SLUICE.ACQUIRE", "jobs", "user"],
            "wrong number of arguments",
        ),
        (
            &["SLUICE.ACQUIRE", "tokens", "user", "a"],
            "no concurrency leaf",
        ),
        (&["SLUICE.ACQUIRE", "nope", "user", "a"], "unknown policy"),
        (&["SLUICE.CHECK", "jobs", "user", "a"], "take a lease"),
        (&["SLUICE.RELEASE", "jobs"], "wrong number of arguments"),
        (
            &["SLUICE.RELEASE", "jobs", "garbage"],
            "is not a lease token",
        ),
        (
            &["SLUICE.RENEW", "jobs", "00000000000000ff.AQ"],
            "cut short",
        ),
        (&["SLUICE.RESERVE", "tokens"], "wrong number of arguments"),
        (
            &["SLUICE.RESERVE", "tokens", "-1", "user", "a"],
            "non-negative",
        ),
        (
            &["SLUICE.RESERVE", "jobs", "1", "user", "a"],
            "rate leaves only",
        ),
        (
            &["SLUICE.SETTLE", "tokens", "x"],
            "wrong number of arguments",
        ),
        (&["SLUICE.SETTLE", "tokens", token, "-5"], "non-negative"),
        (
            &["SLUICE.SETTLE", "tokens", "xyz", "5"],
            "not a reservation token",
        ),
    ] {
        let answer = cli(args);
        assert!(
            answer.starts_with("ERR") && answer.contains(message),
            "{args:?}: {answer}"
        );
    }
    // The settled reservation was not settled again by the refused call.
    let checked = cli(&["SLUICE.CHECK", "tokens", "0", "user", "bob"]);
    assert_eq!(checked.lines().nth(2), Some("900"), "{checked}");
}
