//! sluice's in-memory store, and a `Limiter` over it, against governor's keyed limiter, on
//! identifiers as real policies form them.
//!
//! `cargo bench -p sluice-limiter --bench vs_governor` prints one line per scenario:
//! `scenario=store_keys_1000_threads_2 sluice_ns=41.2 governor_ns=55.0 ratio=0.749`.
//! `VS_GOVERNOR_KEYS=1,1000` limits the run to those key counts, without the memory lines.
//!
//! The identifiers are what a policy `user:100/m` in the default namespace names for a user
//! id of eight digits: `sluice:api:user:00001234:100/m`, 30 bytes. `store_` scenarios hand
//! them to the memory store directly; `limiter_` scenarios call `Limiter::try_check_now`
//! with a policy handle and the selector `("user", "00001234")`, so the limiter writes the
//! identifier on every call (`decision_` scenarios likewise through
//! `Limiter::try_check_decision_now`, which answers without a clone of the handle) (`sluice:api:user:00001234:1000000000/s`, 37 bytes, when
//! admitting; `...:1/m`, 27, when denying). governor's key is a `String` of the same
//! identifier, so both sides hash and compare the same bytes.
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
//!
//! Instructions, where a time is noise: `VS_GOVERNOR_CALLGRIND=store,1000,admit,100000` runs
//! that one scenario on one thread, warmed, then that many calls in `callgrind_sluice` and
//! in `callgrind_governor`; under
//! `valgrind --tool=callgrind --toggle-collect='vs_governor::callgrind_*'` the inclusive
//! count of each function over the calls is the side's instructions per call.

use std::alloc::System;
use std::num::NonZeroU32;
use std::process::Command;
use std::sync::Barrier;
use std::time::Instant;

use governor::{DefaultKeyedRateLimiter, RateLimiter};
use sluice_core::{Evaluation, Quota, Rate, Recording, Shape, Span, Unit};
use sluice_limiter::{Hit, Identifier, Limiter, MemoryStore, Policy, PolicyRef};
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

impl Limit {
    fn rule(self) -> &'static str {
        match self {
            Limit::Admit => "user:1000000000/s",
            Limit::Deny => "user:1/m",
        }
    }
}

/// How sluice is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Path {
    /// `MemoryStore::decide_now` on a prebuilt identifier.
    Store,
    /// `Limiter::try_check_now` on a policy handle and the selector value.
    Limiter,
    /// `Limiter::try_check_decision_now`, the same check answering the decision alone
    /// (no handle cloned into the answer).
    Decision,
}

impl Path {
    fn name(self) -> &'static str {
        match self {
            Path::Store => "store",
            Path::Limiter => "limiter",
            Path::Decision => "decision",
        }
    }
}

/// The keys of one scenario: the selector values, the identifiers the store is given (one-
/// element arrays, so a `Hit` borrows them as they are), and governor's keys (the text of
/// the identifier sluice decides on).
struct Keys {
    values: Vec<String>,
    identifiers: Vec<[Identifier; 1]>,
    governor: Vec<String>,
}

/// A user id of eight digits.
fn user_id(i: usize) -> String {
    format!("{i:08}")
}

fn make_keys(n: usize, path: Path, limit: Limit) -> Keys {
    let values: Vec<String> = (0..n).map(user_id).collect();
    let identifiers: Vec<[Identifier; 1]> = values
        .iter()
        .map(|v| {
            let name = match path {
                Path::Store => format!("sluice:api:user:{v}:100/m"),
                Path::Limiter | Path::Decision => format!(
                    "sluice:api:{}",
                    limit.rule().replacen(':', &format!(":{v}:"), 1)
                ),
            };
            [Identifier::new(name)]
        })
        .collect();
    let governor = identifiers
        .iter()
        .map(|[id]| id.as_str().to_owned())
        .collect();
    Keys {
        values,
        identifiers,
        governor,
    }
}

struct Sluice {
    store: MemoryStore,
    shape: Shape,
    quotas: [Quota; 1],
    limiter: Limiter,
    policy: PolicyRef,
}

impl Sluice {
    fn new(limit: Limit) -> Sluice {
        let rate = match limit {
            Limit::Admit => Rate::new(1_000_000_000, Span::new(1, Unit::Second).unwrap()),
            Limit::Deny => Rate::new(1, Span::new(1, Unit::Minute).unwrap()),
        };
        let store = MemoryStore::builder().max_identifiers(2_000_000).build();
        // The limiter decides on the same store, under its own identifiers.
        let limiter = Limiter::builder(store.clone())
            .policy(Policy::new("api", limit.rule()).unwrap())
            .build()
            .unwrap();
        let policy = limiter.policy("api").unwrap();
        Sluice {
            store,
            shape: Shape::Leaf(0),
            quotas: [Quota::gcra(rate.unwrap(), None).unwrap()],
            limiter,
            policy,
        }
    }

    fn check(&self, path: Path, keys: &Keys, i: usize) -> bool {
        match path {
            Path::Store => self.check_store(&keys.identifiers[i]),
            Path::Limiter => self
                .limiter
                .try_check_now(&self.policy, &[("user", &keys.values[i])], 1)
                .expect("the memory store decides now")
                .expect("the policy's selector is given")
                .decision
                .allowed(),
            Path::Decision => self
                .limiter
                .try_check_decision_now(&self.policy, &[("user", &keys.values[i])], 1)
                .expect("the memory store decides now")
                .expect("the policy's selector is given")
                .decision
                .allowed(),
        }
    }

