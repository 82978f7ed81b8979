//! Real PostgreSQL servers: `initdb` in a temporary directory, then `postgres` on a free
//! port, stopped by PID.
//!
//! PostgreSQL refuses to run as root. Run as root, the server runs as the system user
//! `sluice-pg` (created with `useradd --system` when missing) through `setpriv`, which execs
//! so the PID we hold is the postmaster's; run as anyone else, it runs as that user. The
//! binaries come from `pg_config --bindir`, `/usr/lib/postgresql/*/bin` or `PATH`.
//!
//! The server trusts local TCP connections (`postgres://postgres@127.0.0.1:PORT/postgres`),
//! runs with `fsync=off` (tests do not survive power cuts, only process crashes: committed
//! transactions are in the OS's cache and survive a SIGKILL) and in its own process group,
//! so [`PostgresServer::kill`] takes its backends down with it, as a crash would.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::process::free_port;

/// The system user the server runs as when the tests run as root.
pub const SYSTEM_USER: &str = "sluice-pg";
/// How long the server may take to accept its first session (a restart replays the WAL).
const START_WITHIN: Duration = Duration::from_secs(30);
const PORT_TRIES: usize = 5;

static INSTANCES: AtomicU32 = AtomicU32::new(0);

/// A PostgreSQL server on a free port with a data directory of its own, stopped by PID and
/// removed on drop.
pub struct PostgresServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

impl PostgresServer {
    /// Runs `initdb` and starts the server (about a second).
    pub fn start() -> io::Result<PostgresServer> {
        PostgresServer::start_with(&[])
    }

    /// Starts a server with extra `-c name=value` settings (`"max_connections=300"`).
    pub fn start_with(settings: &[&str]) -> io::Result<PostgresServer> {
        PostgresServer::start_in(fresh_dir()?, settings)
    }

