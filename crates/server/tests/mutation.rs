//! 100,000 mutated frames per protocol (RESP, HTTP/1.1 and HTTP/2, gRPC messages), then a
//! good client on each gets exact answers, and nothing in the process panicked. The fuzz
//! targets (`fuzz/`) go deep into each parser; this goes through the real listeners, with
//! their buffering, timeouts and connection handling.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;
use sluice_testkit::http::{H2_PREFACE, curl, h2_frame};
use support::Server;

const FRAMES: usize = 100_000;
/// Mutated frames sent on one connection before the client half-closes it (a frame the
/// server cannot read ends the connection, so the rest of a long batch would go unread).
const PER_CONNECTION: usize = 10;
/// What the good clients are held to.
const LIMIT: u64 = 5;

const POLICIES: &str = "[policies.api]\nrule = \"user:5/h\"\n\n[policies.login]\nrule = \"ip:20/m; ip+user:3/m\"\ncount_denied = true\n";
const ENVOY: &str = "domain: web\ndescriptors:\n  - key: user\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n  - key: path\n    value: /login\n    descriptors:\n      - key: ip\n        rate_limit: { unit: minute, requests_per_unit: 2 }\n";

/// Panics anywhere in this process (the service runs in it; a panic in a connection's task
/// would otherwise be swallowed by the runtime).
static PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_panics() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        previous(info);
    }));
}

/// xorshift64*: the same mutations on every run, so a failure can be replayed. (A
/// deterministic generator is all this needs; a random-number crate would add nothing.)
struct Mutator(u64);

impl Mutator {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// `seed` with one to four changes: a bit flipped, a byte replaced by one the parsers
    /// care about, a byte inserted or removed, a span repeated, the tail cut.
    fn mutate(&mut self, seed: &[u8]) -> Vec<u8> {
        const SPECIAL: &[u8] = b"\r\n*$:+-0129 {}\"\x00\xff";
        let mut out = seed.to_vec();
        for _ in 0..=self.below(4) {
            let at = self.below(out.len());
            match self.below(6) {
                0 if !out.is_empty() => out[at] ^= 1 << self.below(8),
                1 if !out.is_empty() => out[at] = SPECIAL[self.below(SPECIAL.len())],
                2 => out.insert(at, SPECIAL[self.below(SPECIAL.len())]),
                3 if !out.is_empty() => {
                    out.remove(at);
                }
                4 if !out.is_empty() => {
                    let end = (at + 1 + self.below(16)).min(out.len());
                    let span = out[at..end].to_vec();
                    for _ in 0..=self.below(8) {
                        out.splice(at..at, span.iter().copied());
                    }
                }
                _ => out.truncate(at),
            }
        }
        out
    }
}

fn bulk(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    out
}

fn http1(method: &str, path: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Sends `FRAMES` mutations of `seeds` to `address`, `PER_CONNECTION` to a connection,
/// each connection half-closed after its batch and read until the server closes it.
/// Returns how many connections the server answered with at least one byte.
fn flood(address: &str, seeds: &[Vec<u8>], mutator: &mut Mutator) -> usize {
    let mut answered = 0;
    for _ in 0..FRAMES / PER_CONNECTION {
        let mut batch = Vec::new();
        for _ in 0..PER_CONNECTION {
            let seed = &seeds[mutator.below(seeds.len())];
            batch.extend(mutator.mutate(seed));
        }
        let mut stream = TcpStream::connect(address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        // The server may close early (a frame it cannot read); what it did not read is lost.
        let _ = stream.write_all(&batch);
        let _ = stream.shutdown(Shutdown::Write);
        let mut reply = Vec::new();
        match stream.read_to_end(&mut reply) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("the server neither answered nor closed: {e}"),
        }
        answered += usize::from(!reply.is_empty());
    }
    answered
}

fn resp_line(stream: &mut TcpStream) -> String {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        stream.read_exact(&mut byte).unwrap();
        line.push(byte[0]);
    }
    String::from_utf8(line).unwrap()
}

/// One reply in the Redis protocol: a line, or an array of lines (all the replies here
/// are integers, errors or arrays of integers).
fn resp_reply(stream: &mut TcpStream) -> String {
    let mut reply = resp_line(stream);
    if let Some(count) = reply.strip_prefix('*') {
        let count: usize = count.trim_end().parse().unwrap();
        for _ in 0..count {
            reply.push_str(&resp_line(stream));
        }
    }
    reply
}

