//! Client IP done right: a table of cases with the key each must get, then the same rules
//! through the layer.

mod common;

use std::net::SocketAddr;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use common::{app, clock, from, get_request, limiter, send, status};
use sluice_limiter::Policy;
use sluice_tower::{ClientIpResolver, ForwardedHeader, Key, RateLimitLayer};

struct Case {
    what: &'static str,
    peer: &'static str,
    trusted: &'static [&'static str],
    header: ForwardedHeader,
    headers: &'static [(&'static str, &'static str)],
    key: &'static str,
}

const XFF: ForwardedHeader = ForwardedHeader::XForwardedFor;
const FWD: ForwardedHeader = ForwardedHeader::Forwarded;
const PROXIES: &[&str] = &["10.0.0.0/8", "2001:db8:ffff::/48"];

#[rustfmt::skip]
const CASES: &[Case] = &[
    Case { what: "no header: the socket peer", peer: "203.0.113.9:5000", trusted: &[], header: XFF,
           headers: &[], key: "203.0.113.9" },
    Case { what: "spoofed header from an untrusted peer changes nothing", peer: "203.0.113.9:5000",
           trusted: PROXIES, header: XFF, headers: &[("x-forwarded-for", "198.51.100.7")], key: "203.0.113.9" },
    Case { what: "no proxies trusted: the header is never read", peer: "10.0.0.1:5000", trusted: &[],
           header: XFF, headers: &[("x-forwarded-for", "198.51.100.7")], key: "10.0.0.1" },
    Case { what: "trusted proxy without a header: the proxy", peer: "10.0.0.1:5000", trusted: PROXIES,
           header: XFF, headers: &[], key: "10.0.0.1" },
    Case { what: "one hop", peer: "10.0.0.1:5000", trusted: PROXIES, header: XFF,
           headers: &[("x-forwarded-for", "198.51.100.7")], key: "198.51.100.7" },
    Case { what: "many hops: rightmost untrusted, the client's own prefix ignored", peer: "10.0.0.1:5000",
           trusted: PROXIES, header: XFF, headers: &[("x-forwarded-for", "1.2.3.4, 198.51.100.7, 10.0.0.2")],
           key: "198.51.100.7" },
    Case { what: "several header lines are one list", peer: "10.0.0.1:5000", trusted: PROXIES, header: XFF,
           headers: &[("x-forwarded-for", "1.2.3.4"), ("x-forwarded-for", "198.51.100.7, 10.0.0.3")],
           key: "198.51.100.7" },
    Case { what: "a trusted chain all the way: the leftmost", peer: "10.0.0.1:5000", trusted: PROXIES,
           header: XFF, headers: &[("x-forwarded-for", "10.0.0.5, 10.0.0.6")], key: "10.0.0.5" },
    Case { what: "unreadable hop: the trusted proxy that wrote it", peer: "10.0.0.1:5000", trusted: PROXIES,
           header: XFF, headers: &[("x-forwarded-for", "198.51.100.7, unknown")], key: "10.0.0.1" },
    Case { what: "ports and brackets", peer: "10.0.0.1:5000", trusted: PROXIES, header: XFF,
           headers: &[("x-forwarded-for", "[2001:db8:1:2::9]:443, 10.0.0.9:8080")], key: "2001:db8:1:2::/64" },
    Case { what: "Forwarded, quoted IPv6 with port", peer: "10.0.0.1:5000", trusted: PROXIES, header: FWD,
           headers: &[("forwarded", "for=192.0.2.60;proto=http;by=203.0.113.43, For=\"[2001:db8:cafe::17]:4711\"")],
           key: "2001:db8:cafe::/64" },
    Case { what: "Forwarded through a trusted hop", peer: "10.0.0.1:5000", trusted: PROXIES, header: FWD,
           headers: &[("forwarded", "for=192.0.2.60, for=10.1.1.1;proto=https")], key: "192.0.2.60" },
    Case { what: "Forwarded, obfuscated node: the proxy", peer: "10.0.0.1:5000", trusted: PROXIES, header: FWD,
           headers: &[("forwarded", "for=192.0.2.60, for=_hidden")], key: "10.0.0.1" },
    Case { what: "reading Forwarded ignores X-Forwarded-For", peer: "10.0.0.1:5000", trusted: PROXIES,
           header: FWD, headers: &[("x-forwarded-for", "198.51.100.7")], key: "10.0.0.1" },
    Case { what: "reading X-Forwarded-For ignores Forwarded", peer: "10.0.0.1:5000", trusted: PROXIES,
           header: XFF, headers: &[("forwarded", "for=198.51.100.7")], key: "10.0.0.1" },
    Case { what: "::ffff: peer is IPv4", peer: "[::ffff:203.0.113.9]:5000", trusted: &[], header: XFF,
           headers: &[], key: "203.0.113.9" },
    Case { what: "::ffff: peer matches an IPv4 trusted network", peer: "[::ffff:10.0.0.1]:5000",
           trusted: PROXIES, header: XFF, headers: &[("x-forwarded-for", "::ffff:198.51.100.7")],
           key: "198.51.100.7" },
    Case { what: "IPv6 peer: its /64", peer: "[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:5000", trusted: &[],
           header: XFF, headers: &[], key: "2001:db8:1:2::/64" },
    Case { what: "another address in the same /64: same key", peer: "[2001:db8:1:2::1]:5000", trusted: &[],
           header: XFF, headers: &[], key: "2001:db8:1:2::/64" },
    Case { what: "the next /64: another key", peer: "[2001:db8:1:3::1]:5000", trusted: &[], header: XFF,
           headers: &[], key: "2001:db8:1:3::/64" },
    Case { what: "trusted IPv6 proxy", peer: "[2001:db8:ffff::1]:5000", trusted: PROXIES, header: XFF,
           headers: &[("x-forwarded-for", "2001:db8:77:1::5")], key: "2001:db8:77:1::/64" },
];

