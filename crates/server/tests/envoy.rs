//! The service as a drop-in for envoyproxy/ratelimit and redis-cell, started in process and
//! driven by clients no one here wrote (Python grpcio with xds-protos stubs, redis-cli,
//! redis-py). `scripts/test.sh` installs them. Also config reload, as SIGHUP triggers it.

mod support;

use std::process::Command;

use serde_json::json;
use sluice_testkit::http::{curl, json};
use support::{ENVOY, Server, envoy, one, request, summary};

#[test]
fn grpc_answers_like_envoyproxy_ratelimit() {
    let server = Server::start_with("", &[("config.yaml", ENVOY)], |b| b);
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
    let server = Server::start_with(
        "[policies.api]\nrule = \"user:2/h\"\n",
        &[("config.yaml", ENVOY)],
        |b| b.envoy_headers(true),
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

#[test]
fn redis_cli_and_redis_py_speak_cl_throttle() {
    let server = Server::start_with("[policies.api]\nrule = \"user:2/h\"\n", &[], |b| b);
    assert_eq!(server.redis_cli(&["PING"]).trim(), "PONG");
    // redis-cell's README: the first call on a fresh key.
    let first = server.redis_cli(&["CL.THROTTLE", "user123", "15", "30", "60", "1"]);
    assert_eq!(
        first.split_whitespace().collect::<Vec<_>>(),
        ["0", "16", "15", "-1", "2"]
    );
    // A burst of 16 is spent by 15 more; the 17th waits one emission interval (2 s).
    let mut last = String::new();
    for _ in 0..16 {
        last = server.redis_cli(&["CL.THROTTLE", "user123", "15", "30", "60"]);
    }
    let last: Vec<i64> = last
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert_eq!(&last[..3], [1, 16, 0]);
    assert!((1..=2).contains(&last[3]), "retry_after {last:?}");
    assert!((31..=32).contains(&last[4]), "reset_after {last:?}");
    // Quantity 0 peeks; unknown commands are errors, not dropped connections.
    let peek = server.redis_cli(&["CL.THROTTLE", "fresh", "0", "1", "10", "0"]);
    assert_eq!(
        peek.split_whitespace().collect::<Vec<_>>(),
        ["0", "1", "1", "-1", "0"]
    );
    assert!(
        server
            .redis_cli(&["NOSUCH", "x"])
            .contains("unknown command")
    );
    assert!(
        server
            .redis_cli(&["CL.THROTTLE", "k", "x", "1", "1"])
            .contains("ERR")
    );

    let (host, port) = server.resp.rsplit_once(':').unwrap();
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

const QUOTAS: &str = r#"
domain: quotas
descriptors:
  - key: tenant
    quota_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: region
    quota_mode: true
    metadata: { team: payments, tier: [gold] }
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 1 }
"#;

/// `quota_mode`, as envoyproxy/ratelimit's service tests state it: a quota descriptor over
/// its limit is OVER_LIMIT in its own status, but the answer is OVER_LIMIT only when every
/// quota descriptor of the request is over (or any descriptor not in quota mode is).
/// `metadata` loads.
#[test]
fn quota_descriptors_deny_only_when_all_are_over() {
    let server = Server::start_with("", &[("quotas.yaml", QUOTAS)], |b| b);
    let request = |entries: &[(&str, &str)]| request("quotas", entries);
    let codes = |answer: &serde_json::Value| -> (String, Vec<String>) {
        let statuses = answer["statuses"].as_array().unwrap();
        (
            answer["overall"].as_str().unwrap().to_owned(),
            statuses
                .iter()
                .map(|s| s["code"].as_str().unwrap().to_owned())
                .collect(),
        )
    };
    let answers = envoy(
        &server,
        json!([
            request(&[("tenant", "a"), ("region", "eu")]),
            // tenant a is over, region us is not: OK overall.
            request(&[("tenant", "a"), ("region", "us")]),
            // Both quota descriptors over: OVER_LIMIT.
            request(&[("tenant", "a"), ("region", "eu")]),
            // A descriptor outside quota mode over: OVER_LIMIT whatever the quotas say.
            request(&[("user", "u")]),
            request(&[("tenant", "b"), ("user", "u")]),
        ]),
    );
    let got: Vec<_> = answers.iter().map(codes).collect();
    let s = |x: &str| x.to_owned();
    assert_eq!(got[0], (s("OK"), vec![s("OK"), s("OK")]));
    assert_eq!(got[1], (s("OK"), vec![s("OVER_LIMIT"), s("OK")]));
    assert_eq!(
        got[2],
        (s("OVER_LIMIT"), vec![s("OVER_LIMIT"), s("OVER_LIMIT")])
    );
    assert_eq!(got[3], (s("OK"), vec![s("OK")]));
    assert_eq!(got[4], (s("OVER_LIMIT"), vec![s("OK"), s("OVER_LIMIT")]));
}

const SHARED: &str = r#"
domain: shared
descriptors:
  - key: path
    value: /files/*
    share_threshold: true
    rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: path
    value: /pages/*
    rate_limit: { unit: hour, requests_per_unit: 2 }
"#;

/// `share_threshold` on a wildcard: every value it matches counts on one counter; without
/// it, each value counts apart.
#[test]
fn share_threshold_makes_a_wildcard_one_counter() {
    let server = Server::start_with("", &[("shared.yaml", SHARED)], |b| b);
    let answers = envoy(
        &server,
        json!([
            one("shared", &[("path", "/files/a")]),
            one("shared", &[("path", "/files/b")]),
            one("shared", &[("path", "/files/c")]),
            one("shared", &[("path", "/pages/a")]),
            one("shared", &[("path", "/pages/b")]),
            one("shared", &[("path", "/pages/c")]),
        ]),
    );
    let got: Vec<(String, u64)> = answers.iter().map(summary).collect();
    let want = [
        ("OK", 1),
        ("OK", 0),
        ("OVER_LIMIT", 0),
        ("OK", 1),
        ("OK", 1),
        ("OK", 1),
    ]
    .map(|(c, n)| (c.to_owned(), n));
    assert_eq!(got, want);
}

const FIVE: &str = r#"
domain: five
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: smooth
    rate_limit: { unit: hour, requests_per_unit: 5, algorithm: gcra }
"#;

/// As envoyproxy/ratelimit counts: a request asking more than the whole limit is over, and
/// its hits still count, so the next single hit is over too (fixed window, the default).
/// A sluice algorithm named in the config keeps sluice's rule: a hit that can never pass
/// records nothing.
#[test]
fn a_request_over_the_whole_limit_still_counts() {
    let server = Server::start_with("", &[("five.yaml", FIVE)], |b| b);
    let request = |key: &str, user: &str, hits: u32| {
        json!({ "domain": "five", "hits_addend": hits,
                "descriptors": [{ "entries": [[key, user]] }] })
    };
    let answers = envoy(
        &server,
        json!([
            request("user", "fresh", 6),
            request("user", "fresh", 1),
            request("user", "partly", 2),
            request("user", "partly", 6),
            request("user", "partly", 1),
            request("smooth", "s", 6),
            request("smooth", "s", 1),
        ]),
    );
    let got: Vec<(String, u64)> = answers.iter().map(summary).collect();
    let want = [
        ("OVER_LIMIT", 0),
        ("OVER_LIMIT", 0),
        ("OK", 3),
        ("OVER_LIMIT", 0),
        ("OVER_LIMIT", 0),
        ("OVER_LIMIT", 0),
        ("OK", 4),
    ]
    .map(|(c, n)| (c.to_owned(), n));
    assert_eq!(got, want);
}

/// Limit overrides, as envoyproxy/ratelimit keys them: by the descriptor, not by the
/// override's value, so a new value goes on counting the same hits; and an override in a
/// domain with no config is ignored (OK, no limit).
#[test]
fn overrides_count_by_descriptor_and_need_a_configured_domain() {
    let server = Server::start_with("", &[("five.yaml", FIVE)], |b| b);
    let with = |domain: &str, requests: u32| {
        json!({ "domain": domain, "descriptors": [
            { "entries": [["tenant", "t"]], "limit": [requests, "HOUR"] }
        ]})
    };
    let answers = envoy(
        &server,
        json!([
            with("five", 3),
            with("five", 3),
            // A larger override: the two hits already counted still count.
            with("five", 4),
            with("five", 4),
            // Smaller again: over at once.
            with("five", 2),
            with("nowhere", 1),
            with("nowhere", 1),
        ]),
    );
    let got: Vec<(String, u64)> = answers.iter().map(summary).collect();
    let want = [
        ("OK", 2),
        ("OK", 1),
        ("OK", 1),
        ("OK", 0),
        ("OVER_LIMIT", 0),
        ("OK", 0),
        ("OK", 0),
    ]
    .map(|(c, n)| (c.to_owned(), n));
    assert_eq!(got, want);
    assert_eq!(answers[2]["statuses"][0]["limit"], json!([4, "HOUR"]));
    assert!(
        answers[5]["statuses"][0].get("limit").is_none(),
        "{}",
        answers[5]
    );
}

const TIERS: &str = r#"
domain: tiers
descriptors:
  - key: a
    rate_limit: { unit: hour, requests_per_unit: 5 }
  - key: b
    rate_limit: { unit: hour, requests_per_unit: 2 }
  - key: c
    rate_limit: { unit: hour, requests_per_unit: 1 }
"#;

/// `--envoy-headers` sends envoyproxy/ratelimit's `RateLimit-Limit`, `-Remaining` and
/// `-Reset` for the descriptor it would pick: the last one over its limit, else the first
/// with the fewest hits remaining.
#[test]
fn headers_describe_the_descriptor_envoyproxy_ratelimit_picks() {
    let server = Server::start_with("", &[("tiers.yaml", TIERS)], |b| b.envoy_headers(true));
    let request = |entries: &[(&str, &str)]| request("tiers", entries);
    let answers = envoy(
        &server,
        json!([
            request(&[("a", "x"), ("b", "x")]),
            request(&[("b", "x")]),
            request(&[("c", "x"), ("b", "x")]),
        ]),
    );
    let picked = |answer: &serde_json::Value| {
        let h = &answer["headers"];
        let field = |name: &str| {
            h[name]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: {h}"))
                .to_owned()
        };
        let reset: i64 = field("RateLimit-Reset").parse().unwrap();
        let expected = 3600 - answer["now"].as_i64().unwrap() % 3600;
        assert!(
            (reset - expected).abs() <= 2,
            "reset {reset}, expected {expected}"
        );
        (field("RateLimit-Limit"), field("RateLimit-Remaining"))
    };
    let s = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    assert_eq!(picked(&answers[0]), s("2", "1"));
    assert_eq!(picked(&answers[1]), s("2", "0"));
    // c is at its limit (remaining 0, OK), b is over: b is the one described.
    assert_eq!(answers[2]["overall"], "OVER_LIMIT");
    assert_eq!(picked(&answers[2]), s("2", "0"));
    assert!(answers[2]["headers"]["X-RateLimit-Limit"].is_string());
}

/// `POST /json` answers in proto3 JSON as envoyproxy/ratelimit writes it: a field at its
/// default value is left out (`limitRemaining` 0, an unnamed limit's `name`), enums are
/// names, durations are `"<seconds>s"`.
#[test]
fn json_answers_leave_out_default_fields_as_proto3_json_does() {
    let server = Server::start_with("", &[("tiers.yaml", TIERS)], |b| b);
    let url = format!("{}/json", server.base);
    let body = r#"{"domain":"tiers","descriptors":[{"entries":[{"key":"c","value":"x"}]},{"entries":[{"key":"none","value":"x"}]}]}"#;
    let (status, answer) = curl("POST", &url, Some(body));
    assert_eq!(status, 200, "{answer}");
    let answer = json(&answer);
    let limited = &answer["statuses"][0];
    // c: 1/hour, its only hit taken: remaining 0, left out.
    assert_eq!(limited["code"], "OK");
    assert!(limited.get("limitRemaining").is_none(), "{answer}");
    assert_eq!(
        limited["currentLimit"],
        json!({ "requestsPerUnit": 1, "unit": "HOUR" }),
        "no name: left out"
    );
    let reset = limited["durationUntilReset"].as_str().unwrap();
    assert!(
        reset.ends_with('s') && reset[..reset.len() - 1].parse::<u64>().is_ok(),
        "{reset}"
    );
    // No limit for `none`: only the code.
    assert_eq!(answer["statuses"][1], json!({ "code": "OK" }));
    assert_eq!(answer["overallCode"], "OK");
    assert!(answer.get("responseHeadersToAdd").is_none());
}

/// envoyproxy/ratelimit's global `SHADOW_MODE` and `QUOTA_MODE` settings, as
/// `--envoy-shadow-mode` and `--envoy-quota-mode`: shadow answers OK whatever is over (the
/// statuses still say who is); quota puts every descriptor in quota mode, those without a
/// limit too, so a request is over only when all of them are.
#[test]
fn global_shadow_and_quota_modes() {
    let tiers = |modes: sluice_server::EnvoyModes| {
        Server::start_with("", &[("tiers.yaml", TIERS)], move |b| b.envoy_modes(modes))
    };
    let request = |entries: &[(&str, &str)]| request("tiers", entries);
    let overall = |answers: &[serde_json::Value]| -> Vec<String> {
        answers
            .iter()
            .map(|a| a["overall"].as_str().unwrap().to_owned())
            .collect()
    };
    let shadow = tiers(sluice_server::EnvoyModes {
        shadow: true,
        ..Default::default()
    });
    let answers = envoy(
        &shadow,
        json!([request(&[("c", "x")]), request(&[("c", "x")])]),
    );
    assert_eq!(overall(&answers), ["OK", "OK"]);
    assert_eq!(answers[1]["statuses"][0]["code"], "OVER_LIMIT");

    let quota = tiers(sluice_server::EnvoyModes {
        quota: true,
        ..Default::default()
    });
    let answers = envoy(
        &quota,
        json!([
            request(&[("c", "x")]),
            // c over, a descriptor without a limit OK: not all over.
            request(&[("c", "x"), ("none", "x")]),
            // c over alone: all over.
            request(&[("c", "x")]),
        ]),
    );
    assert_eq!(overall(&answers), ["OK", "OK", "OVER_LIMIT"]);
}
