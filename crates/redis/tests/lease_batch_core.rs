//! The batched lease script against the core, step by step: random acquires, releases and
//! renews on a few lease sets, sent in batches that each share one `now` (as one call of
//! the store does), must answer exactly as sluice-core's concurrency steps taken one after
//! the other, drop the same expired leases, and leave the same leases behind, each key
//! expiring when its latest lease does (set by an acquire that holds a lease later than the
//! others, and by a renew). Between batches the test time jumps; each key's Redis expiry is
//! moved by the same jump, so a set whose key would have expired meanwhile is gone, as on a
//! live server.

use std::collections::BTreeMap;

use sluice_core::algorithm::concurrency::{self, Leases, Released};
use sluice_core::{Algorithm, Decision, Leaf, Quota, Span, Unit};
use sluice_redis::script::{
    LEASE_BATCH_LUA, LeaseAnswer, LeaseStep, TICK_NS, lease_batch_answers, lease_batch_call,
    lease_set, micro,
};
use sluice_testkit::RedisServer;

/// xorshift64*, so every run replays the same steps.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

/// A concurrency quota of `limit` slots and leases of `seconds`, counted in microseconds.
fn quota(limit: u64, seconds: u64) -> Quota {
    let lease = Span::new(seconds, Unit::Second).unwrap();
    let leaf = Leaf::concurrent(limit, Some(lease)).unwrap();
    micro(&Quota::from_leaf(&leaf, Algorithm::Gcra).unwrap()).unwrap()
}

/// One lease set: its key, its quotas (one limit; lease times that differ, as if policies
/// shared it, so a lease taken later may expire sooner), the core's state, and when its
/// Redis key expires (test time, microseconds; 0 when it has none).
#[derive(Clone)]
struct Set {
    key: String,
    quotas: Vec<Quota>,
    core: Leases,
    expires_at: i64,
}

/// The core's answer to `step` (of quota `q`) on `set` at `now`, and the key's expiry after
/// it: an acquire that holds the lease past every other lease sets it to the lease's, a
/// renew to the latest lease's (both in whole milliseconds, rounded up); an emptied set is
/// no key.
fn core_step(set: &mut Set, q: &Quota, step: LeaseStep, id: u64, now: u64) -> LeaseAnswer {
    let expire = |at: u64| (now + (at - now).div_ceil(1_000).max(1) * 1_000) as i64;
    let answer = match step {
        LeaseStep::Acquire { .. } => {
            let dropped = set.core.drop_expired(now);
            let latest = set.core.expires_at();
            let verdict = concurrency::acquire(q, &mut set.core, now, id);
            if let Some(at) = set.core.expiry(id, now)
                && at > latest
            {
                set.expires_at = expire(at);
            }
            LeaseAnswer::Acquired {
                decision: Decision::from_verdict(&verdict, 0, TICK_NS),
                dropped,
            }
        }
        LeaseStep::Release | LeaseStep::ReleaseUnexpired => {
            LeaseAnswer::Released(concurrency::release(&mut set.core, now, id))
        }
        LeaseStep::Renew { .. } => {
            let renewed = concurrency::renew(q, &mut set.core, now, id);
            if renewed.is_some() {
                set.expires_at = expire(set.core.expires_at());
            }
            LeaseAnswer::Renewed(renewed.map(|at| at - now))
        }
    };
    if set.core.is_empty() {
        set.expires_at = 0;
    }
    answer
}

/// `batch` as holders send it at `now`: a holder sends [`LeaseStep::ReleaseUnexpired`]
/// only for a lease that has not expired when the step runs (or that is gone), so where the
/// core finds the lease expired at that step the plain release goes instead.
fn as_holders_send(sets: &[Set], now: i64, batch: &Batch) -> Batch {
    let mut sets = sets.to_vec();
    let now = now as u64;
    batch
        .iter()
        .map(|&(s, q, step, id)| {
            let expired = sets[s]
                .core
                .leases()
                .any(|(held, at)| held == id && at <= now);
            let step = match step {
                LeaseStep::ReleaseUnexpired if expired => LeaseStep::Release,
                other => other,
            };
            core_step(&mut sets[s], &q, step, id, now);
            (s, q, step, id)
        })
        .collect()
}

