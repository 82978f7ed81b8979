//! What the Limiter's tests on the memory store share: a limiter whose store (and near cache)
//! run on one manual clock, and the users they hit.

use std::time::Duration;

use sluice_limiter::{Limiter, ManualClock, MemoryStore, Policy, Selectors};

pub const SEC: u64 = 1_000_000_000;
pub const START: u64 = 1_000_000 * SEC;

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub fn policy(name: &str, rule: &str) -> Policy {
    Policy::new(name, rule).unwrap()
}

/// A limiter whose store (and near cache, if any) run on one manual clock.
pub fn limiter_on(
    policies: impl IntoIterator<Item = Policy>,
    near_cache: Option<Duration>,
) -> (Limiter, ManualClock) {
    let clock = ManualClock::new(START);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let mut builder = Limiter::builder(store)
        .clock(clock.clone())
        .policies(policies);
    if let Some(ttl) = near_cache {
        builder = builder.near_cache(10_000, ttl);
    }
    (builder.build().unwrap(), clock)
}

pub fn limiter(policies: impl IntoIterator<Item = Policy>) -> (Limiter, ManualClock) {
    limiter_on(policies, None)
}

pub const ALICE: &Selectors<'static> = &[("user", "alice")];
pub const BOB: &Selectors<'static> = &[("user", "bob")];
