//! Slow, silent, malformed and greedy clients against the service: cut off or refused within
//! documented bounds, never a crash, and never at the cost of the other clients.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use sluice_testkit::http::curl;
use sluice_testkit::http::{Http1, connect, p99, resident_bytes, timings};
use support::Server;

/// Reads until the server closes the connection; returns what it sent.
fn until_closed(stream: &mut TcpStream) -> String {
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("server kept a slow client: {e}"),
        }
    }
    String::from_utf8_lossy(&all).into_owned()
}

#[test]
fn a_client_sending_headers_slowly_is_cut_off() {
    let server = Server::start("[policies.api]\nrule = \"user:2/h\"\n");
    let started = Instant::now();
    let mut slow = connect(&server.base);
    slow.write_all(b"POST /v1/check HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    until_closed(&mut slow);
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(8), "cut off after {waited:?}");
    // Others were served all along.
    let (status, _) = curl("GET", &format!("{}/health", server.base), None);
    assert_eq!(status, 200);
}

/// Sends `head` at once, then `drip` one byte every 200 ms (each byte resets any idle
/// timer, as a slowloris client does) until the server closes the connection; how long
/// that took. Panics if the server held it past `within`.
fn drip_until_closed(address: &str, head: &[u8], drip: &[u8], within: Duration) -> Duration {
    let started = Instant::now();
    let mut stream = connect(address);
    stream.write_all(head).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut sink = [0u8; 1024];
    for byte in drip.iter().cycle() {
        assert!(
            started.elapsed() < within,
            "{address}: a drip-fed request still open after {within:?}"
        );
        match stream.read(&mut sink) {
            Ok(0) => return started.elapsed(),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return started.elapsed();
            }
            // The pacing: nothing came back within 200 ms.
            Err(_) => {}
        }
        if stream.write_all(&[*byte]).is_err() {
            return started.elapsed();
        }
    }
    unreachable!("the drip never ends")
}

