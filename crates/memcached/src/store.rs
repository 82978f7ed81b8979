//! `MemcachedStore`: the `Store` trait on a pool of memcached servers.

use std::sync::Arc;
use std::time::Duration;

use std::future::Future;

use sluice_core::algorithm::concurrency::Released;
use sluice_core::{Algorithm, Decision};
use sluice_limiter::{
    Clock, Hit, Identifier, LeaseKeys, Settlement, Store, StoreError, SystemClock,
};

use crate::MemcachedError;
use crate::cas::{Combiner, DEFAULT_CAS_TRIES};
use crate::key::Keys;
use crate::lease::Leases;
use crate::pool::{Deadline, Pool, PoolConfig};
use crate::stats::{MemcachedStats, ServerStats};
use crate::url::parse;

/// Time allowed for one decision when neither the builder nor the URL sets one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(250);
/// Connections per server by default. One connection carries every concurrent request
/// (pipelined), and the more share it, the fewer system calls each costs memcached and this
/// process (measured in one run: 7.0 µs of memcached CPU per GCRA decision on a million
/// keys, 9.1 with 4 connections); more connections spread one app server's load over more
/// of memcached's threads.
pub const DEFAULT_CONNECTIONS: usize = 1;
/// The clock difference between app servers the sliding-window counter allows for.
pub const DEFAULT_SKEW: Duration = Duration::from_millis(250);
/// How long a failed server is skipped by default.
pub const DEFAULT_DOWN_FOR: Duration = Duration::from_secs(2);
/// Most sub-window counters one reset deletes around the present (see `reset`).
const RESET_MARGIN: u64 = 2;

/// The store on memcached. Cheap to clone; clones share the connections, the counts of
/// [`MemcachedStats`] and the turn-taking of compare-and-swap updates.
#[derive(Clone)]
pub struct MemcachedStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) pool: Pool,
    pub(crate) combiner: Combiner,
    pub(crate) windows: crate::combine::Combiner,
    pub(crate) leases: Leases,
    pub(crate) cas_tries: u32,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) timeout: Duration,
    pub(crate) skew: Duration,
    /// Lease releases in flight (see `concurrency::judge_leases`).
    pub(crate) releasing: std::sync::atomic::AtomicUsize,
}

/// Configures a [`MemcachedStore`]. Settings made here win over the URL's options.
pub struct MemcachedStoreBuilder {
    url: String,
    timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    connections: Option<usize>,
    down_for: Option<Duration>,
    cas_tries: u32,
    clock: Arc<dyn Clock>,
    skew: Option<Duration>,
}

impl MemcachedStoreBuilder {
    /// Time allowed for one decision; past it the call fails with a transient error and the
    /// policy's failure mode decides.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// Connections per server (at least 1).
    pub fn connections(mut self, connections: usize) -> Self {
        self.connections = Some(connections.max(1));
        self
    }

    /// How long a server that failed is skipped before it is tried again.
    pub fn down_for(mut self, down_for: Duration) -> Self {
        self.down_for = Some(down_for);
        self
    }

    /// Tries of one compare-and-swap update before it fails with
    /// [`MemcachedError::Contention`] (at least 1; default 64).
    pub fn cas_tries(mut self, tries: u32) -> Self {
        self.cas_tries = tries.max(1);
        self
    }

    /// The largest difference expected between app servers' clocks (default 250 ms). Hits
    /// on a sliding-window counter within this of a sub-window boundary re-read the
    /// neighbouring sub-windows after counting (one more round trip), so that no two app
    /// servers whose clocks differ by less can admit more than the limit across it.
    pub fn skew(mut self, skew: Duration) -> Self {
        self.skew = Some(skew);
        self
    }

