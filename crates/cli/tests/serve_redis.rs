//! Several `sluice serve` processes sharing one Redis (standalone, then a 3-master Cluster)
//! enforce one limit exactly, whatever their own clocks say.

mod support;

use sluice_testkit::{RedisCluster, RedisServer};
use support::{EACH_ALGORITHM, Server, assert_one_gcra_bucket, faketime_library, flood};

/// Compound rules beside [`EACH_ALGORITHM`].
const COMPOUND: &str = r#"
[policies.compound]
rule = "or(user:100/m, 1000/h)"
algorithm = "sliding-log"
"#;

/// 64 clients over two servers, one of them with its clock a year ahead, on one identifier
/// of `100/m`: exactly 100 admitted for every algorithm and a compound rule.
fn two_servers_one_limit(store_url: &str) {
    let library = faketime_library(365 * 86_400);
    // A generous timeout: on a loaded machine a slow answer must not hand hits to the
    // failure mode (which decides locally), since the shared count is what is tested here.
    let store_url = format!("{store_url}?timeout_ms=5000");
    let store = ["--store", store_url.as_str()];
    let config = format!("{EACH_ALGORITHM}{COMPOUND}");
    let a = Server::start_with(&config, &store);
    let ahead = [("LD_PRELOAD", library.as_str()), ("FAKETIME", "+31536000")];
    let b = Server::start_with_env(&config, &ahead, &store);
    for policy in ["window", "log", "fixed", "compound"] {
        let (admitted, _) = flood(&[&a, &b], 64, policy, 4);
        assert_eq!(admitted, 100, "policy {policy} on {store_url}");
    }
    assert_one_gcra_bucket(&[&a, &b]);
}

#[test]
fn two_servers_share_one_redis() {
    let redis = RedisServer::start().expect("redis-server");
    two_servers_one_limit(&redis.url());
}

#[test]
fn two_servers_share_one_redis_cluster() {
    let cluster = RedisCluster::start(3).expect("redis cluster");
    two_servers_one_limit(&cluster.url());
}

/// Script calls Redis has run (`EVALSHA`, `EVAL`, `FCALL` and their read-only forms).
fn script_calls(redis: &RedisServer) -> u64 {
    let stats = redis.cli(&["INFO", "commandstats"]).expect("INFO");
    stats
        .lines()
        .filter(|line| {
            [
                "evalsha",
                "eval",
                "fcall",
                "evalsha_ro",
                "eval_ro",
                "fcall_ro",
            ]
            .iter()
            .any(|command| line.starts_with(&format!("cmdstat_{command}:")))
        })
        .filter_map(|line| {
            let calls = line.split("calls=").nth(1)?.split(',').next()?;
            calls.parse::<u64>().ok()
        })
        .sum()
}

/// A global limit with `prefetch` over four servers on one Redis: never more admitted than
/// the limit, and the store asked at most once per 50 decisions.
#[test]
fn four_servers_prefetch_a_hot_limit_from_one_redis() {
    let redis = RedisServer::start().expect("redis-server");
    let store_url = format!("{}?timeout_ms=5000", redis.url());
    let config = r#"
[policies.hot]
rule = "user:2000/h prefetch=100"
"#;
    let servers: Vec<Server> = (0..4)
        .map(|_| Server::start_with(config, &["--store", &store_url]))
        .collect();
    let before = script_calls(&redis);
    let (admitted, seconds) = flood(&servers.iter().collect::<Vec<_>>(), 64, "hot", 50);
    let calls = script_calls(&redis) - before;
    let decisions = 64 * 50;
    // The hour's 2,000 from a full bucket, plus one per 1.8 s that refilled meanwhile.
    let most = 2_000 + (seconds / 1.8).floor() as usize + 1;
    assert!(
        admitted <= most,
        "{admitted} admitted in {seconds:.2}s, at most {most}"
    );
    // Blocks expire after 1 s: each server may leave 99 unspent per second of the flood.
    let least = 2_000 - 4 * 99 * (seconds.ceil() as usize + 1);
    assert!(
        admitted >= least.min(2_000),
        "{admitted} admitted, at least {least}"
    );
    assert!(
        calls * 50 <= decisions as u64,
        "{calls} script calls for {decisions} decisions"
    );
    eprintln!(
        "prefetch over 4 servers: {decisions} decisions, {admitted} admitted, {calls} script calls, {seconds:.2}s"
    );
}
