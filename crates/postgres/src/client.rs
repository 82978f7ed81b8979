//! One client connection opened the way the store opens its pool's: the same URL, the same
//! `sslmode` and `sslrootcert`, the same connect timeout. For other parts of sluice that
//! write to the database a store URL names (the service's audit sink of denials).

use std::time::Duration;

use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, NoTls, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::PostgresError;
use crate::url::{Settings, SslMode};

/// A parsed PostgreSQL URL, ready to connect: `postgres://user:pass@host:port/db` with the
/// store's options (`sslmode`, `sslrootcert`, `connect_timeout_ms`; the pool's options are
/// accepted and play no part). The CA file is read once, here.
#[derive(Clone)]
pub struct ClientUrl {
    config: tokio_postgres::Config,
    tls: Option<MakeRustlsConnect>,
    connect_timeout: Duration,
    /// The URL, its password hidden, for errors.
    shown: String,
}

impl std::fmt::Debug for ClientUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientUrl")
            .field("hosts", &self.config.get_hosts())
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl ClientUrl {
    /// Reads `url`; an unusable URL, or a CA file that cannot be read, is an error saying
    /// why (never showing the password).
    pub fn parse(url: &str) -> Result<ClientUrl, PostgresError> {
        let settings = Settings::parse(url)?;
        let mut config = settings.client.clone();
        let tls = match settings.ssl_mode {
            SslMode::Disable => {
                config.ssl_mode(tokio_postgres::config::SslMode::Disable);
                None
            }
            mode => {
                config.ssl_mode(if mode == SslMode::Require {
                    tokio_postgres::config::SslMode::Require
                } else {
                    tokio_postgres::config::SslMode::Prefer
                });
                Some(crate::tls::connector(settings.root_cert.as_deref())?)
            }
        };
        config.connect_timeout(settings.connect_timeout);
        Ok(ClientUrl {
            config,
            tls,
            connect_timeout: settings.connect_timeout,
            shown: crate::url::redact(url),
        })
    }

    /// Opens a connection, driven by a task of its own on the current Tokio runtime until
    /// the client is dropped or the server hangs up.
    pub async fn connect(&self) -> Result<Client, PostgresError> {
        match &self.tls {
            None => self.connect_with(NoTls).await,
            Some(tls) => self.connect_with(tls.clone()).await,
        }
    }

    async fn connect_with<T>(&self, tls: T) -> Result<Client, PostgresError>
    where
        T: MakeTlsConnect<Socket>,
        T::Stream: Send + 'static,
    {
        let (client, connection) =
            tokio::time::timeout(self.connect_timeout, self.config.connect(tls))
                .await
                .map_err(|_| PostgresError::Timeout(self.connect_timeout))?
                .map_err(|error| PostgresError::Connect {
                    url: self.shown.clone(),
                    error,
                })?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }
}
