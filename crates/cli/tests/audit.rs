//! The audit trail as a user meets it: `sluice serve` with `[audit]` writes each denial
//! once (HTTP and the Redis protocol alike) as a JSON line, rotates the file by size, and
//! `sluice audit` reads the files (or the PostgreSQL table) back as the top offenders.

mod support;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice_testkit::PostgresServer;
use sluice_testkit::http::{curl, json};
use support::Server;

const POLICY: &str = "[policies.api]\nrule = \"ip:1/h\"\n";

fn metric(server: &Server, series: &str) -> u64 {
    let (_, text) = curl("GET", &format!("{}/metrics", server.base), None);
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {series} in {text}"))
}

/// Waits until the sink has written `n` records (10 s at most).
fn written(server: &Server, sink: &str, n: u64) {
    let series = format!("sluice_audit_written_total{{sink=\"{sink}\"}}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(server, &series) < n {
        assert!(Instant::now() < deadline, "{series} never reached {n}");
    }
    assert_eq!(metric(server, &series), n, "every denial written once");
}

/// `hits` checks of `api` for `ip` over HTTP; the denials among them.
fn http_hits(server: &Server, ip: &str, hits: usize) -> usize {
    let body = format!(r#"{{"policy":"api","selectors":{{"ip":"{ip}"}}}}"#);
    (0..hits)
        .filter(|_| {
            let (_, answer) = curl("POST", &format!("{}/v1/check", server.base), Some(&body));
            json(&answer)["allowed"] == false
        })
        .count()
}

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .output()
        .unwrap()
}

/// `sluice audit ... --json`, parsed.
fn audit_json(args: &[&str]) -> Value {
    let mut all = vec!["audit"];
    all.extend_from_slice(args);
    all.push("--json");
    let output = sluice(&all);
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "{all:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    json(&stdout)
}

