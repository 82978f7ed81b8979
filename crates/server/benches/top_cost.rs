//! What the heavy hitters add to a decision. Two parts:
//!
//! - `observe_*`: `Top::observe` alone (what `Service` calls after each decision), K = 64,
//!   on 1 and 2 threads sharing one policy: one value over and over, 32 values in turn (all
//!   held), and a flood of values never seen before, admitted (each one replaces a
//!   counter) and refused (each one replaces a counter in both sketches and is written into
//!   the refusal ring: the worst case).
//! - `service_*`: `Service::check_policy` on the memory store with heavy hitters on (the
//!   defaults) against off (`top(0)`, `refusals(0)`), in alternating rounds, for admitted
//!   hits of 32 values and for refused hits of new values.
//!
//! `cargo bench -p sluice-server --bench top_cost` prints one line per variant:
//! `variant=NAME ns_per_call=X allocations_per_call=Y` (medians of rounds; wall time per
//! call per thread) and, for the service, `added_ns=X-Y`.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use sluice_core::{Decision, Denial};
use sluice_limiter::{Checked, Limiter, MemoryStore, Policy, PolicyRef};
use sluice_server::Service;
use sluice_server::top::Top;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

const ROUNDS: usize = 7;
const CALLS: usize = 200_000;
const T0: u64 = 1_700_000_040 * 1_000_000_000;

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// `count` distinct client addresses, made before timing.
fn addresses(count: usize, offset: usize) -> Vec<String> {
    (offset..offset + count)
        .map(|i| format!("10.{}.{}.{}", i >> 16 & 255, i >> 8 & 255, i & 255))
        .collect()
}

fn checked(policy: &PolicyRef, refused: bool) -> Checked {
    let denial = refused.then_some(Denial::Limited {
        retry_after: Duration::from_secs(3),
    });
    Checked {
        decision: Decision {
            denial,
            limit: 5,
            remaining: 0,
            reset_after: Duration::from_secs(12),
            leaf: 0,
        },
        shadow_denied: false,
        cached: false,
        without_store: None,
        policy: policy.clone(),
    }
}

/// Nanoseconds per `Top::observe` on each of `threads` threads, each cycling through its
/// own `values`.
fn observe_round(top: &Top, policy: &PolicyRef, values: &[Vec<String>], refused: bool) -> f64 {
    let threads = values.len();
    let barrier = Barrier::new(threads + 1);
    let started = std::thread::scope(|scope| {
        for values in values {
            let barrier = &barrier;
            scope.spawn(move || {
                let checked = checked(policy, refused);
                barrier.wait();
                for i in 0..CALLS {
                    let ip = values[i % values.len()].as_str();
                    // Time moves 1 µs a call, so rounds cross minutes as a live server does.
                    let now = T0 + i as u64 * 1_000;
                    top.observe(now, "login", &[("ip", ip)], &checked);
                }
            });
        }
        barrier.wait();
        Instant::now()
    });
    started.elapsed().as_nanos() as f64 / CALLS as f64
}

fn observe_variant(name: &str, threads: usize, distinct: usize, refused: bool) {
    let policy: PolicyRef = Arc::new(
        sluice_limiter::policy::CompiledPolicy::compile(
            Policy::new("login", "ip:5/m").expect("rule"),
        )
        .expect("policy"),
    );
    let top = Top::new(64, 100);
    top.track(["login".to_owned()]);
    let values: Vec<Vec<String>> = (0..threads)
        .map(|t| addresses(distinct, t * distinct))
        .collect();
    observe_round(&top, &policy, &values, refused);
    let times: Vec<f64> = (0..ROUNDS)
        .map(|_| observe_round(&top, &policy, &values, refused))
        .collect();
    let region = Region::new(GLOBAL);
    observe_round(&top, &policy, &values[..1], refused);
    let allocations = region.change().allocations as f64 / CALLS as f64;
    println!(
        "variant=observe_{name}_threads_{threads} ns_per_call={:.1} allocations_per_call={allocations:.3}",
        median(times)
    );
}

fn service(rule: &str, on: bool) -> Service {
    let limiter = Limiter::builder(MemoryStore::new())
        .policy(Policy::new("login", rule).expect("rule"))
        .build()
        .expect("policy");
    let builder = Service::builder(Arc::new(limiter));
    if on {
        builder.build()
    } else {
        builder.top(0).refusals(0).build()
    }
}

/// Nanoseconds per `check_policy`, cycling through `values`.
fn service_round(service: &Service, runtime: &tokio::runtime::Runtime, values: &[String]) -> f64 {
    let policy = service.limiter().policy("login").expect("policy");
    let started = Instant::now();
    runtime.block_on(async {
        for i in 0..CALLS {
            let ip = values[i % values.len()].as_str();
            let checked = service.check_policy(&policy, &[("ip", ip)], 1).await;
            std::hint::black_box(checked.expect("decided"));
        }
    });
    started.elapsed().as_nanos() as f64 / CALLS as f64
}

fn service_variant(name: &str, rule: &str, values: &[String]) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (on, off) = (service(rule, true), service(rule, false));
    service_round(&on, &runtime, values);
    service_round(&off, &runtime, values);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        with.push(service_round(&on, &runtime, values));
        without.push(service_round(&off, &runtime, values));
    }
    let (with, without) = (median(with), median(without));
    println!(
        "variant=service_{name} ns_per_call={with:.0} off_ns={without:.0} added_ns={:.0}",
        with - without
    );
}

fn main() {
    for threads in [1, 2] {
        observe_variant("one_value", threads, 1, false);
        observe_variant("32_values", threads, 32, false);
        observe_variant("new_values_admitted", threads, CALLS, false);
        observe_variant("new_values_refused", threads, CALLS, true);
    }
    service_variant("32_values_admitted", "ip:1000000000/s", &addresses(32, 0));
    // A limit of 1 an hour: after the first hit of each value, every hit is refused; the
    // values are new for the first round only, then the sketches see them again.
    service_variant("refused", "ip:1/h", &addresses(CALLS, 0));
}
