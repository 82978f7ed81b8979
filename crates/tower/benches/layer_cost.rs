//! The layer's own CPU cost per request, without a network: the same trivial axum app called
//! directly, with and without `RateLimitLayer` (memory store, one limit keyed by client IP
//! that never refuses), on 1 and 2 threads (2 threads share the layer and its one counter, as
//! a server's workers do, so what they contend on shows). The layer wraps the router, with
//! its default fields, all five and none; `default_per_route` applies it with
//! `Router::layer` instead (axum then clones and boxes per route on its behalf).
//!
//! `cargo bench -p sluice-tower --bench layer_cost` prints one line per variant:
//! `variant=default_threads_1 ns_per_request=X bare_ns=Y added_ns=X-Y`, medians of
//! alternating rounds, wall time per request per thread. `overhead.sh` measures what a client
//! sees over HTTP; this isolates what the layer adds.

use std::net::SocketAddr;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::Request;
use sluice_limiter::{Limiter, MemoryStore, Policy};
use sluice_tower::{Headers, Key, RateLimitLayer};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tower::{Service, ServiceExt};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

const ROUNDS: usize = 7;
const CALLS: usize = 200_000;
/// Set (to anything) for one short round per variant on one thread: for profilers that
/// count instructions, where repetition adds nothing.
const QUICK: &str = "LAYER_COST_QUICK";

fn request() -> Request<Body> {
    let mut request = Request::get("/").body(Body::empty()).unwrap();
    let peer: SocketAddr = "192.0.2.7:40000".parse().unwrap();
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

fn app() -> Router {
    Router::new().route("/", get(|| async { "hello\n" }))
}

/// Nanoseconds per call of `CALLS` requests through a clone of `service` on each of
/// `threads` threads, each with its own single-threaded runtime.
fn round<S>(service: &S, threads: usize, calls: usize) -> f64
where
    S: Service<Request<Body>> + Clone + Send,
    S::Error: std::fmt::Debug,
    S::Future: Send,
{
    let barrier = Barrier::new(threads + 1);
    let started = std::thread::scope(|scope| {
        for _ in 0..threads {
            let (mut service, barrier) = (service.clone(), &barrier);
            scope.spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .build()
                    .expect("runtime");
                barrier.wait();
                runtime.block_on(async {
                    for _ in 0..calls {
                        let ready = service.ready().await.unwrap();
                        std::hint::black_box(ready.call(request()).await.unwrap());
                    }
                });
            });
        }
        barrier.wait();
        Instant::now()
    });
    started.elapsed().as_nanos() as f64 / calls as f64
}

/// Allocations per request through `service` (deterministic, unlike time).
fn allocations<S>(service: &S) -> f64
where
    S: Service<Request<Body>> + Clone + Send,
    S::Error: std::fmt::Debug,
    S::Future: Send,
{
    let calls = 1_000;
    round(service, 1, calls);
    let region = Region::new(GLOBAL);
    let mut service = service.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let before = region.change().allocations;
    runtime.block_on(async {
        for _ in 0..calls {
            let ready = service.ready().await.unwrap();
            std::hint::black_box(ready.call(request()).await.unwrap());
        }
    });
    (region.change().allocations - before) as f64 / calls as f64
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let limiter = Limiter::builder(MemoryStore::new())
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
    let variants = [
        ("default", Headers::default()),
        ("all_fields", Headers::ALL),
        ("no_fields", Headers::NONE),
    ];
    let quick = std::env::var_os(QUICK).is_some();
    let (rounds, calls, threads) = if quick {
        (1, 20_000, &[1][..])
    } else {
        (ROUNDS, CALLS, &[1, 2][..])
    };
    for &threads in threads {
        for (name, headers) in variants {
            let limited = tower::Layer::layer(&layer(headers), app());
            compare(name, threads, rounds, calls, &limited, &app());
        }
        // As an axum app applies it: with axum's own body, which axum need not box.
        let per_route = app().layer(layer(Headers::default()).axum_body());
        compare(
            "default_per_route",
            threads,
            rounds,
            calls,
            &per_route,
            &app(),
        );
    }
}

/// Times `limited` against `plain` in alternating rounds and prints one line.
fn compare<L, P>(name: &str, threads: usize, rounds: usize, calls: usize, limited: &L, plain: &P)
where
    L: Service<Request<Body>> + Clone + Send,
    L::Error: std::fmt::Debug,
    L::Future: Send,
    P: Service<Request<Body>> + Clone + Send,
    P::Error: std::fmt::Debug,
    P::Future: Send,
{
    round(limited, threads, calls);
    round(plain, threads, calls);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        with.push(round(limited, threads, calls));
        without.push(round(plain, threads, calls));
    }
    let (with, without) = (median(with), median(without));
    let added_allocations = allocations(limited) - allocations(plain);
    println!(
        "variant={name}_threads_{threads} ns_per_request={with:.0} bare_ns={without:.0} \
         added_ns={:.0} added_allocations={added_allocations:.1}",
        with - without
    );
}
