//! sluice's in-memory store against governor's keyed limiter, on the same `String` keys.
//!
//! `cargo bench -p sluice-limiter --bench vs_governor` prints one line per scenario:
//! `scenario=keys_1000_threads_2 sluice_ns=41.2 governor_ns=55.0 ratio=0.749`.
//! `VS_GOVERNOR_KEYS=1,1000` limits the run to those key counts, without the memory lines.
//!
//! Each side decides one single-leaf GCRA hit per call and reads its own clock, as a caller
//! would see it (sluice: `SystemClock`; governor: its default clock). Per scenario, both are
//! warmed (every key inserted), then timed in alternating rounds of the same number of calls;
//! the median round is reported. `ns` is wall time over calls per thread, so under perfect
//! scaling the 2-thread figure equals the 1-thread one. `_deny` scenarios use a limit that
//! denies every timed call. The memory lines count the bytes each side holds for 1,000,000
//! keys, the key's own heap copy included: `memory_1m_keys` as bytes requested from the
//! allocator, `memory_1m_keys_rss` as resident memory grown in a fresh child process (what
//! the allocator's rounding and headers add).

use std::alloc::System;
use std::num::NonZeroU32;
use std::process::Command;
use std::sync::Barrier;
use std::time::Instant;

use governor::{DefaultKeyedRateLimiter, RateLimiter};
use sluice_core::{Evaluation, Quota, Rate, Recording, Shape, Span, Unit};
use sluice_limiter::{Hit, Identifier, MemoryStore};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Set in the child processes that measure resident memory: `sluice` or `governor`.
const RSS_CHILD: &str = "SLUICE_BENCH_RSS_CHILD";
const MEMORY_KEYS: usize = 1_000_000;
const ROUNDS: usize = 7;
/// Target wall time of one timed round.
const ROUND_NANOS: f64 = 120e6;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Limit {
    /// 1,000,000,000/s with a burst of as many: every call takes the full admit path.
    Admit,
    /// 1/min with a burst of 1: after the warm-up hit, every call is denied.
    Deny,
}

struct Sluice {
    store: MemoryStore,
    shape: Shape,
    quotas: [Quota; 1],
}

impl Sluice {
    fn new(limit: Limit) -> Sluice {
        let rate = match limit {
            Limit::Admit => Rate::new(1_000_000_000, Span::new(1, Unit::Second).unwrap()),
            Limit::Deny => Rate::new(1, Span::new(1, Unit::Minute).unwrap()),
        };
        Sluice {
            store: MemoryStore::builder().max_identifiers(2_000_000).build(),
            shape: Shape::Leaf(0),
            quotas: [Quota::gcra(rate.unwrap(), None).unwrap()],
        }
    }

    fn check(&self, identifier: &[Identifier; 1]) -> bool {
        let hit = Hit {
            identifiers: identifier,
            evaluation: Evaluation {
                shape: &self.shape,
                quotas: &self.quotas,
                cost: 1,
                recording: Recording::Admitted,
                penalty: None,
            },
            penalty_identifier: None,
        };
        self.store.decide_now(&hit).allowed()
    }
}

fn governor(limit: Limit) -> DefaultKeyedRateLimiter<String> {
    let quota = match limit {
        Limit::Admit => governor::Quota::per_second(NonZeroU32::new(1_000_000_000).unwrap()),
        Limit::Deny => governor::Quota::per_minute(NonZeroU32::MIN),
    };
    RateLimiter::keyed(quota)
}

/// Realistic identifiers of 20 bytes, one-element arrays so a `Hit` borrows them as they are,
/// beside the same text as governor's key.
fn make_keys(n: usize) -> Vec<([Identifier; 1], String)> {
    (0..n)
        .map(|i| {
            let key = format!("user:{i:015}");
            ([Identifier::new(key.clone())], key)
        })
        .collect()
}

/// A permutation of `0..n` (splitmix64 driving Fisher-Yates): both sides walk the keys in
/// this order, so neither gains from the order keys were inserted in.
fn shuffled(n: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    let mut seed = 0x5eed_u64;
    let mut next = || {
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for i in (1..n).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        order.swap(i, j);
    }
    order
}

/// `ops` calls on each of `threads` threads, thread `t` walking `order` from offset
/// `t * n / threads`. Returns wall nanoseconds per call per thread, and calls admitted.
fn round(
    threads: usize,
    ops: usize,
    order: &[u32],
    check: &(impl Fn(usize) -> bool + Sync),
) -> (f64, u64) {
    let walk = |start: usize| {
        let mut at = start;
        let mut admitted = 0u64;
        for _ in 0..ops {
            admitted += u64::from(check(order[at] as usize));
            at += 1;
            if at == order.len() {
                at = 0;
            }
        }
        admitted
    };
    let started = Instant::now();
    let admitted = if threads == 1 {
        walk(0)
    } else {
        let barrier = Barrier::new(threads);
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    let (walk, barrier) = (&walk, &barrier);
                    scope.spawn(move || {
                        barrier.wait();
                        walk(t * order.len() / threads)
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        })
    };
    (started.elapsed().as_nanos() as f64 / ops as f64, admitted)
}