/// Slowloris on the HTTP body and the Redis protocol: a request whose bytes keep coming,
/// one at a time, is cut off by the whole-request deadline (HTTP: `REQUEST_TIMEOUT`, RESP:
/// `COMMAND_TIMEOUT`, both 10 s), however lively the connection looks; good clients are
/// served meanwhile. (Headers sent slowly: the test above.)
#[test]
fn drip_fed_requests_are_cut_off_on_every_listener() {
    let server = Server::start("[policies.api]\nrule = \"user:2/h\"\n");
    let within = Duration::from_secs(14);
    let body = std::thread::spawn({
        let base = server.base.clone();
        move || {
            let head = b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10000\r\n\r\n{";
            drip_until_closed(&base, head, b" ", within)
        }
    });
    let resp = std::thread::spawn({
        let resp = server.resp.clone();
        move || {
            drip_until_closed(
                &resp,
                b"*3\r\n$11\r\nCL.THROTTLE\r\n$9000\r\n",
                b"k",
                within,
            )
        }
    });
    let mut good = Http1::connect(&server.base);
    while !body.is_finished() || !resp.is_finished() {
        assert_eq!(good.request("GET", "/health", "").0, 200);
    }
    for (name, waited) in [
        ("HTTP body", body.join().unwrap()),
        ("RESP", resp.join().unwrap()),
    ] {
        assert!(
            waited >= Duration::from_secs(9),
            "{name}: closed after {waited:?}, before its deadline: was it the drip that failed?"
        );
    }
}

#[test]
fn malformed_resp_frames_get_an_error_and_the_server_stays_up() {
    let server = Server::start("[policies.api]\nrule = \"user:2/h\"\n");
    let resp = server.resp.clone();
    for frame in [
        &b"*99999999\r\n"[..],
        b"*1\r\n$999999999\r\n",
        b"*1\r\n$-7\r\n",
        b"*2\r\n$4\r\nPING\r\n:5\r\n",
        b"*1\r\n$3\r\nabcdef\r\n",
    ] {
        let mut stream = connect(&resp);
        stream.write_all(frame).unwrap();
        let reply = until_closed(&mut stream);
        assert!(
            reply.starts_with("-ERR Protocol error"),
            "{frame:?}: {reply:?}"
        );
    }
    // Errors in commands keep the connection: all three answered on one stream.
    let mut stream = connect(&resp);
    stream
        .write_all(b"NOSUCH\r\n*2\r\n$11\r\nCL.THROTTLE\r\n$1\r\nk\r\nPING\r\nQUIT\r\n")
        .unwrap();
    let reply = until_closed(&mut stream);
    assert_eq!(
        reply,
        "-ERR unknown command 'NOSUCH'\r\n-ERR wrong number of arguments for 'cl.throttle' command\r\n+PONG\r\n+OK\r\n"
    );
    let (status, _) = curl("GET", &format!("{}/live", server.base), None);
    assert_eq!(status, 200);
}

#[test]
fn a_body_announced_too_large_is_refused_at_once() {
    let server = Server::start("[policies.api]\nrule = \"user:2/h\"\n");
    let started = Instant::now();
    let mut stream = connect(&server.base);
    // The body never comes: the answer must not wait for it (nor for the request timeout).
    stream
        .write_all(b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
        .unwrap();
    let reply = until_closed(&mut stream);
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// The metrics text with the counts blanked out: the series it holds.
fn series(metrics: &str) -> Vec<String> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.rsplit_once(' ').map_or(l, |(name, _)| name).to_owned())
        .collect()
}

/// Found by fuzzing the listeners: every unknown name a client sent became a metrics
/// label, for good (4,000 names of 60 KB grew the process by about 205 MiB and made
/// `/metrics` 1.2 GB). Now the names are counted in one series, and kept nowhere.
#[test]
fn unknown_policy_names_grow_neither_memory_nor_metrics() {
    let server = Server::start("[policies.api]\nrule = \"user:2/h\"\n");
    let mut http = Http1::connect(&server.base);
    let (_, before) = http.request("GET", "/metrics", "");
    let name = |i: usize| format!("{i:05}{}", "x".repeat(60_000));
    // Warm up: the allocator, the connection and the service's first requests.
    for i in 0..50 {
        let body = format!(r#"{{"policy":"{}","selectors":{{}}}}"#, name(i));
        assert_eq!(http.request("POST", "/v1/check", &body).0, 404);
    }
    let resident = resident_bytes(std::process::id());
    for i in 0..4_000 {
        let body = format!(r#"{{"policy":"{}","selectors":{{}}}}"#, name(i));
        let (status, answer) = http.request("POST", "/v1/check", &body);
        assert_eq!(status, 404);
        assert!(
            answer.len() < 400,
            "the 404 repeats at most a short name: {answer}"
        );
    }
    let mut resp = connect(&server.resp);
    for i in 0..1_000 {
        let policy = name(i);
        let frame = format!(
            "*2\r\n$12\r\nSLUICE.CHECK\r\n${}\r\n{policy}\r\n",
            policy.len()
        );
        resp.write_all(frame.as_bytes()).unwrap();
        let mut reply = [0u8; 512];
        let n = resp.read(&mut reply).unwrap();
        assert!(reply[..n].starts_with(b"-ERR unknown policy"), "{i}");
    }
    let grown = resident_bytes(std::process::id()).saturating_sub(resident);
    assert!(grown < 32 << 20, "grew by {} MiB", grown >> 20);
    let (_, after) = http.request("GET", "/metrics", "");
    assert_eq!(series(&after), series(&before));
    assert!(after.len() < before.len() + 64, "{after}");
    assert!(
        after.contains("sluice_unknown_policy_total 5050\n"),
        "{after}"
    );
}

/// Raises this process's soft limit on open files to the hard one; the limit it got.
fn raise_file_limit() -> u64 {
    rlimit::increase_nofile_limit(u64::MAX).unwrap()
}

fn resp_ping(stream: &mut TcpStream) {
    stream.write_all(b"PING\r\n").unwrap();
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"+PONG\r\n");
}

/// Silent connections (a TCP handshake, then nothing) on every listener: each is closed
/// within its listener's deadline, and meanwhile a good client on each listener keeps its
/// latency. The deadlines are the documented ones shortened, so the test takes seconds.
#[test]
fn silent_connections_are_closed_while_good_clients_keep_their_latency() {
    const SILENT: usize = 2_000;
    let limit = raise_file_limit();
    assert!(
        limit > (6 * SILENT + 500) as u64,
        "this test needs {} open files (limit {limit})",
        6 * SILENT + 500
    );
    let deadline = Duration::from_secs(2);
    let quick = sluice_server::Limits {
        first_byte: Some(deadline),
        idle: Duration::from_secs(60),
        ..sluice_server::Server::http_limits()
    };
    let resp_limits = sluice_server::Limits {
        idle: deadline,
        ..sluice_server::Server::resp_limits()
    };
    let server = Server::start_with("[policies.api]\nrule = \"user:2/h\"\n", &[], move |b| {
        b.http_limits(quick)
            .grpc_limits(quick)
            .resp_limits(resp_limits)
    });
    let mut http = Http1::connect(&server.base);
    let mut resp = connect(&server.resp);
    let grpc = GrpcClient::connect(&server.grpc);
    let mut good = || {
        assert_eq!(http.request("GET", "/health", "").0, 200);
        resp_ping(&mut resp);
        grpc.check();
    };
    let quiet = timings(200, &mut good);

    // The silent connections arrive in bursts while the good clients go on (each also
    // keeps its own connection busy enough not to be idle).
    let opened = Instant::now();
    let mut silent = Vec::new();
    let mut loaded = Vec::new();
    for address in [&server.base, &server.grpc, &server.resp] {
        for _ in 0..SILENT / 100 {
            silent.extend((0..100).map(|_| connect(address)));
            loaded.extend(timings(1, &mut good));
        }
    }
    loaded.extend(timings(200, &mut good));
    loaded.sort_by(f64::total_cmp);
    let (quiet_p99, loaded_p99) = (p99(&quiet), p99(&loaded));
    assert!(
        loaded_p99 <= 2.0 * quiet_p99 + 5.0,
        "p99 {loaded_p99:.2} ms with {SILENT} silent connections per listener, {quiet_p99:.2} ms without"
    );
    // Every silent connection is closed by the server, within the deadline (plus the time
    // they took to open and a margin for a loaded machine).
    let by = opened.elapsed() + deadline + Duration::from_secs(3);
    for mut stream in silent {
        let left = by
            .saturating_sub(opened.elapsed())
            .max(Duration::from_millis(1));
        stream.set_read_timeout(Some(left)).unwrap();
        let mut byte = [0u8; 1];
        match stream.read(&mut byte) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("a silent connection was still open after {by:?}: {other:?}"),
        }
    }
    // The good clients' connections were never cut, and the metrics show none open now
    // but theirs.
    good();
    let (_, metrics) = http.request("GET", "/metrics", "");
    for listener in ["http", "grpc", "resp"] {
        let line = format!("sluice_connections{{listener=\"{listener}\"}} 1\n");
        assert!(metrics.contains(&line), "{metrics}");
    }
}

/// A listener holding its most connections closes more at once, and the other listeners
/// (sharing the process's file descriptors) go on serving.
#[test]
fn a_full_listener_refuses_at_once_and_starves_no_other() {
    let small = sluice_server::Limits {
        max_connections: 50,
        ..sluice_server::Server::http_limits()
    };
    let server = Server::start_with("[policies.api]\nrule = \"user:2/h\"\n", &[], move |b| {
        b.grpc_limits(small)
    });
    let held: Vec<TcpStream> = (0..50).map(|_| connect(&server.grpc)).collect();
    // Over the bound: closed at once, not left waiting in the backlog.
    for _ in 0..20 {
        let started = Instant::now();
        let mut extra = connect(&server.grpc);
        until_closed(&mut extra);
        assert!(started.elapsed() < Duration::from_secs(2));
    }
    let mut resp = connect(&server.resp);
    resp_ping(&mut resp);
    let (status, metrics) = curl("GET", &format!("{}/metrics", server.base), None);
    assert_eq!(status, 200);
    assert!(
        metrics.contains("sluice_connections_refused_total{listener=\"grpc\"} 20\n"),
        "{metrics}"
    );
    drop(held);
}

/// A gRPC client of Envoy's protocol on a runtime of its own, one call at a time.
struct GrpcClient {
    runtime: tokio::runtime::Runtime,
    client: RateLimitServiceClient<tonic::transport::Channel>,
}

impl GrpcClient {
    fn connect(address: &str) -> GrpcClient {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let endpoint = format!("http://{address}");
        let client = runtime
            .block_on(RateLimitServiceClient::connect(endpoint))
            .unwrap();
        GrpcClient { runtime, client }
    }

    /// One call for a domain with no config: the whole gRPC path, answered OK.
    fn check(&self) {
        let request = RateLimitRequest {
            domain: "none".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "k".into(),
                    value: "v".into(),
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut client = self.client.clone();
        let answer = self
            .runtime
            .block_on(client.should_rate_limit(request))
            .unwrap();
        assert_eq!(answer.into_inner().overall_code, 1);
    }
}
