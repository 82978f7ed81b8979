//! Reservations on the memory store: admitted on the estimate, settled at the actual cost.
//! 100 tasks on a multi-thread runtime reserve and settle random costs on a frozen manual
//! clock, so every unit charged is still counted at the end and the books can be checked.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sluice_limiter::{Limiter, ManualClock, MemoryStore, Policy};

const ALICE: &[(&str, &str)] = &[("user", "alice")];
const START: u64 = 1_700_000_000_000_000_000;
const LIMIT: u64 = 1_000;

/// xorshift64*: the test must not depend on an RNG crate.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

fn limiter(clock: &ManualClock, rule: &str) -> Arc<Limiter> {
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let built = Limiter::builder(store)
        .clock(clock.clone())
        .policy(Policy::new("tokens", rule).unwrap())
        .build();
    Arc::new(built.unwrap())
}

#[derive(Default)]
struct Books {
    actual: AtomicU64,
    excess: AtomicU64,
    admitted: AtomicU64,
}

/// Each task reserves a random estimate and settles a random actual cost (0 to 1.5x), until
/// it is denied once.
async fn race(limiter: Arc<Limiter>, books: Arc<Books>) {
    let tasks: Vec<_> = (0..100u64)
        .map(|task| {
            let (limiter, books) = (limiter.clone(), books.clone());
            tokio::spawn(async move {
                let mut rng = 0x9e37_79b9_7f4a_7c15 ^ (task + 1);
                loop {
                    let estimate = 10 + next(&mut rng) % 91;
                    let reserved = limiter.reserve("tokens", ALICE, estimate).await.unwrap();
                    let Some(reservation) = reserved.reservation else {
                        assert!(!reserved.checked.decision.allowed());
                        return;
                    };
                    tokio::task::yield_now().await;
                    let actual = next(&mut rng) % (estimate * 3 / 2 + 1);
                    reservation.settle(actual).await.unwrap();
                    books.actual.fetch_add(actual, Ordering::SeqCst);
                    books
                        .excess
                        .fetch_add(actual.saturating_sub(estimate), Ordering::SeqCst);
                    books.admitted.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

fn check_books(rule: &str) {
    let clock = ManualClock::new(START);
    let limiter = limiter(&clock, rule);
    let books = Arc::new(Books::default());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .unwrap();
    runtime.block_on(race(limiter.clone(), books.clone()));
    let actual = books.actual.load(Ordering::SeqCst);
    let excess = books.excess.load(Ordering::SeqCst);
    let admitted = books.admitted.load(Ordering::SeqCst);
    // The documented bound: the limit, plus the excess of settlements over estimates.
    assert!(
        actual <= LIMIT + excess,
        "{rule}: {actual} charged, {excess} excess"
    );
    // Refunds gave room back: more was admitted than the estimates alone allow (at most
    // 10 reservations of 100 fit), and the budget was used up to the last estimate.
    assert!(admitted > 10, "{rule}: only {admitted} admitted");
    assert!(
        actual + 100 >= LIMIT,
        "{rule}: only {actual} of {LIMIT} used"
    );
    // The store counted exactly what was settled: what remains is the limit less it.
    let peek = |cost| {
        let peeked = runtime.block_on(limiter.peek("tokens", ALICE, cost));
        peeked.unwrap().decision
    };
    assert_eq!(peek(0).remaining, LIMIT.saturating_sub(actual), "{rule}");
    let peek = peek(1);
    if actual >= LIMIT {
        assert!(
            !peek.allowed(),
            "{rule}: debt must delay the next admission"
        );
    }
}

#[test]
fn gcra_reservations_keep_the_books() {
    check_books("user:1000/h");
}

#[test]
fn fixed_window_reservations_keep_the_books() {
    check_books("user:1000/h algorithm=fixed-window");
}

#[test]
fn sliding_window_reservations_keep_the_books() {
    check_books("user:1000/h algorithm=sliding-window");
}

#[test]
fn sliding_log_reservations_keep_the_books() {
    check_books("user:1000/h algorithm=sliding-log");
}

#[test]
fn debt_delays_and_unsettled_reservations_keep_their_estimate() {
    let clock = ManualClock::new(START);
    let limiter = limiter(&clock, "user:10/m");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let r = limiter.reserve("tokens", ALICE, 4).await.unwrap();
        drop(r.reservation); // never settled: the 4 stay charged
        let r = limiter.reserve("tokens", ALICE, 4).await.unwrap();
        assert_eq!(r.checked.decision.remaining, 2);
        // Settled at 12: 8 more than reserved, past the limit; never refused.
        r.reservation.unwrap().settle(12).await.unwrap();
        let denied = limiter.reserve("tokens", ALICE, 1).await.unwrap();
        assert!(denied.reservation.is_none());
        // 16 units charged at 6 s each: a hit of 1 passes once 7 have drained, at 42 s.
        assert_eq!(
            denied.checked.decision.retry_after(),
            Some(Duration::from_secs(42))
        );
        clock.advance(Duration::from_secs(42));
        assert!(
            limiter
                .reserve("tokens", ALICE, 1)
                .await
                .unwrap()
                .reservation
                .is_some()
        );
    });
}
