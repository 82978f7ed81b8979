//! Real `redis-server` processes: standalone, or a Redis Cluster made with `redis-cli`.

use std::io;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::process::{Kind, Process};

static INSTANCES: AtomicU32 = AtomicU32::new(0);

/// A `redis-server` on a free port, in a directory of its own, stopped by PID on drop.
pub struct RedisServer {
    process: Process,
    dir: PathBuf,
}

impl RedisServer {
    /// Starts a standalone server.
    pub fn start() -> io::Result<RedisServer> {
        RedisServer::start_with(&[])
    }

    /// Starts a server with extra `--name value` arguments.
    pub fn start_with(extra: &[&str]) -> io::Result<RedisServer> {
        let n = INSTANCES.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("sluice-redis-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let in_dir = dir.clone();
        let kind = Kind {
            name: "redis-server",
            command: Arc::new(move |port| {
                let mut command = Command::new("redis-server");
                command
                    .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                    .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
                    .arg("--dir")
                    .arg(&in_dir)
                    .args(&extra);
                command
            }),
            probe: b"PING\r\n",
            ready: b"+PONG\r\n",
        };
        let process = Process::start(kind)?;
        Ok(RedisServer { process, dir })
    }

    pub fn port(&self) -> u16 {
        self.process.port()
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port())
    }

    /// Kills the server (SIGKILL, as a crash would) and reaps it.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts the server again on the same port.
    pub fn restart(&mut self) -> io::Result<()> {
        self.process.restart()
    }

    /// Runs `redis-cli -p PORT args...` and returns its output.
    pub fn cli(&self, args: &[&str]) -> io::Result<String> {
        let output = Command::new("redis-cli")
            .args(["-p", &self.port().to_string()])
            .args(args)
            .output()?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.process.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of `masters` nodes, no replicas, made with `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start(masters: usize) -> io::Result<RedisCluster> {
        let mut nodes = Vec::new();
        for _ in 0..masters {
            nodes.push(RedisServer::start_with(&[
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                "5000",
                "--cluster-config-file",
                "nodes.conf",
            ])?);
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&output.stdout)
            )));
        }
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cluster.is_ok()? {
            if Instant::now() > deadline {
                return Err(io::Error::other("cluster did not reach state ok"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(cluster)
    }

    /// Whether every node reports `cluster_state:ok` and knows every other node.
    pub fn is_ok(&self) -> io::Result<bool> {
        for node in &self.nodes {
            let info = node.cli(&["cluster", "info"])?;
            let known = format!("cluster_known_nodes:{}", self.nodes.len());
            if !info.contains("cluster_state:ok") || !info.contains(&known) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...`.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}", nodes.join(","))
    }
}
