//! Running `sluice serve` as a user does, and driving it with curl.

#![allow(dead_code)] // each test file uses its own part of the harness

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A running `sluice serve`, stopped (SIGTERM, then reaped) on drop.
pub struct Server {
    child: Child,
    pub base: String,
    /// `host:port` of `--grpc-listen` and `--resp-listen`, when asked for.
    pub grpc: Option<String>,
    pub resp: Option<String>,
    /// The temporary directory holding the config files.
    pub dir: std::path::PathBuf,
    _dir: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Server {
    pub fn start(config: &str) -> Server {
        Server::start_with(config, &[])
    }

    /// Starts `sluice serve` with `extra` arguments (e.g. `--store URL`).
    pub fn start_with(config: &str, extra: &[&str]) -> Server {
        Server::start_with_env(config, &[], extra)
    }

    /// Starts `sluice serve` with extra environment variables (e.g. libfaketime's
    /// `LD_PRELOAD` and `FAKETIME`), set on the server process itself so that the PID this
    /// harness stops is the server's own (a wrapper command would leave it orphaned).
    pub fn start_with_env(config: &str, env: &[(&str, &str)], extra: &[&str]) -> Server {
        Server::start_full(env, config, &[], extra)
    }

    /// Starts `sluice serve` with envoyproxy/ratelimit YAML files `(name, text)` in a
    /// directory passed as `--envoy-config`, listening on gRPC and RESP too.
    pub fn start_envoy(config: &str, envoy: &[(&str, &str)], extra: &[&str]) -> Server {
        let mut args = vec![
            "--grpc-listen",
            "127.0.0.1:0",
            "--resp-listen",
            "127.0.0.1:0",
        ];
        args.extend_from_slice(extra);
        Server::start_full(&[], config, envoy, &args)
    }

    fn start_full(
        env: &[(&str, &str)],
        config: &str,
        envoy: &[(&str, &str)],
        extra: &[&str],
    ) -> Server {
        let dir = std::env::temp_dir().join(format!(
            "sluice-serve-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("policies.toml");
        std::fs::write(&path, config).unwrap();
        let envoy_dir = dir.join("envoy");
        std::fs::create_dir_all(&envoy_dir).unwrap();
        for (name, text) in envoy {
            std::fs::write(envoy_dir.join(name), text).unwrap();
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .envs(env.iter().copied())
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&path)
            .args(if envoy.is_empty() {
                Vec::new()
            } else {
                vec!["--envoy-config".as_ref(), envoy_dir.as_os_str()]
            })
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start sluice");
        let mut line = String::new();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut line).unwrap();
        let mut next = |prefix: &str| {
            let mut line = String::new();
            stdout.read_line(&mut line).unwrap();
            line.trim()
                .strip_prefix(prefix)
                .unwrap_or_else(|| panic!("unexpected line {line:?}"))
                .to_owned()
        };
        let grpc = extra
            .contains(&"--grpc-listen")
            .then(|| next("sluice grpc listening on "));
        let resp = extra
            .contains(&"--resp-listen")
            .then(|| next("sluice resp listening on "));
        let base = line
            .trim()
            .strip_prefix("sluice listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        Server {
            child,
            base,
            grpc,
            resp,
            dir: dir.clone(),
            _dir: TempDir(dir),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the server with SIGTERM and returns whether it exited cleanly.
    pub fn terminate(&mut self) -> bool {
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

/// [`sluice_testkit::http::flood`] over these servers.
pub fn flood(servers: &[&Server], clients: usize, policy: &str, per_client: usize) -> (usize, f64) {
    let bases: Vec<&str> = servers.iter().map(|s| s.base.as_str()).collect();
    sluice_testkit::http::flood(&bases, clients, policy, per_client)
}

/// One policy of each algorithm, each `user:100` per window, for the tests of a shared
/// store; each test adds its compound rules.
pub const EACH_ALGORITHM: &str = r#"
[policies.gcra]
rule = "user:100/m"

[policies.window]
rule = "user:100/m"
algorithm = "sliding-window"

[policies.log]
rule = "user:100/m"
algorithm = "sliding-log"

[policies.fixed]
rule = "user:100/10y"
algorithm = "fixed-window"
"#;

/// The `gcra` policy of [`EACH_ALGORITHM`] (100/m, refilling one hit per 0.6 s of the
/// store's time) flooded through `servers`: exactly 100 from the full bucket, plus at most
/// what refilled while the flood ran.
pub fn assert_one_gcra_bucket(servers: &[&Server]) {
    let (admitted, seconds) = flood(servers, 64, "gcra", 4);
    let refill = (seconds / 0.6).floor() as usize + 1;
    assert!(
        (100..=100 + refill).contains(&admitted),
        "gcra admitted {admitted} in {seconds:.2}s"
    );
}

/// libfaketime's multi-threaded library (Debian package `faketime`, installed by
/// scripts/test.sh), checked to move `date` ahead by `seconds` (as `FAKETIME=+SECONDS`).
pub fn faketime_library(seconds: i64) -> String {
    let library = std::fs::read_dir("/usr/lib")
        .expect("/usr/lib")
        .filter_map(|entry| {
            let path = entry.ok()?.path().join("faketime/libfaketimeMT.so.1");
            path.exists().then(|| path.to_string_lossy().into_owned())
        })
        .next()
        .expect("libfaketime is needed: apt-get install faketime");
    let now = |env: &[(&str, &str)]| {
        let out = Command::new("date")
            .arg("+%s")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse::<i64>()
            .unwrap()
    };
    let offset = format!("+{seconds}");
    let ahead = now(&[("LD_PRELOAD", &library), ("FAKETIME", &offset)]) - now(&[]);
    assert!(
        (seconds - 200..seconds + 200).contains(&ahead),
        "libfaketime moves the clock by {ahead} s, not {seconds}"
    );
    library
}
