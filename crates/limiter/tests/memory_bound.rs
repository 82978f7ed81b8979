//! The memory store's bound on identifiers: it holds, expired state goes first, then the
//! state that expires soonest, and `sweep` drops what has expired. Time is a manual clock.

use std::time::Duration;

use sluice_core::{Decision, Evaluation, Quota, Rate, Recording, Shape, Span, Unit};
use sluice_limiter::{Hit, Identifier, ManualClock, MemoryStore};

const START: u64 = 1_700_000_000_000_000_000;
const SHAPE: Shape = Shape::Leaf(0);

fn gcra(count: u64, unit: Unit, burst: Option<u64>) -> Quota {
    Quota::gcra(
        Rate::new(count, Span::new(1, unit).unwrap()).unwrap(),
        burst,
    )
    .unwrap()
}

fn decide(store: &MemoryStore, quota: Quota, identifier: &str, recording: Recording) -> Decision {
    let identifiers = [Identifier::new(identifier)];
    let quotas = [quota];
    let hit = Hit {
        identifiers: &identifiers,
        evaluation: Evaluation {
            shape: &SHAPE,
            quotas: &quotas,
            cost: 1,
            recording,
            penalty: None,
        },
        penalty_identifier: None,
    };
    store.decide_now(&hit)
}

/// An ordinary check: records the hit if admitted.
fn hit(store: &MemoryStore, quota: Quota, identifier: &str) -> Decision {
    decide(store, quota, identifier, Recording::Admitted)
}

/// Looks without recording (and so without inserting anything).
fn peek(store: &MemoryStore, quota: Quota, identifier: &str) -> Decision {
    decide(store, quota, identifier, Recording::Never)
}

fn store(clock: &ManualClock, max_identifiers: usize, shards: usize) -> MemoryStore {
    MemoryStore::builder()
        .clock(clock.clone())
        .max_identifiers(max_identifiers)
        .shards(shards)
        .build()
}

#[test]
fn a_flood_of_new_identifiers_never_exceeds_the_bound() {
    // One shard makes the store's bound the shard's: an overshoot of one shows.
    for shards in [1, 16] {
        flood(shards);
    }
}

fn flood(shards: usize) {
    let clock = ManualClock::new(START);
    let store = store(&clock, 10_000, shards);
    let quota = gcra(10, Unit::Second, None);
    let capacity = store.stats().capacity;
    assert!(
        capacity <= 10_000,
        "capacity {capacity} is above the bound asked for"
    );
    assert!(
        capacity >= 9_000,
        "capacity {capacity} wastes the bound asked for"
    );

    let flood = 200_000;
    for i in 0..flood {
        assert!(hit(&store, quota, &format!("flood:{i}")).allowed());
        let stats = store.stats();
        assert!(
            stats.identifiers <= stats.capacity,
            "{shards} shards, after {} inserts: {stats:?}",
            i + 1
        );
    }
    let stats = store.stats();
    assert!(stats.evictions > 0, "{stats:?}");
    assert_eq!(stats.expired, 0, "the clock never moved: {stats:?}");
    // Every identifier is either still held or was evicted, once.
    assert_eq!(
        stats.identifiers as u64 + stats.evictions,
        flood as u64,
        "{stats:?}"
    );
    // Evicting an eighth of a full shard at a time keeps the store mostly full.
    assert!(stats.identifiers >= capacity * 3 / 4, "{stats:?}");
}

#[test]
fn a_full_store_drops_expired_state_before_evicting_live_state() {
    let clock = ManualClock::new(START);
    let store = store(&clock, 1_000, 1);
    let long = gcra(1, Unit::Hour, None);
    let short = gcra(1, Unit::Second, None);
    for i in 0..500 {
        assert!(hit(&store, long, &format!("long:{i}")).allowed());
        assert!(hit(&store, short, &format!("short:{i}")).allowed());
    }
    let stats = store.stats();
    assert_eq!(
        (stats.identifiers, stats.capacity),
        (1_000, 1_000),
        "{stats:?}"
    );
    assert_eq!((stats.evictions, stats.expired), (0, 0), "{stats:?}");

    clock.advance(Duration::from_secs(2));
    assert!(hit(&store, long, "newcomer").allowed());

    let stats = store.stats();
    assert_eq!(stats.expired, 500, "{stats:?}");
    assert_eq!(stats.evictions, 0, "{stats:?}");
    assert_eq!(stats.identifiers, 501, "{stats:?}");
    for i in 0..500 {
        // Still limited: the hour-long state survived (a fresh one would admit).
        assert!(
            !peek(&store, long, &format!("long:{i}")).allowed(),
            "long:{i} was dropped"
        );
    }
}

#[test]
fn eviction_takes_the_identifiers_whose_state_expires_soonest() {
    let clock = ManualClock::new(START);
    let store = store(&clock, 1_000, 1);
    // 100 per minute, burst 100: one hit adds 0.6 s of debt.
    let quota = gcra(100, Unit::Minute, None);
    for i in 0..100 {
        for _ in 0..50 {
            assert!(hit(&store, quota, &format!("heavy:{i}")).allowed());
        }
    }
    for i in 0..900 {
        assert!(hit(&store, quota, &format!("light:{i}")).allowed());
    }
    assert_eq!(store.stats().identifiers, 1_000);

    // A flood of one-hit identifiers, with time moving but never past any state's expiry.
    for i in 0..5_000 {
        if i % 1_000 == 0 {
            clock.advance(Duration::from_millis(100));
        }
        assert!(hit(&store, quota, &format!("flood:{i}")).allowed());
    }
    let stats = store.stats();
    assert!(stats.evictions >= 5_000, "{stats:?}");
    assert_eq!(stats.expired, 0, "{stats:?}");
    assert!(stats.identifiers <= stats.capacity, "{stats:?}");

    // The heavy identifiers kept their debt: 50 of 100 spent, minus what 0.5 s gave back
    // (0 whole tokens), so 49 left after this hit. A fresh state would leave 99.
    for i in 0..100 {
        let decision = peek(&store, quota, &format!("heavy:{i}"));
        assert!(decision.allowed());
        assert_eq!(decision.remaining, 49, "heavy:{i} was evicted");
    }
    // The original one-hit identifiers were the idlest and went first.
    let light_left = (0..900)
        .filter(|i| peek(&store, quota, &format!("light:{i}")).remaining < 99)
        .count();
    assert_eq!(
        light_left, 0,
        "{light_left} light identifiers outlived newer ones"
    );
}

#[test]
fn sweep_drops_expired_state_and_nothing_else() {
    let clock = ManualClock::new(START);
    let store = store(&clock, 10_000, 8);
    let long = gcra(1, Unit::Hour, None);
    let short = gcra(1, Unit::Second, None);
    for i in 0..300 {
        assert!(hit(&store, short, &format!("short:{i}")).allowed());
    }
    for i in 0..200 {
        assert!(hit(&store, long, &format!("long:{i}")).allowed());
    }

    // Before anything expires, a sweep drops nothing.
    store.sweep();
    let stats = store.stats();
    assert_eq!((stats.identifiers, stats.expired), (500, 0), "{stats:?}");

    clock.advance(Duration::from_secs(2));
    store.sweep();
    let stats = store.stats();
    assert_eq!(stats.identifiers, 200, "{stats:?}");
    assert_eq!(stats.expired, 300, "{stats:?}");
    assert_eq!(stats.evictions, 0, "{stats:?}");
    for i in 0..200 {
        assert!(
            !peek(&store, long, &format!("long:{i}")).allowed(),
            "long:{i} was dropped"
        );
    }
}