    /// Starts a server with its files in `dir` (removed when the server is dropped).
    fn start_in(dir: PathBuf, settings: &[&str]) -> io::Result<PostgresServer> {
        let mut server = PostgresServer {
            child: None,
            port: 0,
            dir,
        };
        server.init(settings)?;
        let mut last = None;
        for _ in 0..PORT_TRIES {
            server.port = free_port()?;
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) => last = Some(e),
            }
        }
        Err(last.expect("tried at least once"))
    }

    /// Starts a server that speaks TLS (`ssl = on`) with a certificate for 127.0.0.1 and
    /// localhost signed by a private CA; answers the server and the CA's certificate file
    /// (for `sslrootcert`). Clients may still connect without TLS.
    pub fn start_tls() -> io::Result<(PostgresServer, PathBuf)> {
        let dir = fresh_dir()?;
        let tls = dir.join("tls");
        std::fs::create_dir(&tls)?;
        crate::tls::certificates(&tls)?;
        // PostgreSQL refuses a key that others may read, or that another user owns.
        let key = tls.join("server.key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
        if let Some(user) = server_user()? {
            for file in [&tls, &key, &tls.join("server.crt")] {
                chown(file, &user)?;
            }
        }
        let cert = format!("ssl_cert_file = '{}'", tls.join("server.crt").display());
        let key = format!("ssl_key_file = '{}'", key.display());
        let server = PostgresServer::start_in(dir, &["ssl = on", &cert, &key])?;
        Ok((server, tls.join("ca.crt")))
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// `initdb` as the server's user, then the settings appended to `postgresql.conf`.
    fn init(&self, settings: &[&str]) -> io::Result<()> {
        let user = server_user()?;
        if let Some(user) = &user {
            chown(&self.dir, user)?;
        }
        let mut command = as_server_user(&binary("initdb")?, user.as_deref());
        command
            .arg("-D")
            .arg(self.data())
            .args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"])
            .args(["--locale=C", "--no-instructions"]);
        let output = command.output()?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "initdb failed: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        let mut conf = String::from(
            "\n# sluice tests\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n\
             fsync = off\nfull_page_writes = off\nmax_connections = 300\n\
             shared_buffers = 32MB\nlog_min_messages = fatal\n",
        );
        for setting in settings {
            conf.push_str(setting);
            conf.push('\n');
        }
        let path = self.data().join("postgresql.conf");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)?
            .write_all(conf.as_bytes())
    }

    fn spawn(&mut self) -> io::Result<()> {
        let user = server_user()?;
        let mut command = as_server_user(&binary("postgres")?, user.as_deref());
        command
            .arg("-D")
            .arg(self.data())
            .args(["-p", &self.port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        let child = command
            .spawn()
            .map_err(|e| io::Error::other(format!("cannot run postgres: {e}")))?;
        self.child = Some(child);
        self.wait_ready()
    }

    /// Waits until a session is accepted (not "starting up"), or the server has exited.
    fn wait_ready(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + START_WITHIN;
        loop {
            if accepts_session(self.port) {
                return Ok(());
            }
            let exited = match self.child.as_mut() {
                Some(child) => child.try_wait()?.is_some(),
                None => true,
            };
            if exited || Instant::now() > deadline {
                self.kill();
                return Err(io::Error::other(format!(
                    "postgres on port {} did not start (data in {})",
                    self.port,
                    self.dir.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The postmaster's PID while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The CPU time (user + system) the server has spent so far, in seconds: the postmaster,
    /// every live backend and helper process, and those that exited. For benchmarks, where
    /// a rate is noise on a shared machine but CPU per decision is not.
    pub fn cpu_seconds(&self) -> f64 {
        let Some(postmaster) = self.pid() else {
            return 0.0;
        };
        let waited = crate::bench::cpu_seconds(Some(postmaster), true).unwrap_or(0.0);
        let live = descendants(postmaster)
            .into_iter()
            .filter(|p| *p != postmaster);
        waited
            + live
                .filter_map(|p| crate::bench::cpu_seconds(Some(p), false))
                .sum::<f64>()
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Kills the server and its backends with SIGKILL, as a crash would, and waits until
    /// every one of them is gone: PostgreSQL puts each backend in a session of its own, so
    /// the postmaster's process group does not reach them, and a backend left running
    /// could still answer a query after the "crash". The data directory stays for
    /// [`PostgresServer::restart`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let postmaster = child.id();
            let mut doomed = descendants(postmaster);
            doomed.push(postmaster);
            let _ = Command::new("kill")
                .arg("-KILL")
                .arg("--")
                .args(doomed.iter().map(u32::to_string))
                .arg(format!("-{postmaster}"))
                .stderr(Stdio::null())
                .status();
            let _ = child.kill();
            let _ = child.wait();
            // Backends are the postmaster's children, reparented once it dies: wait for
            // them to be reaped (bounded, so a test fails rather than hangs).
            let deadline = Instant::now() + START_WITHIN;
            while doomed.iter().any(|pid| is_running(*pid)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// Starts the server again on the same port and data directory (it runs crash
    /// recovery); retried while the old processes let go of their shared memory.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        let deadline = Instant::now() + START_WITHIN;
        loop {
            match self.spawn() {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// `psql` for this server's `postgres` database, unaligned and tuples only, stopping at
    /// the first error.
    fn psql_command(&self) -> io::Result<Command> {
        let mut command = Command::new(binary("psql")?);
        command
            .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1"])
            .args(["-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", "postgres"]);
        Ok(command)
    }

    /// Runs one SQL command with `psql` and returns its unaligned, tuples-only output
    /// (`"42\n"`), for tests that look under the store.
    pub fn psql(&self, sql: &str) -> io::Result<String> {
        let output = self.psql_command()?.args(["-c", sql]).output()?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "psql failed: {}",
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

/// An open `psql` session holding a transaction, from [`PostgresServer::hold`]: what its
/// statements locked stays locked until [`Transaction::commit`] (or the drop, which ends the
/// session and so rolls back).
pub struct Transaction {
    child: Child,
}

impl PostgresServer {
    /// Opens a `psql` session, runs `BEGIN` and `sql` in it and returns once they have run,
    /// the transaction still open: a test can hold a lock (`LOCK TABLE t`) while the code
    /// under test runs into it, then let go.
    pub fn hold(&self, sql: &str) -> io::Result<Transaction> {
        let child = self
            .psql_command()?
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let mut transaction = Transaction { child };
        let stdin = transaction.child.stdin.as_mut().expect("piped stdin");
        writeln!(stdin, "BEGIN;\n{sql};\n\\echo held")?;
        stdin.flush()?;
        // The marker comes back only after the statements ran; an error ends the session
        // (ON_ERROR_STOP), and the read sees the end of the output instead.
        let stdout = transaction.child.stdout.as_mut().expect("piped stdout");
        let mut seen = Vec::new();
        let mut byte = [0u8; 1];
        while !seen.ends_with(b"held\n") {
            if stdout.read(&mut byte)? == 0 {
                return Err(io::Error::other(format!(
                    "psql ended before `{sql}` was held: {}",
                    String::from_utf8_lossy(&seen)
                )));
            }
            seen.push(byte[0]);
        }
        Ok(transaction)
    }
}

impl Transaction {
    /// Commits and waits for the session to end.
    pub fn commit(mut self) -> io::Result<()> {
        let mut stdin = self.child.stdin.take().expect("piped stdin");
        writeln!(stdin, "COMMIT;")?;
        drop(stdin);
        let status = self.child.wait()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!("psql ended with {status}")))
        }
    }
}

impl Drop for Transaction {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A new, empty directory for one server's files.
fn fresh_dir() -> io::Result<PathBuf> {
    let n = INSTANCES.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("sluice-pg-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sends a protocol 3.0 startup packet for user `postgres` and reads the reply: `R` (an
/// authentication answer) means sessions are accepted; `E` means not yet.
fn accepts_session(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    let body = b"user\0postgres\0database\0postgres\0\0";
    let mut packet = Vec::with_capacity(8 + body.len());
    packet.extend_from_slice(&((8 + body.len()) as u32).to_be_bytes());
    packet.extend_from_slice(&196_608u32.to_be_bytes());
    packet.extend_from_slice(body);
    let mut reply = [0u8; 1];
    stream.write_all(&packet).is_ok() && stream.read_exact(&mut reply).is_ok() && reply[0] == b'R'
}

/// The user the server must run as: `Some(SYSTEM_USER)` when we are root (created once),
/// `None` to run as ourselves.
fn server_user() -> io::Result<Option<String>> {
    static USER: OnceLock<Result<Option<String>, String>> = OnceLock::new();
    USER.get_or_init(|| {
        let uid = Command::new("id")
            .arg("-u")
            .output()
            .map_err(|e| e.to_string())?;
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            return Ok(None);
        }
        // Several test binaries may create the user at once: retry until it exists.
        for _ in 0..50 {
            if user_exists() {
                return Ok(Some(SYSTEM_USER.to_string()));
            }
            let _ = Command::new("useradd")
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                ])
                .arg(SYSTEM_USER)
                .stderr(Stdio::null())
                .status();
            if user_exists() {
                return Ok(Some(SYSTEM_USER.to_string()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("cannot create the system user {SYSTEM_USER}"))
    })
    .clone()
    .map_err(io::Error::other)
}

fn user_exists() -> bool {
    Command::new("id")
        .arg("-u")
        .arg(SYSTEM_USER)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn chown(dir: &Path, user: &str) -> io::Result<()> {
    let status = Command::new("chown")
        .arg(format!("{user}:"))
        .arg(dir)
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "chown {user} {} failed",
            dir.display()
        )))
    }
}

/// A command running `program` as `user` (setpriv execs, so the PID is the program's).
fn as_server_user(program: &Path, user: Option<&str>) -> Command {
    match user {
        Some(user) => {
            let mut command = Command::new("setpriv");
            command
                .args(["--reuid", user, "--regid", user, "--init-groups", "--"])
                .arg(program);
            command
        }
        None => Command::new(program),
    }
}

/// Where PostgreSQL's programs live: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/*/bin`, else `PATH`.
fn bindir() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
            let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if out.status.success() && dir.join("postgres").is_file() {
                return Some(dir);
            }
        }
        let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|entry| entry.ok().map(|e| e.path().join("bin")))
            .filter(|dir| dir.join("postgres").is_file())
            .collect();
        // Newest version last: "9" < "16" as numbers, not as text.
        dirs.sort_by_key(|dir| {
            dir.parent()
                .and_then(|v| v.file_name())
                .and_then(|v| v.to_str())
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0)
        });
        dirs.pop()
    })
    .clone()
}

fn binary(name: &str) -> io::Result<PathBuf> {
    match bindir() {
        Some(dir) => Ok(dir.join(name)),
        None => Ok(PathBuf::from(name)),
    }
}

/// Every process below `pid`, read from `/proc` (children, their children, ...).
fn descendants(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(child) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // `/proc/PID/stat`: "pid (comm) state ppid ...", comm may hold spaces.
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
                continue;
            };
            if let Some(parent) = after.split_whitespace().nth(1).and_then(|p| p.parse().ok()) {
                parents.push((child, parent));
            }
        }
    }
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(c, _)| *c),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// Whether `pid` is a live process (not gone, not a zombie waiting to be reaped).
fn is_running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z"),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_survives_a_crash_and_keeps_its_data() {
        let mut server = PostgresServer::start().unwrap();
        server
            .psql("CREATE TABLE t (n int); INSERT INTO t VALUES (7)")
            .unwrap();
        server.kill();
        assert!(
            server.psql("SELECT 1").is_err(),
            "killed server still answers"
        );
        server.restart().unwrap();
        assert_eq!(server.psql("SELECT n FROM t").unwrap().trim(), "7");
    }
}
