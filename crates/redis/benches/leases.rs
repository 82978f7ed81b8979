//! Concurrency leases on Redis: acquire + release pairs per second on one key, beside the
//! rate check (one GCRA leaf, the store's batched path) and a sliding-window check (one
//! leaf, batched through its own lean script since it has one; it once went through the
//! whole decision script, one call per check, as an acquire of a rule mixing rate and
//! concurrency leaves still does) on the same redis-server in the same run; 50 concurrent callers over
//! the store's one multiplexed connection, 3 alternating rounds, medians. Redis CPU per
//! operation is the redis-server's user + system time (`/proc/PID/stat`) over the
//! operations made; the server is pinned to one core when `taskset` exists. Target: an
//! acquire + release costs at most 2 rate checks. Both the rate checks and the lease steps
//! of a one-leaf rule are batched by the store; the run also prints how many operations
//! shared a script call, the time spent inside scripts (`INFO commandstats`, wall time) and
//! the Redis commands an acquire + release made. `SLUICE_BENCH_KEYS=N` spreads every
//! operation over N keys (N lease sets; N rate-check keys) instead of one, as per-user limits
//! are. A release tells the store the lease's age, as a `Lease` does;
//! `SLUICE_BENCH_LEASE_AGE=unknown` releases as a lease rebuilt from its token (its expiry
//! asked first).
//! Run: `cargo bench -p sluice-redis --bench leases`.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::{Algorithm, Leaf, Quota, Rate, Span, Unit};
use sluice_limiter::{Identifier, LeaseKeys, Released, Store};
use sluice_redis::RedisStore;
use sluice_testkit::RedisServer;
use sluice_testkit::bench::{BenchRule, calls_per_second, decisions_per_second, median};

const CALLERS: usize = 50;
const ROUND: Duration = Duration::from_secs(3);
const ROUNDS: usize = 3;

/// The redis-server's CPU time so far (user + system), in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    sluice_testkit::bench::cpu_seconds(Some(pid), false).expect("/proc/PID/stat")
}

/// Each command Redis ran so far, scripts' own commands included: its calls and the
/// microseconds spent in it (`INFO commandstats`).
fn commands(redis: &RedisServer) -> BTreeMap<String, (f64, f64)> {
    let info = redis.cli(&["INFO", "commandstats"]).expect("INFO");
    let field = |line: &str, name: &str| -> f64 {
        line.split(name)
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0.0)
    };
    info.lines()
        .filter_map(|line| {
            let (name, _) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            Some((
                name.to_owned(),
                (field(line, "calls="), field(line, "usec=")),
            ))
        })
        .collect()
}

/// Script calls (EVAL, EVALSHA and FCALL) in `commands` and the microseconds spent in them:
/// the time inside the scripts, not reading and answering.
fn script_calls(commands: &BTreeMap<String, (f64, f64)>) -> (f64, f64) {
    ["evalsha", "eval", "fcall"]
        .iter()
        .filter_map(|name| commands.get(*name))
        .fold((0.0, 0.0), |(calls, usec), (c, u)| (calls + c, usec + u))
}

/// Acquire + release pairs per second from `callers` tasks on the lease sets `sets` of
/// `quota`, each caller taking them in turn.
async fn pairs_per_second(
    store: &RedisStore,
    quota: Quota,
    sets: Arc<Vec<[Identifier; 1]>>,
    callers: usize,
    round: Duration,
) -> f64 {
    calls_per_second(callers, round, |caller, round| {
        let (store, sets) = (store.clone(), sets.clone());
        async move {
            let rule = BenchRule::one_leaf(quota);
            let quotas = [quota];
            let age_known = std::env::var("SLUICE_BENCH_LEASE_AGE").as_deref() != Ok("unknown");
            let mut n = 0u64;
            while round.running() {
                let lease = ((caller as u64) << 40) | n;
                let ids = &sets[(caller + n as usize * CALLERS) % sets.len()];
                n += 1;
                // As a `Lease` does: its age, counted from before the acquire left, goes
                // with the release (so a lease far from expiry is released by one `ZREM`);
                // with `SLUICE_BENCH_LEASE_AGE=unknown`, as a lease rebuilt from its token.
                let taken = Instant::now();
                let decision = store.acquire(&rule.hit(ids), lease).await.expect("acquire");
                assert!(decision.allowed(), "one slot per caller is free");
                let keys = LeaseKeys {
                    identifiers: ids,
                    quotas: &quotas,
                    held_for: age_known.then(|| taken.elapsed()),
                };
                let released = store.release(&keys, lease).await.expect("release");
                assert_eq!(released, Released::Released);
                round.count();
            }
        }
    })
    .await
}

