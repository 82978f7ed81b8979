//! The layer in a real tonic server, called over HTTP/2 by curl: a limited call gets
//! RESOURCE_EXHAUSTED with a RetryInfo detail that tonic itself decodes.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::process::Command;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderMap, HeaderName, HeaderValue, Request, Response};
use sluice_limiter::{Limiter, MemoryStore, Policy};
use sluice_tower::{Key, RateLimitLayer};
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tower_service::Service;

/// A gRPC service without generated code: every call succeeds with an empty reply.
#[derive(Clone)]
struct Ping;

impl NamedService for Ping {
    const NAME: &'static str = "sluice.test.Ping";
}

impl Service<Request<Body>> for Ping {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        let mut response = Response::new(Body::empty());
        let headers = response.headers_mut();
        headers.insert("content-type", HeaderValue::from_static("application/grpc"));
        headers.insert("grpc-status", HeaderValue::from_static("0"));
        ready(Ok(response))
    }
}

fn start(layer: RateLimitLayer) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            Server::builder()
                .layer(layer)
                .serve_with_incoming(Ping, TcpIncoming::from(listener))
                .await
                .unwrap();
        });
    });
    format!("http://{}/sluice.test.Ping/Ping", rx.recv().unwrap())
}

/// One unary call with an empty message, over cleartext HTTP/2; the response headers.
fn call(url: &str, tenant: &str) -> HeaderMap {
    let tenant = format!("x-tenant: {tenant}");
    let output = Command::new("curl")
        .args(["-s", "-D", "-", "-o", "/dev/null", "--max-time", "10"])
        .args(["--http2-prior-knowledge", "-X", "POST"])
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .args(["-H", &tenant, "--data-binary", "@-", url])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("curl");
    assert!(output.status.success(), "{output:?}");
    let mut headers = HeaderMap::new();
    for line in String::from_utf8(output.stdout).unwrap().lines().skip(1) {
        if let Some((name, value)) = line.split_once(": ") {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value.trim()).unwrap(),
            );
        }
    }
    headers
}

fn layer(limiter: Arc<Limiter>) -> RateLimitLayer {
    RateLimitLayer::builder(limiter, "rpc")
        .selector("tenant", Key::header(HeaderName::from_static("x-tenant")))
        .build()
        .unwrap()
}

#[test]
fn a_limited_call_gets_resource_exhausted_with_retry_info() {
    let limiter = Limiter::builder(MemoryStore::new())
        .policy(Policy::new("rpc", "tenant:1/m").unwrap())
        .build()
        .unwrap();
    let url = start(layer(Arc::new(limiter)));

    let ok = call(&url, "acme");
    assert_eq!(ok.get("grpc-status").unwrap(), "0");
    assert_eq!(ok.get("ratelimit").unwrap(), "\"rpc\";r=0;t=60");

    let limited = call(&url, "acme");
    let status = tonic::Status::from_header_map(&limited).expect("a gRPC status");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert_eq!(
        status.message(),
        "rate limited by policy `rpc`; retry after 60 s"
    );
    // google.rpc.Status carrying google.rpc.RetryInfo, as tonic hands it over.
    let details = status.details();
    let url_at = details
        .windows(40)
        .position(|w| w == b"type.googleapis.com/google.rpc.RetryInfo")
        .expect("a RetryInfo detail");
    assert!(url_at > 0);
    assert_eq!(limited.get("retry-after").unwrap(), "60");

    assert_eq!(call(&url, "other").get("grpc-status").unwrap(), "0");
}

#[cfg(feature = "tonic")]
#[test]
fn with_the_tonic_feature_the_peer_comes_from_tcp_connect_info() {
    use std::sync::Mutex;
    let limiter = Limiter::builder(MemoryStore::new())
        .policy(Policy::new("rpc", "ip:1/m").unwrap())
        .build()
        .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let layer = RateLimitLayer::builder(Arc::new(limiter), "rpc")
        .selector("ip", Key::client_ip())
        .on_denied(move |d| log.lock().unwrap().push(d.client_ip))
        .build()
        .unwrap();
    let url = start(layer);
    call(&url, "-");
    call(&url, "-");
    assert_eq!(*seen.lock().unwrap(), [Some("127.0.0.1".parse().unwrap())]);
}
