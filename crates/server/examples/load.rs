//! A small load client for the benchmark: decisions per second over gRPC (Envoy's
//! `ShouldRateLimit`) or RESP, beside the same server's trivial answer in the same run.
//!
//! ```text
//! cargo run --release -p sluice-server --example load -- grpc 127.0.0.1:8081 64 5 check
//! cargo run --release -p sluice-server --example load -- grpc 127.0.0.1:8081 64 5 trivial
//! cargo run --release -p sluice-server --example load -- resp 127.0.0.1:6380 64 5 throttle
//! cargo run --release -p sluice-server --example load -- resp 127.0.0.1:6380 64 5 ping
//! ```
//!
//! `check` hits a configured descriptor (`domain: bench`, key `user`) over 10,000 users;
//! `trivial` asks about a domain with no config (the whole gRPC path, no decision);
//! `throttle` sends `CL.THROTTLE` over 10,000 keys; `ping` sends `PING`. The line printed
//! ends with the median and 99th percentile of the requests' latencies.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Requests in flight on each gRPC connection.
const STREAMS_PER_CONNECTION: usize = 8;
const USERS: u64 = 10_000;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [protocol, address, connections, seconds, mode] = args.as_slice() else {
        eprintln!("usage: load grpc|resp ADDR CONNECTIONS SECONDS MODE");
        std::process::exit(2);
    };
    let connections: usize = connections.parse().expect("CONNECTIONS");
    let duration = Duration::from_secs(seconds.parse().expect("SECONDS"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut latencies = runtime.block_on(async {
        let mut tasks = Vec::new();
        for c in 0..connections {
            let done = done.clone();
            let address = address.clone();
            let mode = mode.clone();
            match protocol.as_str() {
                "grpc" => {
                    let client = RateLimitServiceClient::connect(format!("http://{address}"))
                        .await
                        .expect("connect");
                    for s in 0..STREAMS_PER_CONNECTION {
                        let mut client = client.clone();
                        let done = done.clone();
                        let trivial = mode == "trivial";
                        let seed = (c * STREAMS_PER_CONNECTION + s) as u64;
                        tasks.push(tokio::spawn(async move {
                            let mut i = seed;
                            let mut latencies = Vec::new();
                            while started.elapsed() < duration {
                                i = i.wrapping_mul(6364136223846793005).wrapping_add(1);
                                let request = grpc_request(trivial, i % USERS);
                                let sent = Instant::now();
                                client.should_rate_limit(request).await.expect("answer");
                                latencies.push(sent.elapsed().as_micros() as u32);
                                done.fetch_add(1, Ordering::Relaxed);
                            }
                            latencies
                        }));
                    }
                }
                "resp" => tasks.push(tokio::spawn(async move {
                    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
                    stream.set_nodelay(true).unwrap();
                    let mut buf = vec![0u8; 4096];
                    let mut i = c as u64;
                    let mut latencies = Vec::new();
                    while started.elapsed() < duration {
                        let sent = Instant::now();
                        i = i.wrapping_mul(6364136223846793005).wrapping_add(1);
                        let command = if mode == "ping" {
                            "*1\r\n$4\r\nPING\r\n".to_owned()
                        } else {
                            let key = format!("u{}", i % USERS);
                            format!(
                                "*5\r\n$11\r\nCL.THROTTLE\r\n${}\r\n{key}\r\n$7\r\n1000000\r\n$7\r\n1000000\r\n$1\r\n1\r\n",
                                key.len()
                            )
                        };
                        stream.write_all(command.as_bytes()).await.unwrap();
                        // PING answers one line; CL.THROTTLE six. Read until complete.
                        let lines = if mode == "ping" { 1 } else { 6 };
                        let mut seen = 0;
                        while seen < lines {
                            let n = stream.read(&mut buf).await.unwrap();
                            assert!(n > 0, "server closed");
                            seen += buf[..n].iter().filter(|&&b| b == b'\n').count();
                        }
                        latencies.push(sent.elapsed().as_micros() as u32);
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    latencies
                })),
                other => panic!("unknown protocol {other}"),
            }
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    });
    let elapsed = started.elapsed().as_secs_f64();
    let total = done.load(Ordering::Relaxed);
    latencies.sort_unstable();
    let percentile = |p: f64| {
        let at = ((latencies.len() as f64 * p).ceil() as usize).saturating_sub(1);
        latencies.get(at).copied().unwrap_or(0)
    };
    println!(
        "{protocol} {mode}: {total} requests in {elapsed:.2}s = {:.0}/s ({connections} connections) p50={}us p99={}us",
        total as f64 / elapsed,
        percentile(0.50),
        percentile(0.99),
    );
}

fn grpc_request(trivial: bool, user: u64) -> RateLimitRequest {
    RateLimitRequest {
        domain: if trivial { "none" } else { "bench" }.into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: format!("u{user}"),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}