fn offenders(report: &Value) -> Vec<(String, String, u64)> {
    report["offenders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            (
                o["policy"].as_str().unwrap().to_owned(),
                o["selectors"]["ip"].as_str().unwrap().to_owned(),
                o["count"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn denials_become_json_lines_rotated_and_sluice_audit_ranks_them() {
    let config = format!(
        "{POLICY}[audit]\nfile = \"denials.jsonl\"\nmax_bytes = 4096\nkeep = 2\nserver = \"test-1\"\n"
    );
    let server = Server::start_envoy(&config, &[], &[]);
    let path = server.dir.join("denials.jsonl");

    // 100 clients over the Redis protocol, one denial each: enough to rotate.
    let (host, port) = server.resp.as_deref().unwrap().rsplit_once(':').unwrap();
    let mut cli = Command::new("redis-cli")
        .args(["-h", host, "-p", port])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut commands = String::new();
    for i in 0..100 {
        commands.push_str(&format!("SLUICE.CHECK api ip flood-{i}\n").repeat(2));
    }
    cli.stdin
        .take()
        .unwrap()
        .write_all(commands.as_bytes())
        .unwrap();
    let replies = String::from_utf8(cli.wait_with_output().unwrap().stdout).unwrap();
    // CL.THROTTLE's reply: limited is the first of five integers.
    let limited = replies
        .lines()
        .collect::<Vec<_>>()
        .chunks(5)
        .filter(|reply| reply[0] == "1")
        .count();
    assert_eq!(limited, 100, "{replies}");
    // Then three clients over HTTP, refused 8, 5 and 2 times.
    let refused: Vec<usize> = [("a", 9), ("b", 6), ("c", 3)]
        .iter()
        .map(|(ip, hits)| http_hits(&server, ip, *hits))
        .collect();
    assert_eq!(refused, [8, 5, 2]);
    written(&server, "file", 115);
    for reason in ["queue_full", "write_failed"] {
        let series = format!("sluice_audit_dropped_total{{sink=\"file\",reason=\"{reason}\"}}");
        assert_eq!(metric(&server, &series), 0);
    }

    // Rotated by size: the file and `keep` older ones, none over the bound.
    let mut names: Vec<String> = std::fs::read_dir(&server.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("denials"))
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["denials.jsonl", "denials.jsonl.1", "denials.jsonl.2"]
    );
    for name in &names {
        let size = std::fs::metadata(server.dir.join(name)).unwrap().len();
        assert!(size <= 4096, "{name}: {size} bytes");
    }
    let newest = std::fs::read_to_string(&path).unwrap();
    let last: Value = json(newest.lines().last().unwrap());
    assert_eq!(last["server"], "test-1");
    assert_eq!(last["policy"], "api");
    assert_eq!(last["leaf"], "ip:1/h");
    assert_eq!(last["selectors"], serde_json::json!({"ip": "c"}));
    assert_eq!(last["reason"], "limited");
    assert!(last["retry_after"].as_f64().unwrap() > 3_500.0, "{last}");
    let time = last["time"].as_str().unwrap();
    assert!(
        time.len() == 24 && time.ends_with('Z') && time.as_bytes()[19] == b'.',
        "RFC 3339 with milliseconds: {time}"
    );

    // The top offenders, over every file.
    let path_text = path.to_str().unwrap();
    let report = audit_json(&["--since", "1h", "--top", "3", "--file", path_text]);
    assert_eq!(
        offenders(&report),
        [
            ("api".to_owned(), "a".to_owned(), 8),
            ("api".to_owned(), "b".to_owned(), 5),
            ("api".to_owned(), "c".to_owned(), 2)
        ]
    );
    let kept = names
        .iter()
        .map(|n| {
            std::fs::read_to_string(server.dir.join(n))
                .unwrap()
                .lines()
                .count()
        })
        .sum::<usize>();
    assert_eq!(report["denials"], kept as u64, "every kept line counted");
    let none = audit_json(&["--policy", "web", "--file", path_text]);
    assert_eq!(offenders(&none), []);

    let table = sluice(&["audit", "--top", "2", "--file", path_text]);
    let table = String::from_utf8(table.stdout).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].contains("COUNT") && lines[0].contains("SELECTORS"),
        "{table}"
    );
    let words = |line: &str| {
        line.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(words(lines[1]), "8 api ip=a", "{table}");
    assert_eq!(words(lines[2]), "5 api ip=b", "{table}");
    assert_eq!(lines.len(), 4, "{table}");
}

#[test]
fn sluice_audit_refuses_bad_input_clearly() {
    let cases: [(&[&str], &str); 5] = [
        (&["--since", "1 fortnight", "--file", "x"], "--since"),
        (
            &["--file", "/no/such/denials.jsonl"],
            "no audit file at /no/such/denials.jsonl",
        ),
        (
            &["--postgres", "mysql://u:hunter2@h/d"],
            "not a postgres:// or postgresql:// URL",
        ),
        (
            &["--postgres", "postgres://u:hunter2@127.0.0.1:1/d"],
            "postgres://u:***@127.0.0.1:1/d",
        ),
        (&["--since", "1h"], "--file"),
    ];
    for (args, says) in cases {
        let mut all = vec!["audit"];
        all.extend_from_slice(args);
        let output = sluice(&all);
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("hunter2") && !stderr.contains("panicked"),
            "{stderr}"
        );
    }
}

#[test]
fn sluice_audit_reads_the_postgres_table() {
    let pg = PostgresServer::start().expect("start postgres");
    let config = format!("{POLICY}[audit]\npostgres = \"{}\"\n", pg.url());
    let server = Server::start(&config);
    let refused: Vec<usize> = [("a", 5), ("b", 3)]
        .iter()
        .map(|(ip, hits)| http_hits(&server, ip, *hits))
        .collect();
    assert_eq!(refused, [4, 2]);
    written(&server, "postgres", 6);
    let report = audit_json(&["--since", "10m", "--postgres", &pg.url()]);
    assert_eq!(
        offenders(&report),
        [
            ("api".to_owned(), "a".to_owned(), 4),
            ("api".to_owned(), "b".to_owned(), 2)
        ]
    );
    assert_eq!(report["denials"], 6);
    let other = sluice(&["audit", "--schema", "elsewhere", "--postgres", &pg.url()]);
    let stderr = String::from_utf8(other.stderr).unwrap();
    assert!(
        stderr.contains("no table elsewhere.audit_denials"),
        "{stderr}"
    );
}
