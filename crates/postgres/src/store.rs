//! `PostgresStore`: the `Store` trait on PostgreSQL.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime};
use sluice_core::Decision;
use sluice_core::algorithm::concurrency::Released;
use sluice_limiter::{Hit, Identifier, LeaseKeys, Settlement, Store, StoreError};
use tokio_postgres::NoTls;

use crate::batch::{Batcher, rolled_back};
use crate::call::{arguments, decision, gcra_one_arguments};
use crate::cleaner::{Cleaner, sweep};
use crate::url::{Settings, SslMode, redact};
use crate::{PostgresError, migrate};

/// The store on PostgreSQL. Cheap to clone; clones share one connection pool.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Arc<Pool>,
    timeout: Duration,
    decide_sql: String,
    /// Lean decisions (one GCRA leaf, no penalty), batched while connections are busy.
    lean: Batcher,
    reset_sql: String,
    schema: String,
    /// Whether the last call that ended got an answer: changes are logged, once each.
    reachable: AtomicBool,
    /// Where [`PostgresStore::clean_expired`] continues its sweep.
    cursor: AtomicU64,
}

/// Configures a [`PostgresStore`]: the URL's settings, which these methods override.
#[derive(Debug, Clone)]
pub struct PostgresStoreBuilder {
    url: String,
    timeout: Option<Duration>,
    cleanup_interval: Option<Duration>,
}

impl PostgresStoreBuilder {
    /// Time allowed for one decision (the URL's `timeout_ms`); past it the call fails with a
    /// transient error and the policy's failure mode decides.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// How often the cleaner deletes expired rows (the URL's `cleanup_interval_ms`).
    pub fn cleanup_interval(mut self, interval: Duration) -> Self {
        self.cleanup_interval = Some(interval);
        self
    }

    /// Opens the pool, creates or upgrades the schema, and starts the cleaner and the
    /// senders of batched decisions (`batch_senders` of them, at most `pool_size`): tasks
    /// on the current Tokio runtime, ending when the last clone of the store is dropped.
    pub async fn connect(self) -> Result<PostgresStore, PostgresError> {
        let mut settings = Settings::parse(&self.url)?;
        if let Some(timeout) = self.timeout {
            settings.timeout = timeout;
        }
        if let Some(interval) = self.cleanup_interval {
            settings.cleanup_interval = interval;
        }
        let pool = pool(&settings)?;
        let shown = redact(&self.url);
        let mut client = pool.get().await.map_err(|e| match e {
            PoolError::Backend(error) => PostgresError::Connect { url: shown, error },
            other => PostgresError::Pool(format!("cannot connect to {shown}: {other}")),
        })?;
        migrate::migrate(&mut client, &settings.schema, settings.unlogged).await?;
        drop(client);
        let schema = settings.schema.clone();
        let pool = Arc::new(pool);
        Cleaner {
            pool: Arc::downgrade(&pool),
            schema: schema.clone(),
            interval: settings.cleanup_interval,
            pages: settings.cleanup_pages,
        }
        .spawn();
        let senders = settings.batch_senders.min(settings.pool_size);
        let lean = Batcher::start(&pool, &schema, settings.timeout, senders);
        Ok(PostgresStore {
            inner: Arc::new(Inner {
                pool,
                timeout: settings.timeout,
                decide_sql: format!(
                    "SELECT {schema}.decide($1::text[], $2::text, $3::bigint[], $4::text)"
                ),
                lean,
                reset_sql: format!("DELETE FROM {schema}.counters WHERE id = ANY($1::text[])"),
                schema,
                reachable: AtomicBool::new(true),
                cursor: AtomicU64::new(0),
            }),
        })
    }
}

/// The connection pool the settings describe (no connection is opened yet).
fn pool(settings: &Settings) -> Result<Pool, PostgresError> {
    let mut config = settings.client.clone();
    let manager_config = ManagerConfig {
        recycling_method: RecyclingMethod::Fast,
    };
    let manager = match settings.ssl_mode {
        SslMode::Disable => {
            config.ssl_mode(tokio_postgres::config::SslMode::Disable);
            Manager::from_config(config, NoTls, manager_config)
        }
        mode => {
            config.ssl_mode(if mode == SslMode::Require {
                tokio_postgres::config::SslMode::Require
            } else {
                tokio_postgres::config::SslMode::Prefer
            });
            let tls = crate::tls::connector(settings.root_cert.as_deref())?;
            Manager::from_config(config, tls, manager_config)
        }
    };
    Pool::builder(manager)
        .max_size(settings.pool_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(settings.timeout))
        .create_timeout(Some(settings.connect_timeout))
        .recycle_timeout(Some(settings.timeout))
        .build()
        .map_err(|e| PostgresError::Pool(e.to_string()))
}

impl From<PoolError> for PostgresError {
    fn from(error: PoolError) -> PostgresError {
        match error {
            PoolError::Backend(e) => PostgresError::Postgres(e),
            other => PostgresError::Pool(other.to_string()),
        }
    }
}

impl PostgresStore {
    /// Connects with the URL's settings: `postgres://user:pass@host:port/db?options` (the
    /// crate's documentation lists the options).
    pub async fn connect(url: &str) -> Result<PostgresStore, PostgresError> {
        PostgresStore::builder(url).connect().await
    }

