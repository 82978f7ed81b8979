//! The state every listener shares: the limiter of configured policies, a second limiter for
//! policies made on the fly (redis-cell's `CL.THROTTLE` parameters, Envoy limit overrides),
//! the Envoy descriptor trees, metrics, heavy hitters and recent refusals, and readiness.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use parking_lot::RwLock;
use sluice_limiter::{
    Checked, Error, Limiter, LimiterStats, Policy, PolicyError, PolicyRef, Selectors,
};

use crate::audit::{AuditConfig, AuditError, AuditSink, DenialRecord};
use crate::envoy::config::EnvoyConfig;
use crate::http::{History, UiAccess};
use crate::metrics::Metrics;
use crate::top::{DEFAULT_CAPACITY, DEFAULT_REFUSALS, PolicyTop, Refusal, Top};

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
    /// Every kind.
    pub(crate) const ALL: [Dynamic; 2] = [Dynamic::ClThrottle, Dynamic::EnvoyOverride];

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
    top: Top,
    ready: AtomicBool,
    envoy_modes: EnvoyModes,
    ui: UiAccess,
    history: History,
    /// Where denials are written, if anywhere.
    audit: RwLock<Option<AuditSink>>,
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
    top: usize,
    refusals: usize,
    ui: UiAccess,
}

impl ServiceBuilder {
    /// Serves the live page to `access` (see [`UiAccess`]); off by default.
    pub fn ui(mut self, access: UiAccess) -> Self {
        self.ui = access;
        self
    }

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

    /// Heavy hitters with `k` counters per policy, kind (hits, refusals) and minute (64 by
    /// default; 0 turns them off). Memory per policy with traffic is about `k` x 480 bytes
    /// plus the labels (see [`top`](crate::top)); a value with more than 1/`k` of a policy's
    /// hits in the window is always reported.
    pub fn top(mut self, k: usize) -> Self {
        self.top = k;
        self
    }

    /// Remember the last `n` refusals (100 by default; 0 keeps none).
    pub fn refusals(mut self, n: usize) -> Self {
        self.refusals = n;
        self
    }

    pub fn build(self) -> Service {
        let metrics = Metrics::default();
        let names: Vec<String> = self
            .limiter
            .policies()
            .iter()
            .map(|p| p.name().to_owned())
            .collect();
        let top = Top::new(self.top, self.refusals);
        top.track(tracked(&names));
        metrics.track(names);
        Service {
            // Policies made on the fly decide on the same store as the configured ones.
            dynamic: Limiter::builder(self.limiter.store().clone())
                .build()
                .expect("no policies to reject"),
            limiter: self.limiter,
            envoy: RwLock::new(Arc::new(self.envoy)),
            metrics,
            top,
            ready: AtomicBool::new(false),
            envoy_modes: self.envoy_modes,
            ui: self.ui,
            history: History::default(),
            audit: RwLock::new(None),
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
            top: DEFAULT_CAPACITY,
            refusals: DEFAULT_REFUSALS,
            ui: UiAccess::Off,
        }
    }

    /// The counters' last minutes, for the live page's chart (empty while the page is off).
    pub(crate) fn history(&self) -> &History {
        &self.history
    }

    /// Who may see the live page (`GET /ui`); nobody by default.
    pub fn ui_access(&self) -> &UiAccess {
        &self.ui
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
        let names: Vec<String> = policies.iter().map(|p| p.name.clone()).collect();
        self.limiter.replace_policies(policies)?;
        *self.envoy.write() = Arc::new(envoy);
        self.top.track(tracked(&names));
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
        self.observe_top(policy.name(), selectors, &result);
        self.audit(policy.name(), selectors, &result);
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
        self.observe_top(kind.label(), selectors, &result);
        self.audit(kind.label(), selectors, &result);
        result
    }

    /// Offers a refusal (or a shadow policy's would-be refusal) to the audit sinks, if any;
    /// never waits. When every queue is full the record is not even built.
    fn audit(&self, name: &str, selectors: &Selectors<'_>, result: &Result<Checked, Error>) {
        if let Ok(checked) = result {
            self.audit_checked(name, selectors, checked);
        }
    }

    /// Counts a decision made outside [`Service::check_policy`] (an acquire, a reservation)
    /// in the heavy hitters and, when refused, the audit trail, as a check's is.
    pub(crate) fn observe_checked(&self, name: &str, selectors: &Selectors<'_>, checked: &Checked) {
        let now = self.limiter.clock().now();
        self.top.observe(now, name, selectors, checked);
        self.audit_checked(name, selectors, checked);
    }

