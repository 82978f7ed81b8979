//! What HTTP clients send: API bodies to the service, forwarding headers and challenge
//! answers to the tower layer.

use std::net::IpAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Method, Request, header};
use ipnet::IpNet;
use sluice_limiter::{Limiter, MemoryStore};
use sluice_server::Service;
use sluice_tower::challenge::{Subject, Verification};
use sluice_tower::{ClientIpResolver, ForwardedHeader, ProofOfWork};
use tower::ServiceExt;

use crate::Target;

/// The example config users start from, and an Envoy domain beside it.
const POLICIES: &str = include_str!("../../examples/sluice.toml");
const ENVOY: &str = "\
domain: web
descriptors:
  - key: ip
    rate_limit: { unit: minute, requests_per_unit: 2 }
  - key: path
    value: /login
    descriptors:
      - key: user
        rate_limit: { unit: second, requests_per_unit: 1 }
";

/// One runtime for every input: building one per input would dominate the time.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a Tokio runtime")
    })
}

/// A fresh service on the memory store (every input starts from empty counters, so an
/// input's outcome does not depend on those before it).
pub fn service() -> Arc<Service> {
    let policies = sluice_server::config::parse(Path::new("sluice.toml"), POLICIES)
        .expect("the example config")
        .policies;
    let envoy = sluice_server::envoy::config::parse([(Path::new("web.yaml"), ENVOY)])
        .expect("the Envoy config");
    let all = policies.into_iter().chain(envoy.policies.iter().cloned());
    let limiter = Limiter::builder(MemoryStore::new())
        .policies(all)
        .build()
        .expect("a limiter");
    Arc::new(Service::builder(Arc::new(limiter)).envoy(envoy).build())
}

/// The endpoints a body goes to, picked by the input's first byte.
const ROUTES: [(&str, &str); 5] = [
    ("POST", "/v1/check"),
    ("POST", "/v1/peek"),
    ("POST", "/v1/reset"),
    ("POST", "/json"),
    ("GET", "/v1/policies"),
];
const CONTENT_TYPES: [Option<&str>; 3] = [Some("application/json"), None, Some("text/plain")];

/// `[route][content type][body...]`: every body gets an answer that is not a server error
/// (bad input is the client's fault, and the memory store cannot fail), and every JSON
/// answer is JSON.
pub fn body(data: &[u8]) {
    let [route, content_type, body @ ..] = data else {
        return;
    };
    let (method, path) = ROUTES[usize::from(*route) % ROUTES.len()];
    let mut request = Request::builder()
        .method(Method::from_bytes(method.as_bytes()).expect("a method"))
        .uri(path);
    if let Some(kind) = CONTENT_TYPES[usize::from(*content_type) % CONTENT_TYPES.len()] {
        request = request.header(header::CONTENT_TYPE, kind);
    }
    let request = request.body(Body::from(body.to_vec())).expect("a request");
    let router = sluice_server::fuzzing::http_router(service());
    let (status, kind, answer) = Target::Http.hold(data.len(), || {
        runtime().block_on(async {
            let response = router.oneshot(request).await.expect("routers do not fail");
            let status = response.status();
            let kind = response.headers().get(header::CONTENT_TYPE).cloned();
            let answer = axum::body::to_bytes(response.into_body(), usize::MAX)
                .await
                .expect("a whole answer");
            (status, kind, answer)
        })
    });
    let shown = || format!("{method} {path} {:?}", String::from_utf8_lossy(body));
    assert!(
        !status.is_server_error(),
        "{} answered {status}: {}",
        shown(),
        String::from_utf8_lossy(&answer)
    );
    if kind
        .as_ref()
        .and_then(|k| k.to_str().ok())
        .is_some_and(|k| k.contains("json"))
    {
        if let Err(e) = serde_json::from_slice::<serde_json::Value>(&answer) {
            panic!("{} answered JSON that is not ({e})", shown());
        }
    }
}

/// `[peer][header kind][forwarding header values, one per line...]`: a peer that is not a
/// trusted proxy is the client whatever the headers say; the key of a client address is
/// its group printed as `Display` would (the IPv4 fast path agrees with it); and no answer
/// built from the input passes the proof of work.
pub fn tower(data: &[u8]) {
    let [peer, kind, rest @ ..] = data else {
        return;
    };
    let trusted: [IpNet; 3] = [
        "10.0.0.0/8".parse().expect("a network"),
        "127.0.0.1/32".parse().expect("a network"),
        "2001:db8::/32".parse().expect("a network"),
    ];
    let peers: [IpAddr; 4] = [
        "10.1.2.3".parse().expect("an address"),
        "2001:db8::7".parse().expect("an address"),
        "203.0.113.9".parse().expect("an address"),
        "2001:ffff::1".parse().expect("an address"),
    ];
    let peer = peers[usize::from(*peer) % peers.len()];
    let header = if kind & 1 == 0 {
        ForwardedHeader::XForwardedFor
    } else {
        ForwardedHeader::Forwarded
    };
    let resolver = ClientIpResolver::new()
        .trust(trusted)
        .header(header)
        .ipv4_prefix([32, 24, 16, 0][usize::from(kind >> 1 & 3)])
        .ipv6_prefix([64, 128, 48, 0][usize::from(kind >> 3 & 3)]);
    let name = match header {
        ForwardedHeader::XForwardedFor => header::HeaderName::from_static("x-forwarded-for"),
        _ => header::FORWARDED,
    };
    let mut headers = HeaderMap::new();
    for line in rest.split(|&b| b == b'\n') {
        if let Ok(value) = HeaderValue::from_bytes(line) {
            headers.append(name.clone(), value);
        }
    }

    let client = Target::Tower.hold(data.len(), || resolver.resolve(peer, &headers));
    if !trusted.iter().any(|net| net.contains(&peer)) {
        assert_eq!(
            client, peer,
            "an untrusted peer named its client in {headers:?}"
        );
    }
    let group = resolver.group(client);
    let expected = if group.prefix_len() == group.max_prefix_len() {
        group.addr().to_string()
    } else {
        group.to_string()
    };
    assert_eq!(resolver.key(client), expected, "the key of {client}");

    let answer = String::from_utf8_lossy(rest);
    let subject = Subject {
        policy: "login",
        digest: &[7; 32],
        level: 0,
    };
    let verdict = ProofOfWork::with_secret([9; 32]).check(&answer, &subject);
    assert!(
        matches!(verdict, Verification::Refused(_)),
        "a forged answer passed: {answer:?}"
    );
}
