//! Shared test vectors for concurrency leaves: sequences of acquire, release and renew on one
//! lease set, each step with the outcome the core computes. `concurrency_vectors.json` is
//! generated here from a fixed seed; a store that keeps leases (Redis, memcached, ...) replays
//! the same steps and must give the same answers.
//!
//! Kept apart from `vectors.json` (whose cases every rate store replays through
//! `evaluate`): leases are changed by their own operations, not by a hit's evaluation.
//!
//! Regenerate (after a deliberate change to the core's semantics) with
//! `SLUICE_REGENERATE_VECTORS=1 cargo test -p sluice-core --test concurrency_vectors`.
//!
//! Format: a list of cases `{"limit", "lease_us", "steps": [...]}`; times are microsecond
//! ticks near a real epoch. A step is `{"op": "acquire"|"release"|"renew", "id", "now"}` and
//! its outcome: for acquire `allowed`, `remaining`, `retry_us` (null when admitted, -1 when
//! never) and `reset_us`; for release `released` (`released`, `expired`, `not_held`); for
//! renew `expires_at` (null when not held); and for every step `held`, the unexpired leases
//! after it as sorted `[id, expires_at]` pairs.

use proptest::prelude::*;
use serde_json::{Value, json};
use sluice_core::algorithm::concurrency::{self, Leases};
use sluice_core::{Algorithm, Leaf, Quota, Retry, Span, Unit};

const FILE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/concurrency_vectors.json"
);
const SEED: u64 = 0xc0c0_2026_1125;
const CASES: usize = 20;
const STEPS: usize = 25;
/// 2025-11-13 in microseconds.
const EPOCH_US: u64 = 1_763_000_000_000_000;
const TICK_NS: u64 = 1_000;

/// xorshift64*, as the rate vectors' generator: no dependency on an RNG crate's versions.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

fn quota(limit: u64, lease_s: u64) -> Quota {
    let lease = Span::new(lease_s, Unit::Second).unwrap();
    let leaf = Leaf::concurrent(limit, Some(lease)).unwrap();
    let quota = Quota::from_leaf(&leaf, Algorithm::Gcra).unwrap();
    quota.with_tick(TICK_NS).unwrap()
}

fn held(leases: &Leases, now: u64) -> Value {
    let mut pairs: Vec<(u64, u64)> = leases.leases().filter(|(_, at)| *at > now).collect();
    pairs.sort_unstable();
    json!(pairs)
}

/// One step applied to `leases`, with its outcome.
fn step(quota: &Quota, leases: &mut Leases, op: &str, id: u64, now: u64) -> Value {
    let mut out = json!({ "op": op, "id": id, "now": now });
    match op {
        "acquire" => {
            let v = concurrency::acquire(quota, leases, now, id);
            out["allowed"] = json!(v.allowed);
            out["remaining"] = json!(v.remaining);
            out["reset_us"] = json!(v.reset_after);
            out["retry_us"] = match v.retry {
                Retry::Now => Value::Null,
                Retry::After(n) => json!(n),
                Retry::Never => json!(-1),
            };
        }
        "release" => {
            out["released"] = json!(concurrency::release(leases, now, id).name());
        }
        _ => out["expires_at"] = json!(concurrency::renew(quota, leases, now, id)),
    }
    out["held"] = held(leases, now);
    out
}

fn generate() -> Value {
    let mut rng = Rng(SEED);
    let cases: Vec<Value> = (0..CASES)
        .map(|_| {
            let limit = rng.range(1, 5);
            let lease_s = rng.range(1, 30);
            let quota = quota(limit, lease_s);
            let mut leases = Leases::default();
            let mut now = EPOCH_US + rng.range(0, 86_400_000_000);
            let steps: Vec<Value> = (0..STEPS)
                .map(|_| {
                    // Steps a fraction of a lease apart, sometimes past one: expiries happen.
                    now += rng.range(0, lease_s * 400_000);
                    let id = rng.range(1, limit + 3);
                    let op = match rng.range(0, 9) {
                        0..=4 => "acquire",
                        5..=7 => "release",
                        _ => "renew",
                    };
                    step(&quota, &mut leases, op, id, now)
                })
                .collect();
            json!({ "limit": limit, "lease_us": lease_s * 1_000_000, "steps": steps })
        })
        .collect();
    json!(cases)
}

