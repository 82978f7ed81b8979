//! The memory store's documented size: 1,000,000 GCRA identifiers of up to 24 bytes take at
//! most 76 bytes each (see `src/memory/table.rs` for the arithmetic), counted by an
//! allocator that sees every byte the store asks for. Its own binary, because the counting
//! allocator is process-wide.

use std::alloc::System;

use sluice_core::{Evaluation, Quota, Rate, Recording, Shape, Span, Unit};
use sluice_limiter::{Hit, Identifier, ManualClock, MemoryStore};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const IDENTIFIERS: usize = 1_000_000;
/// The documented bound for identifiers held inline (up to 24 bytes).
const MAX_BYTES_PER_IDENTIFIER: f64 = 76.0;

#[test]
fn a_million_short_identifiers_fit_in_the_documented_bytes() {
    let identifiers: Vec<[Identifier; 1]> = (0..IDENTIFIERS)
        .map(|i| [Identifier::new(format!("api:user:{i:07}:10/s"))])
        .collect();
    assert!(identifiers.iter().all(|[id]| id.len() <= 24));
    let quotas = [Quota::gcra(
        Rate::new(10, Span::new(1, Unit::Second).unwrap()).unwrap(),
        None,
    )
    .unwrap()];
    let shape = Shape::Leaf(0);
    let hit = |identifier| Hit {
        identifiers: identifier,
        evaluation: Evaluation {
            shape: &shape,
            quotas: &quotas,
            cost: 1,
            recording: Recording::Admitted,
            penalty: None,
        },
        penalty_identifier: None,
    };
    // A thread's first hit on any store registers the thread with the shards' locks, once
    // per thread and for the thread's life: not the store's memory, so done before counting.
    assert!(
        MemoryStore::new()
            .decide_now(&hit(&identifiers[0]))
            .allowed()
    );

    let region = Region::new(GLOBAL);
    let store = MemoryStore::builder()
        .clock(ManualClock::new(1_700_000_000_000_000_000))
        .max_identifiers(2 * IDENTIFIERS)
        .build();
    for identifier in &identifiers {
        assert!(store.decide_now(&hit(identifier)).allowed());
    }
    let change = region.change();
    assert_eq!(store.stats().identifiers, IDENTIFIERS);

    let per_identifier =
        (change.bytes_allocated - change.bytes_deallocated) as f64 / IDENTIFIERS as f64;
    assert!(
        per_identifier <= MAX_BYTES_PER_IDENTIFIER,
        "{per_identifier:.1} bytes per identifier, documented at most {MAX_BYTES_PER_IDENTIFIER}"
    );
    // Held, not leaked: dropping the store gives every byte back.
    let before_drop = GLOBAL.stats().bytes_allocated - GLOBAL.stats().bytes_deallocated;
    drop(store);
    let after_drop = GLOBAL.stats().bytes_allocated - GLOBAL.stats().bytes_deallocated;
    assert!(
        before_drop - after_drop >= (per_identifier * IDENTIFIERS as f64) as usize,
        "dropping the store returned {} bytes",
        before_drop - after_drop
    );
}