#[test]
fn a_hundred_thousand_mutated_frames_per_protocol_then_exact_answers() {
    count_panics();
    let server = Server::start_with(POLICIES, &[("web.yaml", ENVOY)], |b| b);
    let mut mutator = Mutator(0x5eed_0f51_u64);

    // The Redis protocol.
    let resp_seeds = vec![
        bulk(&["CL.THROTTLE", "user:alice", "4", "5", "60"]),
        bulk(&["CL.THROTTLE", "user:alice", "4", "5", "60", "2"]),
        bulk(&["SLUICE.CHECK", "api", "user", "alice"]),
        bulk(&[
            "SLUICE.CHECK",
            "login",
            "2",
            "ip",
            "10.0.0.1",
            "user",
            "bob",
        ]),
        bulk(&["HELLO", "3"]),
        bulk(&["PING", "hi"]),
        b"CL.THROTTLE user:bob 4 5 60\r\n".to_vec(),
        b"SLUICE.CHECK api user carol\r\n".to_vec(),
    ];
    let started = std::time::Instant::now();
    let answered = flood(&server.resp, &resp_seeds, &mut mutator);
    eprintln!(
        "RESP: {FRAMES} mutated frames, {answered} of {} connections answered, {:.1} s",
        FRAMES / PER_CONNECTION,
        started.elapsed().as_secs_f64()
    );
    assert!(
        answered > FRAMES / PER_CONNECTION / 2,
        "only {answered} RESP connections answered"
    );
    let mut good = TcpStream::connect(&server.resp).unwrap();
    for i in 0..=LIMIT {
        good.write_all(&bulk(&["SLUICE.CHECK", "api", "user", "good-resp"]))
            .unwrap();
        let reply = resp_reply(&mut good);
        let denied = if i < LIMIT { ":0\r\n" } else { ":1\r\n" };
        assert!(
            reply.starts_with(&format!("*5\r\n{denied}")),
            "hit {i}: {reply:?}"
        );
    }

    // HTTP/1.1, and HTTP/2 with prior knowledge on the same listener.
    let mut h2 = H2_PREFACE.to_vec();
    h2.extend(h2_frame(4, 0, 0, &[0, 3, 0, 0, 0, 100])); // SETTINGS
    h2.extend(h2_frame(6, 0, 0, &[1; 8])); // PING
    h2.extend(h2_frame(8, 0, 0, &[0, 0, 1, 0])); // WINDOW_UPDATE
    h2.extend(h2_frame(3, 0, 1, &[0, 0, 0, 8])); // RST_STREAM
    h2.extend(h2_frame(7, 0, 0, &[0; 8])); // GOAWAY
    let http_seeds = vec![
        http1(
            "POST",
            "/v1/check",
            r#"{"policy":"api","selectors":{"user":"alice"},"cost":2}"#,
        ),
        http1(
            "POST",
            "/v1/peek",
            r#"{"policy":"login","selectors":{"ip":"10.0.0.1","user":"bob"}}"#,
        ),
        http1(
            "POST",
            "/v1/reset",
            r#"{"policy":"api","selectors":{"user":"alice"}}"#,
        ),
        http1(
            "POST",
            "/json",
            r#"{"domain":"web","descriptors":[{"entries":[{"key":"user","value":"alice"}]}],"hits_addend":2}"#,
        ),
        http1("GET", "/health", ""),
        http1("GET", "/v1/policies", ""),
        h2,
    ];
    let http = server.base.trim_start_matches("http://");
    let started = std::time::Instant::now();
    let answered = flood(http, &http_seeds, &mut mutator);
    eprintln!(
        "HTTP: {FRAMES} mutated requests, {answered} of {} connections answered, {:.1} s",
        FRAMES / PER_CONNECTION,
        started.elapsed().as_secs_f64()
    );
    assert!(
        answered > FRAMES / PER_CONNECTION / 2,
        "only {answered} HTTP connections answered"
    );
    let check = format!("{}/v1/check", server.base);
    for i in 0..=LIMIT {
        let (status, body) = curl(
            "POST",
            &check,
            Some(r#"{"policy":"api","selectors":{"user":"good-http"}}"#),
        );
        assert_eq!(status, 200, "hit {i}: {body}");
        let allowed = if i < LIMIT { "true" } else { "false" };
        assert!(
            body.starts_with(&format!(r#"{{"allowed":{allowed},"#)),
            "hit {i}: {body}"
        );
    }

    // gRPC: mutated messages (and their 5-byte length prefix) in well-formed HTTP/2.
    let request = |user: &str, addend: u32, limit: Option<u32>| RateLimitRequest {
        domain: "web".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: user.into(),
            }],
            limit: limit.map(|n| RateLimitOverride {
                requests_per_unit: n,
                unit: 3,
            }),
            ..Default::default()
        }],
        hits_addend: addend,
    };
    let grpc_seeds: Vec<Vec<u8>> = [
        request("alice", 0, None),
        request("alice", 3, Some(10)),
        RateLimitRequest {
            domain: "web".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![
                    Entry {
                        key: "path".into(),
                        value: "/login".into(),
                    },
                    Entry {
                        key: "ip".into(),
                        value: "10.0.0.1".into(),
                    },
                ],
                ..Default::default()
            }],
            hits_addend: 1,
        },
    ]
    .iter()
    .map(|r| framed(&r.encode_to_vec()))
    .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let tcp = tokio::net::TcpStream::connect(&server.grpc).await.unwrap();
        let (client, connection) = h2::client::handshake(tcp).await.unwrap();
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let mut bodies = Vec::with_capacity(FRAMES);
        for _ in 0..FRAMES {
            let seed = &grpc_seeds[mutator.below(grpc_seeds.len())];
            bodies.push(mutator.mutate(seed));
        }
        let started = std::time::Instant::now();
        let mut calls = tokio::task::JoinSet::new();
        for chunk in bodies.chunks(FRAMES / 8) {
            let client = client.clone();
            let chunk = chunk.to_vec();
            calls.spawn(async move {
                let mut succeeded = 0;
                for body in chunk {
                    succeeded += usize::from(call(client.clone(), body).await.is_some());
                }
                succeeded
            });
        }
        let mut succeeded = 0;
        while let Some(done) = calls.join_next().await {
            succeeded += done.unwrap();
        }
        eprintln!(
            "gRPC: {FRAMES} mutated messages, {succeeded} answered with grpc-status 0, {:.1} s",
            started.elapsed().as_secs_f64()
        );
        for i in 0..=LIMIT {
            let answer = call(
                client.clone(),
                framed(&request("good-grpc", 1, None).encode_to_vec()),
            )
            .await
            .expect("a good request gets an answer");
            let answer = RateLimitResponse::decode(&answer[5..]).unwrap();
            let code = if i < LIMIT { 1 } else { 2 };
            assert_eq!(answer.overall_code, code, "hit {i}: {answer:?}");
        }
    });

    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "something panicked");
    let (status, _) = curl("GET", &format!("{}/live", server.base), None);
    assert_eq!(status, 200);
}

