//! `RedisStore`: the `Store` trait on Redis standalone or Cluster.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{ErrorKind, ServerErrorKind};
use sluice_core::Decision;
use sluice_core::algorithm::concurrency::Released;
use sluice_limiter::{Hit, Identifier, LeaseKeys, Settlement, Store, StoreError};

use crate::RedisError;
use crate::batch::{Queues, gone};
use crate::rule_batch::LeanRule;
use crate::script::{
    DECIDE, LIBRARY, LeanFixed, LeanGcra, LeanLog, LeanSliding, Lua, arguments, decision,
};
use crate::sentinel::SentinelMaster;
use crate::slot::{key, slot_of};
use crate::url::{Target, parse_url};

/// Extra tries for a script the server answered without running (MOVED, ASK, TRYAGAIN,
/// CLUSTERDOWN, LOADING), beyond the client's own.
const MAX_REDIRECTS: u32 = 8;

/// Whether the reply proves the command did not run, so sending it again cannot count twice.
fn not_executed(e: &redis::RedisError) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Server(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::BusyLoading
        )
    )
}

/// Whether the server lacks the function called (not loaded yet, or lost): it did not run.
fn function_missing(e: &redis::RedisError) -> bool {
    e.code() == Some("ERR") && e.detail().is_some_and(|d| d.contains("Function not found"))
}

/// Whether the server will not run functions at all: no FCALL (Redis before 7), or not for
/// this user. The call did not run.
fn functions_refused(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
        || (e.code() == Some("ERR")
            && e.detail()
                .is_some_and(|d| d.to_ascii_lowercase().starts_with("unknown command")))
}

/// Time allowed for one decision when the builder sets none.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);

/// The store on Redis. Cheap to clone; clones share one multiplexed connection (standalone)
/// or one set of node connections (Cluster), over which concurrent decisions are pipelined,
/// and concurrent single-leaf GCRA decisions are batched (see the crate docs).
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    connection: Connection,
    /// The queues of the lean shapes' hits and of lease steps, each sent in batches.
    queues: Queues,
    /// Leases found expired instead of released (see [`RedisStore::leases_expired`]).
    leases_expired: AtomicU64,
    timeout: Duration,
    /// Replicas each decision must reach (`WAIT`) before it counts; 0: none.
    wait_replicas: u32,
    /// Makes sliding-log members unique across calls and processes.
    token_seed: u64,
    tokens: AtomicU64,
    /// Whether the last call that ended got an answer: its changes are logged, once each.
    reachable: AtomicBool,
    /// Whether the full scripts go as Redis Functions (FCALL); false once the server showed
    /// it has none (before Redis 7) or may not load them, and they go by EVALSHA.
    functions: AtomicBool,
}

#[derive(Clone)]
enum Connection {
    Standalone(ConnectionManager),
    Cluster(ClusterConnection),
    Sentinel(Arc<SentinelMaster>),
}

