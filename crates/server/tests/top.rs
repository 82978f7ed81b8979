//! Heavy hitters and recent refusals through the real listeners: decisions made over HTTP
//! and RESP, read back with `GET /v1/top`, `GET /v1/refusals` and `/metrics`.

mod support;

use serde_json::{Value, json};
use sluice_testkit::http::{Http1, curl, json};
use support::Server;

const CONFIG: &str = r#"
[policies.login]
rule = "ip:3/h"

[policies.api]
rule = "user:1000/h"
"#;

fn check(client: &mut Http1, policy: &str, selectors: Value) -> bool {
    let body = json!({ "policy": policy, "selectors": selectors }).to_string();
    let (status, text) = client.request("POST", "/v1/check", &body);
    assert_eq!(status, 200, "{text}");
    json(&text)["allowed"].as_bool().unwrap()
}

fn get(server: &Server, path: &str) -> (u16, Value) {
    let (status, body) = curl("GET", &format!("{}{path}", server.base), None);
    (status, json(&body))
}

#[test]
fn the_heaviest_and_most_refused_values_are_reported_per_policy() {
    let server = Server::start(CONFIG);
    let mut client = Http1::connect(&server.base);
    // One address tries 20 times (3 admitted), ten others once each; a selector the policy
    // does not count by does not split them.
    for i in 0..20 {
        check(
            &mut client,
            "login",
            json!({ "ip": "203.0.113.9", "attempt": i.to_string() }),
        );
    }
    for i in 0..10 {
        assert!(check(
            &mut client,
            "login",
            json!({ "ip": format!("198.51.100.{i}") })
        ));
    }
    let (status, top) = get(&server, "/v1/top?policy=login&n=3");
    assert_eq!(status, 200, "{top}");
    assert_eq!(top["policy"], "login");
    assert_eq!(top["window_seconds"], 300);
    assert_eq!(
        (top["hits"].as_u64(), top["refusals"].as_u64()),
        (Some(30), Some(17))
    );
    assert_eq!(
        top["active"][0],
        json!({ "selectors": "ip=203.0.113.9", "count": 20, "error": 0 })
    );
    assert_eq!(top["active"].as_array().unwrap().len(), 3);
    assert_eq!(
        top["refused"],
        json!([{ "selectors": "ip=203.0.113.9", "count": 17, "error": 0 }])
    );

    // Every protocol's decisions are counted: RESP's SLUICE.CHECK under the policy,
    // CL.THROTTLE under its kind.
    server.redis_cli(&["SLUICE.CHECK", "api", "1", "user", "carol"]);
    for _ in 0..3 {
        server.redis_cli(&["CL.THROTTLE", "user:dave", "0", "1", "60"]);
    }
    let (_, all) = get(&server, "/v1/top?n=1");
    assert_eq!(all["window_seconds"], 300);
    let by_name: Vec<(String, Value)> = all["policies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["policy"].as_str().unwrap().to_owned(),
                p["active"].clone(),
            )
        })
        .collect();
    assert_eq!(
        by_name.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["api", "cl.throttle", "envoy.override", "login"]
    );
    assert_eq!(by_name[0].1[0]["selectors"], "user=carol");
    assert_eq!(
        by_name[1].1[0],
        json!({ "selectors": "key=user:dave", "count": 3, "error": 0 })
    );

    // Refusals, newest first: CL.THROTTLE's (burst 1: the second and third are refused),
    // then login's.
    let (status, recent) = get(&server, "/v1/refusals?n=3");
    assert_eq!(status, 200);
    let recent = recent["refusals"].as_array().unwrap();
    assert_eq!(recent.len(), 3);
    assert_eq!(recent[0]["policy"], "cl.throttle");
    assert_eq!(recent[0]["selectors"], "key=user:dave");
    assert_eq!(recent[0]["denial"], "limited");
    assert!(recent[0]["retry_after"].as_f64().unwrap() > 0.0);
    assert!(recent[0]["at"].as_f64().unwrap() >= recent[1]["at"].as_f64().unwrap());
    assert_eq!(recent[2]["policy"], "login");
    assert_eq!(recent[2]["selectors"], "ip=203.0.113.9");
    assert_eq!(recent[2]["shadow"], false);
    let (_, fifty) = get(&server, "/v1/refusals");
    assert_eq!(fifty["refusals"].as_array().unwrap().len(), 19);

    let (_, text) = curl("GET", &format!("{}/metrics", server.base), None);
    assert!(
        text.contains("sluice_top_refused{policy=\"login\",selectors=\"ip=203.0.113.9\"} 17\n"),
        "{text}"
    );
    assert!(text.contains("# TYPE sluice_top_refused gauge\n"), "{text}");
}

