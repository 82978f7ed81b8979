//! The policy API (`/v1/...`) of the service, started in process and driven by curl.

mod support;

use serde_json::Value;
use sluice_testkit::http::{curl, flood, json};
use support::Server;

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
        let (admitted, _) = flood(&[&server.base], 50, policy, 4);
        assert_eq!(admitted, 100, "policy {policy}");
    }
    // GCRA refills one hit per 0.6 s: exactly 100 from the full bucket, plus at most what
    // refilled while the flood ran.
    let (admitted, seconds) = flood(&[&server.base], 50, "bucket", 4);
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

    assert!(server.terminate(), "shuts down cleanly");
}