/// One timed round, checked: every call took the expected path and none allocated.
fn timed_round(
    side: &str,
    threads: usize,
    ops: usize,
    order: &[u32],
    check: &(impl Fn(usize) -> bool + Sync),
    expected: u64,
) -> f64 {
    let region = Region::new(GLOBAL);
    let (ns, admitted) = round(threads, ops, order, check);
    // Spawning threads allocates; on one thread a call must not allocate at all.
    if threads == 1 {
        assert_eq!(
            region.change().allocations,
            0,
            "{side} allocated in a round"
        );
    }
    assert_eq!(
        admitted,
        expected,
        "{side} admitted {admitted} of {} calls",
        ops * threads
    );
    ns
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Times one (keys, limit) pair on 1 and 2 threads, printing one line per thread count.
fn scenarios(n: usize, limit: Limit) {
    let keys = make_keys(n);
    let order = shuffled(n);
    let sluice = Sluice::new(limit);
    let governor = governor(limit);
    for key in &keys {
        assert!(sluice.check(&key.0), "sluice admits a new key");
        assert!(
            governor.check_key(&key.1).is_ok(),
            "governor admits a new key"
        );
    }
    assert_eq!(sluice.store.stats().identifiers, n);
    assert_eq!(governor.len(), n);
    let sluice_check = |i: usize| sluice.check(&keys[i].0);
    let governor_check = |i: usize| governor.check_key(&keys[i].1).is_ok();

    for threads in [1, 2] {
        // Pilot rounds warm both sides and size the timed rounds.
        let pilot = 200_000;
        let (s, _) = round(threads, pilot, &order, &sluice_check);
        let (g, _) = round(threads, pilot, &order, &governor_check);
        let ops = (ROUND_NANOS / ((s + g) / 2.0)) as usize;
        let expected = match limit {
            Limit::Admit => (ops * threads) as u64,
            Limit::Deny => 0,
        };
        let (mut sluice_ns, mut governor_ns) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            sluice_ns.push(timed_round(
                "sluice",
                threads,
                ops,
                &order,
                &sluice_check,
                expected,
            ));
            governor_ns.push(timed_round(
                "governor",
                threads,
                ops,
                &order,
                &governor_check,
                expected,
            ));
        }
        let suffix = if limit == Limit::Deny { "_deny" } else { "" };
        print_line(
            &format!("keys_{n}_threads_{threads}{suffix}"),
            "ns",
            median(sluice_ns),
            median(governor_ns),
        );
    }
}

fn print_line(scenario: &str, unit: &str, sluice: f64, governor: f64) {
    println!(
        "scenario={scenario} sluice_{unit}={sluice:.1} governor_{unit}={governor:.1} ratio={:.3}",
        sluice / governor
    );
}

/// Net bytes requested from the allocator while `fill` runs.
fn bytes_held<T>(fill: impl FnOnce() -> T) -> (usize, T) {
    let region = Region::new(GLOBAL);
    let held = fill();
    let change = region.change();
    (change.bytes_allocated - change.bytes_deallocated, held)
}

fn fill_sluice(keys: &[([Identifier; 1], String)]) -> Sluice {
    let sluice = Sluice::new(Limit::Admit);
    for key in keys {
        assert!(sluice.check(&key.0));
    }
    assert_eq!(sluice.store.stats().identifiers, keys.len());
    sluice
}

fn fill_governor(keys: &[([Identifier; 1], String)]) -> DefaultKeyedRateLimiter<String> {
    let governor = governor(Limit::Admit);
    for key in keys {
        assert!(governor.check_key(&key.1).is_ok());
    }
    assert_eq!(governor.len(), keys.len());
    governor
}

fn memory() {
    let keys = make_keys(MEMORY_KEYS);
    let (sluice_bytes, sluice) = bytes_held(|| fill_sluice(&keys));
    drop(sluice);
    let (governor_bytes, governor) = bytes_held(|| fill_governor(&keys));
    drop(governor);
    let per_key = |bytes: usize| bytes as f64 / MEMORY_KEYS as f64;
    print_line(
        "memory_1m_keys",
        "bytes_per_key",
        per_key(sluice_bytes),
        per_key(governor_bytes),
    );

    let rss = |side: &str| -> f64 {
        let exe = std::env::current_exe().expect("the bench binary's path");
        let out = Command::new(exe)
            .env(RSS_CHILD, side)
            .output()
            .expect("child bench runs");
        assert!(
            out.status.success(),
            "{side} child failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let bytes: f64 = text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("child printed {text:?}"));
        bytes / MEMORY_KEYS as f64
    };
    print_line(
        "memory_1m_keys_rss",
        "bytes_per_key",
        rss("sluice"),
        rss("governor"),
    );
}

/// Resident bytes of this process, from /proc/self/status.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS line");
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// In a child process: resident memory grown by filling one side with the keys.
fn rss_child(side: &str) {
    let keys = make_keys(MEMORY_KEYS);
    let before = resident_bytes();
    let grown = match side {
        "sluice" => {
            let held = fill_sluice(&keys);
            let grown = resident_bytes() - before;
            drop(held);
            grown
        }
        "governor" => {
            let held = fill_governor(&keys);
            let grown = resident_bytes() - before;
            drop(held);
            grown
        }
        other => panic!("unknown side {other}"),
    };
    println!("{grown}");
}

fn main() {
    if let Ok(side) = std::env::var(RSS_CHILD) {
        rss_child(&side);
        return;
    }
    // `VS_GOVERNOR_KEYS=1,1000` runs only those key counts (and skips the memory lines).
    let only: Option<Vec<usize>> = std::env::var("VS_GOVERNOR_KEYS").ok().map(|list| {
        list.split(',')
            .map(|n| {
                n.trim()
                    .parse()
                    .expect("VS_GOVERNOR_KEYS: key counts, comma-separated")
            })
            .collect()
    });
    for limit in [Limit::Admit, Limit::Deny] {
        for n in [1, 1_000, 1_000_000] {
            if only.as_ref().is_none_or(|only| only.contains(&n)) {
                scenarios(n, limit);
            }
        }
    }
    if only.is_none() {
        memory();
    }
}
