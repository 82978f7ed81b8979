//! The layer on a plain hyper server (no axum): `Request<Incoming>`, the peer address given
//! as a `PeerAddr`, driven by curl.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use sluice_limiter::{Limiter, MemoryStore, Policy};
use sluice_tower::{Key, PeerAddr, RateLimitLayer};
use tower::ServiceBuilder;

fn start(layer: RateLimitLayer) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            loop {
                let (stream, peer): (_, SocketAddr) = listener.accept().await.unwrap();
                let service = ServiceBuilder::new()
                    .map_request(move |mut request: Request<Incoming>| {
                        request.extensions_mut().insert(PeerAddr(peer));
                        request
                    })
                    .layer(layer.clone())
                    .service_fn(|_: Request<Incoming>| async {
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("hello\n"))))
                    });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service)),
                );
            }
        });
    });
    format!("http://{}/", rx.recv().unwrap())
}

fn status_and_retry_after(url: &str) -> (String, Option<String>) {
    let output = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "-D", "-", "--max-time", "10", url])
        .output()
        .expect("curl");
    let head = String::from_utf8(output.stdout).unwrap();
    let status = head.split(' ').nth(1).unwrap_or("").to_owned();
    let retry = head
        .lines()
        .find_map(|l| l.strip_prefix("retry-after: "))
        .map(|v| v.trim().to_owned());
    (status, retry)
}

#[test]
fn a_hyper_service_is_limited_per_peer() {
    let limiter = Limiter::builder(MemoryStore::new())
        .policy(Policy::new("web", "ip:2/m").unwrap())
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder(Arc::new(limiter), "web")
        .selector("ip", Key::client_ip())
        .build()
        .unwrap();
    let url = start(layer);
    assert_eq!(status_and_retry_after(&url).0, "200");
    assert_eq!(status_and_retry_after(&url).0, "200");
    let (status, retry) = status_and_retry_after(&url);
    assert_eq!(status, "429");
    assert_eq!(retry.as_deref(), Some("30"));
}