/// A random step of a random set: half acquires, then releases, then renews, on a few ids
/// so that ids are taken twice, released twice and renewed after they went.
fn random_step(sets: &[Set], rng: &mut u64) -> (usize, Quota, LeaseStep, u64) {
    let s = (next(rng) % sets.len() as u64) as usize;
    let quotas = &sets[s].quotas;
    let q = quotas[(next(rng) % quotas.len() as u64) as usize];
    let step = match next(rng) % 10 {
        0..=4 => LeaseStep::Acquire {
            limit: q.limit(),
            lease: q.window_ticks(),
        },
        5..=6 => LeaseStep::Release,
        // Sent only where its holder would: see `as_holders_send`.
        7 => LeaseStep::ReleaseUnexpired,
        _ => LeaseStep::Renew {
            lease: q.window_ticks(),
        },
    };
    (s, q, step, 1 + next(rng) % 6)
}

/// Moves every key's expiry to test time `now`: the key of a set that would have expired
/// is deleted, and the core forgets its leases too (all expired, as the key outlives them).
fn pass_time(con: &mut redis::Connection, sets: &mut [Set], now: i64) {
    for set in sets.iter_mut() {
        if set.expires_at == 0 {
            continue;
        }
        let left_ms = (set.expires_at - now + 999) / 1_000;
        if left_ms > 0 {
            // In whole milliseconds, as Redis keeps it.
            set.expires_at = now + left_ms * 1_000;
            let _: i64 = redis::cmd("PEXPIRE")
                .arg(&set.key)
                .arg(left_ms)
                .query(con)
                .unwrap();
        } else {
            let _: i64 = redis::cmd("DEL").arg(&set.key).query(con).unwrap();
            let all: Vec<(u64, u64)> = set.core.leases().collect();
            assert!(
                all.iter().all(|&(_, at)| at as i64 <= now),
                "{}: the key expired before its leases {all:?}",
                set.key
            );
            set.core = Leases::default();
            set.expires_at = 0;
        }
    }
}

/// What differs between Redis's lease sets and keys' expiries and the core's after a batch
/// at `now`.
fn compare_sets(con: &mut redis::Connection, sets: &mut [Set], now: i64) -> Vec<String> {
    let mut problems = Vec::new();
    for set in sets.iter_mut() {
        let mut held = lease_set(con, &set.key).unwrap();
        held.sort_unstable();
        let mut core: Vec<(u64, u64)> = set.core.leases().collect();
        core.sort_unstable();
        // Redis counts a key's expiry in real time, which also passes while a batch runs: a
        // key the test left a second or less to live may be gone by now, with the leases
        // the core still keeps all expired. The set is gone on both sides then.
        let ran_out = held.is_empty()
            && set.expires_at - now <= 1_000_000
            && core.iter().all(|&(_, at)| at as i64 <= now);
        if ran_out {
            set.core = Leases::default();
            set.expires_at = 0;
            continue;
        }
        if held != core {
            problems.push(format!("{} holds {held:?}, core {core:?}", set.key));
        }
        // PTTL is read a moment after the batch, on a machine that may be busy: a second of
        // slack below (none above: time only lowers it).
        let pttl: i64 = redis::cmd("PTTL").arg(&set.key).query(con).unwrap();
        let want_ms = if set.expires_at == 0 {
            -2
        } else {
            (set.expires_at - now) / 1_000
        };
        if pttl > want_ms || (want_ms >= 0 && pttl < want_ms - 1_000) {
            problems.push(format!(
                "{} expires in {pttl} ms, the core's in {want_ms} ms",
                set.key
            ));
        }
    }
    problems
}

/// A batch: steps of the set at each index, with its quota, step and lease id.
type Batch = Vec<(usize, Quota, LeaseStep, u64)>;

/// A Redis of its own and the batched script's test entry (`now` the last argument).
struct Replay {
    server: RedisServer,
    con: redis::Connection,
    entry: String,
    /// Every step's core answer, by kind.
    kinds: BTreeMap<&'static str, usize>,
    /// The core's answers to acquires on a key no other step of their batch names (sent as
    /// kind 4, the script's loop that keeps nothing of the key), by kind.
    once: BTreeMap<&'static str, usize>,
    /// How many steps took each of the script's ways for sets kept as strings.
    ways: BTreeMap<&'static str, usize>,
}

impl Replay {
    fn start() -> Replay {
        Replay::start_with(&[])
    }

    /// On a redis-server started with `extra` arguments.
    fn start_with(extra: &[&str]) -> Replay {
        let server = RedisServer::start_with(extra).expect("redis-server");
        let client = redis::Client::open(server.url()).unwrap();
        let con = client.get_connection().expect("connect");
        Replay {
            server,
            con,
            entry: format!("local now = tonumber(ARGV[#ARGV])\n{LEASE_BATCH_LUA}"),
            kinds: BTreeMap::new(),
            once: BTreeMap::new(),
            ways: BTreeMap::new(),
        }
    }

