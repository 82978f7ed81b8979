//! Test support for the sluice workspace, never published: real servers started on free
//! ports and stopped by PID ([`redis`], [`memcached`], [`postgres`](mod@postgres)), the load
//! loops the stores' fault tests share ([`load`]), the throughput rounds of their benchmarks
//! ([`bench`](mod@bench)), the shared test vectors' codec ([`vectors`]), an HTTP client for
//! the service's tests ([`http`]), a capture of what the code logs ([`logs`]), and a TCP
//! proxy that injects faults between the code and a store ([`proxy`]). A store added later
//! adds one module here for its server.
//!
//! The servers need their programs on `PATH` (`redis-server`, `redis-cli`, `memcached`;
//! PostgreSQL's are also found through `pg_config` or `/usr/lib/postgresql`);
//! `scripts/test.sh` installs them.

#![forbid(unsafe_code)]

pub mod bench;
pub mod http;
pub mod load;
pub mod logs;
pub mod memcached;
pub mod postgres;
mod process;
pub mod proxy;
pub mod redis;
pub mod tls;
pub mod vectors;

pub use memcached::MemcachedServer;
pub use postgres::PostgresServer;
pub use process::free_port;
pub use redis::{ProxiedCluster, RedisCluster, RedisSentinels, RedisServer};
