//! HTTP/2 abuse on both HTTP/2 listeners (the HTTP API and gRPC): rapid reset (streams
//! opened and cancelled at once, CVE-2023-44487), SETTINGS and PING floods from a peer that
//! never reads the acknowledgements, and a header block continued without end. The process's
//! memory stays bounded, the endless header block is cut off, and a good client keeps its
//! p99 latency within twice (plus 5 ms) what it was before. `sluice serve` runs in a process
//! of its own, so its resident memory is its own.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice_testkit::http::{H2_PREFACE, Http1, h2_frame, p99, resident_bytes, timings};
use support::Server;

/// Streams each client opens, ordinary or attacking, on each listener.
const STREAMS: usize = 30_000;

/// Opens `STREAMS` streams on `address` as fast as the connection allows, each either
/// answered (at most 64 waiting at once: ordinary heavy traffic) or cancelled at once (the
/// client library sends RST_STREAM when a request's handles are dropped: the rapid reset
/// attack). Returns the connections it took: a server that sees through an attack ends the
/// connection (GOAWAY), and the client reconnects.
fn streams(address: &str, path: &str, content_type: &str, reset: bool) -> usize {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let connect = || async {
            let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
            let (client, connection) = h2::client::handshake(tcp).await.unwrap();
            tokio::spawn(async move {
                let _ = connection.await;
            });
            client
        };
        let mut client: h2::client::SendRequest<Bytes> = connect().await;
        let mut connections = 1;
        let mut waiting = tokio::task::JoinSet::new();
        for _ in 0..STREAMS {
            client = match client.ready().await {
                Ok(ready) => ready,
                Err(_) => {
                    connections += 1;
                    connect().await
                }
            };
            let request = http::Request::post(path)
                .header("content-type", content_type)
                .header("te", "trailers")
                .body(())
                .unwrap();
            match client.send_request(request, true) {
                // Dropped unanswered: the stream is reset.
                Ok((response, _)) if reset => drop(response),
                Ok((response, _)) => {
                    if waiting.len() >= 64 {
                        waiting.join_next().await;
                    }
                    waiting.spawn(response);
                }
                Err(_) => {
                    connections += 1;
                    client = connect().await;
                }
            }
        }
        waiting.join_all().await;
        connections
    })
}

/// Writes `frames` after the preface to `address` and never reads; returns how many bytes
/// the server took before it stopped reading (or closed).
fn never_reading(address: &str, frames: impl Iterator<Item = Vec<u8>>) -> (TcpStream, usize) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut sent = 0;
    if stream.write_all(H2_PREFACE).is_err() {
        return (stream, sent);
    }
    for frame in frames {
        if stream.write_all(&frame).is_err() {
            break;
        }
        sent += frame.len();
    }
    (stream, sent)
}

/// A header block of `count` literal headers of about 100 bytes each.
fn headers(count: usize) -> Vec<u8> {
    let mut block = Vec::new();
    for _ in 0..count {
        block.extend_from_slice(&[0x00, 3]);
        block.extend_from_slice(b"x-a");
        block.push(100);
        block.extend_from_slice(&[b'a'; 100]);
    }
    block
}

/// A HEADERS frame without END_HEADERS, then CONTINUATION frames (150 headers each, about
/// 16 KB) for as long as the server reads them: true when the server closed the connection
/// within 10 s.
fn endless_header_block(address: &str) -> bool {
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut opening = H2_PREFACE.to_vec();
    opening.extend(h2_frame(4, 0, 0, &[]));
    let mut block = vec![0x83, 0x84]; // :method POST, :path /
    block.extend(headers(10));
    opening.extend(h2_frame(1, 0, 1, &block));
    if stream.write_all(&opening).is_err() {
        return true;
    }
    let continuation = h2_frame(9, 0, 1, &headers(150));
    for _ in 0..700 {
        if stream.write_all(&continuation).is_err() {
            break;
        }
    }
    // The server's SETTINGS, its ack and a GOAWAY may come first: read to the end.
    let mut sink = [0u8; 4096];
    loop {
        match stream.read(&mut sink) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

/// The good client's request timings (ms, sorted) while `load` runs, and what it returned.
fn timed_during<T>(health: &mut (impl FnMut() + Send), load: impl FnOnce() -> T) -> (Vec<f64>, T) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let good = scope.spawn(|| {
            let mut all = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                all.extend(timings(1, &mut *health));
            }
            all
        });
        let out = load();
        stop.store(true, Ordering::SeqCst);
        let mut all = good.join().unwrap();
        all.sort_by(f64::total_cmp);
        (all, out)
    })
}

/// Streams on both listeners at once, answered or reset; the connections each took.
fn both_listeners(http: &str, grpc: &str, reset: bool) -> [usize; 2] {
    std::thread::scope(|scope| {
        let on_http = scope.spawn(|| streams(http, "/health", "application/json", reset));
        let path = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
        let on_grpc = scope.spawn(|| streams(grpc, path, "application/grpc", reset));
        [on_http.join().unwrap(), on_grpc.join().unwrap()]
    })
}

