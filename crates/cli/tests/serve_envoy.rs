//! `sluice serve` as a drop-in for envoyproxy/ratelimit and redis-cell: the real binary,
//! driven by clients no one here wrote (Python grpcio with xds-protos stubs, redis-cli,
//! redis-py). `scripts/test.sh` installs them.

mod support;

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use support::{Server, curl, json};

const ENVOY: &str = r#"
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: hour
      requests_per_unit: 3
  - key: remote_address
    rate_limit:
      name: per_ip
      unit: hour
      requests_per_unit: 2
  - key: path
    value: "/api/*"
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: client
    value: vip
    rate_limit:
      unlimited: true
  - key: shadow
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: tenant
    descriptors:
      - key: user
        rate_limit:
          unit: 5 hours
          requests_per_unit: 2
          replaces:
            - name: per_ip
"#;

/// Runs the Python gRPC client on `requests`; one answer per request.
fn envoy(server: &Server, requests: Value) -> Vec<Value> {
    let mut child = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/envoy_client.py"
        ))
        .arg(server.grpc.as_ref().unwrap())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run python3");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(requests.to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "envoy_client.py failed");
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(json)
        .collect()
}

fn one(domain: &str, entries: &[(&str, &str)]) -> Value {
    let entries: Vec<Value> = entries.iter().map(|(k, v)| json!([k, v])).collect();
    json!({ "domain": domain, "descriptors": [{ "entries": entries }] })
}

fn summary(answer: &Value) -> (String, u64) {
    let status = &answer["statuses"][0];
    (
        status["code"].as_str().unwrap().to_owned(),
        status["remaining"].as_u64().unwrap(),
    )
}

#[test]
fn grpc_answers_like_envoyproxy_ratelimit() {
    let server = Server::start_envoy("", &[("config.yaml", ENVOY)], &[]);
    let users = one("mongo_cps", &[("database", "users")]);
    let answers = envoy(&server, json!([users, users, users, users]));
    let got: Vec<(String, u64)> = answers.iter().map(summary).collect();
    assert_eq!(
        got,
        [("OK", 2), ("OK", 1), ("OK", 0), ("OVER_LIMIT", 0)].map(|(c, n)| (c.to_owned(), n))
    );
    for a in &answers {
        let status = &a["statuses"][0];
        assert_eq!(status["limit"], json!([3, "HOUR"]));
        // Fixed windows aligned to the hour, as envoyproxy/ratelimit counts.
        let expected = 3600 - a["now"].as_i64().unwrap() % 3600;
        let reset = status["reset"].as_i64().unwrap();
        assert!(
            (reset - expected).abs() <= 2,
            "reset {reset}, expected {expected}"
        );
    }
    assert_eq!(answers[3]["overall"], "OVER_LIMIT");

    // A key without a value counts per value; wildcards match by prefix; unknown is OK.
    let answers = envoy(
        &server,
        json!([
            one("mongo_cps", &[("remote_address", "10.0.0.1")]),
            one("mongo_cps", &[("remote_address", "10.0.0.1")]),
            one("mongo_cps", &[("remote_address", "10.0.0.1")]),
            one("mongo_cps", &[("remote_address", "10.0.0.2")]),
            one("mongo_cps", &[("path", "/api/a")]),
            one("mongo_cps", &[("path", "/api/a")]),
            one("mongo_cps", &[("path", "/other")]),
            one("mongo_cps", &[("client", "vip")]),
            one("mongo_cps", &[("shadow", "x")]),
            one("mongo_cps", &[("shadow", "x")]),
            one("nowhere", &[("a", "b")]),
        ]),
    );
    let got: Vec<(String, u64)> = answers.iter().map(summary).collect();
    let want = [
        ("OK", 1),
        ("OK", 0),
        ("OVER_LIMIT", 0),
        ("OK", 1),
        ("OK", 0),
        ("OVER_LIMIT", 0),
        ("OK", 0),
        ("OK", u64::from(u32::MAX)),
        ("OK", 0),
        ("OK", 0), // shadow mode: over, but answered OK
    ];
    assert_eq!(&got[..10], want.map(|(c, n)| (c.to_owned(), n)));
    assert_eq!(answers[10]["overall"], "OK");

    // Several descriptors: over when any is; `replaces` drops the per_ip limit; hits_addend
    // 0 on a descriptor only checks; a request override replaces the configured limit.
    let answers = envoy(
        &server,
        json!([
            { "domain": "mongo_cps", "descriptors": [
                { "entries": [["remote_address", "10.0.0.9"]] },
                { "entries": [["tenant", "t1"], ["user", "u1"]], "hits_addend": 2 }
            ]},
            { "domain": "mongo_cps", "descriptors": [
                { "entries": [["tenant", "t1"], ["user", "u1"]], "hits_addend": 0 }
            ]},
            { "domain": "mongo_cps", "hits_addend": 3, "descriptors": [
                { "entries": [["database", "other"]], "limit": [5, "MINUTE"] }
            ]},
            { "domain": "mongo_cps", "hits_addend": 3, "descriptors": [
                { "entries": [["database", "other"]], "limit": [5, "MINUTE"] }
            ]},
        ]),
    );
    let first = &answers[0]["statuses"];
    assert_eq!(first[0]["code"], "OK");
    assert!(first[0].get("limit").is_none(), "replaced: {first}");
    assert_eq!(
        (first[1]["code"].as_str(), first[1]["remaining"].as_u64()),
        (Some("OK"), Some(0))
    );
    assert_eq!(first[1]["limit"], json!([2, "HOUR"]));
    assert_eq!(summary(&answers[1]), ("OK".to_owned(), 0));
    assert_eq!(summary(&answers[2]), ("OK".to_owned(), 2));
    assert_eq!(answers[2]["statuses"][0]["limit"], json!([5, "MINUTE"]));
    assert_eq!(summary(&answers[3]), ("OVER_LIMIT".to_owned(), 0));

    // Malformed requests are refused, not crashed on.
    let answers = envoy(&server, json!([{ "domain": "", "descriptors": [] }]));
    assert_eq!(answers[0]["error"], "INVALID_ARGUMENT");
}