    fn check_store(&self, identifier: &[Identifier; 1]) -> bool {
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

/// Times one (path, keys, limit) triple on 1 and 2 threads, printing one line per thread
/// count.
fn scenarios(path: Path, n: usize, limit: Limit) {
    let keys = make_keys(n, path, limit);
    let order = shuffled(n);
    let (sluice, governor) = warmed(path, &keys, limit);
    let sluice_check = |i: usize| sluice.check(path, &keys, i);
    let governor_check = |i: usize| governor.check_key(&keys.governor[i]).is_ok();

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
            &format!("{}_keys_{n}_threads_{threads}{suffix}", path.name()),
            "ns",
            median(sluice_ns),
            median(governor_ns),
        );
    }
}

/// Both sides with every key inserted; checks that the store holds the identifiers the
/// scenario names (the limiter's included).
fn warmed(path: Path, keys: &Keys, limit: Limit) -> (Sluice, DefaultKeyedRateLimiter<String>) {
    let n = keys.values.len();
    let sluice = Sluice::new(limit);
    let governor = governor(limit);
    for i in 0..n {
        assert!(sluice.check(path, keys, i), "sluice admits a new key");
        assert!(
            governor.check_key(&keys.governor[i]).is_ok(),
            "governor admits a new key"
        );
    }
    assert_eq!(sluice.store.stats().identifiers, n);
    // The limiter named the identifiers governor is keyed on: one more hit on the first,
    // through the store, finds it.
    sluice.check_store(&keys.identifiers[0]);
    assert_eq!(
        sluice.store.stats().identifiers,
        n,
        "{:?}",
        keys.governor[0]
    );
    assert_eq!(governor.len(), n);
    (sluice, governor)
}

/// `calls` hits on one side, walking the keys in order: what callgrind counts.
#[inline(never)]
fn callgrind_sluice(sluice: &Sluice, path: Path, keys: &Keys, order: &[u32], calls: usize) -> u64 {
    (0..calls)
        .map(|c| u64::from(sluice.check(path, keys, order[c % order.len()] as usize)))
        .sum()
}

#[inline(never)]
fn callgrind_governor(
    governor: &DefaultKeyedRateLimiter<String>,
    keys: &Keys,
    order: &[u32],
    calls: usize,
) -> u64 {
    (0..calls)
        .map(|c| {
            u64::from(
                governor
                    .check_key(&keys.governor[order[c % order.len()] as usize])
                    .is_ok(),
            )
        })
        .sum()
}

/// `path,keys,admit|deny,calls`: one scenario on one thread, for callgrind.
fn callgrind(spec: &str) {
    let parts: Vec<&str> = spec.split(',').collect();
    let [path, n, limit, calls] = parts[..] else {
        panic!("VS_GOVERNOR_CALLGRIND: path,keys,admit|deny,calls (got {spec:?})");
    };
    let path = match path {
        "store" => Path::Store,
        "limiter" => Path::Limiter,
        "decision" => Path::Decision,
        other => {
            panic!("VS_GOVERNOR_CALLGRIND: path `store`, `limiter` or `decision`, not {other:?}")
        }
    };
    let limit = match limit {
        "admit" => Limit::Admit,
        "deny" => Limit::Deny,
        other => panic!("VS_GOVERNOR_CALLGRIND: limit `admit` or `deny`, not {other:?}"),
    };
    let n: usize = n.parse().expect("VS_GOVERNOR_CALLGRIND: a key count");
    let calls: usize = calls.parse().expect("VS_GOVERNOR_CALLGRIND: a call count");
    let keys = make_keys(n, path, limit);
    let order = shuffled(n);
    let (sluice, governor) = warmed(path, &keys, limit);
    let expected = match limit {
        Limit::Admit => calls as u64,
        Limit::Deny => 0,
    };
    assert_eq!(
        callgrind_sluice(&sluice, path, &keys, &order, calls),
        expected
    );
    assert_eq!(
        callgrind_governor(&governor, &keys, &order, calls),
        expected
    );
    println!("callgrind: {calls} calls per side on {n} keys");
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

fn fill_sluice(keys: &Keys) -> Sluice {
    let sluice = Sluice::new(Limit::Admit);
    for identifier in &keys.identifiers {
        assert!(sluice.check_store(identifier));
    }
    assert_eq!(sluice.store.stats().identifiers, keys.identifiers.len());
    sluice
}

fn fill_governor(keys: &Keys) -> DefaultKeyedRateLimiter<String> {
    let governor = governor(Limit::Admit);
    for key in &keys.governor {
        assert!(governor.check_key(key).is_ok());
    }
    assert_eq!(governor.len(), keys.governor.len());
    governor
}

fn memory() {
    let keys = make_keys(MEMORY_KEYS, Path::Store, Limit::Admit);
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
    let keys = make_keys(MEMORY_KEYS, Path::Store, Limit::Admit);
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
    if let Ok(spec) = std::env::var("VS_GOVERNOR_CALLGRIND") {
        callgrind(&spec);
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
    for path in [Path::Store, Path::Limiter, Path::Decision] {
        for limit in [Limit::Admit, Limit::Deny] {
            for n in [1, 1_000, 1_000_000] {
                if only.as_ref().is_none_or(|only| only.contains(&n)) {
                    scenarios(path, n, limit);
                }
            }
        }
    }
    if only.is_none() {
        memory();
    }
}