/// Operations per second and Redis CPU microseconds per operation, one per round.
#[derive(Default)]
struct Rounds {
    per_s: Vec<f64>,
    cpu_us: Vec<f64>,
    /// Operations per script call.
    per_call: Vec<f64>,
    /// Microseconds inside scripts per operation.
    in_script_us: Vec<f64>,
}

impl Rounds {
    /// One round: `per_s` operations a second for `seconds`, `cpu` seconds of Redis CPU, and
    /// the script calls and microseconds inside them (`ops` operations each) it took.
    fn push(&mut self, per_s: f64, seconds: f64, cpu: f64, (calls, usec): (f64, f64), ops: f64) {
        let done = per_s * seconds * ops;
        self.per_s.push(per_s);
        self.cpu_us.push(cpu * 1e6 / (per_s * seconds));
        self.per_call.push(done / calls.max(1.0));
        self.in_script_us.push(usec / done.max(1.0));
    }

    fn medians(&self) -> (f64, f64) {
        (median(self.per_s.clone()), median(self.cpu_us.clone()))
    }

    fn script_medians(&self) -> (f64, f64) {
        (
            median(self.per_call.clone()),
            median(self.in_script_us.clone()),
        )
    }
}

fn main() {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let pid = redis.pid().expect("redis-server's pid");
    let pinned = Command::new("taskset")
        .args(["-cp", "1", &pid.to_string()])
        .output()
        .is_ok_and(|o| o.status.success());
    println!("redis-server pid {pid}, pinned to core 1: {pinned}");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // A generous timeout: a loaded machine's slow answer must not end the run.
    let store = runtime
        .block_on(
            RedisStore::builder(&redis.url())
                .timeout(Duration::from_secs(5))
                .connect(),
        )
        .expect("connect");

    // A rate no caller reaches, and a lease set with a slot for every caller.
    let rate = Rate::new(1_000_000_000, Span::new(1, Unit::Second).unwrap()).unwrap();
    let check_quota = Quota::gcra(rate, None).unwrap();
    let spread: usize = std::env::var("SLUICE_BENCH_KEYS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
        .max(1);
    let keys = |prefix: &str, suffix: &str| -> Arc<Vec<[Identifier; 1]>> {
        Arc::new(
            (0..spread)
                .map(|n| [Identifier::grouped(prefix, &n.to_string(), suffix)])
                .collect(),
        )
    };
    let check_keys = keys("bench:check:k:", ":1e9/s");
    let lease = Span::new(60, Unit::Second).unwrap();
    // A slot for every caller (`SLUICE_BENCH_SLOTS=N` for more).
    let slots = std::env::var("SLUICE_BENCH_SLOTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(64u64)
        .max(CALLERS as u64);
    let leaf = Leaf::concurrent(slots, Some(lease)).unwrap();
    let lease_quota = Quota::from_leaf(&leaf, Algorithm::Gcra).unwrap();
    let lease_keys = keys("bench:leases:job:", ":concurrent");
    println!("acquire + release on a leaf of {slots} slots, {spread} key(s)");

    let mut window = Leaf::new(rate);
    window.options.algorithm = Some(Algorithm::SlidingWindow);
    let window_quota = Quota::from_leaf(&window, Algorithm::Gcra).unwrap();
    let window_keys = keys("bench:window:k:", ":1e9/s");

    let mut rounds = [Rounds::default(), Rounds::default(), Rounds::default()];
    // Redis commands per acquire + release in the last round, the scripts' own included.
    let mut pair_commands: Vec<(String, f64)> = Vec::new();
    for round in 0..ROUNDS {
        // Rotate which goes first, so a drift of the shared machine hits all alike.
        for n in 0..3 {
            let which = (n + round) % 3;
            let cpu = cpu_seconds(pid);
            let before = commands(&redis);
            let scripts = script_calls(&before);
            let started = Instant::now();
            let scripts_since = |redis: &RedisServer| {
                let (calls, usec) = script_calls(&commands(redis));
                (calls - scripts.0, usec - scripts.1)
            };
            if which < 2 {
                let (quota, keys) = if which == 0 {
                    (check_quota, check_keys.clone())
                } else {
                    (window_quota, window_keys.clone())
                };
                let rate =
                    runtime.block_on(decisions_per_second(&store, quota, keys, CALLERS, ROUND));
                let seconds = started.elapsed().as_secs_f64();
                let cpu = cpu_seconds(pid) - cpu;
                rounds[which].push(rate, seconds, cpu, scripts_since(&redis), 1.0);
            } else {
                let rate = runtime.block_on(pairs_per_second(
                    &store,
                    lease_quota,
                    lease_keys.clone(),
                    CALLERS,
                    ROUND,
                ));
                let seconds = started.elapsed().as_secs_f64();
                let cpu = cpu_seconds(pid) - cpu;
                // Two operations a pair: the acquire and the release.
                rounds[2].push(rate, seconds, cpu, scripts_since(&redis), 2.0);
                let pairs = rate * seconds;
                pair_commands = commands(&redis)
                    .into_iter()
                    .filter_map(|(name, (calls, _))| {
                        let was = before.get(&name).map_or(0.0, |c| c.0);
                        let per_pair = (calls - was) / pairs;
                        (per_pair >= 0.005).then_some((name, per_pair))
                    })
                    .collect();
            }
        }
        let last = |r: &Rounds| r.per_s.last().copied().unwrap_or(0.0);
        println!(
            "round {}: rate checks {:.0}/s, sliding-window checks {:.0}/s, acquire+release {:.0}/s",
            round + 1,
            last(&rounds[0]),
            last(&rounds[1]),
            last(&rounds[2])
        );
    }
    let scripts = rounds.each_ref().map(Rounds::script_medians);
    let [
        (check_rate, check_cpu),
        (window_rate, window_cpu),
        (pair_rate, pair_cpu),
    ] = rounds.map(|r| r.medians());
    println!(
        "medians of {ROUNDS} rounds, {CALLERS} callers, {spread} key(s) each, same redis-server:"
    );
    println!(
        "  rate check (1 GCRA leaf, batched)    {check_rate:>8.0}/s  {check_cpu:>6.2} us Redis CPU each"
    );
    println!(
        "  sliding-window check (1 leaf)        {window_rate:>8.0}/s  {window_cpu:>6.2} us Redis CPU each"
    );
    println!(
        "  acquire + release                    {pair_rate:>8.0}/s  {pair_cpu:>6.2} us Redis CPU each"
    );
    println!(
        "  one acquire + release = {:.2} rate checks by throughput, {:.2} by Redis CPU (target <= 2); \
         {:.2} and {:.2} sliding-window checks",
        check_rate / pair_rate,
        pair_cpu / check_cpu,
        window_rate / pair_rate,
        pair_cpu / window_cpu
    );
    for (name, (per_call, inside)) in ["rate check", "sliding-window check", "acquire or release"]
        .iter()
        .zip(scripts)
    {
        println!(
            "  {name}: {per_call:.1} per script call, {inside:.2} us inside scripts each \
             (INFO commandstats)"
        );
    }
    let per_pair: Vec<String> = pair_commands
        .iter()
        .map(|(name, n)| format!("{name} {n:.2}"))
        .collect();
    println!(
        "  Redis commands per acquire + release (last round): {}",
        per_pair.join(", ")
    );
}
