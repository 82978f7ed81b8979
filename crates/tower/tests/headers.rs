//! Header fields, exactly: remaining, reset and retry-after, rounded up to whole seconds.

mod common;

use std::time::Duration;

use axum::http::HeaderName;
use common::{Answer, app, clock, get_request, limiter, send};
use sluice_limiter::Policy;
use sluice_tower::{Headers, Key, RateLimitLayer};

fn api_layer(rule: &str, clock: &sluice_limiter::ManualClock, headers: Headers) -> RateLimitLayer {
    let limiter = limiter(clock, vec![Policy::new("api", rule).unwrap()]);
    RateLimitLayer::builder(limiter, "api")
        .selector("apikey", Key::header(HeaderName::from_static("x-api-key")))
        .headers(headers)
        .build()
        .unwrap()
}

fn items(key: &str) -> axum::http::Request<axum::body::Body> {
    let mut request = get_request("203.0.113.9:5000", "/api/items");
    request
        .headers_mut()
        .insert("x-api-key", key.parse().unwrap());
    request
}

fn fields<'a>(
    retry_after: Option<&'a str>,
    rate_limit: &'a str,
    remaining: &'a str,
    reset: &'a str,
) -> Vec<(&'static str, Option<&'a str>)> {
    vec![
        ("retry-after", retry_after),
        ("ratelimit-policy", Some("\"api\";q=3;w=60")),
        ("ratelimit", Some(rate_limit)),
        ("x-ratelimit-limit", Some("3")),
        ("x-ratelimit-remaining", Some(remaining)),
        ("x-ratelimit-reset", Some(reset)),
    ]
}

#[tokio::test]
async fn remaining_reset_and_retry_after_are_exact() {
    let clock = clock();
    let app = app(api_layer("apikey:3/m", &clock, Headers::ALL));

    // 3 per minute: one hit every 20 s refills; each hit pushes the full reset 20 s away.
    let a = send(&app, items("k1")).await;
    assert_eq!(a.status, 200);
    assert_eq!(
        a.limit_fields(),
        fields(None, "\"api\";r=2;t=20", "2", "20")
    );
    let a = send(&app, items("k1")).await;
    assert_eq!(
        a.limit_fields(),
        fields(None, "\"api\";r=1;t=40", "1", "40")
    );
    let a = send(&app, items("k1")).await;
    assert_eq!(
        a.limit_fields(),
        fields(None, "\"api\";r=0;t=60", "0", "60")
    );

    let a = send(&app, items("k1")).await;
    assert_eq!(a.status, 429);
    assert_eq!(
        a.limit_fields(),
        fields(Some("20"), "\"api\";r=0;t=60", "0", "60")
    );
    assert_eq!(a.header("content-type"), Some("application/problem+json"));
    let body = a.json();
    assert_eq!(body["status"], 429);
    assert_eq!(body["policy"], "api");
    assert_eq!(body["reason"], "limited");
    assert_eq!(body["retry_after"], 20);
    assert_eq!(body["remaining"], 0);

    // Another key has its own counter.
    assert_eq!(send(&app, items("k2")).await.status, 200);

    // Part of the wait served: whole seconds, rounded up (14.5 s left is 15).
    clock.advance(Duration::from_millis(5_500));
    let a = send(&app, items("k1")).await;
    assert_eq!(
        a.limit_fields(),
        fields(Some("15"), "\"api\";r=0;t=55", "0", "55")
    );

    clock.advance(Duration::from_millis(14_500));
    let a = send(&app, items("k1")).await;
    assert_eq!(a.status, 200);
    assert_eq!(
        a.limit_fields(),
        fields(None, "\"api\";r=0;t=60", "0", "60")
    );
}

