//! The state every listener shares: the limiter of configured policies, a second limiter for
//! policies made on the fly (redis-cell's `CL.THROTTLE` parameters, Envoy limit overrides),
//! the Envoy descriptor trees, metrics and readiness.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use parking_lot::RwLock;
use sluice_limiter::{Checked, Error, Limiter, Policy, PolicyError};

use crate::envoy::config::EnvoyConfig;
use crate::metrics::Metrics;

/// Most on-the-fly policies kept; past it the table starts afresh. Counters live in the
/// store under names derived from the parameters, so starting afresh loses no count.
pub const MAX_DYNAMIC_POLICIES: usize = 4_096;

/// Everything the listeners share.
pub struct Service {
    pub limiter: Arc<Limiter>,
    dynamic: Limiter,
    envoy: RwLock<Arc<EnvoyConfig>>,
    pub metrics: Metrics,
    ready: AtomicBool,
    /// Add `X-RateLimit-*` and `RateLimit` headers to Envoy answers.
    pub envoy_headers: bool,
    /// Store-specific metric lines (identifiers held, evictions), in Prometheus text.
    pub store_metrics: Option<Box<dyn Fn() -> String + Send + Sync>>,
}

impl Service {
    /// A service over `limiter` (configured policies); policies made on the fly use the
    /// same store.
    pub fn new(limiter: Arc<Limiter>, envoy: EnvoyConfig) -> Service {
        Service {
            dynamic: Limiter::builder(limiter.store().clone())
                .build()
                .expect("no policies to reject"),
            limiter,
            envoy: RwLock::new(Arc::new(envoy)),
            metrics: Metrics::default(),
            ready: AtomicBool::new(false),
            envoy_headers: false,
            store_metrics: None,
        }
    }
}

impl Service {
    /// The store's own metric lines, if it reports any.
    pub fn store_metrics(&self) -> String {
        self.store_metrics.as_ref().map(|f| f()).unwrap_or_default()
    }

    pub fn envoy(&self) -> Arc<EnvoyConfig> {
        self.envoy.read().clone()
    }

    /// Installs new policies and Envoy trees at once; on error nothing changes.
    pub fn replace(
        &self,
        mut policies: Vec<Policy>,
        envoy: EnvoyConfig,
    ) -> Result<(), PolicyError> {
        policies.extend(envoy.policies.iter().cloned());
        self.limiter.replace_policies(policies)?;
        *self.envoy.write() = Arc::new(envoy);
        Ok(())
    }

    /// Whether the service should receive traffic (set once every listener is bound).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Checks a configured policy, counting the decision in the metrics.
    pub async fn check(
        &self,
        policy: &str,
        selectors: &[(&str, &str)],
        cost: u64,
    ) -> Result<Checked, Error> {
        let started = Instant::now();
        let result = self.limiter.check(policy, selectors, cost).await;
        self.metrics.observe(policy, &result, started.elapsed());
        result
    }

    /// Checks an on-the-fly policy named `name`, made by `make` the first time.
    pub async fn check_dynamic(
        &self,
        name: &str,
        make: impl FnOnce() -> Policy,
        selectors: &[(&str, &str)],
        cost: u64,
    ) -> Result<Checked, Error> {
        if self.dynamic.policy(name).is_none() {
            if self.dynamic.policy_count() >= MAX_DYNAMIC_POLICIES {
                let _ = self.dynamic.replace_policies(Vec::new());
            }
            if let Err(e) = self.dynamic.add_policy(make()) {
                // Callers build valid policies; a bad one is a bug, reported as unknown.
                tracing::error!(error = %e, "on-the-fly policy rejected");
                return Err(Error::UnknownPolicy(name.to_owned()));
            }
        }
        let started = Instant::now();
        let result = self.dynamic.check(name, selectors, cost).await;
        self.metrics.observe(name, &result, started.elapsed());
        result
    }

    /// Counters of both limiters, summed.
    pub fn limiter_stats(&self) -> sluice_limiter::LimiterStats {
        let a = self.limiter.stats();
        let b = self.dynamic.stats();
        sluice_limiter::LimiterStats {
            near_cache_hits: a.near_cache_hits + b.near_cache_hits,
            store_errors: a.store_errors + b.store_errors,
            failed_open: a.failed_open + b.failed_open,
            failed_closed: a.failed_closed + b.failed_closed,
            failed_local: a.failed_local + b.failed_local,
        }
    }
}
