//! Which requests a layer limits and how it answers: methods, paths, exempt and deny lists,
//! shadow mode, missing keys, body fields, hooks, gRPC.

mod common;

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{Method, Response};
use bytes::Bytes;
use common::{app, clock, from, get_request, limiter, login_request, send, status};
use sluice_limiter::Policy;
use sluice_tower::{Key, RateLimitLayer, Reason, WhenMissing};

const PEER: &str = "203.0.113.9:5000";

fn builder(rule: &str) -> sluice_tower::RateLimitLayerBuilder {
    let limiter = limiter(&clock(), vec![Policy::new("web", rule).unwrap()]);
    RateLimitLayer::builder(limiter, "web")
}

fn by_ip(rule: &str) -> sluice_tower::RateLimitLayerBuilder {
    builder(rule).selector("ip", Key::client_ip())
}

/// The memory store as a store outside the process would answer: only asynchronously.
#[derive(Clone)]
struct Remote(sluice_limiter::MemoryStore);

impl sluice_limiter::Store for Remote {
    async fn decide(
        &self,
        hit: &sluice_limiter::Hit<'_>,
    ) -> Result<sluice_limiter::Decision, sluice_limiter::StoreError> {
        self.0.decide(hit).await
    }

    async fn reset(
        &self,
        identifiers: &[sluice_limiter::Identifier],
    ) -> Result<(), sluice_limiter::StoreError> {
        self.0.reset(identifiers).await
    }
}

/// The client address as the one key (the layer's quickest configuration) over a store that
/// cannot answer at once: the layer waits for it, and limits.
#[tokio::test]
async fn a_store_that_answers_later_still_limits() {
    let clock = clock();
    let store = Remote(
        sluice_limiter::MemoryStore::builder()
            .clock(clock.clone())
            .build(),
    );
    let limiter = sluice_limiter::Limiter::builder(store)
        .clock(clock)
        .policy(Policy::new("web", "ip:2/m").unwrap())
        .build()
        .unwrap();
    let layer = RateLimitLayer::builder(Arc::new(limiter), "web")
        .selector("ip", Key::client_ip())
        .build()
        .unwrap();
    let app = app(layer);
    let statuses = [
        status(&app, get_request(PEER, "/other")).await,
        status(&app, get_request(PEER, "/other")).await,
        status(&app, get_request(PEER, "/other")).await,
    ];
    assert_eq!(statuses, [200, 200, 429]);
}

#[tokio::test]
async fn post_only() {
    let app = app(by_ip("ip:1/m").methods([Method::POST]).build().unwrap());
    for _ in 0..5 {
        let a = send(&app, get_request(PEER, "/other")).await;
        assert_eq!(a.status, 200);
        assert_eq!(
            a.header("ratelimit"),
            None,
            "GET is not this layer's business"
        );
    }
    assert_eq!(status(&app, login_request(PEER, "a", "correct")).await, 200);
    assert_eq!(status(&app, login_request(PEER, "a", "correct")).await, 429);
    assert_eq!(status(&app, get_request(PEER, "/other")).await, 200);
}

#[tokio::test]
async fn paths_exact_and_prefix() {
    let app = app(by_ip("ip:1/m").paths(["/api/*"]).build().unwrap());
    assert_eq!(status(&app, get_request(PEER, "/api/items")).await, 200);
    assert_eq!(status(&app, get_request(PEER, "/api/items")).await, 429);
    assert_eq!(status(&app, get_request(PEER, "/other")).await, 200);
    let app = common::app(by_ip("ip:1/m").paths(["/other"]).build().unwrap());
    assert_eq!(status(&app, get_request(PEER, "/api/items")).await, 200);
    assert_eq!(status(&app, get_request(PEER, "/api/items")).await, 200);
}

#[tokio::test]
async fn exempt_and_deny_lists() {
    let layer = by_ip("ip:1/m")
        .exempt([
            "10.0.0.0/8".parse().unwrap(),
            "2001:db8::/32".parse().unwrap(),
        ])
        .deny([
            "198.51.100.0/24".parse().unwrap(),
            "10.6.6.0/24".parse().unwrap(),
        ])
        .build()
        .unwrap();
    let app = app(layer);
    for peer in ["10.1.2.3:1", "[2001:db8::1]:1", "[::ffff:10.1.2.3]:1"] {
        for _ in 0..3 {
            let a = send(&app, get_request(peer, "/other")).await;
            assert_eq!(a.status, 200, "{peer} is exempt");
            assert_eq!(a.header("x-ratelimit-remaining"), None);
        }
    }
    // Deny wins over exempt; a denied address gets 403, not 429.
    for peer in ["198.51.100.7:1", "10.6.6.6:1"] {
        let a = send(&app, get_request(peer, "/other")).await;
        assert_eq!(a.status, 403, "{peer} is denied");
        assert_eq!(a.json()["reason"], "deny_listed");
    }
    assert_eq!(status(&app, get_request(PEER, "/other")).await, 200);
    assert_eq!(status(&app, get_request(PEER, "/other")).await, 429);
}