#[tokio::test]
async fn each_field_family_can_be_switched_off() {
    let clock = clock();
    let only_x = Headers {
        retry_after: false,
        ietf: false,
        x_ratelimit: true,
    };
    let app = app(api_layer("apikey:1/m", &clock, only_x));
    let a = send(&app, items("k")).await;
    assert_eq!(a.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(a.header("ratelimit"), None);
    let a = send(&app, items("k")).await;
    assert_eq!(a.status, 429);
    assert_eq!(a.header("retry-after"), None);
    assert_eq!(a.header("ratelimit-policy"), None);
    assert_eq!(a.json()["retry_after"], 60, "the body still says when");

    let app = common::app(api_layer("apikey:1/m", &clock, Headers::NONE));
    let a = send(&app, items("k")).await;
    assert_eq!(a.status, 200);
    assert!(a.limit_fields().iter().all(|(_, v)| v.is_none()), "{a:?}");
    let a: Answer = send(&app, items("k")).await;
    assert_eq!(a.status, 429);
    assert!(a.limit_fields().iter().all(|(_, v)| v.is_none()), "{a:?}");
}

#[tokio::test]
async fn several_leaves_are_listed_and_the_deciding_one_reported() {
    let clock = clock();
    let app = app(api_layer(
        "apikey:3/m; 100/h; apikey:10/m burst=20",
        &clock,
        Headers::default(),
    ));
    let a = send(&app, items("k")).await;
    assert_eq!(a.header("x-ratelimit-limit"), None, "the trio is opt-in");
    assert_eq!(
        a.header("ratelimit-policy"),
        Some("\"api.0\";q=3;w=60, \"api.1\";q=100;w=3600, \"api.2\";q=20;w=120")
    );
    assert_eq!(a.header("ratelimit"), Some("\"api.0\";r=2;t=20"));
}

/// Wrapped around a whole router, the body comes back as the router's own type through
/// `ResponseBody::into_body` (what `axum::serve` wants): the handler's body untouched, the
/// layer's 429 answer converted whole, with its fields.
#[tokio::test]
async fn around_a_router_the_body_is_given_back_as_the_routers_own() {
    use axum::body::Body;
    use http_body_util::BodyExt;
    use sluice_tower::ResponseBody;
    use tower::{Layer, ServiceExt};

    let clock = clock();
    let router = axum::Router::new().route("/api/items", axum::routing::get(|| async { "[]" }));
    let service =
        tower::util::MapResponseLayer::new(|response: axum::http::Response<ResponseBody<Body>>| {
            response.map(ResponseBody::into_body)
        })
        .layer(api_layer("apikey:1/m", &clock, Headers::default()).layer(router));

    let read = |response: axum::http::Response<Body>| async move {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, String::from_utf8(body.to_vec()).unwrap())
    };
    let (status, headers, body) = read(service.clone().oneshot(items("k1")).await.unwrap()).await;
    assert_eq!((status, body.as_str()), (200, "[]"));
    assert_eq!(headers["ratelimit"], "\"api\";r=0;t=60");

    let (status, headers, body) = read(service.oneshot(items("k1")).await.unwrap()).await;
    assert_eq!(status, 429);
    assert_eq!(headers["retry-after"], "60");
    assert_eq!(headers["content-type"], "application/problem+json");
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["status"], 429);
}

/// With `axum_body` the layer answers with axum's own `Body`: around a router no `map` is
/// needed, and under `Router::layer` the same answers come back, fields and all.
#[cfg(feature = "axum")]
#[tokio::test]
async fn with_axum_body_the_router_serves_the_layer_as_it_is() {
    use axum::body::Body;
    use http_body_util::BodyExt;
    use tower::{Layer, ServiceExt};

    let read = |response: axum::http::Response<Body>| async move {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, String::from_utf8(body.to_vec()).unwrap())
    };
    let handler = || async { "[]" };

    let clock = clock();
    let around = api_layer("apikey:1/m", &clock, Headers::default())
        .axum_body()
        .layer(axum::Router::new().route("/api/items", axum::routing::get(handler)));
    let clock = self::clock();
    let per_route = axum::Router::new()
        .route("/api/items", axum::routing::get(handler))
        .layer(api_layer("apikey:1/m", &clock, Headers::default()).axum_body());

    for (admitted, refused) in [
        (
            around.clone().oneshot(items("k1")).await.unwrap(),
            around.clone().oneshot(items("k1")).await.unwrap(),
        ),
        (
            per_route.clone().oneshot(items("k1")).await.unwrap(),
            per_route.clone().oneshot(items("k1")).await.unwrap(),
        ),
    ] {
        let (status, headers, body) = read(admitted).await;
        assert_eq!((status, body.as_str()), (200, "[]"));
        assert_eq!(headers["ratelimit"], "\"api\";r=0;t=60");
        let (status, headers, body) = read(refused).await;
        assert_eq!(status, 429);
        assert_eq!(headers["retry-after"], "60");
        assert_eq!(headers["content-type"], "application/problem+json");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["status"], 429);
    }
}
