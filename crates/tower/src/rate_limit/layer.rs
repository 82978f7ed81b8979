//! `RateLimitLayer` and its builder: configuration is checked once, against the limiter's
//! policies, when the layer is built.

use std::collections::HashSet;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Response};
use ipnet::IpNet;
use sluice_limiter::{CompiledPolicy, Limiter};
use tower_layer::Layer;

use super::config::{ChallengeConfig, Config, Hold, LayerStats, Stats, WhenMissing};
#[cfg(feature = "axum")]
use super::mode::Axum;
use super::mode::Wrapped;
use super::quick;
use super::refusal::Refusal;
use super::service::RateLimit;
use crate::challenge::Challenge;
use crate::denied::{Denied, Hooks};
use crate::error::Error;
use crate::filter::{Filters, PathPattern};
use crate::headers::{Headers, PolicyFields};
use crate::key::body::DEFAULT_MAX_BODY;
use crate::key::{ClientIpResolver, Key};
use crate::outcome::Outcomes;
use crate::reserve::Reserve;

/// Applies one policy of a [`Limiter`] to the requests of an inner service. Stack several
/// layers for several policies. Cheap to clone. `M` says which body its responses carry:
/// its own [`ResponseBody`](super::ResponseBody) by default, axum's `Body` after
/// [`axum_body`](RateLimitLayer::axum_body).
pub struct RateLimitLayer<M = Wrapped> {
    config: Arc<Config>,
    mode: PhantomData<fn() -> M>,
}

impl<M> Clone for RateLimitLayer<M> {
    fn clone(&self) -> Self {
        RateLimitLayer {
            config: self.config.clone(),
            mode: PhantomData,
        }
    }
}

impl<M> fmt::Debug for RateLimitLayer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("policy", &self.config.policy)
            .field("keys", &self.config.keys)
            .finish_non_exhaustive()
    }
}

impl RateLimitLayer {
    /// Starts a layer enforcing `policy` of `limiter`.
    pub fn builder(limiter: Arc<Limiter>, policy: &str) -> RateLimitLayerBuilder {
        RateLimitLayerBuilder {
            limiter,
            policy: policy.to_owned(),
            keys: Vec::new(),
            client_ip: ClientIpResolver::new(),
            client_ip_extension: false,
            filters: Filters::default(),
            shadow: false,
            outcomes: None,
            headers: Headers::default(),
            when_missing: WhenMissing::default(),
            hooks: Hooks::default(),
            challenge: None,
            pardon: false,
            fail_open: false,
            wait_up_to: None,
            max_body: DEFAULT_MAX_BODY,
            reserve: None,
        }
    }

    /// This layer with responses whose body is axum's own `Body`, the type an axum app
    /// serves: around a whole `Router` served by `axum::serve`, no
    /// `map(ResponseBody::into_body)` is needed, and under `Router::layer` axum boxes
    /// nothing per request (it boxes a body of any other type). A concurrency lease rides in
    /// the body as it does in a [`ResponseBody`](super::ResponseBody), released when the
    /// body ends; an inner body that is not axum's is boxed into one.
    #[cfg(feature = "axum")]
    pub fn axum_body(self) -> RateLimitLayer<Axum> {
        RateLimitLayer {
            config: self.config,
            mode: PhantomData,
        }
    }
}

impl<M> RateLimitLayer<M> {
    /// The layer's counters so far (shared by every service it made).
    pub fn stats(&self) -> LayerStats {
        self.config.stats.snapshot()
    }
}

impl<S, M> Layer<S> for RateLimitLayer<M> {
    type Service = RateLimit<S, M>;

    fn layer(&self, inner: S) -> RateLimit<S, M> {
        RateLimit::new(inner, self.config.clone())
    }
}

/// Configures a [`RateLimitLayer`]; [`build`](Self::build) checks it.
pub struct RateLimitLayerBuilder {
    limiter: Arc<Limiter>,
    policy: String,
    keys: Vec<(String, Key)>,
    client_ip: ClientIpResolver,
    client_ip_extension: bool,
    filters: Filters,
    shadow: bool,
    outcomes: Option<Outcomes>,
    headers: Headers,
    when_missing: WhenMissing,
    hooks: Hooks,
    challenge: Option<(Arc<dyn Challenge>, String)>,
    pardon: bool,
    fail_open: bool,
    wait_up_to: Option<Duration>,
    max_body: usize,
    reserve: Option<Reserve>,
}

impl RateLimitLayerBuilder {
    /// The value of the policy's selector `name` comes from `key`. Every selector the
    /// policy's rule names needs one.
    pub fn selector(mut self, name: &str, key: Key) -> Self {
        self.keys.push((name.to_owned(), key));
        self
    }

    /// How the client address is found (trusted proxies, IPv6 grouping).
    pub fn client_ip(mut self, resolver: ClientIpResolver) -> Self {
        self.client_ip = resolver;
        self
    }