type Seen = Arc<Mutex<Vec<(Reason, bool, Vec<(String, String)>)>>>;

fn recorder() -> (
    Seen,
    impl Fn(&sluice_tower::Denied<'_>) + Send + Sync + 'static,
) {
    let seen: Seen = Arc::default();
    let log = seen.clone();
    let hook = move |d: &sluice_tower::Denied<'_>| {
        let selectors = d
            .selectors
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        log.lock().unwrap().push((d.reason, d.shadow, selectors));
    };
    (seen, hook)
}

/// A shadow layer, and a shadow *policy* behind an ordinary layer keyed by the client
/// address (the limiter admits and says the policy would have denied; the layer's quickest
/// configuration): both admit, tell the audit hook and count. Only the shadow layer hides
/// its header fields.
#[tokio::test]
async fn shadow_mode_admits_and_tells_the_audit_hook() {
    let shadow_policy = Policy::new("web", "ip:1/m").unwrap().shadow(true);
    let builders = [
        (by_ip("ip:1/m").shadow(true), true),
        (
            RateLimitLayer::builder(limiter(&clock(), vec![shadow_policy]), "web")
                .selector("ip", Key::client_ip()),
            false,
        ),
    ];
    for (builder, invisible) in builders {
        let (seen, hook) = recorder();
        let layer = builder.on_denied(hook).build().unwrap();
        let stats_of = layer.clone();
        let app = app(layer);
        for _ in 0..3 {
            let a = send(&app, get_request(PEER, "/other")).await;
            assert_eq!(a.status, 200);
            assert_eq!(a.header("ratelimit").is_none(), invisible);
        }
        let seen = seen.lock().unwrap();
        let expected = (
            Reason::Limited,
            true,
            vec![("ip".into(), "203.0.113.9".into())],
        );
        assert_eq!(
            *seen,
            vec![expected.clone(), expected],
            "shadow layer: {invisible}"
        );
        assert_eq!(stats_of.stats().shadow_denied, 2);
        assert_eq!(stats_of.stats().denied, 0);
    }
}

/// The usual refusal is pre-rendered into the request's own header map: the audit hook
/// still sees the request as it came, and nothing of it reaches the answer.
#[tokio::test]
async fn the_default_refusal_tells_the_audit_hook_and_keeps_no_request_field() {
    let seen_agent: Arc<Mutex<Vec<String>>> = Arc::default();
    let log = seen_agent.clone();
    let layer = by_ip("ip:1/m")
        .on_denied(move |d| {
            let agent = d.request.headers.get("user-agent").unwrap();
            log.lock().unwrap().push(agent.to_str().unwrap().to_owned());
        })
        .build()
        .unwrap();
    let stats_of = layer.clone();
    let app = app(layer);
    let request = || {
        from(PEER, "GET", "/other")
            .header("user-agent", "flood/1.0")
            .header("x-request-id", "42")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(send(&app, request()).await.status, 200);
    for _ in 0..3 {
        let a = send(&app, request()).await;
        assert_eq!(a.status, 429);
        assert_eq!(a.header("content-type"), Some("application/problem+json"));
        assert_eq!(a.header("retry-after"), Some("60"));
        assert_eq!(a.header("ratelimit-policy"), Some("\"web\";q=1;w=60"));
        let names: Vec<&str> = a.headers.keys().map(|n| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "content-type",
                "ratelimit-policy",
                "ratelimit",
                "retry-after",
                // Added by axum's route.
                "content-length",
            ],
            "no field of the request is left in the answer"
        );
        assert_eq!(
            a.json()["detail"],
            "rate limited by policy `web`; retry after 60 s"
        );
    }
    assert_eq!(*seen_agent.lock().unwrap(), ["flood/1.0"; 3]);
    assert_eq!(stats_of.stats().denied, 3);
}

#[tokio::test]
async fn audit_and_render_hooks_see_denials() {
    let (seen, hook) = recorder();
    let layer = by_ip("ip:1/m")
        .on_denied(hook)
        .render(|d| {
            let page = format!("<h1>Slow down</h1><p>{}</p>", d.policy);
            let mut response = Response::new(Bytes::from(page));
            *response.status_mut() = axum::http::StatusCode::TOO_MANY_REQUESTS;
            response
                .headers_mut()
                .insert("content-type", "text/html".parse().unwrap());
            Some(response)
        })
        .build()
        .unwrap();
    let app = app(layer);
    send(&app, get_request(PEER, "/other")).await;
    let a = send(&app, get_request(PEER, "/other")).await;
    assert_eq!(a.status, 429);
    assert_eq!(a.body, "<h1>Slow down</h1><p>web</p>");
    assert_eq!(a.header("content-type"), Some("text/html"));
    assert_eq!(
        a.header("retry-after"),
        Some("60"),
        "fields added to custom pages"
    );
    assert_eq!(seen.lock().unwrap()[0].0, Reason::Limited);
    assert!(!seen.lock().unwrap()[0].1);
}

