//! Reservations on the memory store with a manual clock: debt delays the next admission by
//! exactly its cost. (The race of 100 tasks keeping the books runs in the conformance suite,
//! `reservations_keep_the_books`, on every store.)

use std::sync::Arc;
use std::time::Duration;

use sluice_limiter::{Limiter, ManualClock, MemoryStore, Policy};

const ALICE: &[(&str, &str)] = &[("user", "alice")];
const START: u64 = 1_700_000_000_000_000_000;

fn limiter(clock: &ManualClock, rule: &str) -> Arc<Limiter> {
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let built = Limiter::builder(store)
        .clock(clock.clone())
        .policy(Policy::new("tokens", rule).unwrap())
        .build();
    Arc::new(built.unwrap())
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
