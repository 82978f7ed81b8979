//! The memory store under threads that really run at once: every algorithm's one-leaf rule
//! (GCRA's atomic words, the other algorithms' cells under the shard's shared lock and
//! their own) and a compound rule on the same identifiers (the shards' exclusive locks)
//! admit exactly the limit, never one more.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_limiter::{Limiter, MemoryStore, Policy};

const THREADS: usize = 4;
const HITS_PER_THREAD: u64 = 3_000;
const LIMIT: u64 = 2_000;

/// `THREADS` threads hit `policies` in turn on one identifier, as fast as they can; returns
/// how many hits were admitted.
fn admitted(limiter: &Arc<Limiter>, policies: &'static [&'static str]) -> u64 {
    let admitted = Arc::new(AtomicU64::new(0));
    let start = Arc::new(std::sync::Barrier::new(THREADS));
    let threads: Vec<_> = (0..THREADS)
        .map(|thread| {
            let (limiter, admitted, start) = (limiter.clone(), admitted.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for i in 0..HITS_PER_THREAD as usize {
                    let policy = policies[(thread + i) % policies.len()];
                    let checked = limiter
                        .try_check_now(policy, &[("user", "alice")], 1)
                        .expect("the memory store decides at once")
                        .expect("a decision");
                    if checked.decision.allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    admitted.load(Ordering::Relaxed)
}

#[test]
fn every_algorithm_admits_exactly_its_limit_across_threads() {
    for algorithm in ["gcra", "fixed-window", "sliding-window", "sliding-log"] {
        // A day-long limit: no hit of the test's few milliseconds is freed by time (the
        // sliding window's weighting of the previous sub-window included).
        let one = format!("user:{LIMIT}/d algorithm={algorithm}");
        // The same counter (same identifier) through a compound rule: the general path.
        let two = format!("{one}; user:{}/d algorithm={algorithm}", LIMIT * 100);
        let fresh = || {
            Arc::new(
                Limiter::builder(MemoryStore::new())
                    .policy(Policy::new("one", &one).unwrap().key("api"))
                    .policy(Policy::new("two", &two).unwrap().key("api"))
                    .build()
                    .unwrap(),
            )
        };
        // One-leaf hits only, then one-leaf and compound hits mixed, each on a fresh store.
        assert_eq!(
            admitted(&fresh(), &["one"]),
            LIMIT,
            "{algorithm}: one-leaf hits"
        );
        assert_eq!(
            admitted(&fresh(), &["one", "two"]),
            LIMIT,
            "{algorithm}: one-leaf and compound hits on one counter"
        );
    }
}
