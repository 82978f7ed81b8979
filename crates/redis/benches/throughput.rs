//! Decisions per second and Redis CPU per decision through the Redis store, beside
//! `redis-benchmark` running EVALSHA of a minimal GCRA script and of sluice's own scripts on
//! the same server, in one run: single-leaf GCRA, 50 concurrent callers, on 1 key and on
//! 1,000,000 keys, redis-benchmark at pipeline depth 1 and 16.
//! One caller deciding alone (a task on the runtime's one worker) gives the latency figures
//! (p50 and p99 of each decision), the server's script call count how many decisions the
//! store batched per call, and this process's own CPU time (user + system) what a decision
//! costs the client: with Redis's, whether either side is saturated.
//! Run: `cargo bench -p sluice-redis --bench throughput`.
//!
//! With `SLUICE_BENCH_REDIS_CELL=/path/to/libredis_cell.so` (redis-cell built outside the
//! repository), a second redis-server loads that module and `CL.THROTTLE` runs under
//! redis-benchmark beside the scripts, pinned to the same core. `SLUICE_BENCH_SCRIPTS=
//! sluice_lean_batch_16,redis_cell_throttle` (names as in the output) runs only those beside
//! the store. `SLUICE_BENCH_ALGORITHM=fixed-window` (or `sliding-window`, 10 sub-windows, or
//! `sliding-log`) makes the store's leaf a fixed window (a sliding window, a sliding log);
//! `gcra-or` gives the store a rule of two GCRA leaves joined by `;`, the user's and one every hit shares (a global
//! limit of 1,000,000,000 a second), `fixed-or` (`sliding-or`) the same of two fixed-window
//! (sliding-window) leaves, `log-or` of two sliding-log leaves (the global one 1,000,000 a
//! second, a log's largest limit); the scripts beside it stay single-leaf GCRA's.
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
use sluice_limiter::{Identifier, Store};
use sluice_redis::RedisStore;
use sluice_redis::script::{
    ALGORITHMS_LUA, DECIDE, GCRA_BATCH, LeanGcra, arguments, batch_arguments, gcra_one_arguments,
};
use sluice_testkit::RedisServer;
use sluice_testkit::bench::{BenchRule, median, rule_decisions_per_second};

const CALLERS: usize = 50;
const ROUND: Duration = Duration::from_secs(3);
const ROUNDS: usize = 3;
const KEYS_MANY: usize = 1_000_000;
const DEPTHS: [usize; 2] = [1, 16];

/// The redis-server's CPU time so far (user + system), in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    sluice_testkit::bench::cpu_seconds(Some(pid), false).expect("/proc/PID/stat")
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

