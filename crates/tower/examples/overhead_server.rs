//! The benchmark's server: one trivial axum app served twice, on one port behind
//! `RateLimitLayer` (memory store, a limit keyed by client IP that never refuses) and on
//! another without it. `benches/overhead.sh` drives both with wrk.
//!
//! Prints `with_layer http://ADDR` and `without_layer http://ADDR` once both are bound.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use sluice_limiter::{Limiter, MemoryStore, Policy};
use sluice_tower::{Key, RateLimitLayer};

fn app() -> Router {
    Router::new().route("/", get(|| async { "hello\n" }))
}

#[tokio::main]
async fn main() {
    let limiter = Limiter::builder(MemoryStore::new())
        // As high as a rule goes: every request is checked and recorded, none refused.
        .policy(Policy::new("bench", "ip:1000000000000/s").expect("rule"))
        .build()
        .expect("policy");
    let layer = RateLimitLayer::builder(Arc::new(limiter), "bench")
        .selector("ip", Key::client_ip())
        .build()
        .expect("layer");

    let with = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let without = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    println!("with_layer http://{}", with.local_addr().expect("addr"));
    println!(
        "without_layer http://{}",
        without.local_addr().expect("addr")
    );
    let _ = std::io::stdout().flush();

    let limited = app()
        .layer(layer)
        .into_make_service_with_connect_info::<SocketAddr>();
    let plain = app().into_make_service_with_connect_info::<SocketAddr>();
    let (a, b) = tokio::join!(axum::serve(with, limited), axum::serve(without, plain));
    a.and(b).expect("serve");
}
