//! The benchmark's server: one trivial axum app served on several ports: behind
//! `RateLimitLayer` as configured by default (memory store, a limit keyed by client IP that
//! never refuses) answering with axum's own body (`axum_body`) and wrapped around the router,
//! as a limit on every request is applied; behind the same layer sending every header field,
//! and sending none (the limiter's own cost); behind the layer applied with `Router::layer`,
//! which wraps each route (axum then clones per request on the layer's behalf, as it does
//! for any layer applied so); behind the layer with its generic `ResponseBody`, given back
//! as axum's with `map(ResponseBody::into_body)`; without the layer; and behind a layer whose
//! policy refuses every request after the first (`refused`). `benches/overhead.sh` drives
//! them with wrk.
//!
//! Prints one `NAME http://ADDR` line per port once all are bound: `with_layer`,
//! `with_layer_all_fields`, `with_layer_no_fields`, `with_layer_per_route`,
//! `with_layer_wrapped`, `without_layer`, `refused`.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::ServiceExt;
use axum::body::Body;
use axum::extract::Request;
use axum::routing::get;
use sluice_limiter::{Limiter, MemoryStore, Policy};
use sluice_tower::{Headers, Key, RateLimitLayer, ResponseBody};
use tokio::net::TcpListener;
use tower::Layer;

fn app() -> Router {
    Router::new().route("/", get(|| async { "hello\n" }))
}

async fn bind(name: &str) -> TcpListener {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    println!("{name} http://{}", listener.local_addr().expect("addr"));
    listener
}

type Served = tokio::task::JoinHandle<std::io::Result<()>>;

/// `app` as axum serves a router, with the peer address for the client-IP key.
async fn serve(name: &str, app: Router) -> Served {
    let listener = bind(name).await;
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, app).await })
}

/// `app` behind `layer` with its generic body, wrapped around the whole router (the body
/// given back as axum's, which `axum::serve` wants).
async fn serve_wrapped(name: &str, app: Router, layer: RateLimitLayer) -> Served {
    let listener = bind(name).await;
    let service =
        tower::util::MapResponseLayer::new(|response: axum::http::Response<ResponseBody<Body>>| {
            response.map(ResponseBody::into_body)
        })
        .layer(layer.layer(app.with_state(())));
    let make = ServiceExt::<Request>::into_make_service_with_connect_info::<SocketAddr>(service);
    tokio::spawn(async move { axum::serve(listener, make).await })
}

/// `app` behind `layer` answering with axum's own body, wrapped around the whole router:
/// what `axum::serve` takes as it is. The router gets its state first (`with_state(())`, as
/// axum's docs advise for a router used as a service, and as `axum::serve` does for a bare
/// router), or axum would clone each route's handler into a new box per request.
async fn serve_around(name: &str, app: Router, layer: RateLimitLayer) -> Served {
    let listener = bind(name).await;
    let service = layer.axum_body().layer(app.with_state(()));
    let make = ServiceExt::<Request>::into_make_service_with_connect_info::<SocketAddr>(service);
    tokio::spawn(async move { axum::serve(listener, make).await })
}

#[tokio::main]
async fn main() {
    let limiter = Limiter::builder(MemoryStore::new())
        // High enough that every request is checked and recorded and none refused, and no
        // longer than a real rule: its identifiers (`sluice:bench:ip:127.0.0.1:1000000000/s`,
        // 38 bytes) are held inline by the memory store, as those of `user:100/m` are
        // (a 13-digit rate made them 41 bytes, a heap key real rules do not pay for).
        .policy(Policy::new("bench", "ip:1000000000/s").expect("rule"))
        // One hit an hour: after the first request, every request is refused (429 with the
        // default problem+json body), the path a flood takes.
        .policy(Policy::new("refused", "ip:1/h").expect("rule"))
        .build()
        .expect("policy");
    let limiter = Arc::new(limiter);
    let layer_of = |policy: &str, headers| {
        RateLimitLayer::builder(limiter.clone(), policy)
            .selector("ip", Key::client_ip())
            .headers(headers)
            .build()
            .expect("layer")
    };
    let layer = |headers| layer_of("bench", headers);
    let servers = [
        serve_around("with_layer", app(), layer(Headers::default())).await,
        serve_around("with_layer_all_fields", app(), layer(Headers::ALL)).await,
        serve_around("with_layer_no_fields", app(), layer(Headers::NONE)).await,
        serve(
            "with_layer_per_route",
            app().layer(layer(Headers::default()).axum_body()),
        )
        .await,
        serve_wrapped("with_layer_wrapped", app(), layer(Headers::default())).await,
        serve("without_layer", app()).await,
        serve_around("refused", app(), layer_of("refused", Headers::default())).await,
    ];
    let _ = std::io::stdout().flush();
    for server in servers {
        server.await.expect("server task").expect("serve");
    }
}
