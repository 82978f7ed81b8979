//! Decisions per second through the memcached store (GCRA and the sliding window counter),
//! beside the Redis store (GCRA) on the same machine in the same run: 50 concurrent
//! callers, on 1 key and on 1,000,000 keys. Run:
//! `cargo bench -p sluice-memcached --bench throughput`.
//!
//! Every store gets the same runtime (2 worker threads) and the same callers; rounds
//! alternate between the stores and the medians are reported, since the machine is shared.
//! The quota admits 10^6 hits per second per key (3.6 * 10^9 per hour), so every hit takes
//! the write path.

use std::sync::Arc;
use std::time::Duration;

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

fn main() {
    // Room for a million identifiers (and their sub-window counters) without evictions.
    let memcached = MemcachedServer::start_with(&["-m", "2048", "-t", "4"]).expect("memcached");
    let redis = RedisServer::start().expect("redis-server");
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
    for (name, count) in [("keys_1", 1), ("keys_1000000", KEYS_MANY)] {
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
        let (mut mc_gcra, mut mc_window, mut rd_gcra) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            mc_gcra.push(runtime.block_on(decisions_per_second(
                &on_memcached,
                gcra,
                gcra_keys.clone(),
                CALLERS,
                ROUND,
            )));
            mc_window.push(runtime.block_on(decisions_per_second(
                &on_memcached,
                window,
                window_keys.clone(),
                CALLERS,
                ROUND,
            )));
            rd_gcra.push(runtime.block_on(decisions_per_second(
                &on_redis,
                gcra,
                gcra_keys.clone(),
                CALLERS,
                ROUND,
            )));
        }
        println!(
            "scenario={name}_callers_{CALLERS} memcached_gcra_per_s={:.0} \
             memcached_sliding_window_per_s={:.0} redis_gcra_per_s={:.0}",
            median(mc_gcra),
            median(mc_window),
            median(rd_gcra)
        );
    }
    let stats = on_memcached.stats();
    println!(
        "memcached_store_stats evictions={} contention_retries={} contention_exhausted={}",
        stats.evictions, stats.contention_retries, stats.contention_exhausted
    );
}
