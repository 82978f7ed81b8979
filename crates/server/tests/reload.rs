//! Config reload in process, as SIGHUP or a changed file triggers it: counters kept, bad
//! configs rejected, nothing lost or failed under load, and a policy removed while checks
//! of it are in flight answers each of them.

mod support;

use std::process::{Command, Stdio};

use serde_json::json;
use sluice_testkit::http::{curl, json};
use support::{ENVOY, Server, envoy, one, summary};

#[test]
fn reload_keeps_counters_and_rejects_bad_configs() {
    let server = Server::start_with("", &[("config.yaml", ENVOY)], |b| b);
    let users = one("mongo_cps", &[("database", "users")]);
    let answers = envoy(&server, json!([users, users]));
    assert_eq!(summary(&answers[1]), ("OK".to_owned(), 1));
    let file = server.dir.join("envoy/config.yaml");

    // A broken file: the old config keeps serving, with its counters.
    std::fs::write(&file, "domain: [unclosed").unwrap();
    assert!(!server.reload(), "a broken file is rejected");
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
    assert!(server.reload());
    let answers = envoy(
        &server,
        json!([users, one("mongo_cps", &[("remote_address", "1.1.1.1")])]),
    );
    assert_eq!(summary(&answers[0]), ("OVER_LIMIT".to_owned(), 0));
    assert_eq!(summary(&answers[1]), ("OK".to_owned(), 6));
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
/// protocol, while the config is rewritten and reloaded for as long as they run: no request
/// fails and exactly 100 are admitted on each, so no counter was lost.
#[test]
fn reload_under_load_loses_no_decision() {
    let server = Server::start_with(
        "[policies.api]\nrule = \"user:100/h\"\n",
        &[("load.yaml", UNDER_LOAD)],
        |b| b,
    );
    let (host, port) = server.resp.rsplit_once(':').unwrap();
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
    let mut client = Command::new("python3")
        .args(["-c", script, host, port, &server.grpc])
        .stdout(Stdio::piped())
        .spawn()
        .expect("run python3");
    let toml = server.dir.join("policies.toml");
    let yaml = server.dir.join("envoy/load.yaml");
    let mut reloads = 0;
    for i in 0.. {
        // Reload for as long as the clients run (and at least twice).
        if i >= 2 && client.try_wait().unwrap().is_some() {
            break;
        }
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
        assert!(server.reload());
        reloads += 1;
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
    let line = format!(r#"sluice_config_reloads_total{{result="ok"}} {reloads}"#);
    assert!(metrics.contains(&line), "{metrics}");
}

/// Clients check a policy while reloads remove it and bring it back: every check is
/// answered, with a decision or a clear 404, and none finds the service broken (the
/// answer to a check once looked its policy up again after deciding, and panicked when a
/// reload had removed it in between).
#[test]
fn a_policy_removed_while_checks_are_in_flight_answers_each() {
    const WITH: &str =
        "[policies.api]\nrule = \"user:1000000/h\"\n[policies.other]\nrule = \"1/s\"\n";
    const WITHOUT: &str = "[policies.other]\nrule = \"1/s\"\n";
    let server = Server::start(WITH);
    let (clients, per_client) = (8, 100);
    let body = r#"{"policy":"api","selectors":{"user":"u1"}}"#;
    let url = format!("{}/v1/check", server.base);
    let mut children: Vec<_> = (0..clients)
        .map(|_| {
            let mut command = Command::new("curl");
            command.args(["-s", "-H", "content-type: application/json"]);
            for i in 0..per_client {
                if i > 0 {
                    command.arg("--next");
                }
                command.args(["--data-binary", body, &url, "-w", "\n%{http_code}\n"]);
            }
            command.stdout(Stdio::piped()).spawn().expect("run curl")
        })
        .collect();
    let file = server.dir.join("policies.toml");
    for i in 0.. {
        if i >= 2 && children.iter_mut().all(|c| c.try_wait().unwrap().is_some()) {
            break;
        }
        std::fs::write(&file, if i % 2 == 0 { WITHOUT } else { WITH }).unwrap();
        assert!(server.reload());
    }
    let (mut decided, mut unknown) = (0, 0);
    for child in children {
        let output = child.wait_with_output().unwrap();
        let text = String::from_utf8(output.stdout).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2 * per_client, "every check answered: {text}");
        for pair in lines.chunks(2) {
            let answer = json(pair[0]);
            match pair[1] {
                "200" => {
                    assert!(answer["allowed"].is_boolean(), "{answer}");
                    assert_eq!(answer["policy"], "api");
                    decided += 1;
                }
                "404" => {
                    assert_eq!(answer["error"], "unknown policy `api`");
                    unknown += 1;
                }
                other => panic!("status {other}: {answer}"),
            }
        }
    }
    assert_eq!(decided + unknown, clients * per_client);
    assert!(
        decided > 0 && unknown > 0,
        "{decided} decided, {unknown} unknown"
    );
}