    /// Leaves the resolved client address in the request's extensions as
    /// [`ClientIp`](crate::ClientIp), so handlers can log the address the limit was keyed on.
    /// Off by default: it costs an allocation per request (and often makes the extensions map
    /// grow), which an app that does not read it should not pay.
    pub fn client_ip_extension(mut self, insert: bool) -> Self {
        self.client_ip_extension = insert;
        self
    }

    /// Limit only these methods (e.g. `[Method::POST]`); other requests pass untouched.
    pub fn methods(mut self, methods: impl IntoIterator<Item = Method>) -> Self {
        self.filters.methods.extend(methods);
        self
    }

    /// Limit only these paths: exact (`/login`) or prefixes ending in `*` (`/api/*`).
    pub fn paths<'p>(mut self, paths: impl IntoIterator<Item = &'p str>) -> Self {
        self.filters
            .paths
            .extend(paths.into_iter().map(PathPattern::parse));
        self
    }

    /// Clients in these networks are never limited.
    pub fn exempt(mut self, networks: impl IntoIterator<Item = IpNet>) -> Self {
        self.filters.exempt.extend(networks);
        self
    }

    /// Clients in these networks are refused with 403 (the deny list wins over exemptions).
    pub fn deny(mut self, networks: impl IntoIterator<Item = IpNet>) -> Self {
        self.filters.deny.extend(networks);
        self
    }

    /// Decide and count as usual, but let every request through; the audit hook still sees
    /// what would have been refused (with `shadow: true`), and no rate limit header is sent.
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// Count only responses that match (e.g. failed logins). Before the inner service runs
    /// the layer only *peeks*, refusing a client that is already limited; the hit is
    /// recorded after the response. So up to as many requests as are in flight at once may
    /// pass before their failures are counted: the bound is the limit plus the concurrency
    /// of one client. A refused attempt is counted too (so the policy's penalty grows).
    pub fn count_only(mut self, outcomes: Outcomes) -> Self {
        self.outcomes = Some(outcomes);
        self
    }

    /// Which header fields to write (`Retry-After` and the IETF fields by default).
    pub fn headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }

    pub fn when_missing(mut self, when_missing: WhenMissing) -> Self {
        self.when_missing = when_missing;
        self
    }

    /// Sees every denial, shadow ones included (for an audit log). Called on the request's
    /// task: keep it quick, or hand the record to a channel.
    pub fn on_denied<F>(mut self, hook: F) -> Self
    where
        F: Fn(&Denied<'_>) + Send + Sync + 'static,
    {
        self.hooks.audit = Some(Arc::new(hook));
        self
    }

    /// Renders the answer to a denial; `None` falls back to problem+json. Rate limit and
    /// challenge headers are added to whatever it returns. Not used for gRPC requests.
    pub fn render<F>(mut self, render: F) -> Self
    where
        F: Fn(&Denied<'_>) -> Option<Response<Bytes>> + Send + Sync + 'static,
    {
        self.hooks.render = Some(Arc::new(render));
        self
    }

    /// Offers `challenge` to refused clients. A request with a correct answer is admitted
    /// if policy `ceiling` (keyed by the same selectors) admits it: `ceiling` counts solved
    /// requests only, and solving never gets a client past it.
    pub fn challenge(mut self, challenge: impl Challenge, ceiling: &str) -> Self {
        self.challenge = Some((Arc::new(challenge), ceiling.to_owned()));
        self
    }

    /// A solved challenge also pardons the key: its counters and penalty are cleared (the
    /// CAPTCHA case: a person proved, let them carry on). Off by default.
    pub fn pardon_on_solve(mut self, pardon: bool) -> Self {
        self.pardon = pardon;
        self
    }

    /// When the limiter cannot decide (the store is down): `false` (the default) answers
    /// 503; `true` admits, logs a warning and counts it in [`LayerStats::failed_open`].
    pub fn fail_open(mut self, fail_open: bool) -> Self {
        self.fail_open = fail_open;
        self
    }

    /// Instead of refusing, wait until the request would be admitted, when that is at most
    /// `max` away (in total). Meant for outgoing calls and jobs; on a server it holds a
    /// connection open while it waits.
    pub fn wait_up_to(mut self, max: Duration) -> Self {
        self.wait_up_to = Some(max);
        self
    }

    /// Largest body read for form and JSON field keys (64 KiB by default); larger get 413.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    /// Reserve instead of check: admit each request on an estimate of its cost, and settle
    /// at the actual cost its response reports (see [`Reserve`]). The policy's rule must
    /// hold rate leaves only; `count_only`, `challenge` and `wait_up_to` do not combine
    /// with it.
    pub fn reserve(mut self, reserve: Reserve) -> Self {
        self.reserve = Some(reserve);
        self
    }

    /// Checks the configuration against the limiter's policies.
    ///
    /// A policy whose rule has a concurrency leaf (`user:3 concurrent`) makes the layer
    /// take a lease for each admitted request, held by the response body until it ends or
    /// is dropped; [`reserve`](Self::reserve) makes it reserve. Either refuses
    /// `count_only`, `challenge` and `wait_up_to`.
    pub fn build(mut self) -> Result<RateLimitLayer, Error> {
        let policy = self.find_policy(&self.policy)?;
        self.check_keys(&policy)?;
        let hold = self.hold(&policy)?;
        if !self.client_ip.prefixes_valid() {
            return Err(Error::BadPrefix);
        }
        let challenge = match self.challenge.take() {
            Some((challenge, ceiling)) => {
                let compiled = self.find_policy(&ceiling)?;
                if compiled.has_concurrency() {
                    return Err(Error::ConcurrentCeiling(ceiling));
                }
                self.covers(&compiled)?;
                Some(ChallengeConfig {
                    challenge,
                    ceiling_fields: PolicyFields::new(&compiled),
                    ceiling,
                    pardon: self.pardon,
                })
            }
            None => None,
        };
        let needs_client_ip = self.client_ip_extension
            || self.filters.needs_client_ip()
            || self.keys.iter().any(|(_, k)| k.needs_client_ip());
        let needs_body = self.keys.iter().any(|(_, k)| k.needs_body());
        let client_ip_only = matches!(&self.keys[..], [(_, key)] if key.is_plain_client_ip())
            && self.outcomes.is_none();
        let fields = PolicyFields::new(&policy);
        let watch = self.limiter.watch(&self.policy);
        let mut config = Config {
            refusal: Refusal::new(&self.policy),
            fields,
            needs_body,
            always_slow: needs_body || !matches!(hold, Hold::Check),
            hold,
            needs_client_ip,
            limiter: self.limiter,
            policy: watch,
            keys: self.keys,
            client_ip_only,
            quick: false,
            client_ip: self.client_ip,
            client_ip_extension: self.client_ip_extension,
            filters: self.filters,
            shadow: self.shadow,
            outcomes: self.outcomes,
            headers: self.headers,
            when_missing: self.when_missing,
            hooks: self.hooks,
            challenge,
            fail_open: self.fail_open,
            wait_up_to: self.wait_up_to,
            max_body: self.max_body,
            stats: Stats::default(),
        };
        config.quick = quick::applies(&config);
        Ok(RateLimitLayer {
            config: Arc::new(config),
            mode: PhantomData,
        })
    }

    /// Check, lease or reserve, and the options that do not combine with the latter two.
    fn hold(&mut self, policy: &CompiledPolicy) -> Result<Hold, Error> {
        let (hold, kind) = match (policy.has_concurrency(), self.reserve.take()) {
            (true, Some(_)) => return Err(Error::ReserveConcurrency(self.policy.clone())),
            (true, None) => (Hold::Lease, "takes leases"),
            (false, Some(reserve)) => (Hold::Reserve(reserve.validate()?), "reserves"),
            (false, None) => return Ok(Hold::Check),
        };
        let option = if self.outcomes.is_some() {
            Some("count_only")
        } else if self.challenge.is_some() {
            Some("challenge")
        } else if self.wait_up_to.is_some() {
            Some("wait_up_to")
        } else {
            None
        };
        match option {
            Some(option) => Err(Error::Incompatible {
                policy: self.policy.clone(),
                kind,
                option,
            }),
            None => Ok(hold),
        }
    }

    fn find_policy(&self, name: &str) -> Result<Arc<CompiledPolicy>, Error> {
        self.limiter
            .policy(name)
            .ok_or_else(|| Error::UnknownPolicy(name.to_owned()))
    }

    /// One key per selector name, none unused, and every name the policy needs.
    fn check_keys(&self, policy: &CompiledPolicy) -> Result<(), Error> {
        let mut seen = HashSet::new();
        for (name, _) in &self.keys {
            if !seen.insert(name.as_str()) {
                return Err(Error::DuplicateKey(name.clone()));
            }
        }
        let used = selector_names(policy);
        if let Some((name, _)) = self.keys.iter().find(|(n, _)| !used.contains(n)) {
            return Err(Error::UnusedKey {
                policy: self.policy.clone(),
                selector: name.clone(),
            });
        }
        self.covers(policy)
    }

    fn covers(&self, policy: &CompiledPolicy) -> Result<(), Error> {
        for name in selector_names(policy) {
            if !self.keys.iter().any(|(n, _)| *n == name) {
                return Err(Error::NoKey {
                    policy: policy.name().to_owned(),
                    selector: name,
                });
            }
        }
        Ok(())
    }
}

fn selector_names(policy: &CompiledPolicy) -> Vec<String> {
    let mut names: Vec<String> = policy
        .leaves
        .iter()
        .flat_map(|l| l.leaf.selector.names().iter().cloned())
        .collect();
    names.sort();
    names.dedup();
    names
}
