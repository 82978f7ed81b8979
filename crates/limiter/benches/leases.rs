//! Concurrency leases on the memory store against `tokio::sync::Semaphore`, on one key.
//!
//! `cargo bench -p sluice-limiter --bench leases` prints one line per scenario:
//! `scenario=limiter_acquire_release threads=1 sluice_ns=... semaphore_ns=... ratio=...`.
//!
//! One operation is an acquire followed by its release, on one key, with a free slot each
//! time (the limit is 3, one holder per thread). `limiter_` calls `Limiter::acquire` with a
//! policy handle and releases the `Lease` (`Lease::release`), as an application would;
//! `slots_acquire_` does the same through the key's `Slots` (`Limiter::slots`, made once:
//! one object per key, as the semaphore is); `slots_permit_drop` takes a `SlotPermit`
//! (`Slots::permit`, borrowed from the slots as the semaphore's permit is from the
//! semaphore) and drops it, as the semaphore side does; `store_` calls the memory store's
//! `acquire_now` and `release_now` on a ready identifier.
//! The semaphore side is `Semaphore::acquire().await` and dropping the permit. Both sides
//! run in one async loop on a current-thread runtime per thread, as async closures that
//! capture what they use once (no `Arc` cloned per operation, on either side). Sides
//! alternate in 3 rounds of the same number of operations; each figure is the median round,
//! in nanoseconds per operation per thread. The semaphore cannot be shared across
//! processes; the lease can, through a shared store.
//!
//! For a profile of one side: `SLUICE_BENCH_ONLY=store SLUICE_BENCH_OPS=20000
//! SLUICE_BENCH_THREADS=1 valgrind --tool=callgrind target/release/deps/leases-*` (the other
//! sides print 0; one thread, as two contend and move the count from run to run). The
//! instructions of one operation are the difference between two such runs of different
//! `SLUICE_BENCH_OPS`, over the difference in operations (3 rounds; the semaphore side runs
//! four times per round, once beside each row), which leaves out the setup.

use std::sync::{Arc, Barrier};
use std::time::Instant;

use sluice_core::{Evaluation, Recording};
use sluice_limiter::{Hit, Identifier, LeaseKeys, Limiter, MemoryStore, Policy, PolicyRef};
use tokio::sync::Semaphore;

const ROUNDS: usize = 3;
const OPS: u64 = 300_000;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
}

/// Runs `op` `OPS` times on each of `threads` threads at once; ns per op per thread.
///
/// `op` is an async closure: what it needs is captured once per thread, not cloned per
/// operation (an `Arc` cloned per operation is two atomic writes to a line that two threads
/// share, and it was a third of the semaphore's figure).
fn timed<F>(threads: usize, op: F) -> f64
where
    F: AsyncFn() + Send + Clone + 'static,
{
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (op, start) = (op.clone(), start.clone());
            std::thread::spawn(move || {
                let rt = runtime();
                start.wait();
                let began = Instant::now();
                rt.block_on(async {
                    for _ in 0..ops() {
                        op().await;
                    }
                });
                began.elapsed().as_nanos() as f64 / ops() as f64
            })
        })
        .collect();
    start.wait();
    let per_thread: Vec<f64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    per_thread.iter().sum::<f64>() / threads as f64
}

/// Operations per thread per round: `OPS`, or `SLUICE_BENCH_OPS` (a small count for running
/// under a profiler, `valgrind --tool=callgrind`). `SLUICE_BENCH_ONLY=limiter`, `slots`, `permit`,
/// `store` or `semaphore` runs that side alone (the others print 0), so a profile holds one side.
fn ops() -> u64 {
    std::env::var("SLUICE_BENCH_OPS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(OPS)
}

/// Whether `side` is to be measured (see [`ops`]).
fn runs(side: &str) -> bool {
    std::env::var("SLUICE_BENCH_ONLY").map_or(true, |only| only == side)
}

/// `op` timed, or 0 when its side is left out.
fn timed_if<F>(side: &str, threads: usize, op: F) -> f64
where
    F: AsyncFn() + Send + Clone + 'static,
{
    if runs(side) { timed(threads, op) } else { 0.0 }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let limiter = Arc::new(
        Limiter::builder(MemoryStore::new())
            .policy(Policy::new("jobs", "queue:3 concurrent").unwrap())
            .build()
            .unwrap(),
    );
    let policy: PolicyRef = limiter.policy("jobs").unwrap();
    let store = limiter.store().as_memory().unwrap().clone();
    let id = Arc::new(Identifier::new("sluice:jobs:queue:mail:concurrent"));
    let semaphore = Arc::new(Semaphore::new(3));
    let slots = limiter.slots(&policy, &[("queue", "mail")]).unwrap();

    // `SLUICE_BENCH_THREADS=1` (or 2) runs that count alone.
    let only: Option<usize> = std::env::var("SLUICE_BENCH_THREADS")
        .ok()
        .and_then(|n| n.parse().ok());
    for threads in [1, 2].into_iter().filter(|t| only.is_none_or(|o| o == *t)) {
        let mut rows: [(&str, Vec<f64>, Vec<f64>); 4] = [
            ("limiter_acquire_release", Vec::new(), Vec::new()),
            ("slots_acquire_release", Vec::new(), Vec::new()),
            ("slots_permit_drop", Vec::new(), Vec::new()),
            ("store_acquire_release", Vec::new(), Vec::new()),
        ];
        for _ in 0..ROUNDS {
            let (limiter, jobs) = (limiter.clone(), policy.clone());
            rows[0].1.push(timed_if("limiter", threads, async move || {
                let acquired = limiter.acquire(&jobs, &[("queue", "mail")]).await;
                let lease = acquired.unwrap().lease.expect("a free slot");
                lease.release().await.unwrap();
            }));
            let (leases, permits) = (slots.clone(), slots.clone());
            rows[1].1.push(timed_if("slots", threads, async move || {
                let acquired = leases.acquire().await;
                let lease = acquired.unwrap().lease.expect("a free slot");
                lease.release().await.unwrap();
            }));
            rows[2].1.push(timed_if("permit", threads, async move || {
                let permit = permits.permit().await.unwrap().expect("a free slot");
                drop(permit);
            }));
            let (store, policy, id) = (store.clone(), policy.clone(), id.clone());
            rows[3].1.push(timed_if("store", threads, async move || {
                let hit = Hit {
                    identifiers: std::slice::from_ref(&*id),
                    evaluation: Evaluation {
                        shape: &policy.shape,
                        quotas: &policy.quotas,
                        cost: 1,
                        recording: Recording::Admitted,
                        penalty: None,
                    },
                    penalty_identifier: None,
                };
                let lease = sluice_limiter::LeaseId::random().0;
                assert!(store.acquire_now(&hit, lease).allowed());
                let keys = LeaseKeys {
                    identifiers: std::slice::from_ref(&*id),
                    quotas: &policy.quotas,
                    held_for: None,
                };
                store.release_now(&keys, lease);
            }));
            for row in rows.iter_mut() {
                let semaphore = semaphore.clone();
                row.2.push(timed_if("semaphore", threads, async move || {
                    let permit = semaphore.acquire().await.expect("open");
                    drop(permit);
                }));
            }
        }
        for (name, sluice, sem) in rows {
            let (sluice, sem) = (median(sluice), median(sem));
            println!(
                "scenario={name} threads={threads} sluice_ns={sluice:.1} semaphore_ns={sem:.1} ratio={:.2}",
                sluice / sem
            );
        }
    }
}
