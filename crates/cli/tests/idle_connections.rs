//! Ten thousand idle clients held at once by `sluice serve` (in its own process, so its
//! memory and file descriptors are its own): each has made one request and waits, as a
//! client pool's spare connections do. They cost a bounded few KiB each, a good client keeps
//! its latency, and closing them gives every file descriptor back.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;

use sluice_testkit::http::{H2_PREFACE, Http1, connect, h2_frame, p99, resident_bytes, timings};
use support::Server;

/// Idle connections per listener (three listeners: 9,999 in all).
const PER_LISTENER: usize = 3_333;
/// How long the server keeps an idle HTTP/1.1 connection waiting for its next request (the
/// HTTP listener's `HEADER_TIMEOUT`).
const HEADER_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);
/// Most resident memory one idle connection may cost the server.
const MAX_BYTES_PER_CONNECTION: u64 = 48 << 10;

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

fn read_exactly(stream: &mut TcpStream, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    stream.read_exact(&mut buf).unwrap();
    buf
}

/// An HTTP/1.1 client that asked for `/health` once and keeps its connection.
fn idle_http(address: &str) -> TcpStream {
    let mut stream = connect(address);
    stream
        .write_all(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    while !answer.ends_with(b"ok\n") {
        answer.extend(read_exactly(&mut stream, 1));
    }
    stream
}

/// A Redis protocol client that sent `PING` once and keeps its connection.
fn idle_resp(address: &str) -> TcpStream {
    let mut stream = connect(address);
    stream.write_all(b"PING\r\n").unwrap();
    assert_eq!(read_exactly(&mut stream, 7), b"+PONG\r\n");
    stream
}

/// An HTTP/2 (gRPC) client that opened the connection (preface and SETTINGS, answered by
/// the server's SETTINGS) and keeps it.
fn idle_grpc(address: &str) -> TcpStream {
    let mut stream = connect(address);
    let mut opening = H2_PREFACE.to_vec();
    opening.extend(h2_frame(4, 0, 0, &[]));
    stream.write_all(&opening).unwrap();
    let header = read_exactly(&mut stream, 9);
    assert_eq!(header[3], 4, "the server's first frame is SETTINGS");
    let length =
        usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
    read_exactly(&mut stream, length);
    stream
}

#[test]
fn ten_thousand_idle_connections_cost_little_and_slow_no_one() {
    let limit = rlimit::increase_nofile_limit(u64::MAX).unwrap();
    assert!(
        limit > 3 * PER_LISTENER as u64 + 500,
        "this test needs {} open files (limit {limit})",
        3 * PER_LISTENER + 500
    );
    let server = Server::start_envoy("[policies.api]\nrule = \"user:5/h\"\n", &[], &[]);
    let (grpc, resp) = (server.grpc.clone().unwrap(), server.resp.clone().unwrap());
    let mut good = Http1::connect(&server.base);
    let mut health = || assert_eq!(good.request("GET", "/health", "").0, 200);
    timings(200, &mut health);
    let quiet = timings(400, &mut health);
    let (resident, fds) = (resident_bytes(server.pid()), open_fds(server.pid()));

    let mut idle = Vec::with_capacity(3 * PER_LISTENER);
    let mut costs = Vec::new();
    // HTTP last: an idle keep-alive connection is closed once the header deadline (5 s)
    // passes, so those are counted while they are still held.
    let kinds: [(&str, &dyn Fn() -> TcpStream); 3] = [
        ("RESP", &|| idle_resp(&resp)),
        ("gRPC", &|| idle_grpc(&grpc)),
        ("HTTP/1.1", &|| idle_http(&server.base)),
    ];
    // When each connection was opened: an HTTP/1.1 one older than the header deadline may
    // have been closed by then (on a loaded machine, opening 3,333 takes seconds).
    let mut opened = Vec::with_capacity(3 * PER_LISTENER);
    for (name, open) in kinds {
        let before = resident_bytes(server.pid());
        for _ in 0..PER_LISTENER {
            idle.push(open());
            opened.push((name, std::time::Instant::now()));
        }
        let grown = resident_bytes(server.pid()).saturating_sub(before);
        costs.push(format!("{name} {} bytes", grown / PER_LISTENER as u64));
    }
    let held_fds = open_fds(server.pid());
    let surely_held = opened
        .iter()
        .filter(|(name, at)| {
            *name != "HTTP/1.1"
                || at.elapsed() < HEADER_DEADLINE - std::time::Duration::from_secs(1)
        })
        .count();
    assert!(
        held_fds >= fds + surely_held,
        "the server holds {} connections, fewer than the {surely_held} it must",
        held_fds.saturating_sub(fds)
    );
    // A connection of its own: the first one sat idle past the header deadline meanwhile.
    let mut good = Http1::connect(&server.base);
    let mut health = || assert_eq!(good.request("GET", "/health", "").0, 200);
    timings(50, &mut health);
    let held = timings(400, &mut health);
    let grown = resident_bytes(server.pid()).saturating_sub(resident);
    let per_connection = grown / idle.len() as u64;
    let (quiet_p99, held_p99) = (p99(&quiet), p99(&held));
    eprintln!(
        "{} idle connections: the server grew {} KiB ({per_connection} bytes each: {}); \
         good client p99 {quiet_p99:.2} ms before, {held_p99:.2} ms with them held",
        idle.len(),
        grown >> 10,
        costs.join(", ")
    );
    assert!(
        per_connection <= MAX_BYTES_PER_CONNECTION,
        "{per_connection} bytes per idle connection"
    );
    assert!(
        held_p99 <= 2.0 * quiet_p99 + 5.0,
        "p99 {held_p99:.2} ms with {} idle connections, {quiet_p99:.2} ms without",
        idle.len()
    );

    // Closed by their clients, every one is given back.
    drop(idle);
    let closed = std::time::Instant::now();
    while open_fds(server.pid()) > fds + 8 {
        assert!(
            closed.elapsed() < std::time::Duration::from_secs(10),
            "{} file descriptors open 10 s after the clients left, {fds} before they came",
            open_fds(server.pid())
        );
        health();
    }
}
