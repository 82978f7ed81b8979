//! `--store URL`: which store `sluice serve` runs on.
//!
//! - `memory://` or `memory://?max_identifiers=N`: this process's memory.
//! - `redis://[user:pass@]host:port[/db][?timeout_ms=N]`, `rediss://...` (TLS),
//!   `redis+cluster://host:port,host:port,...` (and `rediss+cluster://`): shared Redis.
//!   `timeout_ms` (default 250) bounds each decision; past it the policy's failure mode
//!   decides. Other query parameters go to the Redis client as they are.
//! - `memcached://host:port,host:port,...[?timeout_ms=N&connect_timeout_ms=N&connections=N&down_ms=N&skew_ms=N]`:
//!   a pool of memcached servers (consistent hashing; a failed server is skipped for
//!   `down_ms`, default 2000). Decisions use this process's clock: keep servers on NTP
//!   (`skew_ms`, default 250, is the clock difference the sliding window allows for).
//! - `postgres://[user:pass@]host:port/db[?pool_size=N&timeout_ms=N&schema=NAME&unlogged=true&sslmode=...]`
//!   (or `postgresql://`): PostgreSQL, one PL/pgSQL function per decision under row locks,
//!   the database's clock; the schema is created or upgraded at start (options in full:
//!   the `sluice-postgres` crate's documentation).

use std::time::Duration;

use sluice_limiter::memory::DEFAULT_MAX_IDENTIFIERS;
use sluice_limiter::store::url::{split_query, take_params};
use sluice_limiter::{DynStore, MemoryStore};
use sluice_memcached::MemcachedStore;
use sluice_redis::RedisStore;

fn positive(name: &str, value: &str) -> Result<u64, String> {
    value
        .parse()
        .ok()
        .filter(|&n: &u64| n > 0)
        .ok_or_else(|| format!("{name} `{value}` is not a positive number"))
}

/// Opens the store `url` names (options in full: the README's "Stores" section):
///
/// - `memory://` or `memory://?max_identifiers=N`: this process's memory.
/// - `redis://[user:pass@]host:port[/db][?timeout_ms=N]`, `rediss://...` (TLS),
///   `redis+cluster://host:port,...` (and `rediss+cluster://`),
///   `redis+sentinel://[user:pass@]host:port,.../master-name[/db]` (and `rediss+sentinel://`):
///   shared Redis. `?wait_replicas=N` waits after each decision until N replicas hold it
///   (standalone and Sentinel).
/// - `memcached://host:port,host:port,...[?timeout_ms=N&...]`: a pool of memcached servers.
/// - `postgres://[user:pass@]host:port/db[?pool_size=N&timeout_ms=N&...]` (or
///   `postgresql://`): PostgreSQL.
///
/// A URL that cannot be used is an error saying why, and opens nothing.
pub async fn open(url: &str) -> Result<DynStore, String> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| {
        // Shown redacted: a mistyped `redis//user:secret@host` still holds a password.
        let shown = sluice_redis::redact_url(url);
        format!("`{shown}` is not a store URL (expected e.g. `memory://`)")
    })?;
    match scheme {
        "memory" => {
            let mut max = DEFAULT_MAX_IDENTIFIERS;
            for (name, value) in split_query(rest).1 {
                match name {
                    "max_identifiers" => max = positive(name, value)? as usize,
                    _ => {
                        return Err(format!(
                            "unknown memory store option `{name}` (known: max_identifiers)"
                        ));
                    }
                }
            }
            Ok(DynStore::new(
                MemoryStore::builder().max_identifiers(max).build(),
            ))
        }
        "redis" | "rediss" | "redis+cluster" | "rediss+cluster" | "redis+sentinel"
        | "rediss+sentinel" => {
            let (base, params) =
                take_params(url, &["timeout_ms", "connect_timeout_ms", "wait_replicas"]);
            let mut builder = RedisStore::builder(&base);
            for (name, value) in params {
                let n = positive(name, value)?;
                builder = match name {
                    "timeout_ms" => builder.timeout(Duration::from_millis(n)),
                    "connect_timeout_ms" => builder.connect_timeout(Duration::from_millis(n)),
                    _ => builder.wait_replicas(
                        u32::try_from(n)
                            .map_err(|_| format!("wait_replicas `{value}` is too large"))?,
                    ),
                };
            }
            let store = builder
                .connect()
                .await
                .map_err(|e| format!("{}: {e}", sluice_redis::redact_url(url)))?;
            Ok(DynStore::new(store))
        }
        "memcached" => {
            let store = MemcachedStore::connect(url)
                .await
                .map_err(|e| e.to_string())?;
            Ok(DynStore::new(store))
        }
        "postgres" | "postgresql" => {
            let store = sluice_postgres::PostgresStore::connect(url)
                .await
                .map_err(|e| format!("{}: {e}", sluice_postgres::redact_url(url)))?;
            Ok(DynStore::new(store))
        }
        other => Err(format!(
            "unknown store scheme `{other}` (expected memory://, redis://, rediss://, redis+cluster://, redis+sentinel://, memcached://, postgres://)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(url: &str) -> String {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        match runtime.block_on(open(url)) {
            Ok(_) => panic!("`{url}` opened"),
            Err(e) => e,
        }
    }

    #[test]
    fn a_refused_url_never_shows_its_password() {
        for url in [
            "redis//user:hunter22@cache:6379",
            "redis+c:1?tls_ca=/:1x://u?x&d:hunter22@a:1,b:2",
            "rediss://user:hunter22@cache:6379?tls_ca=",
            "redis+cluster://user:hunter22@a",
            "postgres://user:hunter22@db:5432/app?pool_size=0",
            "postgresql://user:hunter22@127.0.0.1:1/app?connect_timeout_ms=200",
        ] {
            let message = refused(url);
            assert!(!message.contains("hunter22"), "{url}: {message}");
        }
    }
}