/// Rapid reset is held to what the same number of ordinary requests costs: on a 2-core
/// machine the attacking client itself takes a core, so the fair yardstick for the good
/// client's latency is the same client sending ordinary requests at full speed. The floods
/// are held to bounded memory, and the good client is served throughout.
#[test]
fn http2_floods_are_absorbed_and_good_clients_keep_their_latency() {
    let server = Server::start_envoy("[policies.api]\nrule = \"user:5/h\"\n", &[], &[]);
    let http = server.base.trim_start_matches("http://").to_owned();
    let grpc = server.grpc.clone().expect("a gRPC listener");
    let mut good = Http1::connect(&server.base);
    let mut health = move || assert_eq!(good.request("GET", "/health", "").0, 200);
    // Warm up the allocator and the connection.
    timings(200, &mut health);

    let (ordinary, _) = timed_during(&mut health, || both_listeners(&http, &grpc, false));
    let resident = resident_bytes(server.pid());
    let started = Instant::now();
    let (attacked, connections) = timed_during(&mut health, || both_listeners(&http, &grpc, true));
    let took = started.elapsed();
    // Then the floods, with the good client served throughout (each request asserts 200).
    let (flooded, (floods, endless)) = timed_during(&mut health, || {
        // From peers that never read: 200,000 SETTINGS, then 200,000 PINGs, each frame
        // asking for an acknowledgement the peer will not take.
        let mut floods = Vec::new();
        for address in [&http, &grpc] {
            let settings = (0..200_000).map(|_| h2_frame(4, 0, 0, &[0, 3, 0, 0, 0, 100]));
            floods.push(never_reading(address, settings));
            let pings = (0..200_000u64).map(|i| h2_frame(6, 0, 0, &i.to_be_bytes()));
            floods.push(never_reading(address, pings));
        }
        let endless: Vec<bool> = [&http, &grpc]
            .into_iter()
            .map(|address| endless_header_block(address))
            .collect();
        (floods, endless)
    });
    let grown = resident_bytes(server.pid()).saturating_sub(resident);
    let taken: Vec<usize> = floods.iter().map(|(_, sent)| *sent).collect();
    let (ordinary_p99, attacked_p99) = (p99(&ordinary), p99(&attacked));
    eprintln!(
        "rapid reset: {STREAMS} streams per listener in {:.1} s over {connections:?} \
         connections; good client p99 {ordinary_p99:.2} ms under as many ordinary requests \
         ({} requests), {attacked_p99:.2} ms under rapid reset ({} requests); never-reading \
         floods took {taken:?} bytes, good client p99 {:.2} ms meanwhile; resident memory \
         grew {} KiB",
        took.as_secs_f64(),
        ordinary.len(),
        attacked.len(),
        p99(&flooded),
        grown >> 10,
    );
    assert_eq!(
        endless,
        [true, true],
        "an endless header block was not cut off"
    );
    assert!(grown < 64 << 20, "grew by {} MiB", grown >> 20);
    assert!(
        attacked_p99 <= 2.0 * ordinary_p99 + 5.0,
        "p99 {attacked_p99:.2} ms under rapid reset, {ordinary_p99:.2} ms under ordinary load"
    );
}

/// Slowloris over HTTP/2: a HEADERS frame whose payload comes one byte every 200 ms. No
/// frame can be read whole meanwhile, so the peer cannot acknowledge the server's keep-alive
/// PING (sent after 20 s quiet on its side, answered within 10 s or the connection closes):
/// both listeners cut it at about 30 s, where an idle deadline never would.
#[test]
fn a_drip_fed_http2_header_block_is_cut_by_the_keep_alive() {
    let server = Server::start_envoy("[policies.api]\nrule = \"user:5/h\"\n", &[], &[]);
    let http = server.base.trim_start_matches("http://").to_owned();
    let grpc = server.grpc.clone().expect("a gRPC listener");
    let drips: Vec<_> = [http, grpc]
        .into_iter()
        .map(|address| {
            std::thread::spawn(move || {
                let started = Instant::now();
                let mut stream = TcpStream::connect(&address).unwrap();
                let mut opening = H2_PREFACE.to_vec();
                opening.extend(h2_frame(4, 0, 0, &[]));
                // HEADERS, END_HEADERS, announcing 4,000 bytes of header block.
                let mut head = h2_frame(1, 4, 1, &[]);
                head[..3].copy_from_slice(&4_000u32.to_be_bytes()[1..]);
                opening.extend(head);
                stream.write_all(&opening).unwrap();
                stream
                    .set_read_timeout(Some(Duration::from_millis(200)))
                    .unwrap();
                let mut sink = [0u8; 1024];
                loop {
                    assert!(
                        started.elapsed() < Duration::from_secs(45),
                        "{address}: a drip-fed header block still open after 45 s"
                    );
                    match stream.read(&mut sink) {
                        Ok(0) => return started.elapsed(),
                        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                            return started.elapsed();
                        }
                        // The pacing: nothing came back within 200 ms.
                        _ => {}
                    }
                    if stream.write_all(b"a").is_err() {
                        return started.elapsed();
                    }
                }
            })
        })
        .collect();
    let cut: Vec<Duration> = drips.into_iter().map(|d| d.join().unwrap()).collect();
    eprintln!("drip-fed HTTP/2 header blocks cut after {cut:?} (HTTP, gRPC)");
    for after in cut {
        assert!(
            after >= Duration::from_secs(20),
            "cut after {after:?}: before any keep-alive"
        );
    }
}
