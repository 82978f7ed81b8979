//! Decisions per second through the Redis store, beside `redis-benchmark` running EVALSHA of
//! a minimal GCRA script on the same server, in one run: 50 concurrent callers, on 1 key and
//! on 1,000,000 keys. Run: `cargo bench -p sluice-redis --bench throughput`.
//!
//! Both sides keep 50 requests in flight: redis-benchmark over 50 connections, the store over
//! its one multiplexed connection (so its requests are pipelined). Rounds alternate and the
//! medians are reported, since the machine is shared.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::{Leaf, Quota, Rate, Span, Unit};
use sluice_limiter::Identifier;
use sluice_redis::RedisStore;
use sluice_testkit::RedisServer;
use sluice_testkit::bench::{decisions_per_second, median};

const CALLERS: usize = 50;
const ROUND: Duration = Duration::from_secs(3);
const ROUNDS: usize = 3;
const KEYS_MANY: usize = 1_000_000;

/// One round of redis-benchmark: EVALSHA of the minimal script, 50 clients.
fn ceiling_round(port: u16, sha: &str, keys: usize, requests: usize) -> f64 {
    let mut command = Command::new("redis-benchmark");
    command.args([
        "-p",
        &port.to_string(),
        "-c",
        &CALLERS.to_string(),
        "-n",
        &requests.to_string(),
        "-q",
    ]);
    let key = if keys > 1 {
        command.args(["-r", &keys.to_string()]);
        "bench:ceiling:__rand_int__"
    } else {
        "bench:ceiling:one"
    };
    command.args(["EVALSHA", sha, "1", key, "1", "1000000"]);
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

fn main() {
    let redis = RedisServer::start().expect("redis-server (apt-get install redis-server)");
    let sha = redis
        .cli(&["SCRIPT", "LOAD", include_str!("minimal_gcra.lua")])
        .expect("load the minimal script")
        .trim()
        .to_owned();
    // 10^6 per second per key: every hit is admitted, so both sides take the write path.
    let rate = Rate::new(1_000_000, Span::new(1, Unit::Second).unwrap()).unwrap();
    let quota = Quota::from_leaf(&Leaf::new(rate), sluice_core::Algorithm::Gcra).unwrap();

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
        let (mut ours, mut ceiling) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let rate = runtime.block_on(decisions_per_second(
                &store,
                quota,
                keys.clone(),
                CALLERS,
                ROUND,
            ));
            ours.push(rate);
            let requests = (rate * ROUND.as_secs_f64()) as usize;
            ceiling.push(ceiling_round(
                redis.port(),
                &sha,
                count,
                requests.max(10_000),
            ));
        }
        let (ours, ceiling) = (median(ours), median(ceiling));
        println!(
            "scenario={name}_callers_{CALLERS} sluice_per_s={ours:.0} evalsha_ceiling_per_s={ceiling:.0} ratio={:.3}",
            ours / ceiling
        );
    }
}