    /// The clock decisions run on. memcached has no clock to share, so every app server's
    /// clock counts: see the crate documentation on skew.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Builds the pool and checks that at least one server answers `version` (servers that
    /// do not are marked down, and tried again later).
    pub async fn connect(self) -> Result<MemcachedStore, MemcachedError> {
        let settings = parse(&self.url)?;
        let timeout = self.timeout.or(settings.timeout).unwrap_or(DEFAULT_TIMEOUT);
        let connect_timeout = self
            .connect_timeout
            .or(settings.connect_timeout)
            .unwrap_or(Duration::from_secs(2));
        let config = PoolConfig {
            connections: self
                .connections
                .or(settings.connections)
                .unwrap_or(DEFAULT_CONNECTIONS),
            connect_timeout,
            down_for: self
                .down_for
                .or(settings.down_for)
                .unwrap_or(DEFAULT_DOWN_FOR),
        };
        let pool = Pool::new(settings.servers, config);
        let mut answered = 0;
        let mut last_error = None;
        for server in 0..pool.len() {
            match pool.version(server, Deadline::after(connect_timeout)).await {
                Ok(_) => answered += 1,
                Err(e) => last_error = Some(e),
            }
        }
        if answered == 0 {
            return Err(last_error.unwrap_or(MemcachedError::NoServer));
        }
        Ok(MemcachedStore {
            inner: Arc::new(Inner {
                pool,
                combiner: Combiner::new(64),
                windows: crate::combine::Combiner::new(64),
                leases: Leases::new(256),
                cas_tries: self.cas_tries,
                clock: self.clock,
                timeout,
                skew: self.skew.or(settings.skew).unwrap_or(DEFAULT_SKEW),
                releasing: Default::default(),
            }),
        })
    }
}

impl MemcachedStore {
    /// Connects with default settings (and the URL's options).
    pub async fn connect(url: &str) -> Result<MemcachedStore, MemcachedError> {
        MemcachedStore::builder(url).connect().await
    }

    pub fn builder(url: &str) -> MemcachedStoreBuilder {
        MemcachedStoreBuilder {
            url: url.to_owned(),
            timeout: None,
            connect_timeout: None,
            connections: None,
            down_for: None,
            cas_tries: DEFAULT_CAS_TRIES,
            clock: Arc::new(SystemClock::new()),
            skew: None,
        }
    }

    /// What this store (and its clones) counted: evictions seen, contention, servers down.
    pub fn stats(&self) -> MemcachedStats {
        self.inner.pool.counters.snapshot()
    }

    /// Each server's own `stats` (evictions, items), in the URL's order; `Err` for a server
    /// that did not answer.
    pub async fn server_stats(&self) -> Vec<Result<ServerStats, MemcachedError>> {
        let mut all = Vec::new();
        for server in 0..self.inner.pool.len() {
            let deadline = Deadline::after(self.inner.timeout);
            all.push(self.inner.pool.server_stats(server, deadline).await);
        }
        all
    }

    /// The server (`host:port`, as in the URL) that holds `identifier`'s state now.
    pub fn server_of(&self, identifier: &str) -> Option<&str> {
        let pool = &self.inner.pool;
        let index = pool.server_for(Keys::new(identifier).route())?;
        pool.addresses().nth(index)
    }

    /// The time decisions use now: the store's clock.
    pub fn now(&self) -> u64 {
        self.inner.clock.now()
    }

    /// Forgets `identifiers`: their `|s` state, and for sliding-window leaves the counters
    /// of the sub-windows around now (found through the `|m` record).
    async fn forget(&self, identifiers: &[Identifier]) -> Result<(), MemcachedError> {
        let inner = &self.inner;
        let deadline = Deadline::after(inner.timeout);
        let now = inner.clock.now();
        for identifier in identifiers {
            let keys = Keys::new(identifier);
            let route = keys.route();
            let meta = inner.pool.get(route, &[keys.meta()], deadline).await?;
            let mut doomed = vec![keys.state(), keys.meta()];
            if let Some((sub, g)) = meta.values().next().and_then(|m| window_shape(m)) {
                // Every sub-window counted now, and a margin for callers' clocks either way.
                let current = now / sub;
                let first = current.saturating_sub(g + RESET_MARGIN);
                doomed.extend((first..=current + RESET_MARGIN).map(|n| keys.window(n)));
            }
            inner.pool.delete(route, &doomed, deadline).await?;
        }
        Ok(())
    }
}

/// `<sub-window ns> <sub-windows>` from a `|m` record.
fn window_shape(meta: &[u8]) -> Option<(u64, u64)> {
    let text = std::str::from_utf8(meta).ok()?;
    let (sub, g) = text.split_once(' ')?;
    let sub = crate::protocol::number(sub.as_bytes()).filter(|&s| s > 0)?;
    let g = crate::protocol::number(g.as_bytes())
        .filter(|&g| (1..=u64::from(sluice_core::rule::MAX_WINDOWS)).contains(&g))?;
    Some((sub, g))
}