/// Latencies of one caller deciding alone for `round`, in microseconds: (p50, p99).
async fn one_caller_latency(
    store: &RedisStore,
    rule: &BenchRule,
    keys: &[Vec<Identifier>],
    round: Duration,
) -> (f64, f64) {
    let mut latencies = Vec::new();
    let started = Instant::now();
    let mut i = 0usize;
    while started.elapsed() < round {
        let hit = rule.hit(&keys[i % keys.len()]);
        let sent = Instant::now();
        let decision = store.decide(&hit).await.expect("a decision");
        latencies.push(sent.elapsed().as_secs_f64() * 1e6);
        assert!(decision.allowed(), "the quota admits all");
        i = i.wrapping_add(7919);
    }
    latencies.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99))
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
    let pin = |pid: u32| {
        Command::new("taskset")
            .args(["-cp", "1", &pid.to_string()])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    println!("redis-server pid {pid}, pinned to core 1: {}", pin(pid));
    // redis-cell, only when built outside the repository and named.
    let cell = std::env::var("SLUICE_BENCH_REDIS_CELL").ok().map(|module| {
        let server = RedisServer::start_with(&["--loadmodule", &module])
            .expect("redis-server with the redis-cell module");
        let cell_pid = server.pid().expect("pid");
        println!(
            "redis-cell server pid {cell_pid}, pinned to core 1: {}",
            pin(cell_pid)
        );
        server
    });
    let minimal_sha = redis
        .cli(&["SCRIPT", "LOAD", include_str!("minimal_gcra.lua")])
        .expect("load the minimal script")
        .trim()
        .to_owned();
    for lua in [&*DECIDE, &*GCRA_BATCH] {
        redis.cli(&["SCRIPT", "LOAD", lua.source]).expect("load");
    }
    // The full script as a Redis 7 Function: the library is defined once, at FUNCTION LOAD,
    // not on every call as EVALSHA does. `run` reads KEYS and ARGV, made upvalues here.
    let library = format!(
        "#!lua name=sluice_bench\nlocal KEYS, ARGV\n{ALGORITHMS_LUA}\n\
         redis.register_function('sluice_bench_decide', function(keys, args)\n\
         KEYS, ARGV = keys, args\n\
         local time = redis.call('TIME')\n\
         return run(tonumber(time[1]) * 1000000 + tonumber(time[2]))\nend)\n"
    );
    redis
        .cli(&["FUNCTION", "LOAD", "REPLACE", &library])
        .expect("FUNCTION LOAD");
    // 10^6 per second per key: every hit is admitted, so every side takes the write path.
    let rate = Rate::new(1_000_000, Span::new(1, Unit::Second).unwrap()).unwrap();
    let quota = Quota::from_leaf(&Leaf::new(rate), sluice_core::Algorithm::Gcra).unwrap();
    // `SLUICE_BENCH_ALGORITHM=fixed-window`, `sliding-window` or `sliding-log`: the store
    // decides with a leaf of that algorithm and the same rate (1,000,000 a 1 s window; a
    // sliding window in its default 10 sub-windows; a sliding log holds a member per hit of
    // the last second, so one key's grows to about as many as the bench decides a second)
    // instead; `gcra-or` (`fixed-or`, `sliding-or`, `log-or`): with the GCRA (fixed-window,
    // sliding-window, sliding-log) leaf joined by `;` to a global one every hit shares. redis-benchmark's scripts stay single-leaf GCRA's.
    let algorithm = std::env::var("SLUICE_BENCH_ALGORITHM");
    let of = |algorithm| Quota::from_leaf(&Leaf::new(rate), algorithm).unwrap();
    let store_rule = Arc::new(match algorithm.as_deref() {
        Err(_) | Ok("gcra") => BenchRule::one_leaf(quota),
        Ok("fixed-window") => BenchRule::one_leaf(of(sluice_core::Algorithm::FixedWindow)),
        Ok("sliding-window") => BenchRule::one_leaf(of(sluice_core::Algorithm::SlidingWindow)),
        Ok("sliding-log") => BenchRule::one_leaf(of(sluice_core::Algorithm::SlidingLog)),
        Ok(rule @ ("gcra-or" | "fixed-or" | "sliding-or" | "log-or")) => {
            let algorithm = match rule {
                "gcra-or" => sluice_core::Algorithm::Gcra,
                "fixed-or" => sluice_core::Algorithm::FixedWindow,
                "log-or" => sluice_core::Algorithm::SlidingLog,
                _ => sluice_core::Algorithm::SlidingWindow,
            };
            // A log holds at most 1,000,000 (`MAX_LOG_LIMIT`).
            let most = if rule == "log-or" {
                1_000_000
            } else {
                1_000_000_000
            };
            let global = Rate::new(most, Span::new(1, Unit::Second).unwrap()).unwrap();
            let global = Quota::from_leaf(&Leaf::new(global), algorithm).unwrap();
            BenchRule::or(vec![of(algorithm), global])
        }
        Ok(other) => panic!(
            "SLUICE_BENCH_ALGORITHM: gcra, fixed-window, sliding-window, sliding-log, gcra-or, \
             fixed-or, sliding-or or log-or, not {other:?}"
        ),
    });
    let shared = matches!(
        algorithm.as_deref(),
        Ok("gcra-or" | "fixed-or" | "sliding-or" | "log-or")
    );

    // The calls the store makes, as redis-benchmark arguments.
    let placeholder = [Identifier::new("x")];
    let rule = BenchRule::one_leaf(quota);
    let hit = rule.hit(&placeholder);
    let full_args = arguments(&hit, 1).unwrap();
    let lean_args = gcra_one_arguments(&hit)
        .unwrap()
        .expect("a one-leaf GCRA hit");
    let lean_one = LeanGcra::of(&hit).unwrap().expect("a lean hit").arguments();
    let call = |sha: &str, key: &str, args: &[String]| -> Vec<String> {
        let mut call = vec!["EVALSHA".into(), sha.into(), "1".into(), key.into()];
        call.extend(args.iter().cloned());
        call
    };
    // The lean script deciding `n` hits in one call.
    let batch = |key: &str, n: usize| -> Vec<String> {
        let mut call = vec!["EVALSHA".into(), GCRA_BATCH.sha.clone(), n.to_string()];
        call.extend((0..n).map(|_| key.to_owned()));
        call.extend(
            batch_arguments((0..n).map(|_| lean_one))
                .iter()
                .map(u64::to_string),
        );
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
        let keys: Arc<Vec<Vec<Identifier>>> = Arc::new(
            (0..count)
                .map(|i| {
                    let user = Identifier::grouped(
                        &format!("bench:{name}:"),
                        &format!("user-{i}"),
                        ":1000000/s",
                    );
                    let global = Identifier::new(format!("bench:{name}:1000000000/s"));
                    [user].into_iter().chain(shared.then_some(global)).collect()
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
            ("sluice_full_fcall", {
                let mut fcall = call("", &key("fcall"), &full_args);
                fcall[0] = "FCALL".into();
                fcall[1] = "sluice_bench_decide".into();
                fcall
            }),
            (
                "sluice_lean",
                call(&GCRA_BATCH.sha, &key("lean"), &lean_args),
            ),
        ];
        // (name, command, server, decisions per command): redis-cell runs on its own server.
        let mut scripts: Vec<(&str, Vec<String>, &RedisServer, usize)> = scripts
            .into_iter()
            .map(|(name, call)| (name, call, &redis, 1))
            .collect();
        scripts.push(("sluice_lean_batch_16", batch(&key("batch"), 16), &redis, 16));
        if let Some(cell) = &cell {
            let throttle = ["CL.THROTTLE", &key("cell"), "1000000", "1000000", "1", "1"];
            scripts.push((
                "redis_cell_throttle",
                throttle.iter().map(|s| s.to_string()).collect(),
                cell,
                1,
            ));
        }
        // `SLUICE_BENCH_SCRIPTS=name,name` runs only those beside the store (a shorter run).
        if let Ok(only) = std::env::var("SLUICE_BENCH_SCRIPTS") {
            scripts.retain(|(name, ..)| only.split(',').any(|o| o == *name));
        }
        let mut store_rounds = Rounds::default();
        let (mut p50s, mut p99s) = (Vec::new(), Vec::new());
        let mut batch_sizes = Vec::new();
        let mut script_rounds: Vec<Rounds> = (0..scripts.len() * DEPTHS.len())
            .map(|_| Rounds::default())
            .collect();
        let mut requests = vec![50_000usize; script_rounds.len()];
        let mut client_us = Vec::new();
        for _ in 0..ROUNDS {
            let cpu = cpu_seconds(pid);
            let own = sluice_testkit::bench::cpu_seconds(None, false).expect("/proc/self/stat");
            let calls = redis.script_calls();
            let started = Instant::now();
            let rate = runtime.block_on(rule_decisions_per_second(
                &store,
                store_rule.clone(),
                keys.clone(),
                CALLERS,
                ROUND,
            ));
            let seconds = started.elapsed().as_secs_f64();
            store_rounds.push(rate * seconds, seconds, cpu_seconds(pid) - cpu);
            let own =
                sluice_testkit::bench::cpu_seconds(None, false).expect("/proc/self/stat") - own;
            client_us.push(own * 1e6 / (rate * seconds));
            batch_sizes.push(rate * seconds / (redis.script_calls() - calls) as f64);
            // The caller runs on the runtime's worker, as a request handler would: on this
            // thread every answer would wake it across threads, which is the machine's cost.
            let caller = {
                let (store, keys, rule) = (store.clone(), keys.clone(), store_rule.clone());
                runtime.spawn(async move { one_caller_latency(&store, &rule, &keys, ROUND).await })
            };
            let (p50, p99) = runtime.block_on(caller).expect("the lone caller");
            p50s.push(p50);
            p99s.push(p99);
            for (i, (depth, (_, call, server, per_call))) in DEPTHS
                .iter()
                .flat_map(|d| scripts.iter().map(move |s| (*d, s)))
                .enumerate()
            {
                let server_pid = server.pid().expect("pid");
                let cpu = cpu_seconds(server_pid);
                let rate = benchmark_round(server.port(), depth, count, requests[i], call);
                let cpu = cpu_seconds(server_pid) - cpu;
                let decisions = (requests[i] * per_call) as f64;
                script_rounds[i].push(decisions, requests[i] as f64 / rate, cpu);
                // The next round lasts about ROUND.
                requests[i] = ((rate * ROUND.as_secs_f64()) as usize).max(10_000);
            }
        }
        store_rounds.print(&format!("{name}_store_callers_{CALLERS}"));
        println!(
            "scenario={name}_store_callers_{CALLERS} decisions_per_script_call={:.1} client_cpu_us_per_decision={:.2}",
            median(batch_sizes),
            median(client_us)
        );
        println!(
            "scenario={name}_store_one_caller p50_us={:.1} p99_us={:.1}",
            median(p50s),
            median(p99s)
        );
        for (i, rounds) in script_rounds.into_iter().enumerate() {
            let (depth, (script, _, _, _)) =
                (DEPTHS[i / scripts.len()], &scripts[i % scripts.len()]);
            rounds.print(&format!("{name}_evalsha_{script}_depth_{depth}"));
        }
    }
}
