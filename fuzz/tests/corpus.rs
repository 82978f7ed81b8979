//! Replays every committed input (`fuzz/corpus/TARGET/*`, the seeds and what the fuzzer
//! found) through its target, so a regression in any parser fails `cargo test`.

use std::path::Path;

use sluice_fuzz::Target;

fn replay(target: Target) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target.name());
    let mut inputs: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    inputs.sort();
    assert!(!inputs.is_empty(), "{} holds no inputs", dir.display());
    for path in inputs {
        let data = std::fs::read(&path).expect("a corpus file");
        if let Err(panic) = std::panic::catch_unwind(|| target.run(&data)) {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            panic!("{}: {message}", path.display());
        }
    }
}

#[test]
fn rule() {
    replay(Target::Rule);
}

#[test]
fn config() {
    replay(Target::Config);
}

#[test]
fn envoy_config() {
    replay(Target::EnvoyConfig);
}

#[test]
fn resp() {
    replay(Target::Resp);
}

#[test]
fn http() {
    replay(Target::Http);
}

#[test]
fn memcached_reply() {
    replay(Target::MemcachedReply);
}

#[test]
fn store_url() {
    replay(Target::StoreUrl);
}

#[test]
fn redis_reply() {
    replay(Target::RedisReply);
}

#[test]
fn tower() {
    replay(Target::Tower);
}
