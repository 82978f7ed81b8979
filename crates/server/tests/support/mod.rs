//! The service started in this test process, as a program embedding it would, and driven by
//! real clients (curl, redis-cli, grpcio).

#![allow(dead_code)] // each test file uses its own part of the harness

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;

use serde_json::{Value, json};
use sluice_server::reload::Sources;
use sluice_server::{Server as Sluice, ServerBuilder, Service};
use sluice_testkit::http::json;

/// A running service on its own runtime and thread, stopped (and drained) on drop.
pub struct Server {
    pub base: String,
    /// `host:port` of the gRPC and RESP listeners (always started).
    pub grpc: String,
    pub resp: String,
    /// The temporary directory holding the config files (`policies.toml`, `envoy/`).
    pub dir: PathBuf,
    pub service: Arc<Service>,
    sources: Sources,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), String>>>,
}

impl Server {
    /// One `redis-cli` call on the RESP listener; its standard output.
    pub fn redis_cli(&self, args: &[&str]) -> String {
        let (host, port) = self.resp.rsplit_once(':').unwrap();
        let output = std::process::Command::new("redis-cli")
            .args(["-h", host, "-p", port])
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8(output.stdout).unwrap()
    }

    /// Starts the service on `config` (TOML policies).
    pub fn start(config: &str) -> Server {
        Server::start_with(config, &[], |b| b)
    }

    /// Starts the service on `config` and envoyproxy/ratelimit YAML files `(name, text)`,
    /// with the builder adjusted by `adjust` (a store, limits, header options).
    pub fn start_with(
        config: &str,
        envoy: &[(&str, &str)],
        adjust: impl FnOnce(ServerBuilder) -> ServerBuilder + Send + 'static,
    ) -> Server {
        let dir = std::env::temp_dir().join(format!(
            "sluice-server-test-{}-{}",
            std::process::id(),
            unique()
        ));
        std::fs::create_dir_all(dir.join("envoy")).unwrap();
        std::fs::write(dir.join("policies.toml"), config).unwrap();
        for (name, text) in envoy {
            std::fs::write(dir.join("envoy").join(name), text).unwrap();
        }
        let sources = Sources {
            policies: Some(dir.join("policies.toml")),
            envoy: Some(dir.join("envoy")),
        };
        let any = "127.0.0.1:0".parse().unwrap();
        let builder = Sluice::builder()
            .policies_file(dir.join("policies.toml"))
            .envoy_dir(dir.join("envoy"))
            .http(any)
            .grpc(any)
            .resp(any)
            // The tests reload when they mean to (see `Server::reload`), not when a write
            // they make happens to land on the watcher's tick.
            .reload_on_change(false);
        let builder = adjust(builder);
        let (bound, bound_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let server = match builder.bind().await {
                    Ok(server) => server,
                    Err(error) => {
                        let _ = bound.send(Err(error.to_string()));
                        return Ok(());
                    }
                };
                let addresses = (
                    server.http_addr(),
                    server.grpc_addr().unwrap(),
                    server.resp_addr().unwrap(),
                    server.service().clone(),
                );
                let _ = bound.send(Ok(addresses));
                server
                    .run(async {
                        let _ = stopped.await;
                    })
                    .await
                    .map_err(|e| e.to_string())
            })
        });
        let (http, grpc, resp, service) = bound_rx
            .recv()
            .expect("the server thread answers")
            .unwrap_or_else(|e| panic!("the service did not start: {e}"));
        Server {
            base: format!("http://{http}"),
            grpc: grpc.to_string(),
            resp: resp.to_string(),
            dir,
            service,
            sources,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Reloads the config from the files, as SIGHUP does; whether it was installed.
    pub fn reload(&self) -> bool {
        sluice_server::reload::reload(&self.service, &self.sources)
    }

    /// Stops the service and returns whether it shut down cleanly.
    pub fn terminate(&mut self) -> bool {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take() {
            Some(thread) => matches!(thread.join(), Ok(Ok(()))),
            None => false,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.terminate();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// envoyproxy/ratelimit's example config, as its README shows it, with a few more cases.
pub const ENVOY: &str = r#"
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: hour
      requests_per_unit: 3
  - key: remote_address
    rate_limit:
      name: per_ip
      unit: hour
      requests_per_unit: 2
  - key: path
    value: "/api/*"
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: client
    value: vip
    rate_limit:
      unlimited: true
  - key: shadow
    shadow_mode: true
    rate_limit:
      unit: hour
      requests_per_unit: 1
  - key: tenant
    descriptors:
      - key: user
        rate_limit:
          unit: 5 hours
          requests_per_unit: 2
          replaces:
            - name: per_ip
"#;

/// Runs the Python gRPC client on `requests`; one answer per request.
pub fn envoy(server: &Server, requests: Value) -> Vec<Value> {
    let mut child = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/envoy_client.py"
        ))
        .arg(&server.grpc)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run python3");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(requests.to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "envoy_client.py failed");
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(json)
        .collect()
}

pub fn one(domain: &str, entries: &[(&str, &str)]) -> Value {
    let entries: Vec<Value> = entries.iter().map(|(k, v)| json!([k, v])).collect();
    json!({ "domain": domain, "descriptors": [{ "entries": entries }] })
}

pub fn summary(answer: &Value) -> (String, u64) {
    let status = &answer["statuses"][0];
    (
        status["code"].as_str().unwrap().to_owned(),
        status["remaining"].as_u64().unwrap(),
    )
}

/// A request of `domain` with one descriptor of one entry per `(key, value)`.
pub fn request(domain: &str, entries: &[(&str, &str)]) -> Value {
    let descriptors: Vec<Value> = entries
        .iter()
        .map(|(k, v)| json!({ "entries": [[k, v]] }))
        .collect();
    json!({ "domain": domain, "descriptors": descriptors })
}