/// A gRPC message: uncompressed, its length, the bytes.
fn framed(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// One unary call to ShouldRateLimit with `body` as the request's whole body; the answer's
/// body when the call succeeded (grpc-status 0).
async fn call(mut client: h2::client::SendRequest<Bytes>, body: Vec<u8>) -> Option<Vec<u8>> {
    let request =
        axum::http::Request::post("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
    client = client.ready().await.expect("the connection stays up");
    let (response, mut send) = client.send_request(request, false).unwrap();
    send.send_data(Bytes::from(body), true).unwrap();
    let response = response.await.expect("an answer to every call");
    let ok_headers = response
        .headers()
        .get("grpc-status")
        .map(|v| v.as_bytes().to_vec());
    let mut stream = response.into_body();
    let mut answer = Vec::new();
    while let Some(chunk) = stream.data().await {
        let chunk = chunk.expect("the answer's body");
        let _ = stream.flow_control().release_capacity(chunk.len());
        answer.extend_from_slice(&chunk);
    }
    let trailers = stream.trailers().await.expect("the answer's trailers");
    let status = trailers
        .as_ref()
        .and_then(|t| t.get("grpc-status"))
        .map(|v| v.as_bytes().to_vec())
        .or(ok_headers);
    (status.as_deref() == Some(b"0")).then_some(answer)
}
