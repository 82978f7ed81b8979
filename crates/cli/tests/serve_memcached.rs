//! Two `sluice serve` processes sharing one memcached enforce one limit exactly, and a pool
//! of three works the same.

mod support;

use sluice_testkit::MemcachedServer;
use support::{EACH_ALGORITHM, Server, assert_one_gcra_bucket, flood};

/// Compound rules beside [`EACH_ALGORITHM`].
const COMPOUND: &str = r#"
[policies.compound]
rule = "or(user:100/m, 1000/h)"
algorithm = "sliding-window"

[policies.both]
rule = "and(user:100/m, 150/h)"
"#;

/// 64 clients over two servers on one identifier of `100/m`: never more than 100 admitted
/// with the sliding window counter and every other algorithm (150 for `and(100/m, 150/h)`),
/// and, once the flood is over, exactly that many after a few more hits one at a time.
fn two_servers_one_limit(store_url: &str) {
    // A generous timeout: on a loaded machine a slow answer must not hand hits to the
    // failure mode (which decides locally), since the count is what is tested here.
    let store_url = format!("{store_url}?timeout_ms=5000");
    let store = ["--store", store_url.as_str()];
    let config = format!("{EACH_ALGORITHM}{COMPOUND}");
    let a = Server::start_with(&config, &store);
    let b = Server::start_with(&config, &store);
    // A third server on the same store that takes no part in the floods: its near cache
    // holds none of their refusals (see below).
    let c = Server::start_with(&config, &store);
    for (policy, limit) in [
        ("window", 100),
        ("log", 100),
        ("fixed", 100),
        ("compound", 100),
        ("both", 150),
    ] {
        let (flooded, _) = flood(&[&a, &b], 64, policy, 4);
        assert!(
            flooded <= limit,
            "policy {policy}: {flooded} admitted on {store_url}"
        );
        // memcached has no transactions: a hit counts itself with `incr` and gives its cost
        // back with `decr` when the total says no, so hits racing on one counter may all step
        // back below the limit, and a hit that reads the counter meanwhile sees their costs
        // in flight and is refused with a wait, which the flooding servers' near caches keep
        // for up to a second (CI once topped up 0 after a flood of 96). Once the flood is
        // over, nothing is in flight: hits one at a time through the third server take
        // exactly what is left.
        let mut topped = 0;
        while flood(&[&c], 1, policy, 1).0 == 1 {
            topped += 1;
            assert!(flooded + topped <= limit, "policy {policy}: over the limit");
        }
        let total = flooded + topped;
        assert_eq!(
            total, limit,
            "policy {policy} on {store_url}: {flooded} in the flood, {topped} after"
        );
        assert!(
            topped <= 8,
            "policy {policy}: {topped} refused below the limit"
        );
    }
    assert_one_gcra_bucket(&[&a, &b]);
}

#[test]
fn two_servers_share_one_memcached() {
    let memcached = MemcachedServer::start().expect("memcached");
    two_servers_one_limit(&memcached.url());
}

#[test]
fn two_servers_share_a_pool_of_three() {
    let pool = MemcachedServer::start_many(3).expect("memcached");
    two_servers_one_limit(&MemcachedServer::pool_url(&pool));
}

#[test]
fn a_bad_memcached_url_is_refused_at_start() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg("memcached://127.0.0.1:1?speed=fast")
        .output()
        .expect("run sluice");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown option `speed`"), "{stderr}");
}