/// One step per line, so a change shows as a readable diff.
fn text(cases: &Value) -> String {
    let mut out = String::from("[\n");
    let cases = cases.as_array().unwrap();
    for (i, case) in cases.iter().enumerate() {
        let head = json!({ "limit": case["limit"], "lease_us": case["lease_us"] });
        let head = head.to_string();
        out.push_str(&format!("{},\"steps\":[\n", &head[..head.len() - 1]));
        let steps = case["steps"].as_array().unwrap();
        for (j, step) in steps.iter().enumerate() {
            let comma = if j + 1 < steps.len() { "," } else { "" };
            out.push_str(&format!("  {step}{comma}\n"));
        }
        out.push_str(if i + 1 < cases.len() { "]},\n" } else { "]}\n" });
    }
    out.push_str("]\n");
    out
}

#[test]
fn the_file_holds_what_the_core_computes() {
    let generated = text(&generate());
    if std::env::var("SLUICE_REGENERATE_VECTORS").as_deref() == Ok("1") {
        std::fs::write(FILE, &generated).expect("write concurrency_vectors.json");
    }
    let parsed: Value = serde_json::from_str(&generated).expect("the text is JSON");
    assert_eq!(parsed, generate());
    let stored = std::fs::read_to_string(FILE)
        .expect("concurrency_vectors.json is missing: regenerate with SLUICE_REGENERATE_VECTORS=1");
    assert!(
        stored == generated,
        "concurrency_vectors.json differs from what the core computes; if the change is \
         deliberate, regenerate with SLUICE_REGENERATE_VECTORS=1"
    );
}

#[test]
fn the_vectors_cover_every_outcome() {
    let all = generate();
    let steps: Vec<&Value> = all
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["steps"].as_array().unwrap())
        .collect();
    let has = |f: &dyn Fn(&Value) -> bool| steps.iter().any(|s| f(s));
    assert!(has(&|s| s["allowed"] == json!(true)));
    assert!(has(&|s| s["allowed"] == json!(false)));
    for name in ["released", "expired", "not_held"] {
        assert!(has(&|s| s["released"] == json!(name)), "no release {name}");
    }
    assert!(has(&|s| s["op"] == "renew" && !s["expires_at"].is_null()));
    assert!(has(&|s| s["op"] == "renew" && s["expires_at"].is_null()));
}

/// Random steps: (0 acquire, 1 release, 2 renew; lease id; microseconds since the last step).
fn steps() -> impl Strategy<Value = Vec<(u8, u64, u64)>> {
    prop::collection::vec((0..3u8, 1..10u64, 0..20_000_000u64), 1..80)
}

proptest! {
    /// Whatever the operations, never more than `limit` unexpired leases are held, and an
    /// admitted acquire's lease is held right after it.
    #[test]
    fn never_more_than_the_limit(
        limit in 1..6u64,
        ops in steps(),
    ) {
        let quota = quota(limit, 10);
        let mut leases = Leases::default();
        let mut now = EPOCH_US;
        for (op, id, dt) in ops {
            now += dt;
            match op {
                0 => {
                    let v = concurrency::acquire(&quota, &mut leases, now, id);
                    prop_assert!(!v.allowed || leases.expiry(id, now).is_some());
                }
                1 => {
                    concurrency::release(&mut leases, now, id);
                    prop_assert!(leases.expiry(id, now).is_none());
                }
                _ => {
                    concurrency::renew(&quota, &mut leases, now, id);
                }
            }
            prop_assert!(leases.held(now) <= limit);
        }
    }

    /// `acquire` decides in one pass what its definition says in several: drop the expired
    /// leases; renew a lease already held (answering as an acquire of 0 slots); otherwise
    /// the verdict on one more slot, and the lease held when it admits. Every verdict and
    /// every resulting set equal the definition's, step by step.
    #[test]
    fn acquire_is_its_definition(
        limit in 1..6u64,
        ops in steps(),
    ) {
        let quota = quota(limit, 10);
        let (mut fast, mut defined) = (Leases::default(), Leases::default());
        let mut now = EPOCH_US;
        for (op, id, dt) in ops {
            now += dt;
            match op {
                0 => {
                    let got = concurrency::acquire(&quota, &mut fast, now, id);
                    defined.drop_expired(now);
                    let want = if defined.expiry(id, now).is_some() {
                        concurrency::renew(&quota, &mut defined, now, id);
                        concurrency::verdict(&quota, &defined, now, 0)
                    } else {
                        let v = concurrency::verdict(&quota, &defined, now, 1);
                        if v.allowed {
                            concurrency::hold(&quota, &mut defined, now, id);
                        }
                        v
                    };
                    prop_assert_eq!(got, want);
                }
                1 => {
                    prop_assert_eq!(
                        concurrency::release(&mut fast, now, id),
                        concurrency::release(&mut defined, now, id)
                    );
                }
                _ => {
                    prop_assert_eq!(
                        concurrency::renew(&quota, &mut fast, now, id),
                        concurrency::renew(&quota, &mut defined, now, id)
                    );
                }
            }
            prop_assert_eq!(&fast, &defined);
        }
    }
}
