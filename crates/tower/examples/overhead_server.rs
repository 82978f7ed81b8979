//! The benchmark's server: one trivial axum app served on four ports: behind
//! `RateLimitLayer` as configured by default (memory store, a limit keyed by client IP that
//! never refuses), behind the same layer sending every header field, and sending none (the
//! limiter's own cost), and without the layer. `benches/overhead.sh` drives them with wrk.
//!
//! Prints one `NAME http://ADDR` line per port once all are bound: `with_layer`,
//! `with_layer_all_fields`, `with_layer_no_fields`, `without_layer`.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use sluice_limiter::{Limiter, MemoryStore, Policy};
use sluice_tower::{Headers, Key, RateLimitLayer};

fn app() -> Router {
    Router::new().route("/", get(|| async { "hello\n" }))
}

async fn serve(name: &str, app: Router) -> tokio::task::JoinHandle<std::io::Result<()>> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    println!("{name} http://{}", listener.local_addr().expect("addr"));
    let app = app.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, app).await })
}

#[tokio::main]
async fn main() {
    let limiter = Limiter::builder(MemoryStore::new())
        // As high as a rule goes: every request is checked and recorded, none refused.
        .policy(Policy::new("bench", "ip:1000000000000/s").expect("rule"))
        .build()
        .expect("policy");
    let limiter = Arc::new(limiter);
    let layer = |headers| {
        RateLimitLayer::builder(limiter.clone(), "bench")
            .selector("ip", Key::client_ip())
            .headers(headers)
            .build()
            .expect("layer")
    };
    let servers = [
        serve("with_layer", app().layer(layer(Headers::default()))).await,
        serve("with_layer_all_fields", app().layer(layer(Headers::ALL))).await,
        serve("with_layer_no_fields", app().layer(layer(Headers::NONE))).await,
        serve("without_layer", app()).await,
    ];
    let _ = std::io::stdout().flush();
    for server in servers {
        server.await.expect("server task").expect("serve");
    }
}
