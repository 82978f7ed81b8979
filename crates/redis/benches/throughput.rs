//! Decisions per second and Redis CPU per decision through the Redis store, beside
//! `redis-benchmark` running EVALSHA of a minimal GCRA script and of sluice's own scripts on
//! the same server, in one run: single-leaf GCRA, 50 concurrent callers, on 1 key and on
//! 1,000,000 keys, redis-benchmark at pipeline depth 1 and 16.
//! Run: `cargo bench -p sluice-redis --bench throughput`.
//!
//! The store keeps 50 requests in flight over its one multiplexed connection (so its requests
//! are pipelined); redis-benchmark uses 50 connections. Redis CPU per decision is the
//! redis-server's user + system time (`/proc/PID/stat`) over the decisions made; the server is
//! pinned to one core when `taskset` exists. Rounds alternate and medians are reported, since
//! the machine is shared: read the ratios, not the absolutes.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::{Leaf, Quota, Rate, Span, Unit};
use sluice_limiter::Identifier;
use sluice_redis::RedisStore;
use sluice_redis::script::{DECIDE, GCRA_ONE, arguments, gcra_one_arguments};
use sluice_testkit::RedisServer;
use sluice_testkit::bench::{OneLeaf, decisions_per_second, median};

const CALLERS: usize = 50;
const ROUND: Duration = Duration::from_secs(3);
const ROUNDS: usize = 3;
const KEYS_MANY: usize = 1_000_000;
const DEPTHS: [usize; 2] = [1, 16];

/// The redis-server's CPU time so far (user + system), in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/PID/stat");
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    let ticks = |i: usize| fields[i].parse::<f64>().unwrap();
    // utime and stime are fields 14 and 15 of stat(5); `fields` starts at field 3.
    (ticks(11) + ticks(12)) / 100.0
}

/// One round of redis-benchmark: EVALSHA of `sha` with `args` (`__rand_int__` replaced by a
/// key number when `keys > 1`), 50 clients, `depth` commands in flight per client.
/// Returns requests per second.
fn benchmark_round(port: u16, depth: usize, keys: usize, requests: usize, call: &[String]) -> f64 {
    let mut command = Command::new("redis-benchmark");
    command.args(["-p", &port.to_string(), "-c", &CALLERS.to_string()]);
    command.args(["-n", &requests.to_string(), "-P", &depth.to_string(), "-q"]);
    if keys > 1 {
        command.args(["-r", &keys.to_string()]);
    }
    command.args(call);
    let output = command.output().expect("redis-benchmark");
    let text = String::from_utf8_lossy(&output.stdout);
    // "EVALSHA ...: 123456.78 requests per second, p50=0.191 msec"
    text.rsplit("\r")
        .find_map(|part| {
            let (_, after) = part.split_once(": ")?;
            after.split_whitespace().next()?.parse::<f64>().ok()
        })
        .unwrap_or_else(|| panic!("cannot read redis-benchmark output: {text}"))
}

/// Medians of decisions per second and Redis CPU microseconds per decision.
#[derive(Default)]
struct Rounds {
    per_s: Vec<f64>,
    cpu_us: Vec<f64>,
}

impl Rounds {
    fn push(&mut self, decisions: f64, seconds: f64, cpu: f64) {
        self.per_s.push(decisions / seconds);
        self.cpu_us.push(cpu * 1e6 / decisions);
    }

    fn print(self, scenario: &str) {
        println!(
            "scenario={scenario} per_s={:.0} redis_cpu_us={:.2}",
            median(self.per_s),
            median(self.cpu_us)
        );
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
    let minimal_sha = redis
        .cli(&["SCRIPT", "LOAD", include_str!("minimal_gcra.lua")])
        .expect("load the minimal script")
        .trim()
        .to_owned();
    for lua in [&*DECIDE, &*GCRA_ONE] {
        redis.cli(&["SCRIPT", "LOAD", lua.source]).expect("load");
    }
    // 10^6 per second per key: every hit is admitted, so every side takes the write path.
    let rate = Rate::new(1_000_000, Span::new(1, Unit::Second).unwrap()).unwrap();
    let quota = Quota::from_leaf(&Leaf::new(rate), sluice_core::Algorithm::Gcra).unwrap();

    // The calls the store makes, as redis-benchmark arguments.
    let placeholder = [Identifier::new("x")];
    let rule = OneLeaf::new(quota);
    let hit = rule.hit(&placeholder);
    let full_args = arguments(&hit, 1).unwrap();
    let lean_args = gcra_one_arguments(&hit)
        .unwrap()
        .expect("a one-leaf GCRA hit");
    let call = |sha: &str, key: &str, args: &[String]| -> Vec<String> {
        let mut call = vec!["EVALSHA".into(), sha.into(), "1".into(), key.into()];
        call.extend(args.iter().cloned());
        call
    };

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let store = runtime
        .block_on(RedisStore::connect(&redis.url()))
        .expect("connect");
    for (name, count) in [("keys_1", 1), ("keys_1000000", KEYS_MANY)] {
        let keys: Arc<Vec<[Identifier; 1]>> = Arc::new(
            (0..count)
                .map(|i| {
                    [Identifier::grouped(
                        &format!("bench:{name}:"),
                        &format!("user-{i}"),
                        ":1000000/s",
                    )]
                })
                .collect(),
        );
        let key = |side: &str| {
            if count > 1 {
                format!("bench:{side}:__rand_int__")
            } else {
                format!("bench:{side}:one")
            }
        };
        let scripts = [
            (
                "minimal",
                call(
                    &minimal_sha,
                    &key("minimal"),
                    &["1".into(), "1000000".into()],
                ),
            ),
            ("sluice_full", call(&DECIDE.sha, &key("full"), &full_args)),
            ("sluice_lean", call(&GCRA_ONE.sha, &key("lean"), &lean_args)),
        ];
        let mut store_rounds = Rounds::default();
        let mut script_rounds: Vec<Rounds> = (0..scripts.len() * DEPTHS.len())
            .map(|_| Rounds::default())
            .collect();
        let mut requests = vec![50_000usize; script_rounds.len()];
        for _ in 0..ROUNDS {
            let cpu = cpu_seconds(pid);
            let started = Instant::now();
            let rate = runtime.block_on(decisions_per_second(
                &store,
                quota,
                keys.clone(),
                CALLERS,
                ROUND,
            ));
            let seconds = started.elapsed().as_secs_f64();
            store_rounds.push(rate * seconds, seconds, cpu_seconds(pid) - cpu);
            for (i, (depth, (_, call))) in DEPTHS
                .iter()
                .flat_map(|d| scripts.iter().map(move |s| (*d, s)))
                .enumerate()
            {
                let cpu = cpu_seconds(pid);
                let rate = benchmark_round(redis.port(), depth, count, requests[i], call);
                let cpu = cpu_seconds(pid) - cpu;
                script_rounds[i].push(requests[i] as f64, requests[i] as f64 / rate, cpu);
                // The next round lasts about ROUND.
                requests[i] = ((rate * ROUND.as_secs_f64()) as usize).max(10_000);
            }
        }
        store_rounds.print(&format!("{name}_store_callers_{CALLERS}"));
        for (i, rounds) in script_rounds.into_iter().enumerate() {
            let (depth, (script, _)) = (DEPTHS[i / scripts.len()], &scripts[i % scripts.len()]);
            rounds.print(&format!("{name}_evalsha_{script}_depth_{depth}"));
        }
    }
}
