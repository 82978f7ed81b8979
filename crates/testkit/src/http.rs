//! The service's HTTP API driven as a user would: with curl, and with a keep-alive client
//! fast enough to time single requests.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// One curl call: (status, body). A body is sent as JSON.
pub fn curl(method: &str, url: &str, body: Option<&str>) -> (u16, String) {
    let mut command = Command::new("curl");
    command.args(["-s", "-X", method, "-w", "\n%{http_code}", url]);
    if let Some(body) = body {
        command.args([
            "-H",
            "content-type: application/json",
            "--data-binary",
            body,
        ]);
    }
    let output = command.output().expect("run curl");
    let text = String::from_utf8(output.stdout).unwrap();
    let (body, code) = text.rsplit_once('\n').unwrap();
    (code.parse().unwrap(), body.to_owned())
}

/// `body` as JSON; panics with the body when it is not.
pub fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// `clients` concurrent curl processes, spread round-robin over `bases` (HTTP base URLs),
/// each sending `per_client` checks of `policy` for user `u1` over one connection; returns
/// the number admitted and the seconds the flood took. Every answer must be a decision.
pub fn flood(bases: &[&str], clients: usize, policy: &str, per_client: usize) -> (usize, f64) {
    let body = format!(r#"{{"policy":"{policy}","selectors":{{"user":"u1"}}}}"#);
    let started = Instant::now();
    let children: Vec<Child> = (0..clients)
        .map(|i| {
            let base = bases[i % bases.len()];
            let url = format!("{base}/v1/check");
            let mut command = Command::new("curl");
            command.args(["-s", "-H", "content-type: application/json"]);
            for _ in 0..per_client {
                command.args(["--data-binary", &body, &url, "-w", "\n"]);
                command.arg("--next");
            }
            command.args(["-s", "-o", "/dev/null", &format!("{base}/health")]);
            command.stdout(Stdio::piped()).spawn().expect("run curl")
        })
        .collect();
    let mut admitted = 0;
    let mut answered = 0;
    for child in children {
        let output = child.wait_with_output().unwrap();
        for line in String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .filter(|l| !l.is_empty())
        {
            answered += 1;
            let decision = json(line);
            assert!(decision.get("error").is_none(), "{line}");
            if decision["allowed"] == Value::Bool(true) {
                admitted += 1;
            }
        }
    }
    assert_eq!(answered, clients * per_client, "every request answered");
    (admitted, started.elapsed().as_secs_f64())
}

/// A TCP connection to `address` (`host:port`, or an `http://` base), reads timing out after
/// 9 s so a test fails rather than hangs.
pub fn connect(address: &str) -> TcpStream {
    let address = address.trim_start_matches("http://");
    let stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(9)))
        .unwrap();
    stream
}

/// A keep-alive HTTP/1.1 client on one connection: just enough to send many requests fast.
pub struct Http1 {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Http1 {
    pub fn connect(base: &str) -> Http1 {
        Http1 {
            stream: connect(base),
            buf: Vec::new(),
        }
    }

    /// Sends one request and reads its answer: (status, body).
    pub fn request(&mut self, method: &str, path: &str, body: &str) -> (u16, String) {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        // One write: a head and a body written apart wait out delayed ACKs.
        self.stream.write_all((head + body).as_bytes()).unwrap();
        let end = loop {
            if let Some(at) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            self.fill();
        };
        let head = String::from_utf8_lossy(&self.buf[..end]).to_lowercase();
        let status = head[9..12].parse().unwrap();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map_or(0, |n| n.trim().parse().unwrap());
        while self.buf.len() < end + length {
            self.fill();
        }
        let body = String::from_utf8_lossy(&self.buf[end..end + length]).into_owned();
        self.buf.drain(..end + length);
        (status, body)
    }

    fn fill(&mut self) {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).unwrap();
        assert!(n > 0, "the server closed a good client's connection");
        self.buf.extend_from_slice(&chunk[..n]);
    }
}

/// Resident memory of process `pid` (`std::process::id()` for this one).
pub fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap();
    kib * 1024
}

/// Milliseconds of each of `n` requests made by `request`, sorted.
pub fn timings(n: usize, mut request: impl FnMut()) -> Vec<f64> {
    let mut all: Vec<f64> = (0..n)
        .map(|_| {
            let started = Instant::now();
            request();
            started.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    all.sort_by(f64::total_cmp);
    all
}

pub fn p99(sorted: &[f64]) -> f64 {
    sorted[sorted.len() * 99 / 100]
}

/// The bytes an HTTP/2 client opens a connection with.
pub const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// One HTTP/2 frame, written by hand for tests that send what no client library would:
/// length, type, flags, stream, payload.
pub fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}
