//! `RedisStore`: the `Store` trait on Redis standalone or Cluster.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use sluice_core::Decision;
use sluice_limiter::{Hit, Store, StoreError};

use crate::RedisError;
use crate::script::{DECIDE, arguments, decision};
use crate::slot::slot;
use crate::url::{Target, parse};

/// Time allowed for one decision when the builder sets none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

/// The store on Redis. Cheap to clone; clones share one multiplexed connection (standalone)
/// or one set of node connections (Cluster), over which concurrent decisions are pipelined.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    connection: Connection,
    timeout: Duration,
    /// Makes sliding-log members unique across calls and processes.
    token_seed: u64,
    tokens: AtomicU64,
}

#[derive(Clone)]
enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Configures a [`RedisStore`].
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    url: String,
    timeout: Duration,
    connect_timeout: Duration,
}

impl RedisStoreBuilder {
    /// Time allowed for one decision; past it the call fails with a transient error and the
    /// policy's failure mode decides.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Connects (to every seed node's cluster, for a cluster URL).
    pub async fn connect(self) -> Result<RedisStore, RedisError> {
        install_crypto();
        let connection = match parse(&self.url)? {
            Target::Standalone(url) => {
                let client = redis::Client::open(url.as_str())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    .set_response_timeout(Some(self.timeout))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_millis(500));
                Connection::Standalone(ConnectionManager::new_with_config(client, config).await?)
            }
            Target::Cluster(nodes) => {
                let client = ClusterClientBuilder::new(nodes)
                    .connection_timeout(self.connect_timeout)
                    .response_timeout(self.timeout)
                    .retries(3)
                    .build()?;
                Connection::Cluster(client.get_async_connection().await?)
            }
        };
        Ok(RedisStore {
            inner: Arc::new(Inner {
                connection,
                timeout: self.timeout,
                token_seed: token_seed(),
                tokens: AtomicU64::new(0),
            }),
        })
    }
}

/// rustls needs one process-wide crypto provider; install ring's unless one is set.
fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

fn token_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    nanos ^ (u64::from(std::process::id()) << 32)
}

impl RedisStore {
    /// Connects with default settings.
    pub async fn connect(url: &str) -> Result<RedisStore, RedisError> {
        RedisStore::builder(url).connect().await
    }

    pub fn builder(url: &str) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: Duration::from_secs(2),
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.connection, Connection::Cluster(_))
    }

    pub(crate) fn next_token(&self) -> u64 {
        self.inner
            .token_seed
            .wrapping_add(self.inner.tokens.fetch_add(1, Ordering::Relaxed))
    }

    /// Runs a script invocation on the connection within the timeout.
    pub(crate) async fn run_script<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, RedisError> {
        let call = async {
            match &self.inner.connection {
                Connection::Standalone(c) => invocation.invoke_async(&mut c.clone()).await,
                Connection::Cluster(c) => invocation.invoke_async(&mut c.clone()).await,
            }
        };
        match tokio::time::timeout(self.inner.timeout, call).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(RedisError::Timeout(self.inner.timeout)),
        }
    }

    /// Decides `hit` in one script call. Every key must be in one slot on a cluster.
    async fn decide_in_one_call(&self, hit: &Hit<'_>) -> Result<Decision, RedisError> {
        let mut invocation = DECIDE.prepare_invoke();
        for id in hit
            .identifiers
            .iter()
            .map(String::as_str)
            .chain(hit.penalty_identifier)
        {
            invocation.key(id);
        }
        for arg in arguments(hit, self.next_token())? {
            invocation.arg(arg);
        }
        let reply: Vec<i64> = self.run_script(&invocation).await?;
        decision(&reply)
    }

    /// Clears keys one by one (a cluster may hold them in different slots).
    async fn delete(&self, keys: &[String]) -> Result<(), RedisError> {
        for key in keys {
            let mut cmd = redis::cmd("DEL");
            cmd.arg(key);
            let call = async {
                match &self.inner.connection {
                    Connection::Standalone(c) => cmd.query_async::<()>(&mut c.clone()).await,
                    Connection::Cluster(c) => cmd.query_async::<()>(&mut c.clone()).await,
                }
            };
            tokio::time::timeout(self.inner.timeout, call)
                .await
                .map_err(|_| RedisError::Timeout(self.inner.timeout))??;
        }
        Ok(())
    }
}

/// Whether all keys of a hit hash to one cluster slot.
pub fn one_slot(hit: &Hit<'_>) -> bool {
    let mut keys = hit
        .identifiers
        .iter()
        .map(String::as_str)
        .chain(hit.penalty_identifier);
    let first = keys.next().map(slot);
    keys.all(|k| Some(slot(k)) == first)
}

impl Store for RedisStore {
    async fn decide(&self, hit: &Hit<'_>) -> Result<Decision, StoreError> {
        if self.is_cluster() && !one_slot(hit) {
            return crate::split::decide_across_slots(self, hit)
                .await
                .map_err(StoreError::from);
        }
        Ok(self.decide_in_one_call(hit).await?)
    }

    async fn reset(&self, identifiers: &[String]) -> Result<(), StoreError> {
        Ok(self.delete(identifiers).await?)
    }
}
