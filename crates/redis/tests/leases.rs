//! Leases on real Redis beyond the conformance suite: compound rules (rate and concurrency
//! leaves under `or` and `and`) answer exactly as the memory store does, step for step, also
//! spread over Cluster slots; a reservation across slots is a clear error; and a holder
//! process killed with SIGKILL gives its slots back when its leases expire, not before.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice_limiter::{Error, Limiter, MemoryStore, Policy, StoreError};
use sluice_redis::RedisStore;
use sluice_testkit::{RedisCluster, RedisServer};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A limiter of one policy `p`; each test has a server of its own, so one namespace serves
/// (the holder process and its parent must share it).
fn limiter<S: sluice_limiter::Store>(store: S, rule: &str, count_denied: bool) -> Limiter {
    let policy = Policy::new("p", rule)
        .unwrap()
        .namespace("leases")
        .count_denied(count_denied);
    Limiter::builder(store).policy(policy).build().unwrap()
}

/// xorshift64*, so every run replays the same steps.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// Rules with rate and concurrency leaves; times are long, so the seconds a run takes
/// change no answer.
const RULES: [(&str, bool); 5] = [
    ("user:3/h; user:2 concurrent lease=1h", false),
    (
        "user:2 concurrent lease=1h; user:4/h algorithm=sliding-log",
        false,
    ),
    ("and(user:4/h, user:2 concurrent lease=1h)", false),
    (
        "or(user:5/h algorithm=fixed-window, and(user:1 concurrent lease=1h, user:2/h))",
        false,
    ),
    ("user:3/h; user:2 concurrent lease=1h", true),
];

/// Runs the same 60 random acquires, releases and renews on both limiters; returns every
/// answer that differs.
async fn differences(memory: &Limiter, redis: &Limiter, seed: u64, loose: bool) -> Vec<String> {
    let user = format!("u{seed}");
    let ip = format!("10.0.0.{seed}");
    let who = [("user", user.as_str()), ("ip", ip.as_str())];
    let (mut held_memory, mut held_redis) = (Vec::new(), Vec::new());
    let mut rng = seed;
    let mut out = Vec::new();
    for step in 0..60 {
        let roll = next(&mut rng);
        match roll % 4 {
            0 | 1 => {
                let a = memory.acquire("p", &who).await.unwrap();
                let b = redis.acquire("p", &who).await.unwrap();
                let (da, db) = (&a.checked.decision, &b.checked.decision);
                let say = |d: &sluice_limiter::Decision| {
                    if loose {
                        return format!("allowed {}", d.allowed());
                    }
                    format!(
                        "allowed {} limit {} remaining {} leaf {} denial {:?}",
                        d.allowed(),
                        d.limit,
                        d.remaining,
                        d.leaf,
                        d.denial.map(|d| d.name())
                    )
                };
                if say(da) != say(db) {
                    out.push(format!(
                        "step {step} acquire: memory {} redis {}",
                        say(da),
                        say(db)
                    ));
                }
                held_memory.extend(a.lease);
                held_redis.extend(b.lease);
            }
            2 if !held_memory.is_empty() && held_memory.len() == held_redis.len() => {
                let at = (roll / 4) as usize % held_memory.len();
                let a = held_memory.swap_remove(at).release().await.unwrap();
                let b = held_redis.swap_remove(at).release().await.unwrap();
                if a != b {
                    out.push(format!("step {step} release: memory {a:?} redis {b:?}"));
                }
            }
            _ if !held_memory.is_empty() && held_memory.len() == held_redis.len() => {
                let at = (roll / 4) as usize % held_memory.len();
                let a = held_memory[at].renew().await.unwrap();
                let b = held_redis[at].renew().await.unwrap();
                if a.is_some() != b.is_some() {
                    out.push(format!("step {step} renew: memory {a:?} redis {b:?}"));
                }
            }
            _ => {}
        }
    }
    for lease in held_memory.into_iter().chain(held_redis) {
        lease.release().await.unwrap();
    }
    out
}