    fn audit_checked(&self, name: &str, selectors: &Selectors<'_>, checked: &Checked) {
        if checked.decision.allowed() && !checked.shadow_denied {
            return;
        }
        let audit = self.audit.read();
        let Some(sink) = audit.as_ref() else { return };
        if !sink.has_room() {
            sink.count_full();
            return;
        }
        let now = self.limiter.clock().now();
        if let Some(record) = DenialRecord::from_checked(now, name, selectors, checked) {
            sink.record_owned(record);
        }
    }

    /// Writes denials where `config` says from now on (`None`: nowhere). An unchanged
    /// config keeps the running sinks; a changed one starts new sinks, and the old ones
    /// write what they hold, then finish. On error nothing changes. A config naming
    /// PostgreSQL needs a Tokio runtime (see [`AuditSink::start`]). Whether it changed.
    pub fn set_audit(&self, config: Option<&AuditConfig>) -> Result<bool, AuditError> {
        let change = self.prepare_audit(config)?;
        let changed = change.is_some();
        self.install_audit(change);
        Ok(changed)
    }

    /// The sinks `config` asks for, started, when they differ from those in use (`None`:
    /// nothing to change).
    pub(crate) fn prepare_audit(
        &self,
        config: Option<&AuditConfig>,
    ) -> Result<Option<Option<AuditSink>>, AuditError> {
        if self.audit.read().as_ref().map(AuditSink::config) == config {
            return Ok(None);
        }
        match config {
            Some(config) => Ok(Some(Some(AuditSink::start_counted(
                config,
                &self.metrics.audit,
            )?))),
            None => Ok(Some(None)),
        }
    }

    /// Puts in use what [`Service::prepare_audit`] started.
    pub(crate) fn install_audit(&self, change: Option<Option<AuditSink>>) {
        if let Some(next) = change {
            // The old sinks' writers finish once their queues are empty.
            let old = std::mem::replace(&mut *self.audit.write(), next);
            drop(old);
        }
    }

    /// The audit sinks in use, if any.
    pub fn audit_sink(&self) -> Option<AuditSink> {
        self.audit.read().clone()
    }

    /// Takes the audit sinks out (denials are no longer written) and waits up to `within`
    /// for them to write what they hold.
    pub async fn close_audit(&self, within: std::time::Duration) {
        let sink = self.audit.write().take();
        if let Some(sink) = sink {
            sink.close(within).await;
        }
    }

    /// Counts a decision in the heavy hitters and, if refused, the recent refusals, at the
    /// limiter's time.
    fn observe_top(&self, name: &str, selectors: &Selectors<'_>, result: &Result<Checked, Error>) {
        if let Ok(checked) = result {
            let now = self.limiter.clock().now();
            self.top.observe(now, name, selectors, checked);
        }
    }

    /// The `n` values (at most K, see [`ServiceBuilder::top`]) with the most hits and the
    /// most refusals of `policy` (a configured policy's name, or an on-the-fly kind:
    /// `cl.throttle`, `envoy.override`) over the last minutes; `None` when there is no such
    /// policy or heavy hitters are off.
    pub fn top(&self, policy: &str, n: usize) -> Option<PolicyTop> {
        self.top.policy(self.limiter.clock().now(), policy, n)
    }

    /// [`Service::top`] of every policy and on-the-fly kind, by name.
    pub fn top_all(&self, n: usize) -> Vec<PolicyTop> {
        self.top.all(self.limiter.clock().now(), n)
    }

    /// The last `n` refusals (at most as many as [`ServiceBuilder::refusals`] keeps), newest
    /// first.
    pub fn recent_refusals(&self, n: usize) -> Vec<Refusal> {
        self.top.recent_refusals(n)
    }

    /// The heavy hitters and refusal ring themselves: their sizes, and the
    /// `sluice_top_refused` metrics.
    pub fn heavy_hitters(&self) -> &Top {
        &self.top
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
            prefetch_blocks: a.prefetch_blocks + b.prefetch_blocks,
            prefetch_spent: a.prefetch_spent + b.prefetch_spent,
        }
    }
}

/// The names heavy hitters are kept for: the policies and the on-the-fly kinds.
fn tracked(names: &[String]) -> impl Iterator<Item = String> + '_ {
    names
        .iter()
        .cloned()
        .chain(Dynamic::ALL.map(|kind| kind.label().to_owned()))
}
