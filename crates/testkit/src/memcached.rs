//! Real `memcached` processes. Run as root, the server is told `-u root`, which it requires
//! then.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::process::{Kind, Process};

/// A `memcached` on a free port, stopped by PID on drop.
pub struct MemcachedServer {
    process: Process,
}

/// Whether this process runs as root (memcached then wants `-u root`).
fn is_root() -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| {
        Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
    })
}

impl MemcachedServer {
    /// Starts a server with 64 MB of memory.
    pub fn start() -> io::Result<MemcachedServer> {
        MemcachedServer::start_with(&[])
    }

    /// Starts a server with extra arguments (`-m 1` for a tiny memory, say; a later `-m`
    /// wins over the default).
    pub fn start_with(extra: &[&str]) -> io::Result<MemcachedServer> {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let kind = Kind {
            name: "memcached",
            command: Arc::new(move |port| {
                let mut command = Command::new("memcached");
                command
                    .args(["-l", "127.0.0.1", "-p", &port.to_string()])
                    .args(["-U", "0", "-m", "64"]);
                if is_root() {
                    command.args(["-u", "root"]);
                }
                command.args(&extra);
                command
            }),
            probe: b"version\r\n",
            ready: b"VERSION ",
        };
        Ok(MemcachedServer {
            process: Process::start(kind)?,
        })
    }

    /// Starts `n` servers.
    pub fn start_many(n: usize) -> io::Result<Vec<MemcachedServer>> {
        (0..n).map(|_| MemcachedServer::start()).collect()
    }

    pub fn port(&self) -> u16 {
        self.process.port()
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// `127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }

    /// `memcached://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("memcached://{}", self.address())
    }

    /// The URL of a pool of `servers`.
    pub fn pool_url(servers: &[MemcachedServer]) -> String {
        let addresses: Vec<String> = servers.iter().map(MemcachedServer::address).collect();
        format!("memcached://{}", addresses.join(","))
    }

    /// Kills the server (SIGKILL, as a crash would) and reaps it.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) -> io::Result<()> {
        self.process.restart()
    }

    /// Sends one raw command line (and a data block, if any) and returns the reply's first
    /// line: `delete k`, `get k`... for tests that reach under the store.
    pub fn raw(&self, command: &str) -> io::Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port()))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(command.as_bytes())?;
        stream.write_all(b"\r\n")?;
        let mut reply = Vec::new();
        let mut byte = [0u8; 1];
        while !reply.ends_with(b"\r\n") {
            stream.read_exact(&mut byte)?;
            reply.push(byte[0]);
        }
        reply.truncate(reply.len() - 2);
        Ok(String::from_utf8_lossy(&reply).into_owned())
    }
}
