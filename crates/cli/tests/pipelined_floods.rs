//! Clients that pipeline requests without end and never read an answer, on the HTTP and
//! Redis protocol listeners of `sluice serve` (its own process, so its memory is its own):
//! the server stops reading from them once their answers back up, so they cost bounded
//! memory, and a good client keeps its p99 latency within twice (plus 5 ms) its quiet one.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use sluice_testkit::http::{Http1, p99, resident_bytes, timings};
use support::Server;

/// Writes `request` again and again to `address` without reading, until a write has waited
/// 2 s (the server stopped reading); the stream, still open, and the bytes it took.
fn pipeline_without_reading(address: &str, request: &[u8]) -> (TcpStream, usize) {
    let mut stream = TcpStream::connect(address.trim_start_matches("http://")).unwrap();
    stream
        .set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let batch = request.repeat(64);
    let mut sent = 0;
    while stream.write_all(&batch).is_ok() {
        sent += batch.len();
    }
    (stream, sent)
}

#[test]
fn pipelining_clients_that_never_read_are_held_in_bounded_memory() {
    const FLOODERS: usize = 8;
    let server = Server::start_envoy("[policies.api]\nrule = \"user:5/h\"\n", &[], &[]);
    let resp = server.resp.clone().unwrap();
    let mut good = Http1::connect(&server.base);
    let mut health = || assert_eq!(good.request("GET", "/health", "").0, 200);
    timings(200, &mut health);
    let quiet = timings(400, &mut health);
    let resident = resident_bytes(server.pid());

    let check = b"*4\r\n$12\r\nSLUICE.CHECK\r\n$3\r\napi\r\n$4\r\nuser\r\n$5\r\nalice\r\n";
    let http = b"POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 46\r\n\r\n{\"policy\":\"api\",\"selectors\":{\"user\":\"bob\"}}\r\n";
    let floods: Vec<(TcpStream, usize)> = std::thread::scope(|scope| {
        let mut floods = Vec::new();
        for _ in 0..FLOODERS {
            floods.push(scope.spawn(|| pipeline_without_reading(&resp, check)));
            floods.push(scope.spawn(|| pipeline_without_reading(&server.base, http)));
        }
        floods.into_iter().map(|f| f.join().unwrap()).collect()
    });
    // A connection of its own: the first sat idle past the header deadline meanwhile.
    let mut good = Http1::connect(&server.base);
    let mut health = || assert_eq!(good.request("GET", "/health", "").0, 200);
    timings(50, &mut health);
    let held = timings(400, &mut health);
    let grown = resident_bytes(server.pid()).saturating_sub(resident);
    let sent: usize = floods.iter().map(|(_, sent)| sent).sum();
    let (quiet_p99, held_p99) = (p99(&quiet), p99(&held));
    eprintln!(
        "{} pipelining clients sent {} KiB before the server stopped reading; it grew {} KiB; \
         good client p99 {quiet_p99:.2} ms before, {held_p99:.2} ms with them held",
        floods.len(),
        sent >> 10,
        grown >> 10
    );
    assert!(grown < 64 << 20, "grew by {} MiB", grown >> 20);
    assert!(
        held_p99 <= 2.0 * quiet_p99 + 5.0,
        "p99 {held_p99:.2} ms with pipelining clients held, {quiet_p99:.2} ms without"
    );
}