    pub fn builder(url: &str) -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            url: url.to_owned(),
            timeout: None,
            cleanup_interval: None,
        }
    }

    /// The schema holding the store's table and functions.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    pub(crate) fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// One `SELECT 1` through the pool, within the store's timeout: the floor under a
    /// decision's round trip (the benchmark compares the two).
    pub async fn round_trip(&self) -> Result<(), PostgresError> {
        self.within_timeout(async {
            let client = self.inner.pool.get().await?;
            let statement = client.prepare_cached("SELECT 1").await?;
            client.query_one(&statement, &[]).await?;
            Ok(())
        })
        .await
    }

    /// Runs the cleaner's sweep once, now, over `pages` pages (the background cleaner does
    /// this every `cleanup_interval_ms`); returns the rows deleted.
    pub async fn clean_expired(&self, pages: u32) -> Result<u64, PostgresError> {
        let mut cursor = self.inner.cursor.load(Ordering::Relaxed);
        let deleted = sweep(&self.inner.pool, &self.inner.schema, &mut cursor, pages)
            .await
            .map_err(|e| match e.downcast::<tokio_postgres::Error>() {
                Ok(e) => PostgresError::Postgres(*e),
                Err(e) => PostgresError::Pool(e.to_string()),
            })?;
        self.inner.cursor.store(cursor, Ordering::Relaxed);
        Ok(deleted)
    }

    /// `call` within the store's timeout, noting whether PostgreSQL answered.
    async fn within_timeout<T>(
        &self,
        call: impl Future<Output = Result<T, PostgresError>>,
    ) -> Result<T, PostgresError> {
        let result = match tokio::time::timeout(self.inner.timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(PostgresError::Timeout(self.inner.timeout)),
        };
        self.note_reachable(&result);
        result
    }

    /// Logs when PostgreSQL stops answering and when it answers again: one line per change.
    fn note_reachable<T>(&self, result: &Result<T, PostgresError>) {
        let reachable = &self.inner.reachable;
        match result {
            Ok(_) => {
                if !reachable.load(Ordering::Relaxed) && !reachable.swap(true, Ordering::Relaxed) {
                    tracing::info!("postgres answers again");
                }
            }
            Err(e) if e.is_transient() => {
                if reachable.load(Ordering::Relaxed) && reachable.swap(false, Ordering::Relaxed) {
                    tracing::warn!(
                        error = %e,
                        "postgres does not answer; each policy's failure mode decides meanwhile"
                    );
                }
            }
            Err(_) => {}
        }
    }

    /// One call of the decision function: the lean one for one GCRA leaf without a
    /// penalty (batched with the lean decisions waiting beside it), the whole one otherwise.
    /// A transaction PostgreSQL rolled back (deadlock, serialization failure) counted
    /// nothing, so it is tried again.
    async fn decide_once(&self, hit: &Hit<'_>) -> Result<Decision, PostgresError> {
        if let Some(lean) = gcra_one_arguments(hit)? {
            let id = hit.identifiers[0].as_str();
            return self.inner.lean.decide(id, lean).await;
        }
        let (params, shape) = arguments(hit)?;
        let ids: Vec<&str> = hit.identifiers.iter().map(Identifier::as_str).collect();
        let penalty = hit.penalty_identifier.map(Identifier::as_str);
        loop {
            let client = self.inner.pool.get().await?;
            let statement = client.prepare_cached(&self.inner.decide_sql).await?;
            match client
                .query_one(&statement, &[&ids, &penalty, &params, &shape])
                .await
            {
                Ok(row) => {
                    let reply: Vec<i64> = row
                        .try_get(0)
                        .map_err(|e| PostgresError::Reply(e.to_string()))?;
                    return decision(&reply);
                }
                Err(e) if rolled_back(&e) => {
                    tracing::debug!(error = %e, "postgres rolled the decision back; trying again");
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

impl Store for PostgresStore {
    async fn decide(&self, hit: &Hit<'_>) -> Result<Decision, StoreError> {
        Ok(self.within_timeout(self.decide_once(hit)).await?)
    }

    /// One call of `SCHEMA.acquire(...)` (see [`crate::leases`]).
    async fn acquire(&self, hit: &Hit<'_>, lease: u64) -> Result<Decision, StoreError> {
        Ok(self.within_timeout(self.acquire_once(hit, lease)).await?)
    }

    async fn release(&self, leases: &LeaseKeys<'_>, lease: u64) -> Result<Released, StoreError> {
        Ok(self
            .within_timeout(self.release_once(leases, lease))
            .await?)
    }

    async fn renew(
        &self,
        leases: &LeaseKeys<'_>,
        lease: u64,
    ) -> Result<Option<Duration>, StoreError> {
        Ok(self.within_timeout(self.renew_once(leases, lease)).await?)
    }

    /// The decision and the database's time of the step in nanoseconds since the Unix
    /// epoch (microseconds, PostgreSQL's resolution, times 1,000).
    async fn reserve(&self, hit: &Hit<'_>) -> Result<(Decision, u64), StoreError> {
        Ok(self.within_timeout(self.reserve_once(hit)).await?)
    }

    async fn settle(&self, settlement: &Settlement<'_>) -> Result<(), StoreError> {
        Ok(self.within_timeout(self.settle_once(settlement)).await?)
    }

    async fn reset(&self, identifiers: &[Identifier]) -> Result<(), StoreError> {
        let ids: Vec<&str> = identifiers.iter().map(Identifier::as_str).collect();
        let call = async {
            let client = self.inner.pool.get().await?;
            let statement = client.prepare_cached(&self.inner.reset_sql).await?;
            client.execute(&statement, &[&ids]).await?;
            Ok(())
        };
        Ok(self.within_timeout(call).await?)
    }
}