/// Configures a [`RedisStore`].
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    url: String,
    timeout: Duration,
    connect_timeout: Duration,
    wait_replicas: u32,
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

    /// After each decision, wait (`WAIT`) until `replicas` replicas hold its writes, within
    /// half the store's timeout; a decision not copied in time is an error, so the policy's
    /// failure mode answers instead (with `closed`, nothing is admitted that a failover
    /// could forget). Standalone and Sentinel only. Each decision then costs a round trip to
    /// the replicas, and the calls sharing the connection wait behind it.
    pub fn wait_replicas(mut self, replicas: u32) -> Self {
        self.wait_replicas = replicas;
        self
    }

    /// Connects (to every seed node's cluster, for a cluster URL).
    pub async fn connect(self) -> Result<RedisStore, RedisError> {
        install_crypto();
        let parsed = parse_url(&self.url)?;
        if self.wait_replicas > 0 && matches!(parsed.target, Target::Cluster(_)) {
            return Err(RedisError::Unsupported(
                "wait_replicas on a cluster (WAIT acts on one node's connection)".into(),
            ));
        }
        let certs = match &parsed.tls_ca {
            Some(path) => Some(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(std::fs::read(path).map_err(|e| {
                    RedisError::Url(format!("cannot read tls_ca {}: {e}", path.display()))
                })?),
            }),
            None => None,
        };
        let connection = match parsed.target {
            Target::Standalone(url) => {
                let client = match certs {
                    Some(certs) => redis::Client::build_with_tls(url.as_str(), certs)?,
                    None => redis::Client::open(url.as_str())?,
                };
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    .set_response_timeout(Some(self.timeout))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_millis(500));
                Connection::Standalone(ConnectionManager::new_with_config(client, config).await?)
            }
            Target::Cluster(nodes) => {
                let mut builder = ClusterClientBuilder::new(nodes);
                if let Some(certs) = certs {
                    builder = builder.certs(certs);
                }
                let client = builder
                    .connection_timeout(self.connect_timeout)
                    .response_timeout(self.timeout)
                    .retries(3)
                    .build()?;
                Connection::Cluster(client.get_async_connection().await?)
            }
            Target::Sentinel(target) => {
                let config = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    .set_response_timeout(Some(self.timeout));
                let master = SentinelMaster::connect(&target, certs, config).await?;
                Connection::Sentinel(Arc::new(master))
            }
        };
        let cluster = matches!(connection, Connection::Cluster(_));
        Ok(RedisStore {
            inner: Arc::new_cyclic(|store| Inner {
                connection,
                queues: Queues::start(store, cluster),
                leases_expired: AtomicU64::new(0),
                timeout: self.timeout,
                wait_replicas: self.wait_replicas,
                token_seed: token_seed(),
                tokens: AtomicU64::new(0),
                reachable: AtomicBool::new(true),
                functions: AtomicBool::new(true),
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
            wait_replicas: 0,
        }
    }

    pub(crate) fn from_inner(inner: Arc<Inner>) -> RedisStore {
        RedisStore { inner }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.connection, Connection::Cluster(_))
    }

    /// Concurrency leases that expired instead of being released, counted by this store and
    /// its clones so far: each is a holder that vanished (or forgot to release), worth a look
    /// in the client that took it. Counted are the expired leases an acquire of a rule of
    /// one concurrency leaf drops from its set, and releases that find their lease expired.
    /// Not counted: a set whose every lease expired and whose key Redis then deleted by its
    /// own expiry (`PEXPIRE`, the latest lease's), as no step sees those leases again, and
    /// the leases dropped by an acquire of a rule of several leaves.
    pub fn leases_expired(&self) -> u64 {
        self.inner.leases_expired.load(Ordering::Relaxed)
    }

    pub(crate) fn expired_counter(&self) -> &AtomicU64 {
        &self.inner.leases_expired
    }

    pub(crate) fn queues(&self) -> &Queues {
        &self.inner.queues
    }

    pub(crate) fn next_token(&self) -> u64 {
        self.inner
            .token_seed
            .wrapping_add(self.inner.tokens.fetch_add(1, Ordering::Relaxed))
    }

    /// How long a call may take before its caller hears [`RedisError::Timeout`].
    pub(crate) fn call_timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// Runs `cmd` once on the connection.
    async fn send<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        match &self.inner.connection {
            Connection::Standalone(c) => cmd.query_async(&mut c.clone()).await,
            Connection::Cluster(c) => cmd.query_async(&mut c.clone()).await,
            Connection::Sentinel(s) => s.query(cmd).await,
        }
    }

    /// Runs a decision script: alone, or followed on the same connection by `WAIT` (the
    /// two sent as one pipeline, so no other call's command comes between them); then the
    /// replicas that acknowledged it.
    async fn decide_call<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<(T, Option<i64>)> {
        if self.inner.wait_replicas == 0 {
            return Ok((self.send(cmd).await?, None));
        }
        let wait_ms = u64::try_from(self.inner.timeout.as_millis() / 2)
            .unwrap_or(u64::MAX)
            .max(1);
        let mut pipe = redis::pipe();
        pipe.add_command(cmd.clone())
            .cmd("WAIT")
            .arg(self.inner.wait_replicas)
            .arg(wait_ms);
        let (value, acked): (T, i64) = match &self.inner.connection {
            Connection::Standalone(c) => pipe.query_async(&mut c.clone()).await?,
            Connection::Sentinel(s) => s.query_pipe(&pipe).await?,
            // Refused when the store is built.
            Connection::Cluster(c) => pipe.query_async(&mut c.clone()).await?,
        };
        Ok((value, Some(acked)))
    }

    /// After a call ran out of time: a master behind a sentinel may be unreachable without
    /// a word (no reset, no refusal), so the next call asks the sentinels again.
    fn timed_out(&self) {
        if let Connection::Sentinel(s) = &self.inner.connection {
            s.forget();
        }
    }

    /// Runs `lua`: by its function name when it is in the Functions library and the server
    /// has Functions (loading the library when the server lacks it: first call, restart,
    /// failover, FUNCTION FLUSH), otherwise by its SHA1, sending the whole script when the
    /// server has lost it (after a restart, a failover or SCRIPT FLUSH); and retrying
    /// redirections that outlast the client's own retries (a slot mid-migration, a cluster
    /// settling on a new owner). Only replies that prove the script did not run are retried,
    /// so nothing counts twice. Everything happens within the store's timeout.
    pub(crate) async fn eval<T, K, A>(
        &self,
        lua: &Lua,
        keys: &[K],
        args: &[A],
    ) -> Result<T, RedisError>
    where
        T: redis::FromRedisValue,
        K: redis::ToRedisArgs + Sync,
        A: redis::ToRedisArgs + Sync,
    {
        let call = async {
            let mut whole = false;
            let mut loaded = false;
            // This call's function went missing again after a load (the library flushed
            // meanwhile): the whole script, which cannot be missing, runs instead.
            let mut by_script = false;
            let mut attempt = 0u32;
            loop {
                let functions = &self.inner.functions;
                let function = lua
                    .function
                    .as_deref()
                    .filter(|_| !by_script && functions.load(Ordering::Relaxed));
                let mut cmd = match function {
                    Some(name) => {
                        let mut c = redis::cmd("FCALL");
                        c.arg(name);
                        c
                    }
                    None if whole => {
                        let mut c = redis::cmd("EVAL");
                        c.arg(lua.source);
                        c
                    }
                    None => {
                        let mut c = redis::cmd("EVALSHA");
                        c.arg(&lua.sha);
                        c
                    }
                };
                cmd.arg(keys.len()).arg(keys).arg(args);
                match self.decide_call(&cmd).await {
                    Ok((_, Some(acked))) if acked < i64::from(self.inner.wait_replicas) => {
                        return Err(RedisError::Unreplicated {
                            acked,
                            wanted: self.inner.wait_replicas,
                        });
                    }
                    Ok((value, _)) => return Ok(value),
                    Err(e) if function.is_some() && function_missing(&e) => {
                        // As NOSCRIPT: expected on each server's first call and after a
                        // restart, failover or FUNCTION FLUSH.
                        if loaded {
                            by_script = true;
                            whole = true;
                        } else {
                            tracing::debug!(library = %LIBRARY.tag, "loading the functions library");
                            loaded = true;
                            self.load_library().await?;
                        }
                    }
                    Err(e) if function.is_some() && functions_refused(&e) => {
                        self.no_functions(&e);
                    }
                    Err(e)
                        if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) && !whole =>
                    {
                        // Expected on each server's first call and after a restart,
                        // failover or SCRIPT FLUSH (the outage itself is logged once, by
                        // note_reachable): a detail, not news.
                        tracing::debug!(
                            script = %lua.sha,
                            "decision script not cached on the server; sending it whole"
                        );
                        whole = true;
                    }
                    Err(e) if not_executed(&e) && attempt < MAX_REDIRECTS => {
                        tracing::debug!(error = %e, attempt, "redis did not run the script; trying again");
                        attempt += 1;
                        tokio::time::sleep(Duration::from_millis(5 * u64::from(attempt))).await;
                    }
                    Err(e) => return Err(RedisError::from(e)),
                }
            }
        };
        let result = match tokio::time::timeout(self.inner.timeout, call).await {
            Ok(result) => result,
            Err(_) => {
                self.timed_out();
                Err(RedisError::Timeout(self.inner.timeout))
            }
        };
        self.note_reachable(&result);
        result
    }

    /// Loads the Functions library (on every master of a cluster). A server that refuses it
    /// (no FUNCTION command, or not allowed to this user) is sent scripts by EVALSHA from
    /// then on; only an error a retry may cure fails the call.
    async fn load_library(&self) -> Result<(), RedisError> {
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg("REPLACE").arg(&LIBRARY.source);
        match self.send::<redis::Value>(&load).await {
            Ok(_) => Ok(()),
            Err(e) if RedisError::from(e.clone()).is_transient() => Err(RedisError::from(e)),
            Err(e) => {
                self.no_functions(&e);
                Ok(())
            }
        }
    }

    /// Goes back to EVALSHA for good, saying why once.
    fn no_functions(&self, why: &redis::RedisError) {
        if self.inner.functions.swap(false, Ordering::Relaxed) {
            tracing::info!(
                reason = %why,
                "redis functions unavailable (Redis before 7, or not allowed); using EVALSHA"
            );
        }
    }

    /// Logs when Redis stops answering (down, failing over, unreachable) and when it answers
    /// again: one line per change, not one per call.
    fn note_reachable<T>(&self, result: &Result<T, RedisError>) {
        let reachable = &self.inner.reachable;
        match result {
            Ok(_) => {
                if !reachable.load(Ordering::Relaxed) && !reachable.swap(true, Ordering::Relaxed) {
                    tracing::info!("redis answers again");
                }
            }
            Err(e) if e.is_transient() => {
                if reachable.load(Ordering::Relaxed) && reachable.swap(false, Ordering::Relaxed) {
                    tracing::warn!(
                        error = %e,
                        "redis does not answer; each policy's failure mode decides meanwhile"
                    );
                }
            }
            Err(_) => {}
        }
    }

    /// Decides `hit` in one script call: a lean script for the lean shapes (one GCRA,
    /// fixed-window, sliding-window or sliding-log leaf without a penalty; up to 8 such
    /// leaves joined by `;` or in a tree, or one with a penalty: see `rule_batch.rs`),
    /// batched with the other hits of its shape waiting; the whole one otherwise. Every key must be in one slot on a cluster.
    async fn decide_in_one_call(&self, hit: &Hit<'_>) -> Result<Decision, RedisError> {
        if let Some(lean) = LeanGcra::of(hit)? {
            return self.decide_lean(hit, lean).await;
        }
        if let Some(lean) = LeanFixed::of(hit)? {
            return self.decide_fixed(hit, lean).await;
        }
        if let Some(lean) = LeanSliding::of(hit)? {
            return self.decide_sliding(hit, lean).await;
        }
        if let Some(lean) = LeanLog::of(hit)? {
            return self.decide_log(hit, lean).await;
        }
        if let Some(lean) = LeanRule::of(hit)? {
            return self.decide_rule(hit, lean).await;
        }
        let keys: Vec<String> = hit
            .identifiers
            .iter()
            .chain(hit.penalty_identifier)
            .map(key)
            .collect();
        let args = arguments(hit, self.next_token())?;
        let reply: Vec<i64> = self.eval(&DECIDE, &keys, &args).await?;
        decision(&reply)
    }

    /// Waits, within the store's timeout, for the answer of a step submitted for a batch,
    /// sending it first when it goes `alone` (see `Batcher::submit`).
    pub(crate) async fn await_batched<T>(
        &self,
        alone: Option<crate::batch::Alone>,
        answer: tokio::sync::oneshot::Receiver<Result<T, RedisError>>,
    ) -> Result<T, RedisError> {
        let answered = async {
            if let Some(send) = alone {
                send.await;
            }
            answer.await
        };
        match tokio::time::timeout(self.inner.timeout, answered).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(gone()),
            Err(_) => {
                self.timed_out();
                let timeout = Err(RedisError::Timeout(self.inner.timeout));
                self.note_reachable(&timeout);
                timeout
            }
        }
    }

    /// Clears keys one by one (a cluster may hold them in different slots).
    async fn delete(&self, identifiers: &[Identifier]) -> Result<(), RedisError> {
        for identifier in identifiers {
            let mut cmd = redis::cmd("DEL");
            cmd.arg(key(identifier));
            tokio::time::timeout(self.inner.timeout, self.send::<()>(&cmd))
                .await
                .map_err(|_| RedisError::Timeout(self.inner.timeout))??;
        }
        Ok(())
    }
}

