//! The `sluice` binary as a user runs it: exit codes and messages, signals, stdout.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use sluice_testkit::http::{curl, json};
use support::Server;

/// Config reloads the server has attempted (succeeded or failed), from `/metrics`.
fn reloads(server: &Server) -> u64 {
    let (_, metrics) = curl("GET", &format!("{}/metrics", server.base), None);
    metrics
        .lines()
        .filter(|l| l.starts_with("sluice_config_reloads_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Waits until the server has attempted more than `before` reloads.
fn reloaded_since(server: &Server, before: u64, cause: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while reloads(server) <= before {
        assert!(Instant::now() < deadline, "no reload after {cause}");
    }
}

fn check(server: &Server, policy: &str) -> u16 {
    let body = format!(r#"{{"policy":"{policy}","selectors":{{"user":"u"}}}}"#);
    curl("POST", &format!("{}/v1/check", server.base), Some(&body)).0
}

#[test]
fn bad_thread_counts_are_refused() {
    for threads in ["0", "-1", "many", "1025"] {
        let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .arg(format!("--threads={threads}"))
            .env_remove("SLUICE_THREADS")
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "--threads {threads}");
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(stderr.contains("--threads"), "{stderr}");
    }
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

/// What only the binary does: print where it listens, reload on SIGHUP and when the config
/// file changes, and exit cleanly on SIGTERM. (The service itself is tested in process in
/// `sluice-server`.)
#[test]
fn the_binary_prints_its_addresses_reloads_and_stops_on_signals() {
    let mut server = Server::start_envoy("[policies.api]\nrule = \"user:5/h\"\n", &[], &[]);
    let (grpc, resp) = (server.grpc.clone().unwrap(), server.resp.clone().unwrap());
    assert!(grpc.parse::<std::net::SocketAddr>().is_ok(), "{grpc}");
    assert!(resp.parse::<std::net::SocketAddr>().is_ok(), "{resp}");
    assert_eq!(check(&server, "api"), 200);
    assert_eq!(check(&server, "web"), 404);
    let file = server.dir.join("policies.toml");

    // SIGHUP: the file written before it is in force once the reload is counted.
    let config = "[policies.api]\nrule = \"user:5/h\"\n[policies.web]\nrule = \"user:1/h\"\n";
    std::fs::write(&file, config).unwrap();
    let before = reloads(&server);
    let hangup = Command::new("kill")
        .args(["-HUP", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(hangup.success());
    reloaded_since(&server, before, "SIGHUP");
    assert_eq!(check(&server, "web"), 200);
    let (_, answer) = curl(
        "POST",
        &format!("{}/v1/check", server.base),
        Some(r#"{"policy":"api","selectors":{"user":"u"}}"#),
    );
    assert_eq!(
        json(&answer)["remaining"],
        3,
        "api kept its count: {answer}"
    );

    // A changed file reloads by itself.
    let before = reloads(&server);
    std::fs::write(&file, "[policies.login]\nrule = \"user:1/h\"\n").unwrap();
    reloaded_since(&server, before, "the file changed");
    assert_eq!(check(&server, "login"), 200);
    assert_eq!(check(&server, "api"), 404);

    assert!(server.terminate(), "SIGTERM shuts down cleanly");
}
