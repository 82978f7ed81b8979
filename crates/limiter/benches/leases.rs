//! Concurrency leases on the memory store against `tokio::sync::Semaphore`, on one key.
//!
//! `cargo bench -p sluice-limiter --bench leases` prints one line per scenario:
//! `scenario=limiter_acquire_release threads=1 sluice_ns=... semaphore_ns=... ratio=...`.
//!
//! One operation is an acquire followed by its release, on one key, with a free slot each
//! time (the limit is 3, one holder per thread). `limiter_` calls `Limiter::acquire` with a
//! policy handle and releases the `Lease` (`Lease::release`), as an application would;
//! `store_` calls the memory store's `acquire_now` and `release_now` on a ready identifier.
//! The semaphore side is `Semaphore::acquire().await` and dropping the permit. Both sides
//! run in one async loop on a current-thread runtime per thread. Sides alternate in 3
//! rounds of the same number of operations; each figure is the median round, in
//! nanoseconds per operation per thread. The semaphore cannot be shared across processes;
//! the lease can, through a shared store.

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
fn timed<F, Fut>(threads: usize, op: F) -> f64
where
    F: Fn() -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = ()>,
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
                    for _ in 0..OPS {
                        op().await;
                    }
                });
                began.elapsed().as_nanos() as f64 / OPS as f64
            })
        })
        .collect();
    start.wait();
    let per_thread: Vec<f64> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    per_thread.iter().sum::<f64>() / threads as f64
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

    for threads in [1, 2] {
        let mut rows: [(&str, Vec<f64>, Vec<f64>); 2] = [
            ("limiter_acquire_release", Vec::new(), Vec::new()),
            ("store_acquire_release", Vec::new(), Vec::new()),
        ];
        for _ in 0..ROUNDS {
            let (limiter2, policy2) = (limiter.clone(), policy.clone());
            rows[0].1.push(timed(threads, move || {
                let (limiter, policy) = (limiter2.clone(), policy2.clone());
                async move {
                    let acquired = limiter.acquire(&policy, &[("queue", "mail")]).await;
                    let lease = acquired.unwrap().lease.expect("a free slot");
                    lease.release().await.unwrap();
                }
            }));
            let (store, policy, id2) = (store.clone(), policy.clone(), id.clone());
            rows[1].1.push(timed(threads, move || {
                let (store, policy, id) = (store.clone(), policy.clone(), id2.clone());
                async move {
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
                    };
                    store.release_now(&keys, lease);
                }
            }));
            for row in rows.iter_mut() {
                let semaphore = semaphore.clone();
                row.2.push(timed(threads, move || {
                    let semaphore = semaphore.clone();
                    async move {
                        let permit = semaphore.acquire().await.expect("open");
                        drop(permit);
                    }
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
