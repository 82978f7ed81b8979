//! The memory store's keys: identifiers as policies form them are held by length class
//! (up to 24, 32 and 40 bytes inline, longer on the heap). Whatever the class, two
//! identifiers share a counter exactly when they are equal, and the bound on identifiers
//! holds. Time is a manual clock.

use std::time::Duration;

use sluice_core::{Decision, Evaluation, Quota, Rate, Recording, Shape, Span, Unit};
use sluice_limiter::{Hit, Identifier, Limiter, ManualClock, MemoryStore, Policy, Store};

const START: u64 = 1_700_000_000_000_000_000;

fn one_per_minute() -> Quota {
    Quota::gcra(
        Rate::new(1, Span::new(1, Unit::Minute).unwrap()).unwrap(),
        None,
    )
    .unwrap()
}

fn decide(store: &MemoryStore, quotas: &[Quota], identifiers: &[&str]) -> Decision {
    let identifiers: Vec<Identifier> = identifiers.iter().map(|&i| Identifier::new(i)).collect();
    let shape = match identifiers.len() {
        1 => Shape::Leaf(0),
        n => Shape::Or((0..n).map(Shape::Leaf).collect()),
    };
    let hit = Hit {
        identifiers: &identifiers,
        evaluation: Evaluation {
            shape: &shape,
            quotas,
            cost: 1,
            recording: Recording::Admitted,
            penalty: None,
        },
        penalty_identifier: None,
    };
    store.decide_now(&hit)
}

fn store(clock: &ManualClock, max_identifiers: usize, shards: usize) -> MemoryStore {
    MemoryStore::builder()
        .clock(clock.clone())
        .max_identifiers(max_identifiers)
        .shards(shards)
        .build()
}

/// Identifiers of every length from 1 to 90 bytes, plus, at each length, one that differs
/// from the base only in its last byte: around and past each class's edge (24, 32, 40).
fn near_identifiers() -> Vec<String> {
    let base = "sluice:api:user:00001234:100/m~".repeat(3);
    let mut ids = Vec::new();
    for len in 1..=90 {
        let id = base[..len].to_owned();
        let mut other = id[..len - 1].to_owned();
        other.push(if id.ends_with('z') { 'y' } else { 'z' });
        ids.push(id);
        ids.push(other);
    }
    ids
}

#[test]
fn identifiers_that_differ_anywhere_never_share_a_counter() {
    let clock = ManualClock::new(START);
    // One shard: every identifier in the same tables.
    let store = store(&clock, 10_000, 1);
    let quota = [one_per_minute()];
    let ids = near_identifiers();
    for id in &ids {
        assert!(decide(&store, &quota, &[id]).allowed(), "{id:?} is fresh");
    }
    assert_eq!(store.stats().identifiers, ids.len());
    for id in &ids {
        assert!(!decide(&store, &quota, &[id]).allowed(), "{id:?} was spent");
    }
    assert_eq!(store.stats().identifiers, ids.len());
}

#[test]
fn identifiers_differing_only_after_byte_24_have_their_own_counters() {
    let clock = ManualClock::new(START);
    let store = store(&clock, 10_000, 4);
    let quota = [one_per_minute()];
    // 24 equal bytes, then different users, rates, or one byte more.
    let ids = [
        "sluice:api:user:00001234",
        "sluice:api:user:00001234:100/m",
        "sluice:api:user:00001234:100/h",
        "sluice:api:user:00001234:1000/m",
        "sluice:api:user:000012345:100/m",
        "sluice:api:user:000012346:100/m",
        "sluice:api:user:00001234:100/m~sliding_window",
        "sluice:api:user:00001234:100/m~sliding_windoW",
        "sluice:api:user:00001234#6b86b273ff34fce19d6b804eff5a3f57:100/m",
        "sluice:api:user:00001234#6b86b273ff34fce19d6b804eff5a3f58:100/m",
    ];
    for id in ids {
        assert!(id.len() >= 24);
        assert_eq!(id[..24], *ids[0]);
        assert!(decide(&store, &quota, &[id]).allowed(), "{id:?} is fresh");
        assert!(!decide(&store, &quota, &[id]).allowed(), "{id:?} was spent");
    }
    assert_eq!(store.stats().identifiers, ids.len());

    // Two leaves of one rule (the exclusive path) keep theirs apart too.
    let quotas = [one_per_minute(), one_per_minute()];
    let pair = [
        "sluice:api:user:00009999:100/m",
        "sluice:api:user:00009999:100/h",
    ];
    assert!(decide(&store, &quotas, &pair).allowed());
    assert!(!decide(&store, &quotas, &pair).allowed());
    let again = [
        "sluice:api:user:00009999:100/h",
        "sluice:api:user:00009999:100/mm",
    ];
    // One of the two is spent: `or` denies.
    assert!(!decide(&store, &quotas, &again).allowed());
    assert!(decide(&store, &quota, &[again[1]]).allowed());

    // Resetting a long identifier clears it and nothing else.
    let reset = [Identifier::new(ids[4])];
    tokio_block_on(store.reset(&reset)).unwrap();
    assert!(decide(&store, &quota, &[ids[4]]).allowed());
    assert!(!decide(&store, &quota, &[ids[5]]).allowed());
    assert!(!decide(&store, &quota, &[ids[8]]).allowed());
}

#[test]
fn a_limiter_with_real_policies_counts_each_user_apart() {
    let limiter = Limiter::builder(MemoryStore::new())
        .policy(Policy::new("api", "user:2/m").unwrap())
        .build()
        .unwrap();
    let users = [
        "00001234",
        "00001235",
        "a-much-longer-user-name-than-most",
        "x",
    ];
    for user in users {
        for expected in [true, true, false] {
            let checked = limiter
                .try_check_now("api", &[("user", user)], 1)
                .unwrap()
                .unwrap();
            assert_eq!(checked.decision.allowed(), expected, "{user}");
        }
    }
}

#[test]
fn a_flood_of_long_identifiers_never_exceeds_the_bound() {
    let clock = ManualClock::new(START);
    for shards in [1, 8] {
        let store = store(&clock, 2_000, shards);
        let quota = [Quota::gcra(
            Rate::new(10, Span::new(1, Unit::Second).unwrap()).unwrap(),
            None,
        )
        .unwrap()];
        let flood = 40_000;
        for i in 0..flood {
            // Every length class: 30, 37, 50 and 80 bytes.
            let id = match i % 4 {
                0 => format!("sluice:api:user:{i:08}:100/m"),
                1 => format!("sluice:api:user:{i:08}:1000000000/s"),
                2 => format!("sluice:api:user:{i:08}:100/m~sliding_window:pad"),
                _ => format!("sluice:api:apikey:#{i:032x}:100/m~sliding_window:padding:pa"),
            };
            assert!(decide(&store, &quota, &[&id]).allowed(), "{id}");
            let stats = store.stats();
            assert!(
                stats.identifiers <= stats.capacity,
                "{shards} shards, after {} inserts: {stats:?}",
                i + 1
            );
        }
        let stats = store.stats();
        assert!(stats.evictions > 0, "{stats:?}");
        assert_eq!(
            stats.identifiers as u64 + stats.evictions,
            flood as u64,
            "every identifier is held or was evicted, once: {stats:?}"
        );
        assert!(stats.identifiers >= stats.capacity * 3 / 4, "{stats:?}");
        // Time moves past every state's expiry: a sweep empties every class.
        clock.advance(Duration::from_secs(1));
        store.sweep();
        assert_eq!(store.stats().identifiers, 0);
    }
}

fn tokio_block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(future)
}
