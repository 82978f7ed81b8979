//! Decisions per second through the PostgreSQL store, beside the floor of one `SELECT 1`
//! round trip on the same pool and beside the Redis store, in one run: 50 concurrent
//! callers, single-leaf GCRA (the lean function, batched) on 1 key and on 100,000 keys, and a
//! sliding window (the full function) on 100,000 keys. Rounds alternate; medians of 3.
//! Run: `cargo bench -p sluice-postgres --bench throughput`.
//!
//! The PostgreSQL server is the test kit's (`fsync=off`, as on a machine whose disk write
//! cache absorbs commits; decisions still commit one transaction each), pool of 16
//! connections unless `SLUICE_BENCH_POOL` says otherwise (`SLUICE_BENCH_OPTIONS` adds store
//! URL options, e.g. `batch_senders=2`). The machine is shared with the
//! server: read the ratios, not the absolutes. Beside each PostgreSQL rate: the server's CPU
//! time (postmaster and backends, `/proc/PID/stat`) and this process's, per call, which the
//! machine's noise moves far less than a rate.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::{Algorithm, Leaf, Quota, Rate, Span, Unit};
use sluice_limiter::Identifier;
use sluice_postgres::PostgresStore;
use sluice_redis::RedisStore;
use sluice_testkit::bench::{calls_per_second, cpu_seconds, decisions_per_second, median};
use sluice_testkit::{PostgresServer, RedisServer};

const CALLERS: usize = 50;
const ROUND: Duration = Duration::from_secs(3);
const ROUNDS: usize = 3;
const KEYS_MANY: usize = 100_000;

/// `SELECT 1` per second from `callers` tasks on the store's pool.
async fn select_one_per_second(store: &PostgresStore, callers: usize, round: Duration) -> f64 {
    calls_per_second(callers, round, |_, round| {
        let store = store.clone();
        async move {
            while round.running() {
                store.round_trip().await.expect("SELECT 1");
                round.count();
            }
        }
    })
    .await
}

/// One scenario's PostgreSQL rounds: calls per second, and server and client CPU per call
/// (µs).
#[derive(Default, Clone)]
struct Rounds {
    per_s: Vec<f64>,
    server_us: Vec<f64>,
    client_us: Vec<f64>,
}

impl Rounds {
    /// Runs one round (answering calls per second), noting the CPU per call.
    async fn run(&mut self, server: &PostgresServer, round: impl Future<Output = f64>) -> f64 {
        let client = || cpu_seconds(None, false).expect("/proc/self/stat");
        let (server_before, client_before) = (server.cpu_seconds(), client());
        let started = Instant::now();
        let rate = round.await;
        let calls = rate * started.elapsed().as_secs_f64();
        self.per_s.push(rate);
        self.server_us
            .push((server.cpu_seconds() - server_before) * 1e6 / calls);
        self.client_us
            .push((client() - client_before) * 1e6 / calls);
        rate
    }

    /// `per_s=… server_us=… client_us=…`, medians.
    fn medians(&self) -> (f64, f64, f64) {
        (
            median(self.per_s.clone()),
            median(self.server_us.clone()),
            median(self.client_us.clone()),
        )
    }
}

fn keys(name: &str, count: usize, rate: &str) -> Arc<Vec<[Identifier; 1]>> {
    Arc::new(
        (0..count)
            .map(|i| {
                [Identifier::grouped(
                    &format!("bench:{name}:"),
                    &format!("user-{i}"),
                    rate,
                )]
            })
            .collect(),
    )
}

fn main() {
    let pool: usize = std::env::var("SLUICE_BENCH_POOL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let postgres = PostgresServer::start().expect("postgres (apt-get install postgresql)");
    let redis = RedisServer::start().expect("redis-server");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // More store URL options for an experiment: `SLUICE_BENCH_OPTIONS=batch_senders=2`.
    let extra = std::env::var("SLUICE_BENCH_OPTIONS").map_or(String::new(), |o| format!("&{o}"));
    let url = format!("{}?pool_size={pool}&timeout_ms=5000{extra}", postgres.url());
    let store = runtime
        .block_on(PostgresStore::connect(&url))
        .expect("connect");
    // A long timeout: on a loaded machine a decision may wait, and a bench must not fail.
    let redis_store = RedisStore::builder(&redis.url()).timeout(Duration::from_secs(5));
    let redis_store = runtime.block_on(redis_store.connect()).expect("redis");
    println!("postgres pool_size={pool} callers={CALLERS} round={ROUND:?} rounds={ROUNDS}");

    // 10^6 per second per key: every hit is admitted, so every side takes the write path.
    let rate = Rate::new(1_000_000, Span::new(1, Unit::Second).unwrap()).unwrap();
    let gcra = Quota::from_leaf(&Leaf::new(rate), Algorithm::Gcra).unwrap();
    let sliding = Quota::from_leaf(&Leaf::new(rate), Algorithm::SlidingWindow).unwrap();
    let scenarios = [
        ("gcra_keys_1", gcra, keys("g1", 1, ":1000000/s")),
        (
            "gcra_keys_100000",
            gcra,
            keys("gm", KEYS_MANY, ":1000000/s"),
        ),
        (
            "sliding_window_keys_100000",
            sliding,
            keys("sm", KEYS_MANY, ":1000000/s~sw"),
        ),
    ];
    let mut floor = Rounds::default();
    let mut results: Vec<(Rounds, Vec<f64>)> =
        vec![(Rounds::default(), Vec::new()); scenarios.len()];
    runtime.block_on(async {
        // Warm up: every key's row exists, every connection is open and has its statements.
        for (_, quota, keys) in &scenarios {
            decisions_per_second(
                &store,
                *quota,
                keys.clone(),
                CALLERS,
                Duration::from_secs(2),
            )
            .await;
        }
        select_one_per_second(&store, CALLERS, Duration::from_secs(1)).await;
        for round in 0..ROUNDS {
            floor
                .run(&postgres, select_one_per_second(&store, CALLERS, ROUND))
                .await;
            for (i, (name, quota, keys)) in scenarios.iter().enumerate() {
                let pg = decisions_per_second(&store, *quota, keys.clone(), CALLERS, ROUND);
                let pg = results[i].0.run(&postgres, pg).await;
                let rd =
                    decisions_per_second(&redis_store, *quota, keys.clone(), CALLERS, ROUND).await;
                println!("round {round}: {name} postgres={pg:.0}/s redis={rd:.0}/s");
                results[i].1.push(rd);
            }
        }
    });
    let (floor, floor_server, floor_client) = floor.medians();
    println!(
        "scenario=select_1_floor per_s={floor:.0} server_cpu_us={floor_server:.1} \
         client_cpu_us={floor_client:.1}"
    );
    for ((name, _, _), (pg, rd)) in scenarios.iter().zip(results) {
        let (pg, server, client) = pg.medians();
        println!(
            "scenario={name} postgres_per_s={pg:.0} of_floor={:.0}% server_cpu_us={server:.1} \
             client_cpu_us={client:.1} redis_per_s={:.0}",
            100.0 * pg / floor,
            median(rd)
        );
    }
}
