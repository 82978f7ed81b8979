//! The state every listener shares: the limiter of configured policies, a second limiter for
//! policies made on the fly (redis-cell's `CL.THROTTLE` parameters, Envoy limit overrides),
//! the Envoy descriptor trees, metrics and readiness.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use parking_lot::RwLock;
use sluice_limiter::{
    Checked, Error, Limiter, LimiterStats, Policy, PolicyError, PolicyRef, Selectors,
};

use crate::envoy::config::EnvoyConfig;
use crate::metrics::Metrics;

/// Most on-the-fly policies kept; past it the table starts afresh. Counters live in the
/// store under names derived from the parameters, so starting afresh loses no count.
pub const MAX_DYNAMIC_POLICIES: usize = 4_096;

/// The kinds of policy made on the fly from a request's parameters. Their metrics are
/// labelled by kind, never by the parameters: clients cannot choose label values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dynamic {
    /// redis-cell's `CL.THROTTLE key max_burst count period`.
    ClThrottle,
    /// A descriptor's `limit` in an Envoy request.
    EnvoyOverride,
}

impl Dynamic {
    /// The `policy` label of this kind's metrics.
    pub const fn label(self) -> &'static str {
        match self {
            Dynamic::ClThrottle => "cl.throttle",
            Dynamic::EnvoyOverride => "envoy.override",
        }
    }
}

/// Everything the listeners share. Build with [`Service::builder`].
pub struct Service {
    limiter: Arc<Limiter>,
    dynamic: Limiter,
    envoy: RwLock<Arc<EnvoyConfig>>,
    metrics: Metrics,
    ready: AtomicBool,
    envoy_modes: EnvoyModes,
}

/// How Envoy requests are answered beyond their config, as envoyproxy/ratelimit's runtime
/// settings say (`LIMIT_RESPONSE_HEADERS_ENABLED`, `SHADOW_MODE`, `QUOTA_MODE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EnvoyModes {
    /// Add `RateLimit-*`, `X-RateLimit-*` and IETF `RateLimit` headers to the answers.
    pub headers: bool,
    /// Answer OK where the answer would be OVER_LIMIT (statuses still say who is over).
    pub shadow: bool,
    /// Every descriptor with a limit, or with none, is in quota mode.
    pub quota: bool,
}

/// Configures a [`Service`].
pub struct ServiceBuilder {
    limiter: Arc<Limiter>,
    envoy: EnvoyConfig,
    envoy_modes: EnvoyModes,
}

impl ServiceBuilder {
    /// envoyproxy/ratelimit's descriptor trees; their limits must be among the limiter's
    /// policies (see [`EnvoyConfig::policies`]).
    pub fn envoy(mut self, envoy: EnvoyConfig) -> Self {
        self.envoy = envoy;
        self
    }

    /// Add `RateLimit-*`, `X-RateLimit-*` and `RateLimit` headers to Envoy answers.
    pub fn envoy_headers(mut self, on: bool) -> Self {
        self.envoy_modes.headers = on;
        self
    }

    /// Every answer setting at once.
    pub fn envoy_modes(mut self, modes: EnvoyModes) -> Self {
        self.envoy_modes = modes;
        self
    }

    pub fn build(self) -> Service {
        let metrics = Metrics::default();
        metrics.track(
            self.limiter
                .policies()
                .iter()
                .map(|p| p.name().to_owned())
                .collect(),
        );
        Service {
            // Policies made on the fly decide on the same store as the configured ones.
            dynamic: Limiter::builder(self.limiter.store().clone())
                .build()
                .expect("no policies to reject"),
            limiter: self.limiter,
            envoy: RwLock::new(Arc::new(self.envoy)),
            metrics,
            ready: AtomicBool::new(false),
            envoy_modes: self.envoy_modes,
        }
    }
}

impl Service {
    /// A service over `limiter`, whose policies are the configured ones.
    pub fn builder(limiter: Arc<Limiter>) -> ServiceBuilder {
        ServiceBuilder {
            limiter,
            envoy: EnvoyConfig::default(),
            envoy_modes: EnvoyModes::default(),
        }
    }

    /// The limiter of configured policies.
    pub fn limiter(&self) -> &Arc<Limiter> {
        &self.limiter
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Whether Envoy answers carry rate limit headers.
    pub fn envoy_headers(&self) -> bool {
        self.envoy_modes.headers
    }

    /// How Envoy requests are answered beyond their config.
    pub fn envoy_modes(&self) -> EnvoyModes {
        self.envoy_modes
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
        let names = policies.iter().map(|p| p.name.clone()).collect();
        self.limiter.replace_policies(policies)?;
        *self.envoy.write() = Arc::new(envoy);
        self.metrics.track(names);
        Ok(())
    }

    /// Whether the service should receive traffic (set once every listener is bound).
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Checks a configured policy, counting the decision in the metrics under its name. A
    /// name no policy has is counted once, without the name.
    pub async fn check(
        &self,
        policy: &str,
        selectors: &Selectors<'_>,
        cost: u64,
    ) -> Result<Checked, Error> {
        match self.limiter.policy(policy) {
            Some(policy) => self.check_policy(&policy, selectors, cost).await,
            None => {
                self.metrics.unknown_policy();
                Err(Error::unknown_policy(policy))
            }
        }
    }

    /// Checks `policy` (a handle on a configured policy), counting the decision.
    pub async fn check_policy(
        &self,
        policy: &PolicyRef,
        selectors: &Selectors<'_>,
        cost: u64,
    ) -> Result<Checked, Error> {
        let started = Instant::now();
        let result = self.limiter.check(policy, selectors, cost).await;
        self.metrics
            .observe(policy.name(), &result, started.elapsed());
        result
    }

    /// Checks an on-the-fly policy of `kind` named `name`, made by `make` the first time.
    /// Its metrics are counted under the kind.
    pub async fn check_dynamic(
        &self,
        kind: Dynamic,
        name: &str,
        make: impl FnOnce() -> Policy,
        selectors: &Selectors<'_>,
        cost: u64,
    ) -> Result<Checked, Error> {
        let policy = match self.dynamic.policy(name) {
            Some(policy) => policy,
            None => {
                if self.dynamic.policy_count() >= MAX_DYNAMIC_POLICIES {
                    let _ = self.dynamic.replace_policies(Vec::new());
                }
                match self.dynamic.add_policy(make()) {
                    Ok(policy) => policy,
                    Err(e) => {
                        // Callers build valid policies; a bad one is a bug, reported as unknown.
                        tracing::error!(error = %e, "on-the-fly policy rejected");
                        return Err(Error::unknown_policy(name));
                    }
                }
            }
        };
        let started = Instant::now();
        let result = self.dynamic.check(&policy, selectors, cost).await;
        self.metrics
            .observe(kind.label(), &result, started.elapsed());
        result
    }

    /// Counters of both limiters, summed.
    pub fn limiter_stats(&self) -> LimiterStats {
        let a = self.limiter.stats();
        let b = self.dynamic.stats();
        LimiterStats {
            near_cache_hits: a.near_cache_hits + b.near_cache_hits,
            store_errors: a.store_errors + b.store_errors,
            failed_open: a.failed_open + b.failed_open,
            failed_closed: a.failed_closed + b.failed_closed,
            failed_local: a.failed_local + b.failed_local,
        }
    }
}