/// Compares every rule of `rules` on Redis at `url` with the memory store; `loose`: only
/// admissions on rules that count denials.
async fn compare_on(url: &str, rules: &[(&str, bool)], loose: bool) {
    let store = RedisStore::connect(url).await.expect("connect");
    let mut failures = Vec::new();
    for (n, (rule, count_denied)) in rules.iter().enumerate() {
        let memory = limiter(MemoryStore::new(), rule, *count_denied);
        let redis = limiter(store.clone(), rule, *count_denied);
        for seed in 1..=4u64 {
            let found = differences(
                &memory,
                &redis,
                n as u64 * 100 + seed,
                loose && *count_denied,
            )
            .await;
            if !found.is_empty() {
                failures.push(format!("{rule} (seed {seed}):\n  {}", found.join("\n  ")));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "redis differs from memory:\n{}",
        failures.join("\n")
    );
}

#[test]
fn compound_rules_answer_as_the_memory_store() {
    let server = RedisServer::start().expect("redis-server");
    runtime().block_on(compare_on(&server.url(), &RULES, false));
}

#[test]
fn compound_rules_answer_as_the_memory_store_on_a_cluster() {
    let cluster = RedisCluster::start(3).expect("redis cluster");
    runtime().block_on(async {
        compare_on(&cluster.url(), &RULES, false).await;
        // Leaves of two selectors fall in two slots: an `or` takes its lease slot by slot.
        compare_on(&cluster.url(), &SPREAD, true).await;
        // A reservation answers one time for its settlement: it must stay in one slot.
        let store = RedisStore::connect(&cluster.url()).await.unwrap();
        let limiter = limiter(store, "ip:5/h; user:5/h", false);
        let spread = [("user", "alice"), ("ip", "10.0.0.1")];
        match limiter.reserve("p", &spread, 2).await {
            Err(Error::Store(StoreError::Protocol(why))) => {
                assert!(why.contains("several cluster slots"), "{why}");
            }
            other => panic!("expected a clear error, got {other:?}"),
        }
    });
}

/// Rules whose leaves name two selectors: on a Cluster, an `or` of them spans two slots.
/// With counted denials only admissions are compared: across slots a denial reports the
/// wait before it was counted, as for rates (see `split.rs`).
const SPREAD: [(&str, bool); 4] = [
    ("ip:3/h; user:2 concurrent lease=1h", false),
    ("user:2 concurrent lease=1h; ip:3/h", false),
    ("user:2 concurrent lease=1h; ip:3/h", true),
    (
        "ip:1 concurrent lease=1h; user:2 concurrent lease=1h; ip:4/h",
        false,
    ),
];

/// Where the holder finds Redis.
const HOLDER_URL: &str = "SLUICE_TEST_LEASE_HOLDER_URL";
/// What the holder prints once it holds its leases, then the times before and after.
const HELD: &str = "sluice-lease-holder-held ";
const LEASE: Duration = Duration::from_secs(2);
const HOLDER_RULE: &str = "job:2 concurrent lease=2s";

fn unix_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

/// The holder process of `sigkilled_holders_slots_come_back` (run by it, never alone):
/// takes both slots, says so with the times before and after, then holds them forever.
#[test]
#[ignore = "a child process of sigkilled_holders_slots_come_back"]
fn lease_holder() {
    let Ok(url) = std::env::var(HOLDER_URL) else {
        return;
    };
    runtime().block_on(async {
        let store = RedisStore::connect(&url).await.expect("connect");
        let limiter = limiter(store, HOLDER_RULE, false);
        let before = unix_micros();
        let first = limiter.acquire("p", &[("job", "export")]).await.unwrap();
        let second = limiter.acquire("p", &[("job", "export")]).await.unwrap();
        let after = unix_micros();
        assert!(
            first.lease.is_some() && second.lease.is_some(),
            "slots taken"
        );
        println!("{HELD}{before} {after}");
        std::future::pending::<()>().await;
    });
}

#[test]
fn sigkilled_holders_slots_come_back() {
    let server = RedisServer::start().expect("redis-server");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "lease_holder",
            "--ignored",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HOLDER_URL, server.url())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the holder");
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let mut held = None;
    for line in stdout.lines() {
        let line = line.expect("read the holder");
        // libtest writes its "test lease_holder ... " before the line.
        if let Some((_, times)) = line.split_once(HELD) {
            let (before, after) = times.split_once(' ').expect("two times");
            held = Some((
                before.parse::<u128>().unwrap(),
                after.parse::<u128>().unwrap(),
            ));
            break;
        }
    }
    let Some((before, after)) = held else {
        let _ = child.kill();
        panic!("the holder exited without holding: {:?}", child.wait());
    };
    child.kill().expect("SIGKILL the holder"); // std's kill is SIGKILL on Unix
    child.wait().unwrap();

    runtime().block_on(async {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let limiter = limiter(store, HOLDER_RULE, false);
        let job = [("job", "export")];
        // Dead, its leases still hold both slots.
        let denied = limiter.acquire("p", &job).await.unwrap();
        assert!(
            denied.lease.is_none(),
            "the killed holder's slots were free at once"
        );
        let deadline = Instant::now() + LEASE * 5;
        let mut taken = Vec::new();
        while taken.len() < 2 {
            let acquired = limiter.acquire("p", &job).await.unwrap();
            match acquired.lease {
                Some(lease) => {
                    let at = unix_micros();
                    let lease_us = LEASE.as_micros();
                    assert!(
                        at >= before + lease_us,
                        "a slot came back {} us early",
                        before + lease_us - at
                    );
                    assert!(
                        at <= after + lease_us + 1_000_000,
                        "a slot came back {} ms after its lease",
                        (at - after - lease_us) / 1_000
                    );
                    println!(
                        "slot {} back {} ms after the acquire began ({} ms after it ended)",
                        taken.len() + 1,
                        (at - before) / 1_000,
                        (at - after) / 1_000
                    );
                    taken.push(lease);
                }
                None => {
                    assert!(Instant::now() < deadline, "the slots never came back");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    });
}

/// A `Lease` tells the store how long it has been held, so its release, far from the
/// lease's expiry, asks no expiry (a set of one lease is one `GETDEL` either way); on a set
/// of several leases, a lease rebuilt from its token (its age unknown) asks it.
#[test]
fn a_lease_released_by_its_holder_does_not_ask_its_expiry() {
    let server = RedisServer::start().expect("redis-server");
    runtime().block_on(async {
        let store = RedisStore::connect(&server.url()).await.unwrap();
        let limiter = limiter(store, "user:2 concurrent lease=10m", false);
        let alice = &[("user", "alice")];
        let before = server.calls("zscore");
        let lease = limiter.acquire("p", alice).await.unwrap().lease.unwrap();
        assert_eq!(
            lease.release().await.unwrap(),
            sluice_limiter::Released::Released
        );
        assert_eq!(server.calls("zscore"), before, "released by one ZREM");

        let other = limiter.acquire("p", alice).await.unwrap().lease.unwrap();
        let held = limiter.acquire("p", alice).await.unwrap().lease.unwrap();
        let rebuilt = limiter.lease("p", &held.token()).unwrap();
        let before = server.calls("zscore");
        assert_eq!(
            rebuilt.release().await.unwrap(),
            sluice_limiter::Released::Released
        );
        assert_eq!(server.calls("zscore"), before + 1, "its age unknown");
        held.forget();
        other.release().await.unwrap();
    });
}

/// A lease's age grows with real time, so one held close to its expiry (within twice the
/// store's timeout, 1 s here) asks its expiry at release, as it may have expired; a renew
/// that found the lease counts its age afresh from before it left.
#[test]
fn a_lease_near_its_expiry_asks_it_unless_renewed() {
    let server = RedisServer::start().expect("redis-server");
    runtime().block_on(async {
        let store = RedisStore::builder(&server.url())
            .timeout(Duration::from_secs(1))
            .connect()
            .await
            .unwrap();
        let limiter = limiter(store, "user:2 concurrent lease=3s", false);
        let alice = &[("user", "alice")];
        let old = limiter.acquire("p", alice).await.unwrap().lease.unwrap();
        let renewed = limiter.acquire("p", alice).await.unwrap().lease.unwrap();
        // Real time must pass for the leases to age: 1.2 s and twice the timeout reach the
        // lease time (the renew has 1.8 s to spare).
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        assert!(renewed.renew().await.unwrap().is_some());
        let before = server.calls("zscore");
        old.release().await.unwrap();
        assert_eq!(server.calls("zscore"), before + 1, "near its expiry");
        assert_eq!(
            renewed.release().await.unwrap(),
            sluice_limiter::Released::Released
        );
        assert_eq!(server.calls("zscore"), before + 1, "renewed just now");
    });
}