/// Whether all keys of a hit hash to one cluster slot.
pub fn one_slot(hit: &Hit<'_>) -> bool {
    let mut ids = hit.identifiers.iter().chain(hit.penalty_identifier);
    let first = ids.next().map(slot_of);
    ids.all(|id| Some(slot_of(id)) == first)
}

impl Store for RedisStore {
    async fn decide(&self, hit: &Hit<'_>) -> Result<Decision, StoreError> {
        if self.is_cluster() && !one_slot(hit) {
            return crate::split::decide_across_slots(self, hit, None)
                .await
                .map_err(StoreError::from);
        }
        Ok(self.decide_in_one_call(hit).await?)
    }

    async fn reset(&self, identifiers: &[Identifier]) -> Result<(), StoreError> {
        Ok(self.delete(identifiers).await?)
    }

    async fn acquire(&self, hit: &Hit<'_>, lease: u64) -> Result<Decision, StoreError> {
        Ok(self.acquire_lease(hit, lease).await?)
    }

    async fn release(&self, leases: &LeaseKeys<'_>, lease: u64) -> Result<Released, StoreError> {
        Ok(self.release_lease(leases, lease).await?)
    }

    async fn renew(
        &self,
        leases: &LeaseKeys<'_>,
        lease: u64,
    ) -> Result<Option<Duration>, StoreError> {
        Ok(self.renew_lease(leases, lease).await?)
    }

    async fn reserve(&self, hit: &Hit<'_>) -> Result<(Decision, u64), StoreError> {
        Ok(self.reserve_hit(hit).await?)
    }

    async fn settle(&self, settlement: &Settlement<'_>) -> Result<(), StoreError> {
        Ok(self.settle_reservation(settlement).await?)
    }
}
