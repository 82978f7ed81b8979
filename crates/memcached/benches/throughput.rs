//! Decisions per second through the memcached store (GCRA and the sliding window counter),
//! beside the Redis store (GCRA) on the same machine in the same run: 50 concurrent
//! callers, on 1 key and on 1,000,000 keys. Run:
//! `cargo bench -p sluice-memcached --bench throughput`.
//!
//! Every store gets the same runtime (2 worker threads) and the same callers; rounds
//! alternate between the stores and the medians are reported, since the machine is shared.
//! The quota admits 10^6 hits per second per key (3.6 * 10^9 per hour), so every hit takes
//! the write path.
//!
//! Beside each rate: the CPU time (user + system, from `/proc/PID/stat`) per decision of
//! memcached (`mc_cpu_us`) and of this process (`client_cpu_us`, the store's own code plus
//! the callers), figures that the noise of a shared machine moves less than the rate.
//!
//! For a profile of one case: `SLUICE_BENCH_ONLY=memcached_sliding_window` (or
//! `memcached_gcra`, `redis_gcra`) runs that store alone, and `SLUICE_BENCH_KEYS=1000000`
//! (or `1`) that key count alone; the others print nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::{Algorithm, Leaf, Quota, Rate, Span, Unit};
use sluice_limiter::Identifier;
use sluice_memcached::MemcachedStore;
use sluice_redis::RedisStore;
use sluice_testkit::MemcachedServer;
use sluice_testkit::RedisServer;
use sluice_testkit::bench::{decisions_per_second, median};

const CALLERS: usize = 50;
const ROUND: Duration = Duration::from_secs(2);
const ROUNDS: usize = 3;
const KEYS_MANY: usize = 1_000_000;

/// A process's CPU time so far (user + system), in seconds; `None` is this process.
fn cpu_seconds(pid: Option<u32>) -> f64 {
    sluice_testkit::bench::cpu_seconds(pid, false).expect("/proc/PID/stat")
}

/// The medians of one store's rounds.
#[derive(Default)]
struct Rounds {
    per_s: Vec<f64>,
    server_cpu_us: Vec<f64>,
    client_cpu_us: Vec<f64>,
}

impl Rounds {
    /// Runs `round` (which answers decisions per second), noting the CPU of `server` and of
    /// this process per decision.
    fn run(&mut self, server: Option<u32>, round: impl FnOnce() -> f64) {
        let (server_before, client_before) =
            (server.map(|p| cpu_seconds(Some(p))), cpu_seconds(None));
        let started = Instant::now();
        let rate = round();
        let decisions = rate * started.elapsed().as_secs_f64();
        let client = cpu_seconds(None) - client_before;
        self.per_s.push(rate);
        self.client_cpu_us.push(client * 1e6 / decisions);
        if let (Some(pid), Some(before)) = (server, server_before) {
            self.server_cpu_us
                .push((cpu_seconds(Some(pid)) - before) * 1e6 / decisions);
        }
    }

    fn show(&self, name: &str, server: &str) -> String {
        let mut line = format!("{name}_per_s={:.0}", median(self.per_s.clone()));
        if !self.server_cpu_us.is_empty() {
            let cpu = median(self.server_cpu_us.clone());
            line += &format!(" {name}_{server}_cpu_us={cpu:.2}");
        }
        line + &format!(
            " {name}_client_cpu_us={:.2}",
            median(self.client_cpu_us.clone())
        )
    }
}

fn main() {
    // Room for a million identifiers (and their sub-window counters) without evictions.
    let memcached = MemcachedServer::start_with(&["-m", "2048", "-t", "4"]).expect("memcached");
    let redis = RedisServer::start().expect("redis-server");
    let (mc_pid, redis_pid) = (memcached.pid(), redis.pid());
    // 10^6 per second, counted per hour: sub-windows of 6 minutes, so few hits fall within
    // the clock-skew margin of a boundary (where the window pays one more round trip).
    let rate = Rate::new(3_600_000_000, Span::new(1, Unit::Hour).unwrap()).unwrap();
    let gcra = Quota::from_leaf(&Leaf::new(rate), Algorithm::Gcra).unwrap();
    let window = Quota::from_leaf(&Leaf::new(rate), Algorithm::SlidingWindow).unwrap();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let timeout = Duration::from_secs(5);
    let on_memcached = runtime
        .block_on(
            MemcachedStore::builder(&memcached.url())
                .timeout(timeout)
                .connect(),
        )
        .expect("connect to memcached");
    let on_redis = runtime
        .block_on(RedisStore::builder(&redis.url()).timeout(timeout).connect())
        .expect("connect to redis");
    let only = std::env::var("SLUICE_BENCH_ONLY").ok();
    let runs = |store: &str| only.as_deref().is_none_or(|only| only == store);
    let keys_only: Option<usize> = std::env::var("SLUICE_BENCH_KEYS")
        .ok()
        .map(|n| n.parse().expect("SLUICE_BENCH_KEYS: a key count"));
    for (name, count) in [("keys_1", 1), ("keys_1000000", KEYS_MANY)] {
        if keys_only.is_some_and(|only| only != count) {
            continue;
        }
        let keys = |algorithm: &str| -> Arc<Vec<[Identifier; 1]>> {
            Arc::new(
                (0..count)
                    .map(|i| {
                        [Identifier::grouped(
                            &format!("bench:{name}:{algorithm}:"),
                            &format!("user-{i}"),
                            ":3600000000/h",
                        )]
                    })
                    .collect(),
            )
        };
        let (gcra_keys, window_keys) = (keys("gcra"), keys("window"));
        let (mut mc_gcra, mut mc_window, mut rd_gcra) =
            (Rounds::default(), Rounds::default(), Rounds::default());
        for _ in 0..ROUNDS {
            if runs("memcached_gcra") {
                mc_gcra.run(mc_pid, || {
                    runtime.block_on(decisions_per_second(
                        &on_memcached,
                        gcra,
                        gcra_keys.clone(),
                        CALLERS,
                        ROUND,
                    ))
                });
            }
            if runs("memcached_sliding_window") {
                mc_window.run(mc_pid, || {
                    runtime.block_on(decisions_per_second(
                        &on_memcached,
                        window,
                        window_keys.clone(),
                        CALLERS,
                        ROUND,
                    ))
                });
            }
            if runs("redis_gcra") {
                rd_gcra.run(redis_pid, || {
                    runtime.block_on(decisions_per_second(
                        &on_redis,
                        gcra,
                        gcra_keys.clone(),
                        CALLERS,
                        ROUND,
                    ))
                });
            }
        }
        let shown: Vec<String> = [
            (&mc_gcra, "memcached_gcra", "mc"),
            (&mc_window, "memcached_sliding_window", "mc"),
            (&rd_gcra, "redis_gcra", "redis"),
        ]
        .into_iter()
        .filter(|(rounds, _, _)| !rounds.per_s.is_empty())
        .map(|(rounds, name, server)| rounds.show(name, server))
        .collect();
        println!("scenario={name}_callers_{CALLERS} {}", shown.join(" "));
    }
    let stats = on_memcached.stats();
    println!(
        "memcached_store_stats evictions={} contention_retries={} contention_exhausted={}",
        stats.evictions, stats.contention_retries, stats.contention_exhausted
    );
}
