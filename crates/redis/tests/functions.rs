//! The full script as Redis 7 Functions: loaded once, called by FCALL, reloaded when the
//! server loses it, and replaced by EVALSHA where the server has no Functions.

use std::sync::Arc;

use sluice_limiter::{Limiter, Policy};
use sluice_redis::RedisStore;
use sluice_testkit::RedisServer;
use sluice_testkit::load::checks;

/// Calls of `command` Redis ran without error so far (`INFO commandstats`: `calls` counts
/// an FCALL answered "Function not found" too, and `failed_calls` those).
fn calls(server: &RedisServer, command: &str) -> u64 {
    let info = server.cli(&["INFO", "commandstats"]).expect("INFO");
    let prefix = format!("cmdstat_{command}:");
    let Some(stats) = info.lines().find_map(|line| line.strip_prefix(&prefix)) else {
        return 0;
    };
    let field = |name: &str| -> u64 {
        stats
            .split(',')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
            .unwrap_or(0)
    };
    field("calls") - field("failed_calls")
}

async fn limiter(url: &str) -> Arc<Limiter> {
    let store = RedisStore::builder(url)
        .timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .expect("connect");
    // A rule of more than 8 leaves is no lean shape: it goes through the full script.
    let rule = [
        "user:300/h",
        "user:100000/d",
        "user:100001/d",
        "user:100002/d",
        "user:100003/d",
        "user:100004/d",
        "user:100005/d",
        "user:100006/d",
        "user:100007/d",
    ]
    .join("; ");
    let policy = Policy::new("wide", &rule).unwrap();
    Arc::new(Limiter::builder(store).policy(policy).build().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn functions_flushed_mid_load_are_reloaded_and_lose_no_decision() {
    let redis = RedisServer::start().expect("redis-server");
    let limiter = limiter(&redis.url()).await;
    let flusher = {
        let port = redis.port().to_string();
        tokio::task::spawn_blocking(move || {
            for _ in 0..20 {
                let status = std::process::Command::new("redis-cli")
                    .args(["-p", &port, "FUNCTION", "FLUSH"])
                    .output()
                    .expect("redis-cli");
                assert!(status.status.success());
            }
        })
    };
    let answers = checks(&limiter, "wide", "flushed", 16, 25).await;
    flusher.await.unwrap();
    assert!(answers.iter().all(|(c, _)| c.without_store.is_none()));
    let admitted = answers.iter().filter(|(c, _)| c.decision.allowed()).count();
    assert_eq!(
        admitted, 300,
        "exactly the limit, the library reloaded as needed"
    );
    assert!(calls(&redis, "fcall") >= 300, "the decisions went by FCALL");
    assert_eq!(calls(&redis, "evalsha"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_fcall_is_sent_evalsha() {
    // FCALL renamed away: the server answers as one before Redis 7 does.
    let redis = RedisServer::start_with(&["--rename-command", "FCALL", ""]).expect("redis");
    let limiter = limiter(&redis.url()).await;
    let answers = checks(&limiter, "wide", "old", 4, 100).await;
    assert!(answers.iter().all(|(c, _)| c.without_store.is_none()));
    let admitted = answers.iter().filter(|(c, _)| c.decision.allowed()).count();
    assert_eq!(admitted, 300);
    assert!(
        calls(&redis, "evalsha") >= 300,
        "the decisions went by EVALSHA"
    );
}
