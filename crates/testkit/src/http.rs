//! The service's HTTP API driven with curl, as a user would.

use std::process::{Child, Command, Stdio};
use std::time::Instant;

use serde_json::Value;

/// One curl call: (status, body). A body is sent as JSON.
pub fn curl(method: &str, url: &str, body: Option<&str>) -> (u16, String) {
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

/// `body` as JSON; panics with the body when it is not.
pub fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// `clients` concurrent curl processes, spread round-robin over `bases` (HTTP base URLs),
/// each sending `per_client` checks of `policy` for user `u1` over one connection; returns
/// the number admitted and the seconds the flood took. Every answer must be a decision.
pub fn flood(bases: &[&str], clients: usize, policy: &str, per_client: usize) -> (usize, f64) {
    let body = format!(r#"{{"policy":"{policy}","selectors":{{"user":"u1"}}}}"#);
    let started = Instant::now();
    let children: Vec<Child> = (0..clients)
        .map(|i| {
            let base = bases[i % bases.len()];
            let url = format!("{base}/v1/check");
            let mut command = Command::new("curl");
            command.args(["-s", "-H", "content-type: application/json"]);
            for _ in 0..per_client {
                command.args(["--data-binary", &body, &url, "-w", "\n"]);
                command.arg("--next");
            }
            command.args(["-s", "-o", "/dev/null", &format!("{base}/health")]);
            command.stdout(Stdio::piped()).spawn().expect("run curl")
        })
        .collect();
    let mut admitted = 0;
    let mut answered = 0;
    for child in children {
        let output = child.wait_with_output().unwrap();
        for line in String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .filter(|l| !l.is_empty())
        {
            answered += 1;
            let decision = json(line);
            assert!(decision.get("error").is_none(), "{line}");
            if decision["allowed"] == Value::Bool(true) {
                admitted += 1;
            }
        }
    }
    assert_eq!(answered, clients * per_client, "every request answered");
    (admitted, started.elapsed().as_secs_f64())
}