    /// Sends `batch` as one call at `now` (after moving the keys' expiries there) and
    /// replays it on the core: what differs.
    fn run(&mut self, sets: &mut [Set], now: i64, batch: &Batch) -> Vec<String> {
        let batch = &as_holders_send(sets, now, batch);
        pass_time(&mut self.con, sets, now);
        let steps: Vec<LeaseStep> = batch.iter().map(|&(_, _, step, _)| step).collect();
        let (keys, mut args) = lease_batch_call(
            batch
                .iter()
                .map(|&(s, _, step, id)| (sets[s].key.as_str(), step, id)),
        )
        .unwrap();
        args.push(now.to_string().into_bytes());
        // Which ways through the script the steps alone on their sets take: an acquire on a
        // set with no key writes it as a string, and a release on a set kept as a string
        // takes it whole, putting back another holder's lease.
        for &(s, _, step, id) in batch {
            if batch.iter().filter(|other| other.0 == s).count() != 1 {
                continue;
            }
            let kind: String = redis::cmd("TYPE")
                .arg(&sets[s].key)
                .query(&mut self.con)
                .unwrap();
            let way = match (step, kind.as_str()) {
                (LeaseStep::Acquire { .. }, "none") => "acquired on a new set",
                (LeaseStep::Release | LeaseStep::ReleaseUnexpired, "string") => {
                    let held = lease_set(&mut self.con, &sets[s].key).unwrap();
                    if held[0].0 == id {
                        "released from a string"
                    } else {
                        "put back another's lease"
                    }
                }
                _ => continue,
            };
            *self.ways.entry(way).or_default() += 1;
        }
        let reply: Vec<i64> = redis::cmd("EVAL")
            .arg(&self.entry)
            .arg(keys.len())
            .arg(&keys)
            .arg(&args)
            .query(&mut self.con)
            .unwrap_or_else(|e| panic!("{e}"));
        let answers = lease_batch_answers(&steps, &reply).unwrap();
        let mut problems = Vec::new();
        for (n, (&(s, q, step, id), answer)) in batch.iter().zip(&answers).enumerate() {
            let want = core_step(&mut sets[s], &q, step, id, now as u64);
            *self.kinds.entry(kind(&want)).or_default() += 1;
            if matches!(step, LeaseStep::Acquire { .. })
                && batch.iter().filter(|other| other.0 == s).count() == 1
            {
                *self.once.entry(kind(&want)).or_default() += 1;
            }
            if step == LeaseStep::ReleaseUnexpired
                && want == LeaseAnswer::Released(Released::Released)
            {
                *self
                    .kinds
                    .entry("released by its unexpired holder")
                    .or_default() += 1;
            }
            if *answer != want {
                problems.push(format!(
                    "step {n} ({step:?} of lease {id} on {}): answered {answer:?}, core {want:?}",
                    sets[s].key
                ));
            }
        }
        problems.extend(compare_sets(&mut self.con, sets, now));
        problems
    }
}

