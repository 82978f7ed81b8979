//! A server process on a port of its own: started, waited for, stopped by PID.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a server may take to answer its first probe.
const START_WITHIN: Duration = Duration::from_secs(10);
/// Ports tried before giving up: another process may take a free port before the server
/// binds it.
const PORT_TRIES: usize = 5;

/// A port that is free now, with `port + 10000` (a Redis Cluster node's bus port) free too.
pub fn free_port() -> io::Result<u16> {
    for _ in 0..200 {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return Ok(port);
        }
    }
    Err(io::Error::other("no free port pair found"))
}

/// How to start one kind of server and to tell that it is ready.
#[derive(Clone)]
pub(crate) struct Kind {
    pub name: &'static str,
    /// The command for a server on this port.
    pub command: Arc<dyn Fn(u16) -> Command + Send + Sync>,
    /// Sent once connected; the server is ready when its reply starts with `ready`.
    pub probe: &'static [u8],
    pub ready: &'static [u8],
}

/// A running server process, killed and reaped on drop.
pub(crate) struct Process {
    kind: Kind,
    child: Option<Child>,
    port: u16,
}

impl Process {
    /// Starts a server on a free port, on another one if the port was taken meanwhile.
    pub fn start(kind: Kind) -> io::Result<Process> {
        let mut last = None;
        for _ in 0..PORT_TRIES {
            let mut process = Process {
                kind: kind.clone(),
                child: None,
                port: free_port()?,
            };
            match process.spawn() {
                Ok(()) => return Ok(process),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("tried at least once"))
    }

    fn spawn(&mut self) -> io::Result<()> {
        let child = (self.kind.command)(self.port)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| io::Error::other(format!("cannot run {}: {e}", self.kind.name)))?;
        self.child = Some(child);
        self.wait_ready()
    }

    /// Waits until the server answers its probe, or has exited (its port taken, say).
    fn wait_ready(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + START_WITHIN;
        loop {
            if let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                stream.set_read_timeout(Some(Duration::from_millis(200)))?;
                let mut reply = vec![0u8; self.kind.ready.len()];
                if stream.write_all(self.kind.probe).is_ok()
                    && stream.read_exact(&mut reply).is_ok()
                    && reply == self.kind.ready
                {
                    return Ok(());
                }
            }
            let exited = match self.child.as_mut() {
                Some(child) => child.try_wait()?.is_some(),
                None => true,
            };
            if exited || Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "{} on port {} did not start",
                    self.kind.name, self.port
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (SIGKILL, as a crash would) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        self.spawn()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}
