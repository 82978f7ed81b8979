//! The live page of `sluice serve --ui` in a real browser: headless Chromium (Debian's
//! `chromium`, installed by scripts/test.sh) loads it from a server under load, a screenshot
//! is saved, and the numbers the page shows are read from its DOM and compared with
//! `/metrics` and `/v1/top`.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;

use sluice_testkit::http::{Http1, curl, json};
use support::Server;

const CONFIG: &str = "[policies.api]\nrule = \"user:5/h\"\n\n[policies.login]\nrule = \"ip:3/h\"\n";

/// Where screenshots go: kept after the test as artifacts.
fn artifacts() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs headless Chromium on `url` with `args` (`--dump-dom` or `--screenshot=...`), letting
/// the page's script run for a few seconds of virtual time (it polls once a second).
fn chromium(url: &str, args: &[&str]) -> String {
    let profile = std::env::temp_dir().join(format!("sluice-chromium-{}", std::process::id()));
    let output = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--virtual-time-budget=3500",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .output()
        .expect("chromium is installed (scripts/test.sh installs Debian's package)");
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The text of the first element carrying all of `attributes` (`name="value"` each).
fn shown(dom: &str, attributes: &[&str]) -> Option<String> {
    let mut rest = dom;
    while let Some(start) = rest.find("<td ") {
        let tag_end = start + rest[start..].find('>')?;
        let tag = &rest[start..tag_end];
        let close = tag_end + rest[tag_end..].find("</td>")?;
        if attributes.iter().all(|a| tag.contains(a)) {
            return Some(rest[tag_end + 1..close].to_owned());
        }
        rest = &rest[close..];
    }
    None
}

/// `sluice_decisions_total{policy=P,result=R}` from `/metrics`.
fn counted(base: &str, policy: &str, result: &str) -> u64 {
    let (_, metrics) = curl("GET", &format!("{base}/metrics"), None);
    let series = format!("sluice_decisions_total{{policy=\"{policy}\",result=\"{result}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .unwrap_or_else(|| panic!("no {series} in /metrics"))
        .parse()
        .unwrap()
}

/// Checks for several users and addresses, some over their limits, until `stop`.
fn load(base: String, stop: Arc<AtomicBool>) -> thread::JoinHandle<u64> {
    thread::spawn(move || {
        let mut client = Http1::connect(&base);
        let mut sent = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let n = sent % 7;
            let body = if n < 4 {
                format!(r#"{{"policy":"api","selectors":{{"user":"user-{n}"}}}}"#)
            } else {
                format!(r#"{{"policy":"login","selectors":{{"ip":"203.0.113.{n}"}}}}"#)
            };
            let (status, _) = client.request("POST", "/v1/check", &body);
            assert_eq!(status, 200);
            sent += 1;
        }
        sent
    })
}

#[test]
fn the_live_page_shows_what_metrics_and_top_say() {
    let server = Server::start_with(CONFIG, &["--ui"]);
    let base = server.base.clone();
    let url = format!("{base}/ui");

    // Under load: the page loads, draws and is photographed, at a desktop and a phone size.
    let stop = Arc::new(AtomicBool::new(false));
    let loader = load(base.clone(), stop.clone());
    let before = counted(&base, "api", "allowed") + counted(&base, "api", "denied");
    for (name, size) in [("live-page", "1280,1000"), ("live-page-phone", "412,915")] {
        let path = artifacts().join(format!("{name}.png"));
        let _ = std::fs::remove_file(&path);
        chromium(
            &url,
            &[
                &format!("--screenshot={}", path.display()),
                &format!("--window-size={size}"),
            ],
        );
        let png = std::fs::read(&path).expect("a screenshot was written");
        assert!(
            png.starts_with(b"\x89PNG") && png.len() > 10_000,
            "{name}: {} bytes",
            png.len()
        );
    }
    let dom = chromium(&url, &["--dump-dom"]);
    let after = counted(&base, "api", "allowed") + counted(&base, "api", "denied");
    let shown_total: u64 = ["allowed", "denied"]
        .iter()
        .map(|field| {
            let attributes = [
                &format!("data-field=\"{field}\"") as &str,
                "data-policy=\"api\"",
            ];
            shown(&dom, &attributes)
                .expect("the policy row")
                .parse::<u64>()
                .unwrap()
        })
        .sum();
    assert!(
        before <= shown_total && shown_total <= after,
        "under load the page shows {shown_total} api decisions, between {before} and {after}"
    );
    stop.store(true, Ordering::Relaxed);
    assert!(loader.join().unwrap() > 0);

    // At rest: every number shown equals /metrics and /v1/top exactly.
    let dom = chromium(&url, &["--dump-dom"]);
    assert!(
        dom.contains("data-loaded=\"true\""),
        "the page's script ran: {dom}"
    );
    for policy in ["api", "login"] {
        for field in ["allowed", "denied"] {
            let attributes = [
                &format!("data-field=\"{field}\"") as &str,
                &format!("data-policy=\"{policy}\""),
            ];
            let on_page: u64 = shown(&dom, &attributes).unwrap().parse().unwrap();
            assert_eq!(on_page, counted(&base, policy, field), "{policy} {field}");
        }
    }
    let (status, top) = curl("GET", &format!("{base}/v1/top?policy=api&n=5"), None);
    assert_eq!(status, 200, "{top}");
    let refused = json(&top)["refused"].as_array().unwrap().clone();
    assert!(
        !refused.is_empty(),
        "the load was refused for some users: {top}"
    );
    for item in refused {
        let selectors = item["selectors"].as_str().unwrap();
        let attributes = [
            "data-field=\"count\"",
            "data-policy=\"api\"",
            &format!("data-selectors=\"{selectors}\"") as &str,
        ];
        let on_page = shown(&dom, &attributes)
            .unwrap_or_else(|| panic!("{selectors} is among the most refused on the page"));
        assert_eq!(on_page, item["count"].to_string(), "{selectors}");
    }
    assert!(dom.contains("user:5/h"), "the rules are shown");
}

#[test]
fn the_page_is_off_by_default_and_takes_a_token_when_asked() {
    let off = Server::start(CONFIG);
    assert_eq!(curl("GET", &format!("{}/ui", off.base), None).0, 404);
    assert_eq!(
        curl("GET", &format!("{}/v1/ui/state", off.base), None).0,
        404
    );

    let guarded = Server::start_with(CONFIG, &["--ui-token", "s3cret"]);
    let base = &guarded.base;
    assert_eq!(curl("GET", &format!("{base}/ui"), None).0, 401);
    assert_eq!(curl("GET", &format!("{base}/ui?token=wrong"), None).0, 401);
    assert_eq!(
        curl("GET", &format!("{base}/v1/ui/state?token=s3cre"), None).0,
        401
    );
    let (status, page) = curl("GET", &format!("{base}/ui?token=s3cret"), None);
    assert_eq!(status, 200);
    assert!(page.contains("<title>sluice</title>"));
    assert!(
        !page.contains("src=\"http") && !page.contains("href=\"http"),
        "no external assets"
    );
    let (status, state) = curl("GET", &format!("{base}/v1/ui/state?token=s3cret"), None);
    assert_eq!(status, 200);
    assert_eq!(json(&state)["policies"].as_array().unwrap().len(), 2);
}

#[test]
fn an_open_page_on_a_public_address_is_refused_at_start() {
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--listen", "0.0.0.0:0", "--ui"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("--ui-token"), "{stderr}");
}

#[test]
fn the_grafana_dashboard_queries_only_metrics_the_service_serves() {
    let server = Server::start(CONFIG);
    let check = r#"{"policy":"login","selectors":{"ip":"203.0.113.7"}}"#;
    for _ in 0..4 {
        curl("POST", &format!("{}/v1/check", server.base), Some(check));
    }
    let (_, metrics) = curl("GET", &format!("{}/metrics", server.base), None);
    let served: std::collections::BTreeSet<&str> = metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split(['{', ' ']).next())
        .collect();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/grafana-dashboard.json");
    let dashboard = std::fs::read_to_string(path).unwrap();
    json(&dashboard); // valid JSON
    let mut queried = std::collections::BTreeSet::new();
    let mut rest = dashboard.as_str();
    while let Some(at) = rest.find("sluice_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        queried.insert(name);
    }
    assert!(queried.len() >= 10, "{queried:?}");
    for name in &queried {
        assert!(
            served.contains(name.as_str()),
            "the dashboard queries {name}, which /metrics does not serve"
        );
    }
}
