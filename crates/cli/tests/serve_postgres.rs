//! Two `sluice serve` processes sharing one PostgreSQL enforce one limit exactly, whatever
//! their own clocks say: one of them runs two hours ahead (libfaketime), and decisions use
//! the database's clock.

mod support;

use sluice_testkit::PostgresServer;
use support::{EACH_ALGORITHM, Server, assert_one_gcra_bucket, faketime_library, flood};

/// A compound rule beside [`EACH_ALGORITHM`].
const COMPOUND: &str = r#"
[policies.compound]
rule = "or(user:100/m, 1000/h)"
algorithm = "sliding-log"
"#;

/// 64 clients over two servers, one with its clock 2 h ahead, on one identifier of `100/m`:
/// exactly 100 admitted for every algorithm and a compound rule.
#[test]
fn two_servers_share_one_postgres() {
    let postgres = PostgresServer::start().expect("postgres");
    let library = faketime_library(7_200);
    // A generous timeout: on a loaded machine a slow answer must not hand hits to the
    // failure mode, since the shared count is what is tested here.
    let store_url = format!("{}?timeout_ms=5000&pool_size=8", postgres.url());
    let store = ["--store", store_url.as_str()];
    let config = format!("{EACH_ALGORITHM}{COMPOUND}");
    let a = Server::start_with(&config, &store);
    let ahead = [("LD_PRELOAD", library.as_str()), ("FAKETIME", "+7200")];
    let b = Server::start_with_env(&config, &ahead, &store);
    for policy in ["window", "log", "fixed", "compound"] {
        let (admitted, _) = flood(&[&a, &b], 64, policy, 4);
        assert_eq!(admitted, 100, "policy {policy}");
    }
    assert_one_gcra_bucket(&[&a, &b]);
}