#[test]
fn every_case_gets_its_key() {
    for case in CASES {
        let resolver = ClientIpResolver::new()
            .trust(case.trusted.iter().map(|n| n.parse().unwrap()))
            .header(case.header);
        let mut headers = HeaderMap::new();
        for (name, value) in case.headers {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let peer: SocketAddr = case.peer.parse().unwrap();
        let key = resolver.key(resolver.resolve(peer.ip(), &headers));
        assert_eq!(key, case.key, "{}", case.what);
    }
}

#[test]
fn prefixes_are_configurable() {
    let resolver = ClientIpResolver::new().ipv6_prefix(56).ipv4_prefix(24);
    assert_eq!(
        resolver.key("2001:db8:1:2ff::1".parse().unwrap()),
        "2001:db8:1:200::/56"
    );
    assert_eq!(
        resolver.key("203.0.113.9".parse().unwrap()),
        "203.0.113.0/24"
    );
    let host = ClientIpResolver::new().ipv6_prefix(128);
    assert_eq!(host.key("2001:db8::1".parse().unwrap()), "2001:db8::1");
}

fn ip_layer(resolver: ClientIpResolver) -> RateLimitLayer {
    let limiter = limiter(&clock(), vec![Policy::new("web", "ip:1/m").unwrap()]);
    RateLimitLayer::builder(limiter, "web")
        .selector("ip", Key::client_ip())
        .client_ip(resolver)
        .build()
        .unwrap()
}

#[tokio::test]
async fn one_host_cannot_rotate_through_its_slash_64() {
    let app = app(ip_layer(ClientIpResolver::new()));
    assert_eq!(
        status(&app, get_request("[2001:db8:1:2::1]:1", "/other")).await,
        200
    );
    assert_eq!(
        status(&app, get_request("[2001:db8:1:2::2]:1", "/other")).await,
        429
    );
    assert_eq!(
        status(&app, get_request("[2001:db8:1:3::1]:1", "/other")).await,
        200
    );
}

#[tokio::test]
async fn a_spoofed_header_does_not_escape_the_limit() {
    let app = app(ip_layer(
        ClientIpResolver::new().trust(["10.0.0.0/8".parse().unwrap()]),
    ));
    let spoofed = |fake: &str| {
        from("203.0.113.9:5000", "GET", "/other")
            .header("x-forwarded-for", fake)
            .body(axum::body::Body::empty())
            .unwrap()
    };
    assert_eq!(status(&app, spoofed("1.1.1.1")).await, 200);
    assert_eq!(status(&app, spoofed("2.2.2.2")).await, 429);
}

#[tokio::test]
async fn handlers_see_the_resolved_client_when_asked() {
    let whoami = || {
        from("10.0.0.1:5000", "GET", "/whoami")
            .header("x-forwarded-for", "198.51.100.7")
            .body(axum::body::Body::empty())
            .unwrap()
    };
    let trusted = || ClientIpResolver::new().trust(["10.0.0.0/8".parse().unwrap()]);
    let limiter = limiter(&clock(), vec![Policy::new("web", "ip:10/m").unwrap()]);
    let layer = |insert: bool| {
        RateLimitLayer::builder(limiter.clone(), "web")
            .selector("ip", Key::client_ip())
            .client_ip(trusted())
            .client_ip_extension(insert)
            .build()
            .unwrap()
    };
    let answer = send(&app(layer(true)), whoami()).await;
    assert_eq!((answer.status, answer.body.as_str()), (200, "198.51.100.7"));
    // An exempt client is not limited, and its handlers still see it.
    let exempt = RateLimitLayer::builder(limiter.clone(), "web")
        .selector("ip", Key::client_ip())
        .client_ip(trusted())
        .client_ip_extension(true)
        .exempt(["198.51.100.0/24".parse().unwrap()])
        .build()
        .unwrap();
    let answer = send(&app(exempt), whoami()).await;
    assert_eq!((answer.status, answer.body.as_str()), (200, "198.51.100.7"));
    // Not asked for: the handler's extractor finds nothing (axum answers 500).
    let answer = send(&app(layer(false)), whoami()).await;
    assert_eq!(answer.status, 500);
}

#[test]
fn bad_prefixes_are_refused_when_the_layer_is_built() {
    let limiter = limiter(&clock(), vec![Policy::new("web", "ip:1/m").unwrap()]);
    let built = RateLimitLayer::builder(limiter, "web")
        .selector("ip", Key::client_ip())
        .client_ip(ClientIpResolver::new().ipv6_prefix(129))
        .build();
    assert_eq!(built.unwrap_err(), sluice_tower::Error::BadPrefix);
}