#[tokio::test]
async fn missing_keys_share_skip_or_reject() {
    let key = || Key::header(axum::http::HeaderName::from_static("x-api-key"));
    let shared = app(builder("apikey:1/m")
        .selector("apikey", key())
        .build()
        .unwrap());
    assert_eq!(status(&shared, get_request(PEER, "/api/items")).await, 200);
    assert_eq!(
        status(&shared, get_request("192.0.2.1:1", "/api/items")).await,
        429
    );

    let skip = app(builder("apikey:1/m")
        .selector("apikey", key())
        .when_missing(WhenMissing::Skip)
        .build()
        .unwrap());
    for _ in 0..3 {
        assert_eq!(status(&skip, get_request(PEER, "/api/items")).await, 200);
    }

    let reject = app(builder("apikey:1/m")
        .selector("apikey", key())
        .when_missing(WhenMissing::Reject)
        .build()
        .unwrap());
    let a = send(&reject, get_request(PEER, "/api/items")).await;
    assert_eq!(a.status, 400);
    assert!(a.json()["detail"].as_str().unwrap().contains("apikey"));
}

#[tokio::test]
async fn json_fields_are_read_hashed_and_the_body_passed_on() {
    let (seen, hook) = recorder();
    let layer = builder("user:1/m")
        .selector(
            "user",
            Key::json_field("/user/name").map(|v| v.to_lowercase()),
        )
        .on_denied(hook)
        .build()
        .unwrap();
    let app = app(layer);
    let echo = |name: &str| {
        from(PEER, "POST", "/echo")
            .header("content-type", "application/json")
            .body(Body::from(format!(r#"{{"user": {{"name": "{name}"}}}}"#)))
            .unwrap()
    };
    let a = send(&app, echo("Alice")).await;
    assert_eq!(a.status, 200);
    assert_eq!(
        a.body, r#"{"user": {"name": "Alice"}}"#,
        "the handler gets the body"
    );
    assert_eq!(
        status(&app, echo("ALICE")).await,
        429,
        "mapped before hashing"
    );
    assert_eq!(status(&app, echo("bob")).await, 200);
    let seen = seen.lock().unwrap();
    let (_, _, selectors) = &seen[0];
    assert_eq!(selectors[0].1, sluice_tower::hashed("alice"));
    assert_eq!(selectors[0].1.len(), 32);
}

#[tokio::test]
async fn oversized_bodies_are_refused() {
    let layer = builder("user:1/m")
        .selector("user", Key::form_field("username"))
        .max_body(16)
        .build()
        .unwrap();
    let app = app(layer);
    let a = send(&app, login_request(PEER, "someone-with-a-long-name", "x")).await;
    assert_eq!(a.status, 413);
}

#[tokio::test]
async fn grpc_calls_get_resource_exhausted() {
    let app = app(by_ip("ip:1/m").build().unwrap());
    let call = || {
        from(PEER, "POST", "/echo")
            .header("content-type", "application/grpc")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(status(&app, call()).await, 200);
    let a = send(&app, call()).await;
    assert_eq!(a.status, 200, "gRPC errors travel in grpc-status");
    assert_eq!(a.header("content-type"), Some("application/grpc"));
    assert_eq!(a.header("grpc-status"), Some("8"));
    assert_eq!(
        a.header("grpc-message"),
        Some("rate limited by policy `web`; retry after 60 s")
    );
    assert_eq!(a.header("retry-after"), Some("60"));
    assert!(a.header("grpc-status-details-bin").is_some());
    assert_eq!(a.body, "");
}

#[test]
fn configuration_is_checked_against_the_policy() {
    use sluice_tower::Error;
    let err = |b: sluice_tower::RateLimitLayerBuilder| b.build().unwrap_err();
    assert_eq!(
        err(builder("ip+user:1/m").selector("ip", Key::client_ip())),
        Error::NoKey {
            policy: "web".into(),
            selector: "user".into()
        }
    );
    assert_eq!(
        err(by_ip("ip:1/m").selector("user", Key::path())),
        Error::UnusedKey {
            policy: "web".into(),
            selector: "user".into()
        }
    );
    assert_eq!(
        err(by_ip("ip:1/m").selector("ip", Key::path())),
        Error::DuplicateKey("ip".into())
    );
    let limiter = limiter(&clock(), vec![Policy::new("web", "1/s").unwrap()]);
    assert_eq!(
        RateLimitLayer::builder(limiter, "nope")
            .build()
            .unwrap_err(),
        Error::UnknownPolicy("nope".into())
    );
}
