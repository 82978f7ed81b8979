//! Slow and malformed clients against `sluice serve`: cut off or refused, never a crash.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::{Server, curl};

fn connect(address: &str) -> TcpStream {
    let address = address.trim_start_matches("http://");
    let stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(9)))
        .unwrap();
    stream
}

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
    let server = Server::start_envoy("[policies.api]\nrule = \"user:2/h\"\n", &[], &[]);
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

#[test]
fn malformed_resp_frames_get_an_error_and_the_server_stays_up() {
    let server = Server::start_envoy("[policies.api]\nrule = \"user:2/h\"\n", &[], &[]);
    let resp = server.resp.clone().unwrap();
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