impl MemcachedStore {
    /// Runs `step` (bounded by deadlines of its own) under a backstop of three timeouts.
    async fn bounded<T>(
        &self,
        step: impl Future<Output = Result<T, MemcachedError>>,
    ) -> Result<T, StoreError> {
        let backstop = self.inner.timeout * 3;
        match tokio::time::timeout(backstop, step).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(StoreError::Timeout(self.inner.timeout)),
        }
    }
}

/// Concurrency leases (see `src/concurrency.rs`) and reservations (`src/reservation.rs`)
/// are kept as the rest: leaf by leaf, each leaf's step a compare-and-swap, a compound rule
/// decided as `decide` decides it.
impl Store for MemcachedStore {
    async fn decide(&self, hit: &Hit<'_>) -> Result<Decision, StoreError> {
        let inner = &self.inner;
        let deadline = Deadline::after(inner.timeout);
        let now = inner.clock.now();
        // Every step is bounded by a deadline (the steps after the decision by one of their
        // own, so a slow start does not leave reservations behind); this is only a backstop.
        let (decision, _) = self.bounded(inner.decide(hit, now, deadline, None)).await?;
        Ok(decision)
    }

    async fn reset(&self, identifiers: &[Identifier]) -> Result<(), StoreError> {
        Ok(self.forget(identifiers).await?)
    }

    async fn acquire(&self, hit: &Hit<'_>, lease: u64) -> Result<Decision, StoreError> {
        let inner = &self.inner;
        let deadline = Deadline::after(inner.timeout);
        let now = inner.clock.now();
        let decided = inner.decide(hit, now, deadline, Some(lease));
        let (decision, _) = self.bounded(decided).await?;
        let quotas = hit.evaluation.quotas;
        let by_concurrency = quotas
            .get(decision.leaf)
            .is_some_and(|q| q.algorithm() == Algorithm::Concurrency);
        Ok(if by_concurrency {
            decision.occupied()
        } else {
            decision
        })
    }

    async fn release(&self, leases: &LeaseKeys<'_>, lease: u64) -> Result<Released, StoreError> {
        let inner = &self.inner;
        let deadline = Deadline::after(inner.timeout);
        let now = inner.clock.now();
        let mut found = Released::NotHeld;
        for identifier in leases.identifiers {
            let keys = Keys::new(identifier);
            let step = inner.release_lease(&keys, now, lease, deadline);
            match self.bounded(step).await? {
                Released::Released => found = Released::Released,
                Released::Expired if found == Released::NotHeld => found = Released::Expired,
                _ => {}
            }
        }
        if found == Released::Expired {
            inner.count_expired(1);
        }
        Ok(found)
    }

    async fn renew(
        &self,
        leases: &LeaseKeys<'_>,
        lease: u64,
    ) -> Result<Option<Duration>, StoreError> {
        let inner = &self.inner;
        let deadline = Deadline::after(inner.timeout);
        let now = inner.clock.now();
        let mut left: Option<u64> = None;
        for (identifier, quota) in leases.identifiers.iter().zip(leases.quotas) {
            let keys = Keys::new(identifier);
            let step = inner.renew_lease(&keys, quota, now, lease, deadline);
            if let Some(expires_at) = self.bounded(step).await? {
                let this = expires_at.saturating_sub(now);
                left = Some(left.map_or(this, |l| l.min(this)));
            }
        }
        Ok(left.map(Duration::from_nanos))
    }

    async fn reserve(&self, hit: &Hit<'_>) -> Result<(Decision, u64), StoreError> {
        let inner = &self.inner;
        let deadline = Deadline::after(inner.timeout);
        let now = inner.clock.now();
        self.bounded(inner.decide(hit, now, deadline, None)).await
    }

    async fn settle(&self, settlement: &Settlement<'_>) -> Result<(), StoreError> {
        let inner = &self.inner;
        let deadline = Deadline::after(inner.timeout);
        let now = inner.clock.now();
        self.bounded(inner.settle(settlement, now, deadline)).await
    }
}