#[test]
fn envoy_decisions_are_counted_under_their_policy() {
    let yaml = "domain: web\ndescriptors:\n  - key: remote_address\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n";
    let server = Server::start_with("", &[("web.yaml", yaml)], |b| b);
    let body = r#"{"domain":"web","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}"#;
    for want in [200, 429, 429] {
        let (status, answer) = curl("POST", &format!("{}/json", server.base), Some(body));
        assert_eq!(status, want, "{answer}");
    }
    let (_, all) = get(&server, "/v1/top");
    let envoy = all["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["policy"].as_str().unwrap().starts_with("envoy.web."))
        .unwrap_or_else(|| panic!("{all}"));
    assert_eq!(
        envoy["refused"],
        json!([{ "selectors": "descriptor=remote_address=10.0.0.1", "count": 2, "error": 0 }])
    );
    // A policy name with `=` in it, as a query parameter.
    let name = envoy["policy"].as_str().unwrap();
    let (status, one) = get(&server, &format!("/v1/top?policy={name}&n=1"));
    assert_eq!((status, &one["refused"]), (200, &envoy["refused"]));
}

#[test]
fn bad_queries_get_400_unknown_policies_404_and_change_nothing() {
    let server = Server::start_with(CONFIG, &[], |b| b.top(4).refusals(3));
    let mut client = Http1::connect(&server.base);
    for _ in 0..5 {
        check(&mut client, "login", json!({ "ip": "203.0.113.9" }));
    }
    let before = (get(&server, "/v1/top"), get(&server, "/v1/refusals"));
    assert_eq!(before.0.1["policies"][3]["active"][0]["count"], 5);
    assert_eq!(before.1.1["refusals"].as_array().unwrap().len(), 2);
    for (path, want, says) in [
        ("/v1/top?policy=nope", 404, "unknown policy `nope`"),
        ("/v1/top?policy=login&n=0", 400, "from 1 to 4, not `0`"),
        ("/v1/top?policy=login&n=5", 400, "from 1 to 4, not `5`"),
        ("/v1/top?n=abc", 400, "not `abc`"),
        ("/v1/top?n=-1", 400, "not `-1`"),
        ("/v1/top?n=", 400, "not ``"),
        ("/v1/top?n=1&n=2", 400, "`n` given twice"),
        (
            "/v1/top?policy=login&limit=3",
            400,
            "unknown parameter `limit`",
        ),
        ("/v1/refusals?n=0", 400, "from 1 to 3"),
        ("/v1/refusals?n=4", 400, "from 1 to 3"),
        (
            "/v1/refusals?policy=login",
            400,
            "unknown parameter `policy`",
        ),
        // Not UTF-8: decoded lossily, then no policy has that name.
        ("/v1/top?policy=%FF", 404, "unknown policy `\u{FFFD}`"),
    ] {
        let (status, body) = get(&server, path);
        assert_eq!(status, want, "{path}: {body}");
        let error = body["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{path}: {body}"));
        assert!(error.contains(says), "{path}: {error}");
    }
    // A long unknown name is not echoed whole.
    let long = format!("/v1/top?policy={}", "x".repeat(1_000));
    let (status, body) = get(&server, &long);
    assert_eq!(status, 404);
    assert!(body["error"].as_str().unwrap().len() < 200, "{body}");
    // Default n is clipped to what is kept; nothing above changed anything.
    let after = (get(&server, "/v1/top"), get(&server, "/v1/refusals"));
    assert_eq!(after, before);
}

#[test]
fn hostile_values_are_escaped_in_the_metrics_and_cut_in_answers() {
    let server = Server::start(CONFIG);
    let mut client = Http1::connect(&server.base);
    let hostile = "x\"} 1\nsluice_fake{a=\"\\";
    for _ in 0..4 {
        check(&mut client, "login", json!({ "ip": hostile }));
    }
    let long = "é".repeat(1_000);
    for _ in 0..4 {
        check(&mut client, "login", json!({ "ip": long }));
    }
    let (_, text) = curl("GET", &format!("{}/metrics", server.base), None);
    let line = r#"sluice_top_refused{policy="login",selectors="ip=x\"} 1\nsluice_fake{a=\"\\"} 1"#;
    assert!(text.contains(&format!("{line}\n")), "{text}");
    assert!(
        !text.lines().any(|l| l.starts_with("sluice_fake")),
        "{text}"
    );
    let (_, top) = get(&server, "/v1/top?policy=login");
    let refused = top["refused"].as_array().unwrap();
    assert_eq!(refused.len(), 2);
    let cut = format!("ip={}", "é".repeat(64));
    assert!(
        refused.iter().any(|h| h["selectors"] == cut.as_str()),
        "{top}"
    );
    assert!(
        refused
            .iter()
            .any(|h| h["selectors"] == format!("ip={hostile}")),
        "{top}"
    );
}

#[test]
fn a_reload_keeps_the_counts_of_kept_policies_and_forgets_removed_ones() {
    let server = Server::start(CONFIG);
    let mut client = Http1::connect(&server.base);
    check(&mut client, "login", json!({ "ip": "203.0.113.9" }));
    check(&mut client, "api", json!({ "user": "carol" }));
    std::fs::write(
        server.dir.join("policies.toml"),
        "[policies.login]\nrule = \"ip:3/h\"\n",
    )
    .unwrap();
    assert!(server.reload());
    assert_eq!(get(&server, "/v1/top?policy=login").1["hits"], 1);
    assert_eq!(get(&server, "/v1/top?policy=api").0, 404);
}

#[test]
fn off_means_404_and_no_series() {
    let server = Server::start_with(CONFIG, &[], |b| b.top(0).refusals(0));
    let mut client = Http1::connect(&server.base);
    for _ in 0..5 {
        check(&mut client, "login", json!({ "ip": "203.0.113.9" }));
    }
    assert_eq!(get(&server, "/v1/top?policy=login").0, 404);
    assert_eq!(get(&server, "/v1/refusals").0, 404);
    let (_, text) = curl("GET", &format!("{}/metrics", server.base), None);
    assert!(!text.contains("sluice_top_refused"), "{text}");
}
