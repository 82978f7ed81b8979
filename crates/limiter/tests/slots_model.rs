//! One key's lease set on the memory store, driven at random through every way there is to
//! it (`Slots` made and dropped, their leases and permits, acquires by name on a rule of one
//! leaf and on a compound rule, releases, drops, sweeps, resets, time) and checked step by
//! step against a model of the set: which acquires are admitted, and what each release
//! answers. Slots pin the set against sweeps; a reset drops it from under them; the model
//! says what each of those must and must not change.

use std::time::Duration;

use proptest::prelude::*;
use sluice_limiter::{Lease, Limiter, ManualClock, MemoryStore, Policy, Released, Slots};

const LIMIT: usize = 2;
const LEASE: u64 = 10_000_000_000;
const X: &[(&str, &str)] = &[("x", "a")];

#[derive(Debug, Clone)]
enum Op {
    MakeSlots,
    DropSlots(usize),
    /// Through slots `n` (modulo those alive), or by name when there are none.
    AcquireThroughSlots(usize),
    /// By name: the one-leaf policy, or (true) the compound one on the same key.
    AcquireByName(bool),
    /// A permit of slots `n`, taken and released at once.
    PermitRoundTrip(usize),
    Release(usize),
    Drop(usize),
    Sweep,
    Reset,
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => Just(Op::MakeSlots),
        1 => any::<usize>().prop_map(Op::DropSlots),
        3 => any::<usize>().prop_map(Op::AcquireThroughSlots),
        3 => any::<bool>().prop_map(Op::AcquireByName),
        2 => any::<usize>().prop_map(Op::PermitRoundTrip),
        3 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Drop),
        2 => Just(Op::Sweep),
        1 => Just(Op::Reset),
        2 => (0..2 * LEASE / 1_000_000).prop_map(Op::Advance),
    ]
}

/// The set as the store must hold it: each lease by its number, with its expiry.
#[derive(Default)]
struct Model {
    now: u64,
    held: Vec<(u64, u64)>,
}

impl Model {
    /// An acquire at `now`: drops the expired leases, then takes a slot if one is free.
    fn acquire(&mut self, lease: u64) -> bool {
        let now = self.now;
        self.held.retain(|&(_, at)| at > now);
        let admitted = self.held.len() < LIMIT;
        if admitted {
            self.held.push((lease, now + LEASE));
        }
        admitted
    }

    fn release(&mut self, lease: u64) -> Released {
        match self.held.iter().position(|&(held, _)| held == lease) {
            Some(at) => {
                let (_, expires_at) = self.held.swap_remove(at);
                if expires_at > self.now {
                    Released::Released
                } else {
                    Released::Expired
                }
            }
            None => Released::NotHeld,
        }
    }

    /// A sweep drops the set once every lease in it has expired, unless it is pinned.
    fn sweep(&mut self, pinned: bool) {
        if !pinned && self.held.iter().all(|&(_, at)| at <= self.now) {
            self.held.clear();
        }
    }
}

fn block_on<T>(future: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime")
        .block_on(future)
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let clock = ManualClock::new(1_000_000_000);
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let rule = format!("x:{LIMIT} concurrent lease=10s");
    let limiter = Limiter::builder(store.clone())
        .policy(Policy::new("one", &rule).unwrap().key("jobs"))
        .policy(
            Policy::new("two", &format!("{rule}; x:1000000/s"))
                .unwrap()
                .key("jobs"),
        )
        .build()
        .unwrap();
    let mut model = Model {
        now: 1_000_000_000,
        ..Model::default()
    };
    let mut slots: Vec<Slots> = Vec::new();
    // Each lease with its number in the model and whether it came through slots (it then
    // keeps their set pinned while it lives).
    let mut leases: Vec<(u64, Lease, bool)> = Vec::new();
    let mut next = 0_u64;
    for (step, op) in ops.into_iter().enumerate() {
        let pinned = !slots.is_empty() || leases.iter().any(|(_, _, through)| *through);
        match op {
            Op::MakeSlots => slots.push(limiter.slots("one", X).unwrap()),
            Op::DropSlots(n) if !slots.is_empty() => drop(slots.remove(n % slots.len())),
            Op::DropSlots(_) => {}
            Op::AcquireThroughSlots(_) if slots.is_empty() => {}
            Op::AcquireThroughSlots(_) | Op::AcquireByName(_) => {
                next += 1;
                let expected = model.acquire(next);
                let (acquired, through) = match op {
                    Op::AcquireThroughSlots(n) => {
                        (block_on(slots[n % slots.len()].acquire()).unwrap(), true)
                    }
                    Op::AcquireByName(compound) => {
                        let policy = if compound { "two" } else { "one" };
                        (block_on(limiter.acquire(policy, X)).unwrap(), false)
                    }
                    _ => unreachable!(),
                };
                prop_assert_eq!(
                    acquired.lease.is_some(),
                    expected,
                    "step {}: {:?}",
                    step,
                    op
                );
                if let Some(lease) = acquired.lease {
                    leases.push((next, lease, through));
                }
            }
            Op::PermitRoundTrip(n) if !slots.is_empty() => {
                next += 1;
                let expected = model.acquire(next);
                let permit = block_on(slots[n % slots.len()].permit()).unwrap();
                prop_assert_eq!(permit.is_ok(), expected, "step {}: {:?}", step, op);
                if let Ok(permit) = permit {
                    let answer = block_on(permit.release()).unwrap();
                    prop_assert_eq!(answer, model.release(next), "step {}", step);
                }
            }
            Op::PermitRoundTrip(_) => {}
            Op::Release(n) if !leases.is_empty() => {
                let (number, lease, _) = leases.swap_remove(n % leases.len());
                let answer = block_on(lease.release()).unwrap();
                prop_assert_eq!(answer, model.release(number), "step {}: {:?}", step, op);
            }
            Op::Drop(n) if !leases.is_empty() => {
                let (number, lease, _) = leases.swap_remove(n % leases.len());
                drop(lease);
                model.release(number);
            }
            Op::Release(_) | Op::Drop(_) => {}
            Op::Sweep => {
                store.sweep();
                model.sweep(pinned);
            }
            Op::Reset => {
                block_on(limiter.reset("one", X)).unwrap();
                model.held.clear();
            }
            Op::Advance(ms) => {
                clock.advance(Duration::from_millis(ms));
                model.now += ms * 1_000_000;
            }
        }
    }
    // Whatever is held at the end is what the model holds: every slot it says is free is.
    next += 1;
    let free = block_on(limiter.acquire("one", X)).unwrap();
    prop_assert_eq!(free.lease.is_some(), model.acquire(next));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_way_to_a_keys_lease_set_agrees_with_the_model(ops in prop::collection::vec(op(), 1..60)) {
        run(ops)?;
    }
}
