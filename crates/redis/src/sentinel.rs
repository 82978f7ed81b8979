//! Redis Sentinel: a connection to whichever server the sentinels name master now.
//!
//! redis-rs asks the sentinels for the master (and checks its `ROLE`), but has no
//! connection that follows a failover by itself: its connection manager reconnects to the
//! address it started with, which after a failover is a replica or nothing. So this holds
//! one multiplexed connection to the master and forgets it on any sign that the master is
//! gone or demoted (a dropped connection, a refusal, a timeout, `READONLY`); the next call
//! asks the sentinels again. The call that saw the sign is answered by the policy's failure
//! mode, like any store error: nothing is retried, so nothing counts twice.

use std::sync::Mutex;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{AsyncConnectionConfig, ConnectionAddr, ErrorKind, ServerErrorKind, TlsMode};

use crate::url::SentinelTarget;

pub(crate) struct SentinelMaster {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    current: Mutex<Option<MultiplexedConnection>>,
    config: AsyncConnectionConfig,
}

impl SentinelMaster {
    /// Asks the sentinels of `target` for its master and connects to it.
    pub(crate) async fn connect(
        target: &SentinelTarget,
        certificates: Option<redis::TlsCertificates>,
        config: AsyncConnectionConfig,
    ) -> redis::RedisResult<SentinelMaster> {
        let addresses = target.sentinels.iter().map(|(host, port)| {
            if target.tls {
                ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port: *port,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(host.clone(), *port)
            }
        });
        let mut builder =
            SentinelClientBuilder::new(addresses, &target.master, SentinelServerType::Master)?
                .set_client_to_redis_db(target.db);
        if let Some(username) = &target.username {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = &target.password {
            builder = builder.set_client_to_redis_password(password);
        }
        if target.tls {
            builder = builder
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure);
            if let Some(certificates) = certificates {
                builder = builder
                    .set_client_to_redis_certificates(certificates.clone())
                    .set_client_to_sentinel_certificates(certificates);
            }
        }
        let master = SentinelMaster {
            sentinels: tokio::sync::Mutex::new(builder.build()?),
            current: Mutex::new(None),
            config,
        };
        master.connection().await?;
        Ok(master)
    }

    fn held(&self) -> Option<MultiplexedConnection> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The connection to the master, asking the sentinels first when there is none.
    async fn connection(&self) -> redis::RedisResult<MultiplexedConnection> {
        if let Some(connection) = self.held() {
            return Ok(connection);
        }
        let mut sentinels = self.sentinels.lock().await;
        // Another call may have found the master while this one waited.
        if let Some(connection) = self.held() {
            return Ok(connection);
        }
        let client = sentinels.async_get_client().await?;
        let connection = client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        tracing::debug!(master = ?client.get_connection_info().addr(), "connected to the master the sentinels name");
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(connection.clone());
        Ok(connection)
    }

    /// Forgets the connection: the next call asks the sentinels where the master is.
    pub(crate) fn forget(&self) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Runs `cmd` on the master.
    pub(crate) async fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        let mut connection = self.connection().await?;
        self.watch(cmd.query_async(&mut connection).await)
    }

    /// Runs `pipe` on the master.
    pub(crate) async fn query_pipe<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
    ) -> redis::RedisResult<T> {
        let mut connection = self.connection().await?;
        self.watch(pipe.query_async(&mut connection).await)
    }

    /// Passes `result` on, forgetting the connection if it says the master may have moved.
    fn watch<T>(&self, result: redis::RedisResult<T>) -> redis::RedisResult<T> {
        if let Err(e) = &result
            && master_may_have_moved(e)
        {
            self.forget();
        }
        result
    }
}

/// Errors after which the master may be another server now.
fn master_may_have_moved(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || e.is_unrecoverable_error()
        || e.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
}