#[test]
fn json_endpoint_metrics_and_readiness() {
    let server = Server::start_envoy(
        "[policies.api]\nrule = \"user:2/h\"\n",
        &[("config.yaml", ENVOY)],
        &["--envoy-headers"],
    );
    let check = r#"{"policy":"api","selectors":{"user":"u1"}}"#;
    assert_eq!(
        curl("POST", &format!("{}/v1/check", server.base), Some(check)).0,
        200
    );
    let body =
        r#"{"domain":"mongo_cps","descriptors":[{"entries":[{"key":"path","value":"/api/x"}]}]}"#;
    let url = format!("{}/json", server.base);
    let (status, answer) = curl("POST", &url, Some(body));
    let answer = json(&answer);
    assert_eq!((status, answer["overallCode"].as_str()), (200, Some("OK")));
    assert_eq!(answer["statuses"][0]["currentLimit"]["requestsPerUnit"], 1);
    let (status, answer) = curl("POST", &url, Some(body));
    assert_eq!(status, 429, "{answer}");
    let headers = &json(&answer)["responseHeadersToAdd"];
    assert!(
        headers.to_string().contains("X-RateLimit-Remaining"),
        "{headers}"
    );
    let (status, _) = curl("POST", &url, Some("{not json"));
    assert_eq!(status, 400);

    let (status, text) = curl("GET", &format!("{}/metrics", server.base), None);
    assert_eq!(status, 200);
    assert!(
        text.contains(
            r#"sluice_decisions_total{policy="envoy.mongo_cps.path=/api/*",result="denied"} 1"#
        ),
        "{text}"
    );
    assert!(text.contains("sluice_identifiers "), "{text}");
    assert!(
        text.contains(r#"sluice_decisions_total{policy="api",result="allowed"} 1"#),
        "{text}"
    );
    assert_eq!(curl("GET", &format!("{}/ready", server.base), None).0, 200);
    assert_eq!(curl("GET", &format!("{}/live", server.base), None).0, 200);
}

fn redis_cli(server: &Server, args: &[&str]) -> String {
    let (host, port) = server.resp.as_ref().unwrap().rsplit_once(':').unwrap();
    let output = Command::new("redis-cli")
        .args(["-h", host, "-p", port])
        .args(args)
        .output()
        .expect("run redis-cli");
    String::from_utf8(output.stdout).unwrap()
}

#[test]
fn redis_cli_and_redis_py_speak_cl_throttle() {
    let server = Server::start_envoy("[policies.api]\nrule = \"user:2/h\"\n", &[], &[]);
    assert_eq!(redis_cli(&server, &["PING"]).trim(), "PONG");
    // redis-cell's README: the first call on a fresh key.
    let first = redis_cli(&server, &["CL.THROTTLE", "user123", "15", "30", "60", "1"]);
    assert_eq!(
        first.split_whitespace().collect::<Vec<_>>(),
        ["0", "16", "15", "-1", "2"]
    );
    // A burst of 16 is spent by 15 more; the 17th waits one emission interval (2 s).
    let mut last = String::new();
    for _ in 0..16 {
        last = redis_cli(&server, &["CL.THROTTLE", "user123", "15", "30", "60"]);
    }
    let last: Vec<i64> = last
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(&last[..3], [1, 16, 0]);
    assert!((1..=2).contains(&last[3]), "retry_after {last:?}");
    assert!((31..=32).contains(&last[4]), "reset_after {last:?}");
    // Quantity 0 peeks; unknown commands are errors, not dropped connections.
    let peek = redis_cli(&server, &["CL.THROTTLE", "fresh", "0", "1", "10", "0"]);
    assert_eq!(
        peek.split_whitespace().collect::<Vec<_>>(),
        ["0", "1", "1", "-1", "0"]
    );
    assert!(redis_cli(&server, &["NOSUCH", "x"]).contains("unknown command"));
    assert!(redis_cli(&server, &["CL.THROTTLE", "k", "x", "1", "1"]).contains("ERR"));

    let (host, port) = server.resp.as_ref().unwrap().rsplit_once(':').unwrap();
    let script = r#"
import sys, redis
r = redis.Redis(host=sys.argv[1], port=int(sys.argv[2]))
assert r.ping()
print(r.execute_command("CL.THROTTLE", "py", 1, 10, 60))
print(r.execute_command("SLUICE.CHECK", "api", "user", "alice"))
print(r.execute_command("SLUICE.CHECK", "api", "user", "alice"))
print(r.execute_command("SLUICE.CHECK", "api", "user", "alice"))
try:
    r.execute_command("NOPE")
except redis.ResponseError as e:
    print("error", e)
print(r.ping())
pipe = r.pipeline(transaction=False)
for _ in range(3):
    pipe.execute_command("CL.THROTTLE", "pipe", 0, 1, 60)
print([x[0] for x in pipe.execute()])
"#;
    let output = Command::new("python3")
        .args(["-c", script, host, port])
        .output()
        .expect("run python3");
    let text = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(lines[0], "[0, 2, 1, -1, 6]");
    assert!(lines[1].starts_with("[0, 2, 1, -1,"), "{text}");
    assert!(lines[2].starts_with("[0, 2, 0, -1,"), "{text}");
    assert!(lines[3].starts_with("[1, 2, 0,"), "{text}");
    assert!(lines[4].contains("unknown command"), "{text}");
    assert_eq!(lines[5], "True");
    assert_eq!(lines[6], "[0, 1, 1]");
}

#[test]
fn reload_keeps_counters_and_rejects_bad_configs() {
    let server = Server::start_envoy("", &[("config.yaml", ENVOY)], &[]);
    let users = one("mongo_cps", &[("database", "users")]);
    let answers = envoy(&server, json!([users, users]));
    assert_eq!(summary(&answers[1]), ("OK".to_owned(), 1));
    let pid = server_pid(&server);
    let file = server.dir.join("envoy/config.yaml");

    // A broken file: the old config keeps serving, with its counters.
    std::fs::write(&file, "domain: [unclosed").unwrap();
    hangup(&server, &pid);
    let answers = envoy(&server, json!([users]));
    assert_eq!(summary(&answers[0]), ("OK".to_owned(), 0));
    let (_, metrics) = curl("GET", &format!("{}/metrics", server.base), None);
    assert!(
        metrics.contains(r#"sluice_config_reloads_total{result="failed"} 1"#),
        "{metrics}"
    );

    // A good file: new limits apply; unchanged leaves keep counting where they were.
    std::fs::write(
        &file,
        ENVOY.replace("requests_per_unit: 2\n", "requests_per_unit: 7\n"),
    )
    .unwrap();
    hangup(&server, &pid);
    let answers = envoy(
        &server,
        json!([users, one("mongo_cps", &[("remote_address", "1.1.1.1")])]),
    );
    assert_eq!(summary(&answers[0]), ("OVER_LIMIT".to_owned(), 0));
    assert_eq!(summary(&answers[1]), ("OK".to_owned(), 6));
}

fn server_pid(server: &Server) -> String {
    // The HTTP port is unique to this server; find the process listening on it.
    let (_, body) = curl("GET", &format!("{}/live", server.base), None);
    assert_eq!(body.trim(), "ok");
    server.pid().to_string()
}

/// Config reloads the server has attempted (succeeded or failed), from `/metrics`.
fn reloads(server: &Server) -> u64 {
    let (_, metrics) = curl("GET", &format!("{}/metrics", server.base), None);
    metrics
        .lines()
        .filter(|l| l.starts_with("sluice_config_reloads_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Sends SIGHUP and waits until the server has attempted one more reload than before, so
/// what follows sees the file written before the call (or its rejection).
fn hangup(server: &Server, pid: &str) {
    let before = reloads(server);
    hangup_for(pid, 0);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while reloads(server) <= before {
        assert!(
            std::time::Instant::now() < deadline,
            "no reload after SIGHUP"
        );
    }
}

fn hangup_for(pid: &str, pause_ms: u64) {
    assert!(
        Command::new("kill")
            .args(["-HUP", pid])
            .status()
            .unwrap()
            .success()
    );
    // Under load, space the reloads out (the caller waits on nothing else).
    if pause_ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(pause_ms));
    }
}

const UNDER_LOAD: &str = r#"
domain: load
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 100 }
  - key: other
    rate_limit: { unit: hour, requests_per_unit: 5 }
"#;

/// Four clients over RESP and four over gRPC, 50 hits each on one 100/hour limit per
/// protocol, while the config is rewritten and reloaded every 20 ms: no request fails and
/// exactly 100 are admitted on each, so no counter was lost.
#[test]
fn reload_under_load_loses_no_decision() {
    let server = Server::start_envoy(
        "[policies.api]\nrule = \"user:100/h\"\n",
        &[("load.yaml", UNDER_LOAD)],
        &[],
    );
    let (host, port) = server.resp.as_ref().unwrap().rsplit_once(':').unwrap();
    let script = r#"
import json, sys, threading, grpc, redis
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
host, port, target = sys.argv[1], int(sys.argv[2]), sys.argv[3]
counts = {"resp": 0, "grpc": 0, "errors": []}
lock = threading.Lock()
def resp():
    r = redis.Redis(host=host, port=port)
    for _ in range(50):
        try:
            reply = r.execute_command("SLUICE.CHECK", "api", "user", "u1")
            with lock: counts["resp"] += 1 - reply[0]
        except Exception as e:
            with lock: counts["errors"].append(repr(e))
def rpc():
    stub = rls_pb2_grpc.RateLimitServiceStub(grpc.insecure_channel(target))
    request = rls_pb2.RateLimitRequest(domain="load")
    request.descriptors.add().entries.add(key="user", value="u1")
    for _ in range(50):
        try:
            answer = stub.ShouldRateLimit(request, timeout=60)
            with lock: counts["grpc"] += answer.overall_code == rls_pb2.RateLimitResponse.OK
        except Exception as e:
            with lock: counts["errors"].append(repr(e))
threads = [threading.Thread(target=f) for f in [resp] * 4 + [rpc] * 4]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(counts))
"#;
    let client = Command::new("python3")
        .args(["-c", script, host, port, server.grpc.as_ref().unwrap()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run python3");
    let pid = server.pid().to_string();
    let toml = server.dir.join("policies.toml");
    let yaml = server.dir.join("envoy/load.yaml");
    for i in 0..40 {
        // Alternate an unrelated change, so each reload swaps the policy tables.
        let n = 5 + i % 2;
        std::fs::write(
            &yaml,
            UNDER_LOAD.replace("requests_per_unit: 5", &format!("requests_per_unit: {n}")),
        )
        .unwrap();
        std::fs::write(
            &toml,
            format!("[policies.api]\nrule = \"user:100/h\"\n[policies.x]\nrule = \"{n}/h\"\n"),
        )
        .unwrap();
        hangup_for(&pid, 20);
    }
    let output = client.wait_with_output().unwrap();
    let counts = json(std::str::from_utf8(&output.stdout).unwrap());
    assert_eq!(counts["errors"], json!([]), "{counts}");
    assert_eq!(
        (counts["resp"].as_u64(), counts["grpc"].as_u64()),
        (Some(100), Some(100)),
        "{counts}"
    );
    let (_, metrics) = curl("GET", &format!("{}/metrics", server.base), None);
    assert!(
        !metrics.contains(r#"sluice_config_reloads_total{result="ok"} 0"#),
        "{metrics}"
    );
}
