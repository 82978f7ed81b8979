//! Real `redis-server` processes: standalone, or a Redis Cluster made with `redis-cli`.

use std::io;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::process::{Kind, Process};
use crate::proxy::{Fault, FaultProxy};

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

    /// Script calls the server ran so far (EVAL, EVALSHA and FCALL), from
    /// `INFO commandstats`: how many calls a batch of decisions took.
    pub fn script_calls(&self) -> u64 {
        ["evalsha", "eval", "fcall"]
            .iter()
            .map(|command| self.calls(command))
            .sum()
    }

    /// Calls of `command` (lower case, e.g. `zscore`) the server ran so far, scripts' own
    /// included, from `INFO commandstats`.
    pub fn calls(&self, command: &str) -> u64 {
        let info = self.cli(&["INFO", "commandstats"]).expect("INFO");
        let prefix = format!("cmdstat_{command}:");
        info.lines()
            .filter(|line| line.starts_with(&prefix))
            .filter_map(|line| {
                let calls = line.split("calls=").nth(1)?.split(',').next()?;
                calls.parse::<u64>().ok()
            })
            .sum()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.process.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster made with `redis-cli --cluster create`: `masters` masters first in
/// `nodes`, then their replicas, if any.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// `masters` masters, no replicas.
    pub fn start(masters: usize) -> io::Result<RedisCluster> {
        RedisCluster::start_with_replicas(masters, 0, Duration::from_secs(5))
    }

    /// `masters` masters with `replicas` replicas each; a node silent for `node_timeout` is
    /// judged failed (and its replica promoted).
    pub fn start_with_replicas(
        masters: usize,
        replicas: usize,
        node_timeout: Duration,
    ) -> io::Result<RedisCluster> {
        let mut nodes = Vec::new();
        let timeout = node_timeout.as_millis().to_string();
        for _ in 0..masters * (1 + replicas) {
            nodes.push(RedisServer::start_with(&[
                "--cluster-enabled",
                "yes",
                "--cluster-node-timeout",
                &timeout,
                "--cluster-config-file",
                "nodes.conf",
                // Replicas sync at once, not after the default 5 s wait for company.
                "--repl-diskless-sync-delay",
                "0",
            ])?);
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
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

    /// Whether every node reports `cluster_state:ok` and knows every other node, and every
    /// replica has synced with its master (a replica that never did cannot take over).
    pub fn is_ok(&self) -> io::Result<bool> {
        for node in &self.nodes {
            let info = node.cli(&["cluster", "info"])?;
            let known = format!("cluster_known_nodes:{}", self.nodes.len());
            if !info.contains("cluster_state:ok") || !info.contains(&known) {
                return Ok(false);
            }
            let replication = node.cli(&["INFO", "replication"])?;
            if replication.contains("role:slave") && !replication.contains("master_link_status:up")
            {
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

/// A Redis Cluster whose every node is reached through a [`FaultProxy`]: each node
/// announces its proxy's port (`cluster-announce-port`), so a client that learns the slot
/// map from the cluster still goes through the proxies. Faults are set on all of them.
pub struct ProxiedCluster {
    pub cluster: RedisCluster,
    pub proxies: Vec<FaultProxy>,
}

impl ProxiedCluster {
    pub fn start(masters: usize) -> io::Result<ProxiedCluster> {
        let cluster = RedisCluster::start(masters)?;
        let mut proxies = Vec::new();
        for node in &cluster.nodes {
            let proxy = FaultProxy::start(([127, 0, 0, 1], node.port()).into())?;
            let announced = proxy.address().port().to_string();
            let bus = (node.port() + 10_000).to_string();
            node.cli(&["CONFIG", "SET", "cluster-announce-bus-port", &bus])?;
            node.cli(&["CONFIG", "SET", "cluster-announce-port", &announced])?;
            proxies.push(proxy);
        }
        let proxied = ProxiedCluster { cluster, proxies };
        // Every node must tell every node's proxy port before a client looks.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !proxied.announced()? {
            if Instant::now() > deadline {
                return Err(io::Error::other("the nodes did not announce their proxies"));
            }
            std::thread::sleep(Duration::from_millis(50)); // polling real servers' state
        }
        Ok(proxied)
    }

    fn announced(&self) -> io::Result<bool> {
        for node in &self.cluster.nodes {
            let nodes = node.cli(&["CLUSTER", "NODES"])?;
            for proxy in &self.proxies {
                let address = format!("127.0.0.1:{}@", proxy.address().port());
                if !nodes.contains(&address) {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// The same fault on every node's proxy.
    pub fn set(&self, fault: Fault) {
        for proxy in &self.proxies {
            proxy.set(fault);
        }
    }

    /// `redis+cluster://` through the proxies.
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .proxies
            .iter()
            .map(|p| p.address().to_string())
            .collect();
        format!("redis+cluster://{}", nodes.join(","))
    }
}

/// A master, one replica of it, and three sentinels watching them (quorum 2; the master is
/// judged down after 1 s without an answer), all on free ports, stopped by PID on drop.
pub struct RedisSentinels {
    pub master: RedisServer,
    pub replica: RedisServer,
    sentinels: Vec<Process>,
    /// With TLS: the TLS ports of the master, the replica and each sentinel (the plain
    /// ports stay open for the harness's own probes and `redis-cli`).
    tls: Option<TlsPorts>,
    dir: PathBuf,
}

struct TlsPorts {
    master: u16,
    replica: u16,
    sentinels: Vec<u16>,
}

impl RedisSentinels {
    /// The name the sentinels monitor the master by.
    pub const MASTER: &'static str = "sluice";

    /// Starts the master, the replica (waiting until it has synced), then the sentinels.
    pub fn start() -> io::Result<RedisSentinels> {
        RedisSentinels::start_with(None)
    }

    /// The same speaking TLS everywhere (replication, sentinels to servers, clients), with
    /// `server.crt`, `server.key` and `ca.crt` from `certificates` (see
    /// [`crate::tls::certificates`]).
    pub fn start_tls(certificates: &std::path::Path) -> io::Result<RedisSentinels> {
        RedisSentinels::start_with(Some(certificates))
    }

    fn start_with(certificates: Option<&std::path::Path>) -> io::Result<RedisSentinels> {
        let tls_args = |port: u16| -> Vec<String> {
            let Some(dir) = certificates else {
                return Vec::new();
            };
            let file = |name: &str| dir.join(name).to_string_lossy().into_owned();
            vec![
                "--tls-port".into(),
                port.to_string(),
                "--tls-cert-file".into(),
                file("server.crt"),
                "--tls-key-file".into(),
                file("server.key"),
                "--tls-ca-cert-file".into(),
                file("ca.crt"),
                "--tls-auth-clients".into(),
                "no".into(),
                "--tls-replication".into(),
                "yes".into(),
            ]
        };
        let tls = match certificates {
            Some(_) => Some(TlsPorts {
                master: crate::free_port()?,
                replica: crate::free_port()?,
                sentinels: (0..3)
                    .map(|_| crate::free_port())
                    .collect::<io::Result<_>>()?,
            }),
            None => None,
        };
        let owned = |args: &[String]| args.to_vec();
        let master_args = owned(&tls_args(tls.as_ref().map_or(0, |t| t.master)));
        let master_args: Vec<&str> = master_args.iter().map(String::as_str).collect();
        let master = RedisServer::start_with(&master_args)?;
        // Replicas and sentinels reach the master on its TLS port when there is one.
        let master_port = tls.as_ref().map_or(master.port(), |t| t.master).to_string();
        let mut replica_args = owned(&tls_args(tls.as_ref().map_or(0, |t| t.replica)));
        replica_args.extend([
            "--replicaof".into(),
            "127.0.0.1".into(),
            master_port.clone(),
        ]);
        let replica_args: Vec<&str> = replica_args.iter().map(String::as_str).collect();
        let replica = RedisServer::start_with(&replica_args)?;
        let synced = Instant::now() + Duration::from_secs(10);
        while !replica
            .cli(&["INFO", "replication"])?
            .contains("master_link_status:up")
        {
            if Instant::now() > synced {
                return Err(io::Error::other("the replica did not sync"));
            }
            std::thread::sleep(Duration::from_millis(20)); // polling a real server's state
        }
        let n = INSTANCES.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("sluice-sentinel-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let (dir, master_port) = (dir.clone(), master_port.clone());
            let extra = tls_args(tls.as_ref().map_or(0, |t| t.sentinels[i]));
            let kind = Kind {
                name: "redis-server --sentinel",
                command: Arc::new(move |port| {
                    // A sentinel rewrites its config file: one each, written afresh.
                    let config = dir.join(format!("sentinel-{i}-{port}.conf"));
                    let text = format!(
                        "sentinel monitor {name} 127.0.0.1 {master_port} 2\n\
                         sentinel down-after-milliseconds {name} 1000\n\
                         sentinel failover-timeout {name} 10000\n\
                         sentinel parallel-syncs {name} 1\n",
                        name = RedisSentinels::MASTER
                    );
                    let _ = std::fs::write(&config, text);
                    let mut command = Command::new("redis-server");
                    command
                        .arg(&config)
                        .arg("--sentinel")
                        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                        .args(["--protected-mode", "no"])
                        .args(&extra);
                    command
                }),
                probe: b"PING\r\n",
                ready: b"+PONG\r\n",
            };
            sentinels.push(Process::start(kind)?);
        }
        Ok(RedisSentinels {
            master,
            replica,
            sentinels,
            tls,
            dir,
        })
    }

    /// The replica's port as the sentinels name it once it is master (its TLS port with
    /// TLS).
    pub fn replica_port(&self) -> u16 {
        self.tls.as_ref().map_or(self.replica.port(), |t| t.replica)
    }

    /// The master's port as the sentinels name it (its TLS port with TLS).
    pub fn master_port_announced(&self) -> u16 {
        self.tls.as_ref().map_or(self.master.port(), |t| t.master)
    }

    /// `redis+sentinel://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C/sluice`; with TLS,
    /// `rediss+sentinel://` to the sentinels' TLS ports (add `?tls_ca=` for the test CA).
    pub fn url(&self) -> String {
        let ports: Vec<u16> = match &self.tls {
            Some(tls) => tls.sentinels.clone(),
            None => self.sentinels.iter().map(Process::port).collect(),
        };
        let hosts: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let scheme = if self.tls.is_some() {
            "rediss+sentinel"
        } else {
            "redis+sentinel"
        };
        format!("{scheme}://{}/{}", hosts.join(","), RedisSentinels::MASTER)
    }

    /// Runs `redis-cli` on sentinel `i`.
    pub fn sentinel_cli(&self, i: usize, args: &[&str]) -> io::Result<String> {
        let output = Command::new("redis-cli")
            .args(["-p", &self.sentinels[i].port().to_string()])
            .args(args)
            .output()?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The master's port as sentinel `i` names it now.
    pub fn master_port(&self, i: usize) -> Option<u16> {
        let answer = self.sentinel_cli(
            i,
            &[
                "SENTINEL",
                "get-master-addr-by-name",
                RedisSentinels::MASTER,
            ],
        );
        answer.ok()?.lines().nth(1)?.trim().parse().ok()
    }

    /// Waits until every sentinel knows the replica and the two other sentinels, so a
    /// failover can happen.
    pub fn wait_until_watching(&self, within: Duration) -> io::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let mut ready = true;
            for i in 0..self.sentinels.len() {
                let fields =
                    self.sentinel_cli(i, &["SENTINEL", "master", RedisSentinels::MASTER])?;
                let lines: Vec<&str> = fields.lines().map(str::trim).collect();
                let field = |name: &str| {
                    lines
                        .iter()
                        .position(|l| *l == name)
                        .and_then(|at| lines.get(at + 1)?.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                ready &= field("num-slaves") >= 1 && field("num-other-sentinels") >= 2;
            }
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::other(
                    "the sentinels did not find the replica and each other",
                ));
            }
            std::thread::sleep(Duration::from_millis(100)); // polling real servers' state
        }
    }
}

impl Drop for RedisSentinels {
    fn drop(&mut self) {
        for sentinel in &mut self.sentinels {
            sentinel.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
