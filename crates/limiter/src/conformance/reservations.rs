//! Reservations: admitted on an estimate, settled at the actual cost, on every algorithm, by
//! 100 racing tasks over two limiters (two app servers). The books must balance: what the
//! store has left is the limit less what was settled, and what was settled stays within the
//! limit plus the debts (the documented bound of [`sluice_core::algorithm::settle`]).
//!
//! Time is real, so the rates are a day long (a GCRA bucket of 1,000 drains one unit every
//! 86.4 s) and fixed windows ten years; the drift a slow run may see is measured and allowed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use sluice_core::Algorithm;

use super::StoreFactory;
use super::harness::{ALICE, Namespace, limiter, peek};
use crate::Limiter;

const LIMIT: u64 = 1_000;
const TASKS: u64 = 100;

/// xorshift64*: the case must not depend on an RNG crate.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

#[derive(Default)]
struct Books {
    actual: AtomicU64,
    excess: AtomicU64,
    admitted: AtomicU64,
}

/// Each task reserves a random estimate (10 to 100) and settles a random actual cost (0 to
/// 1.5 times it) until it is denied once, alternating between the two servers.
async fn race(servers: [Arc<Limiter>; 2], books: Arc<Books>) {
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let (servers, books) = (servers.clone(), books.clone());
            tokio::spawn(async move {
                let mut rng = 0x9e37_79b9_7f4a_7c15 ^ (task + 1);
                for round in 0.. {
                    let limiter = &servers[(task + round) as usize % 2];
                    let estimate = 10 + next(&mut rng) % 91;
                    let reserved = limiter.reserve("tokens", ALICE, estimate).await;
                    let reserved = reserved.unwrap_or_else(|e| panic!("reserve: {e}"));
                    let Some(reservation) = reserved.reservation else {
                        assert!(
                            !reserved.checked.decision.allowed(),
                            "admitted, no reservation"
                        );
                        return;
                    };
                    tokio::task::yield_now().await;
                    let actual = next(&mut rng) % (estimate * 3 / 2 + 1);
                    reservation
                        .settle(actual)
                        .await
                        .unwrap_or_else(|e| panic!("settle: {e}"));
                    books.actual.fetch_add(actual, Ordering::SeqCst);
                    let excess = actual.saturating_sub(estimate);
                    books.excess.fetch_add(excess, Ordering::SeqCst);
                    books.admitted.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a reserving task panicked");
    }
}

/// The books of 100 racing reservations balance on every algorithm.
pub async fn reservations_keep_the_books<F: StoreFactory>(factory: &F) {
    for algorithm in [
        Algorithm::Gcra,
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow,
        Algorithm::SlidingLog,
    ] {
        let span = match algorithm {
            Algorithm::FixedWindow => "10y",
            _ => "d",
        };
        let rule = format!("user:{LIMIT}/{span} algorithm={}", algorithm.name());
        let ns = Namespace::new("reservations");
        let policies = || [ns.policy("tokens", &rule)];
        let servers = [limiter(factory, policies()), limiter(factory, policies())];
        let books = Arc::new(Books::default());
        let started = Instant::now();
        race(servers.clone(), books.clone()).await;
        // A store without transactions (memcached: `incr`, then `decr` when the total says
        // no) may refuse a racing hit that would fit, and each task stops at its first
        // refusal. Once the race is over nothing is in flight: reservations one at a time
        // take what is left, and the books below must still balance.
        loop {
            let reserved = servers[0].reserve("tokens", ALICE, 10).await;
            let reserved = reserved.unwrap_or_else(|e| panic!("reserve: {e}"));
            let Some(reservation) = reserved.reservation else {
                break;
            };
            reservation
                .settle(10)
                .await
                .unwrap_or_else(|e| panic!("settle: {e}"));
            books.actual.fetch_add(10, Ordering::SeqCst);
            books.admitted.fetch_add(1, Ordering::SeqCst);
        }
        let actual = books.actual.load(Ordering::SeqCst);
        let excess = books.excess.load(Ordering::SeqCst);
        let admitted = books.admitted.load(Ordering::SeqCst);
        let left = peek(&servers[1], "tokens", ALICE, 0)
            .await
            .decision
            .remaining;
        // Units a day-long rate may have given back meanwhile (at most 1,000 a day, spread
        // over sub-windows a tenth of it long), with one to spare.
        let drift = (LIMIT as f64 * started.elapsed().as_secs_f64() / 8_640.0).ceil() as u64 + 1;
        assert!(
            actual <= LIMIT + excess + drift,
            "{rule}: {actual} charged, {excess} excess"
        );
        // Refunds gave room back: more was admitted than the estimates alone allow (at most
        // 100 of the smallest fit), and the budget was used up to the last 10.
        assert!(admitted > 10, "{rule}: only {admitted} admitted");
        assert!(
            actual + 10 >= LIMIT,
            "{rule}: only {actual} of {LIMIT} used"
        );
        // The store counted exactly what was settled: what remains is the limit less it.
        let expected = LIMIT.saturating_sub(actual);
        assert!(
            left >= expected && left <= expected + drift,
            "{rule}: {left} left after {actual} settled (drift allowed {drift})"
        );
        if actual >= LIMIT + drift {
            let next = peek(&servers[0], "tokens", ALICE, 1).await.decision;
            assert!(
                !next.allowed(),
                "{rule}: debt must delay the next admission"
            );
        }
    }
}
