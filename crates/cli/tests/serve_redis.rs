//! Several `sluice serve` processes sharing one Redis (standalone, then a 3-master Cluster)
//! enforce one limit exactly, whatever their own clocks say.

mod support;

use sluice_testkit::{RedisCluster, RedisServer};
use support::{EACH_ALGORITHM, Server, assert_one_gcra_bucket, flood};

/// Compound rules beside [`EACH_ALGORITHM`].
const COMPOUND: &str = r#"
[policies.compound]
rule = "or(user:100/m, 1000/h)"
algorithm = "sliding-log"
"#;

/// libfaketime's multi-threaded library (Debian package `faketime`, installed by
/// scripts/test.sh), checked to move `date` a year ahead.
fn faketime_library() -> String {
    let library = std::fs::read_dir("/usr/lib")
        .expect("/usr/lib")
        .filter_map(|entry| {
            let path = entry.ok()?.path().join("faketime/libfaketimeMT.so.1");
            path.exists().then(|| path.to_string_lossy().into_owned())
        })
        .next()
        .expect("libfaketime is needed: apt-get install faketime");
    let year = |env: &[(&str, &str)]| {
        let out = std::process::Command::new("date")
            .arg("+%Y")
            .envs(env.iter().copied())
            .output()
            .unwrap();
        String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse::<i32>()
            .unwrap()
    };
    let ahead = year(&[("LD_PRELOAD", &library), ("FAKETIME", "+365d")]);
    assert!(ahead > year(&[]), "libfaketime moves the clock");
    library
}

/// 64 clients over two servers, one of them with its clock a year ahead, on one identifier
/// of `100/m`: exactly 100 admitted for every algorithm and a compound rule.
fn two_servers_one_limit(store_url: &str) {
    let library = faketime_library();
    // A generous timeout: on a loaded machine a slow answer must not hand hits to the
    // failure mode (which decides locally), since the shared count is what is tested here.
    let store_url = format!("{store_url}?timeout_ms=5000");
    let store = ["--store", store_url.as_str()];
    let config = format!("{EACH_ALGORITHM}{COMPOUND}");
    let a = Server::start_with(&config, &store);
    let ahead = [("LD_PRELOAD", library.as_str()), ("FAKETIME", "+365d")];
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
