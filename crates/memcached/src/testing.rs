//! Real memcached servers for tests and benchmarks: each started on a free port, and stopped
//! by PID when dropped. Needs `memcached` on PATH (Debian's `memcached`; `scripts/test.sh`
//! installs it). Run as root, the server is told `-u root`, which it requires then.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A `memcached` process.
pub struct MemcachedServer {
    child: Option<Child>,
    port: u16,
    extra: Vec<String>,
}

fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
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

/// Waits until the server on `port` answers `version`.
fn wait_ready(port: u16, within: Duration) -> io::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) {
            stream.set_read_timeout(Some(Duration::from_millis(200)))?;
            let mut reply = [0u8; 8];
            if stream.write_all(b"version\r\n").is_ok()
                && stream.read_exact(&mut reply).is_ok()
                && &reply == b"VERSION "
            {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            return Err(io::Error::other(format!(
                "memcached on port {port} did not start"
            )));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl MemcachedServer {
    /// Starts a server with 64 MB of memory.
    pub fn start() -> io::Result<MemcachedServer> {
        MemcachedServer::start_with(&[])
    }

    /// Starts a server with extra arguments (`-m 1` for a tiny memory, say; a later `-m`
    /// wins over the default).
    pub fn start_with(extra: &[&str]) -> io::Result<MemcachedServer> {
        let mut server = MemcachedServer {
            child: None,
            port: free_port()?,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        server.spawn()?;
        Ok(server)
    }

    /// Starts `n` servers.
    pub fn start_many(n: usize) -> io::Result<Vec<MemcachedServer>> {
        (0..n).map(|_| MemcachedServer::start()).collect()
    }

    fn spawn(&mut self) -> io::Result<()> {
        let mut command = Command::new("memcached");
        command
            .args(["-l", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "0", "-m", "64"]);
        if is_root() {
            command.args(["-u", "root"]);
        }
        let child = command
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        wait_ready(self.port, Duration::from_secs(10))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
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
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        self.spawn()
    }

    /// Sends one raw command line (and a data block, if any) and returns the reply's first
    /// line: `delete k`, `get k`... for tests that reach under the store.
    pub fn raw(&self, command: &str) -> io::Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
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

impl Drop for MemcachedServer {
    fn drop(&mut self) {
        self.kill();
    }
}