impl Replay {
    /// Sends `count` batches of up to `most` random steps on `sets`, up to `gap`
    /// microseconds apart, and fails with every difference from the core.
    fn batches(&mut self, sets: &mut [Set], count: usize, most: u64, gap: u64) {
        let mut rng = 0x5eed_u64;
        let mut now: i64 = 1_763_000_000_000_000;
        let mut failures = Vec::new();
        for number in 0..count {
            now += (next(&mut rng) % gap) as i64;
            let size = 1 + (next(&mut rng) % most) as usize;
            let batch: Batch = (0..size).map(|_| random_step(sets, &mut rng)).collect();
            for problem in self.run(sets, now, &batch) {
                failures.push(format!("batch {number}: {problem}"));
            }
        }
        let steps: usize = self.kinds.values().sum();
        assert!(
            failures.is_empty(),
            "{} differences in {steps} steps:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}

/// What kind of answer the core gave.
fn kind(answer: &LeaseAnswer) -> &'static str {
    match answer {
        LeaseAnswer::Acquired { dropped, .. } if *dropped > 0 => "dropped expired",
        LeaseAnswer::Acquired { decision, .. } if decision.allowed() => "admitted",
        LeaseAnswer::Acquired { .. } => "denied",
        LeaseAnswer::Released(Released::Expired) => "released expired",
        LeaseAnswer::Released(_) => "released",
        LeaseAnswer::Renewed(_) => "renewed",
    }
}

/// Lease sets of these limits and lease times (seconds), named `prefix:N`.
fn sets(prefix: &str, shapes: &[(u64, &[u64])]) -> Vec<Set> {
    shapes
        .iter()
        .enumerate()
        .map(|(i, &(limit, seconds))| Set {
            key: format!("{prefix}:{i}"),
            quotas: seconds.iter().map(|&s| quota(limit, s)).collect(),
            core: Leases::default(),
            expires_at: 0,
        })
        .collect()
}

#[test]
fn batches_answer_as_the_core_step_by_step() {
    let mut replay = Replay::start();
    let shapes: [(u64, &[u64]); 5] = [
        (1, &[20]),
        (3, &[30]),
        (2, &[5]),
        (4, &[60]),
        (3, &[5, 60, 20]),
    ];
    let mut sets = sets("batch-core", &shapes);
    // Up to 24 steps a batch, up to 20 s between batches: leases of 5 s to 60 s expire now
    // and then.
    replay.batches(&mut sets, 1_000, 24, 20_000_000);
    // The run went through every kind of answer, several times each.
    for kind in [
        "admitted",
        "denied",
        "dropped expired",
        "released",
        "released expired",
        "released by its unexpired holder",
        "renewed",
    ] {
        let seen = replay.kinds.get(kind).copied().unwrap_or(0);
        assert!(seen >= 5, "only {seen} steps {kind}: {:?}", replay.kinds);
    }
    // Acquires on a key named once in their batch, and so sent through the script's loop
    // that keeps nothing of the key, met each answer an acquire can get.
    for kind in ["admitted", "denied", "dropped expired"] {
        let seen = replay.once.get(kind).copied().unwrap_or(0);
        assert!(
            seen >= 5,
            "only {seen} acquires {kind} alone: {:?}",
            replay.once
        );
    }
}

/// What a batch learnt of a key's latest lease must not outlive the lease: a long lease
/// released, then leases that expire sooner, their latest read, taken, released, and one
/// more taken, which must set the key's expiry down from the released long lease's.
#[test]
fn a_batch_forgets_the_latest_lease_once_it_goes() {
    let mut replay = Replay::start();
    let mut sets = sets("batch-latest", &[(3, &[60, 5])]);
    let (long, short) = (sets[0].quotas[0], sets[0].quotas[1]);
    let acquire = |q: Quota, id| {
        let step = LeaseStep::Acquire {
            limit: q.limit(),
            lease: q.window_ticks(),
        };
        (0, q, step, id)
    };
    let release = |id| (0, long, LeaseStep::Release, id);
    let now: i64 = 1_763_000_000_000_000;
    let mut problems = replay.run(&mut sets, now, &vec![acquire(long, 1), acquire(short, 2)]);
    // Lease 1 expires 57 s after this batch, lease 2 in 2 s.
    let batch = vec![
        acquire(short, 3),
        release(1),
        acquire(short, 4),
        release(3),
        release(4),
        acquire(short, 5),
    ];
    problems.extend(replay.run(&mut sets, now + 3_000_000, &batch));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Many sets, few steps a batch: most steps are alone on their set, so sets of one lease
/// are kept as strings (one SET an acquire, one GETDEL a release), and every way through
/// that layout answers and leaves the leases as the core does.
#[test]
fn sets_of_one_lease_answer_as_the_core() {
    one_lease_sets(Replay::start(), true);
}

/// The same on a server without `GETDEL` (as before Redis 6.2): a release alone on a set
/// kept as a string then turns it into the sorted set and removes its lease there.
#[test]
fn sets_of_one_lease_answer_as_the_core_without_getdel() {
    one_lease_sets(
        Replay::start_with(&["--rename-command", "GETDEL", ""]),
        false,
    );
}

/// Many sets of one lease, as above; `getdel` whether the server has the command.
fn one_lease_sets(mut replay: Replay, getdel: bool) {
    let shapes = [(2, &[10][..]); 24];
    let mut sets = sets("batch-one", &shapes);
    replay.batches(&mut sets, 2_000, 4, 3_000_000);
    for way in [
        "acquired on a new set",
        "released from a string",
        "put back another's lease",
    ] {
        let seen = replay.ways.get(way).copied().unwrap_or(0);
        assert!(seen >= 5, "only {seen} steps {way}: {:?}", replay.ways);
    }
    assert_eq!(replay.server.calls("getdel") > 0, getdel);
}
