//! `sluice serve` as a user runs it: the real binary, driven by curl.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use serde_json::Value;

/// A running `sluice serve`, stopped (SIGTERM, then reaped) on drop.
struct Server {
    child: Child,
    base: String,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Server {
    fn start(config: &str) -> Server {
        let dir = std::env::temp_dir().join(format!(
            "sluice-serve-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("policies.toml");
        std::fs::write(&path, config).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start sluice");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let base = line
            .trim()
            .strip_prefix("sluice listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Server {
            child,
            base,
            _dir: TempDir(dir),
        }
    }

    /// Stops the server with SIGTERM and returns whether it exited cleanly.
    fn terminate(&mut self) -> bool {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        self.child.wait().unwrap().success()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// One curl call: (status, body).
fn curl(method: &str, url: &str, body: Option<&str>) -> (u16, String) {
    let mut command = Command::new("curl");
    command.args(["-s", "-X", method, "-w", "\n%{http_code}", url]);
    if let Some(body) = body {
        command.args([
            "-H",
            "content-type: application/json",
            "--data-binary",
            body,
        ]);
    }
    let output = command.output().expect("run curl");
    let text = String::from_utf8(output.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.parse().unwrap(), body.to_owned())
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// 50 concurrent curl processes, each sending `per_client` checks in one connection;
/// returns the number admitted and the seconds the flood took.
fn flood(server: &Server, policy: &str, per_client: usize) -> (usize, f64) {
    let url = format!("{}/v1/check", server.base);
    let body = format!(r#"{{"policy":"{policy}","selectors":{{"user":"u1"}}}}"#);
    let started = Instant::now();
    let clients: Vec<Child> = (0..50)
        .map(|_| {
            let mut command = Command::new("curl");
            command.args(["-s", "-H", "content-type: application/json"]);
            for _ in 0..per_client {
                command.args(["--data-binary", &body, &url, "-w", "\n"]);
                command.arg("--next");
            }
            command.args(["-s", "-o", "/dev/null", &format!("{}/health", server.base)]);
            command.stdout(Stdio::piped()).spawn().expect("run curl")
        })
        .collect();
    let mut admitted = 0;
    let mut answered = 0;
    for client in clients {
        let output = client.wait_with_output().unwrap();
        for line in String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .filter(|l| !l.is_empty())
        {
            answered += 1;
            if json(line)["allowed"] == Value::Bool(true) {
                admitted += 1;
            }
        }
    }
    assert_eq!(answered, 50 * per_client, "every request answered");
    (admitted, started.elapsed().as_secs_f64())
}

const CONFIG: &str = r#"
[policies.log]
rule = "user:100/m"
algorithm = "sliding-log"

[policies.window]
rule = "user:100/m"
algorithm = "sliding-window"

[policies.bucket]
rule = "user:100/m"

[policies.compound]
rule = "or(user:100/m, 1000/h)"
algorithm = "sliding-log"

[policies.login]
rule = "ip:3/m"
penalty = { base = "30s", factor = 2, max = "10m", forget_after = "1h" }
"#;

#[test]
fn fifty_concurrent_clients_get_exactly_the_limit() {
    let server = Server::start(CONFIG);
    for policy in ["log", "window", "compound"] {
        let (admitted, _) = flood(&server, policy, 4);
        assert_eq!(admitted, 100, "policy {policy}");
    }
    // GCRA refills one hit per 0.6 s: exactly 100 from the full bucket, plus at most what
    // refilled while the flood ran.
    let (admitted, seconds) = flood(&server, "bucket", 4);
    let refill = (seconds / 0.6).floor() as usize + 1;
    assert!(
        (100..=100 + refill).contains(&admitted),
        "admitted {admitted} in {seconds:.2}s"
    );
}

#[test]
fn answers_and_rejects_like_the_docs_say() {
    let mut server = Server::start(CONFIG);
    let check = format!("{}/v1/check", server.base);

    let (status, body) = curl("GET", &format!("{}/health", server.base), None);
    assert_eq!((status, json(&body)["status"].as_str()), (200, Some("ok")));

    let (status, body) = curl(
        "POST",
        &check,
        Some(r#"{"policy":"login","selectors":{"ip":"10.1.1.1"}}"#),
    );
    let decision = json(&body);
    assert_eq!(status, 200);
    assert_eq!(decision["allowed"], true);
    assert_eq!(decision["limit"], 3);
    assert_eq!(decision["remaining"], 2);
    assert_eq!(decision["retry_after"], Value::Null);
    assert_eq!(decision["reset_after"], 20.0);

    for _ in 0..2 {
        curl(
            "POST",
            &check,
            Some(r#"{"policy":"login","selectors":{"ip":"10.1.1.1"}}"#),
        );
    }
    let (_, body) = curl(
        "POST",
        &check,
        Some(r#"{"policy":"login","selectors":{"ip":"10.1.1.1"}}"#),
    );
    let denied = json(&body);
    assert_eq!(denied["allowed"], false);
    assert_eq!(denied["denial"], "penalized", "{denied}");
    assert_eq!(denied["retry_after"], 30.0);

    // Peek sees the box without adding a strike (a second strike would say 60 s); the real
    // clock moved a little since, so the wait is just under 30 s. Reset pardons.
    let (_, body) = curl(
        "POST",
        &format!("{}/v1/peek", server.base),
        Some(r#"{"policy":"login","selectors":{"ip":"10.1.1.1"}}"#),
    );
    let wait = json(&body)["retry_after"].as_f64().unwrap();
    assert!(wait > 25.0 && wait <= 30.0, "{body}");
    let (status, _) = curl(
        "POST",
        &format!("{}/v1/reset", server.base),
        Some(r#"{"policy":"login","selectors":{"ip":"10.1.1.1"}}"#),
    );
    assert_eq!(status, 200);
    let (_, body) = curl(
        "POST",
        &check,
        Some(r#"{"policy":"login","selectors":{"ip":"10.1.1.1"}}"#),
    );
    assert_eq!(json(&body)["remaining"], 2);

    let cost_too_high = r#"{"policy":"login","selectors":{"ip":"10.9.9.9"},"cost":4}"#;
    let (_, body) = curl("POST", &check, Some(cost_too_high));
    let never = json(&body);
    assert_eq!(
        (never["allowed"].clone(), never["denial"].clone()),
        (Value::Bool(false), "cost_exceeds_capacity".into())
    );
    assert_eq!(never["retry_after"], Value::Null);

    for (body, want) in [
        ("not json", 400),
        (r#"{"policy":"nope"}"#, 404),
        (r#"{"policy":"login"}"#, 400),
        (
            r#"{"policy":"login","selectors":{"ip":"1"},"cost":-1}"#,
            400,
        ),
        (
            r#"{"policy":"login","selectors":{"ip":"1"},"cost":1.5}"#,
            400,
        ),
        (r#"{"policy":"login","selectors":{"ip":7}}"#, 400),
        (
            r#"{"policy":"login","selectors":{"ip":"1"},"extra":1}"#,
            400,
        ),
        (r#"{"selectors":{"ip":"1"}}"#, 400),
    ] {
        let (status, text) = curl("POST", &check, Some(body));
        assert_eq!(status, want, "{body} -> {text}");
        assert!(json(&text)["error"].is_string(), "{text}");
    }
    let huge = format!(
        r#"{{"policy":"login","selectors":{{"ip":"{}"}}}}"#,
        "x".repeat(100_000)
    );
    assert_eq!(curl("POST", &check, Some(&huge)).0, 413);
    // Nothing malformed was counted: 10.1.1.1 still has the 1 hit made after the reset.
    let (_, body) = curl(
        "POST",
        &format!("{}/v1/peek", server.base),
        Some(r#"{"policy":"login","selectors":{"ip":"10.1.1.1"}}"#),
    );
    assert_eq!(json(&body)["remaining"], 1);

    let (status, body) = curl("GET", &format!("{}/v1/policies", server.base), None);
    assert_eq!(status, 200);
    let names: Vec<String> = json(&body)["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["bucket", "compound", "log", "login", "window"]);

    assert!(server.terminate(), "SIGTERM shuts down cleanly");
}

#[test]
fn bad_config_is_refused_with_its_place() {
    let dir = std::env::temp_dir().join(format!("sluice-validate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(
        &path,
        "[policies.api]\nrule = \"10/s\"\n\n[policies.web]\nrule = \"0/s\"\n",
    )
    .unwrap();
    for args in [
        vec!["validate", "--config"],
        vec!["serve", "--listen", "127.0.0.1:0", "--config"],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(&args)
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(
            stderr.contains("bad.toml:5:9: policies.web.rule: expected a count"),
            "{stderr}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
