//! `sluice._sluice`: the workspace's limiter, stores and config reader for Python. Nothing is
//! implemented twice: policies are compiled by `sluice-limiter`, stores opened by the URL
//! reader of `sluice serve`, config files read by its config reader, header fields written
//! by the tower layer's code. The Python package (`python/sluice`) wraps this module with
//! the framework integrations.
//!
//! Calls on a store in this process (`memory://`) decide without releasing the GIL or
//! touching a runtime; calls on a remote store release the GIL while they wait (sync) or
//! return an awaitable driven by one shared tokio runtime (async), so an asyncio event loop
//! is never blocked.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use sluice_limiter::{Checked, Limiter as RustLimiter, Policy};
use smallvec::SmallVec;

mod errors;

use errors::{config_error, limiter_error, policy_error, store_error};

/// A refusal as Python receives it: `(status, headers, body)`.
type Refusal<'py> = (u16, Vec<(String, String)>, Bound<'py, PyBytes>);

/// A decision: admitted or not, with the numbers a client needs. It holds the Rust answer
/// and reads each field when asked: most callers look at `allowed` only, so nothing is
/// formatted or copied for the others.
#[pyclass(frozen, module = "sluice", name = "Decision")]
struct Decision {
    checked: Checked,
}

impl Decision {
    fn new(checked: Checked) -> Decision {
        Decision { checked }
    }
}

#[pymethods]
impl Decision {
    /// Whether the hit was admitted (a shadow policy always admits: see `shadow_denied`).
    #[getter]
    fn allowed(&self) -> bool {
        self.checked.decision.allowed()
    }

    /// Hits of cost 1 still admissible: after this hit if admitted, now if denied.
    #[getter]
    fn remaining(&self) -> u64 {
        self.checked.decision.remaining
    }

    /// The deciding leaf's capacity (the burst for GCRA, the count otherwise).
    #[getter]
    fn limit(&self) -> u64 {
        self.checked.decision.limit
    }

    /// Seconds until the same hit would pass, when denied and known.
    #[getter]
    fn retry_after(&self) -> Option<f64> {
        self.checked.decision.retry_after().map(|r| r.as_secs_f64())
    }

    /// Seconds until the deciding leaf is back to full capacity.
    #[getter]
    fn reset_after(&self) -> f64 {
        self.checked.decision.reset_after.as_secs_f64()
    }

    /// The deciding leaf as rule text, e.g. `ip+user:5/m`.
    #[getter]
    fn leaf(&self) -> String {
        self.checked.leaf().leaf.to_string()
    }

    /// Why it was denied: `limited`, `penalized`, `cost_exceeds_capacity`,
    /// `store_unavailable`; `None` when admitted.
    #[getter]
    fn denial(&self) -> Option<&'static str> {
        self.checked.decision.denial.map(|denial| denial.name())
    }

    /// A shadow policy would have denied this hit.
    #[getter]
    fn shadow_denied(&self) -> bool {
        self.checked.shadow_denied
    }

    /// Answered by the near cache without asking the store.
    #[getter]
    fn cached(&self) -> bool {
        self.checked.cached
    }

    /// The store could not decide; the policy's failure mode (`open`, `closed`, `local`) did.
    #[getter]
    fn without_store(&self) -> Option<&'static str> {
        self.checked.without_store.map(|mode| mode.name())
    }

    /// The policy's name.
    #[getter]
    fn policy(&self) -> &str {
        self.checked.policy.name()
    }

    /// The response header fields for this decision, as the tower layer writes them:
    /// `Retry-After` (denied only), the IETF `RateLimit-Policy` and `RateLimit`, and with
    /// `x_ratelimit=True` the `X-RateLimit-Limit/Remaining/Reset` trio.
    #[pyo3(signature = (*, retry_after = true, ietf = true, x_ratelimit = false))]
    fn headers(&self, retry_after: bool, ietf: bool, x_ratelimit: bool) -> Vec<(String, String)> {
        let which = sluice_tower::Headers {
            retry_after,
            ietf,
            x_ratelimit,
        };
        let fields = sluice_tower::header_fields(
            &self.checked.policy,
            &self.checked.decision,
            !self.checked.decision.allowed(),
            which,
        );
        pairs(&fields)
    }

    /// The default answer to this denial, as the tower layer gives it: `(status, headers,
    /// body)` with 429 and an RFC 9457 problem+json body (503 when the store could not
    /// decide and the policy fails closed), header fields as `headers` writes them. `None`
    /// when the decision admits.
    #[pyo3(signature = (*, retry_after = true, ietf = true, x_ratelimit = false))]
    fn refusal<'py>(
        &self,
        py: Python<'py>,
        retry_after: bool,
        ietf: bool,
        x_ratelimit: bool,
    ) -> Option<Refusal<'py>> {
        let which = sluice_tower::Headers {
            retry_after,
            ietf,
            x_ratelimit,
        };
        let response = sluice_tower::refusal(&self.checked.policy, &self.checked.decision, which)?;
        let headers = pairs(response.headers());
        let body = PyBytes::new(py, response.body());
        Some((response.status().as_u16(), headers, body))
    }

    fn __bool__(&self) -> bool {
        self.allowed()
    }

    fn __repr__(&self) -> String {
        let mut out = format!(
            "Decision(allowed={}, remaining={}, limit={}, leaf={:?}, policy={:?}",
            if self.allowed() { "True" } else { "False" },
            self.remaining(),
            self.limit(),
            self.leaf(),
            self.policy()
        );
        if let Some(denial) = self.denial() {
            out.push_str(&format!(", denial={denial:?}"));
        }
        if let Some(retry) = self.retry_after() {
            out.push_str(&format!(", retry_after={retry}"));
        }
        out.push(')');
        out
    }
}

fn pairs(fields: &http::HeaderMap) -> Vec<(String, String)> {
    fields
        .iter()
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            (canonical(name.as_str()), value)
        })
        .collect()
}

/// `ratelimit-policy` as `RateLimit-Policy`: the spelling of the specifications, which
/// frameworks pass on as given (HTTP field names are case-insensitive).
fn canonical(name: &str) -> String {
    name.split('-')
        .map(|word| match word {
            "ratelimit" => "RateLimit".to_owned(),
            "x" => "X".to_owned(),
            _ => {
                let mut chars = word.chars();
                chars.next().map_or_else(String::new, |first| {
                    first.to_ascii_uppercase().to_string() + chars.as_str()
                })
            }
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// Named policies over a store, shared by every thread of the process.
#[pyclass(frozen, module = "sluice", name = "Limiter")]
struct Limiter {
    inner: Arc<RustLimiter>,
    /// The store URL with any password taken out.
    store: String,
    /// Whether the store decides in this process (no waiting, no GIL release).
    local: bool,
}

#[pymethods]
impl Limiter {
    /// `Limiter(store="memory://", policies={"api": "user:100/m"})`. A policy is rule text or
    /// a dict of the fields a `[policies.NAME]` table of the config file takes. `config`
    /// reads policies from a `sluice serve` config file as well. `near_cache=(entries,
    /// seconds)` answers known denials without asking the store.
    #[new]
    #[pyo3(signature = (store = "memory://", policies = None, *, config = None, near_cache = None))]
    fn new(
        py: Python<'_>,
        store: &str,
        policies: Option<&Bound<'_, PyDict>>,
        config: Option<PathBuf>,
        near_cache: Option<(usize, f64)>,
    ) -> PyResult<Limiter> {
        let mut all = Vec::new();
        if let Some(path) = &config {
            let config = sluice_server::config::load(path).map_err(|e| config_error(py, &e))?;
            all.extend(config.policies);
        }
        if let Some(policies) = policies {
            all.extend(policies_from_dict(py, policies)?);
        }
        build(py, store, all, near_cache)
    }

    /// The policies of a `sluice serve` config file, on `store`.
    #[staticmethod]
    #[pyo3(signature = (path, store = "memory://", *, near_cache = None))]
    fn from_config(
        py: Python<'_>,
        path: PathBuf,
        store: &str,
        near_cache: Option<(usize, f64)>,
    ) -> PyResult<Limiter> {
        let config = sluice_server::config::load(&path).map_err(|e| config_error(py, &e))?;
        build(py, store, config.policies, near_cache)
    }

    /// Decides a hit of `cost` on `policy` for `selectors` (`{"user": "alice"}`) and records
    /// it. Cost 0 checks without recording.
    #[pyo3(signature = (policy, selectors = None, cost = 1))]
    fn check(
        &self,
        py: Python<'_>,
        policy: &str,
        selectors: Option<&Bound<'_, PyAny>>,
        cost: u64,
    ) -> PyResult<Decision> {
        self.decide(py, policy, selectors, cost, Mode::Check)
    }

    /// What a hit of `cost` would get, recording nothing.
    #[pyo3(signature = (policy, selectors = None, cost = 1))]
    fn peek(
        &self,
        py: Python<'_>,
        policy: &str,
        selectors: Option<&Bound<'_, PyAny>>,
        cost: u64,
    ) -> PyResult<Decision> {
        self.decide(py, policy, selectors, cost, Mode::Peek)
    }

    /// Pardon: clears the counters and penalty of the keys `selectors` name.
    #[pyo3(signature = (policy, selectors = None))]
    fn reset(
        &self,
        py: Python<'_>,
        policy: &str,
        selectors: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let owned = owned_selectors(selectors)?;
        let limiter = self.inner.clone();
        let policy = policy.to_owned();
        let result = py.detach(move || {
            runtime().block_on(async move { limiter.reset(&*policy, &borrow(&owned)).await })
        });
        result.map_err(|e| limiter_error(py, &e))
    }

    /// `check` as an awaitable, for asyncio: the event loop is never blocked.
    #[pyo3(signature = (policy, selectors = None, cost = 1))]
    fn check_async<'py>(
        &self,
        py: Python<'py>,
        policy: &str,
        selectors: Option<&Bound<'py, PyAny>>,
        cost: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.decide_async(py, policy, selectors, cost, Mode::Check)
    }

    /// `peek` as an awaitable.
    #[pyo3(signature = (policy, selectors = None, cost = 1))]
    fn peek_async<'py>(
        &self,
        py: Python<'py>,
        policy: &str,
        selectors: Option<&Bound<'py, PyAny>>,
        cost: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.decide_async(py, policy, selectors, cost, Mode::Peek)
    }

    /// `reset` as an awaitable.
    #[pyo3(signature = (policy, selectors = None))]
    fn reset_async<'py>(
        &self,
        py: Python<'py>,
        policy: &str,
        selectors: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let owned = owned_selectors(selectors)?;
        let limiter = self.inner.clone();
        let policy = policy.to_owned();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let result = limiter.reset(&*policy, &borrow(&owned)).await;
            result.map_err(|e| Python::attach(|py| limiter_error(py, &e)))
        })
    }

    /// Every policy's rule text, by name.
    #[getter]
    fn policies(&self) -> std::collections::BTreeMap<String, String> {
        self.inner
            .policies()
            .iter()
            .map(|p| (p.name().to_owned(), p.policy.rule.to_string()))
            .collect()
    }

    /// The selector names a policy's rule uses, sorted.
    fn selectors(&self, py: Python<'_>, policy: &str) -> PyResult<Vec<String>> {
        let policy = self
            .inner
            .policy(policy)
            .ok_or_else(|| limiter_error(py, &sluice_limiter::Error::unknown_policy(policy)))?;
        let mut names: Vec<String> = policy
            .leaves
            .iter()
            .flat_map(|leaf| leaf.leaf.selector.names().iter().cloned())
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// The store's URL, any password taken out.
    #[getter]
    fn store(&self) -> &str {
        &self.store
    }

    /// Near-cache answers, store errors and decisions taken without the store, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.inner.stats();
        let out = PyDict::new(py);
        out.set_item("near_cache_hits", stats.near_cache_hits)?;
        out.set_item("store_errors", stats.store_errors)?;
        out.set_item("failed_open", stats.failed_open)?;
        out.set_item("failed_closed", stats.failed_closed)?;
        out.set_item("failed_local", stats.failed_local)?;
        Ok(out)
    }

    fn __repr__(&self) -> String {
        format!(
            "Limiter(store={:?}, policies={})",
            self.store,
            self.inner.policy_count()
        )
    }
}

#[derive(Clone, Copy)]
enum Mode {
    Check,
    Peek,
}

impl Limiter {
    fn decide(
        &self,
        py: Python<'_>,
        policy: &str,
        selectors: Option<&Bound<'_, PyAny>>,
        cost: u64,
        mode: Mode,
    ) -> PyResult<Decision> {
        if self.local {
            // Borrowed straight from the Python strings: no copy, no GIL release.
            let held = held_selectors(selectors)?;
            let pairs = held
                .iter()
                .map(|(k, v)| Ok((k.to_str()?, v.to_str()?)))
                .collect::<PyResult<SmallVec<[_; 4]>>>()?;
            let now = match mode {
                Mode::Check => self.inner.try_check_now(policy, &pairs, cost),
                Mode::Peek => self.inner.try_peek_now(policy, &pairs, cost),
            };
            if let Some(result) = now {
                return result.map(Decision::new).map_err(|e| limiter_error(py, &e));
            }
        }
        let owned = owned_selectors(selectors)?;
        let limiter = self.inner.clone();
        let policy = policy.to_owned();
        let result = py.detach(move || {
            runtime().block_on(async move { run(&limiter, &policy, &owned, cost, mode).await })
        });
        result.map(Decision::new).map_err(|e| limiter_error(py, &e))
    }

    fn decide_async<'py>(
        &self,
        py: Python<'py>,
        policy: &str,
        selectors: Option<&Bound<'py, PyAny>>,
        cost: u64,
        mode: Mode,
    ) -> PyResult<Bound<'py, PyAny>> {
        let owned = owned_selectors(selectors)?;
        let limiter = self.inner.clone();
        let policy = policy.to_owned();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let result = run(&limiter, &policy, &owned, cost, mode).await;
            result
                .map(Decision::new)
                .map_err(|e| Python::attach(|py| limiter_error(py, &e)))
        })
    }
}

async fn run(
    limiter: &RustLimiter,
    policy: &str,
    selectors: &[(String, String)],
    cost: u64,
    mode: Mode,
) -> Result<Checked, sluice_limiter::Error> {
    let pairs = borrow(selectors);
    match mode {
        Mode::Check => limiter.check(policy, &pairs, cost).await,
        Mode::Peek => limiter.peek(policy, &pairs, cost).await,
    }
}

fn borrow(owned: &[(String, String)]) -> Vec<(&str, &str)> {
    owned
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// The runtime every remote store runs on: the one the asyncio bridge drives, so sync and
/// async calls share the store's connections.
fn runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

fn build(
    py: Python<'_>,
    store: &str,
    policies: Vec<Policy>,
    near_cache: Option<(usize, f64)>,
) -> PyResult<Limiter> {
    let url = store.to_owned();
    let opened = py.detach(|| runtime().block_on(sluice_server::open_store(&url)));
    let opened = opened.map_err(|message| store_error(py, &message, false))?;
    let local = store.starts_with("memory://");
    let mut builder = RustLimiter::builder(opened).policies(policies);
    if let Some((entries, seconds)) = near_cache {
        let ttl = Duration::try_from_secs_f64(seconds)
            .ok()
            .filter(|ttl| !ttl.is_zero())
            .ok_or_else(|| PyValueError::new_err("near_cache seconds must be positive"))?;
        builder = builder.near_cache(entries, ttl);
    }
    let inner = builder.build().map_err(|e| policy_error(py, &e))?;
    Ok(Limiter {
        inner: Arc::new(inner),
        store: sluice_redis::redact_url(store),
        local,
    })
}

/// Policies from `{"name": "rule"}` or `{"name": {"rule": ..., "algorithm": ...}}`. A dict
/// goes through the config file's own reader (written out as its TOML table), so it takes
/// exactly the fields and checks a config file does.
fn policies_from_dict(py: Python<'_>, policies: &Bound<'_, PyDict>) -> PyResult<Vec<Policy>> {
    let mut out = Vec::new();
    let mut tables = toml::Table::new();
    for (name, value) in policies.iter() {
        let name: String = name
            .extract()
            .map_err(|_| PyTypeError::new_err("policy names must be str"))?;
        if let Ok(rule) = value.cast::<PyString>() {
            let policy = Policy::new(name, rule.to_str()?).map_err(|e| policy_error(py, &e))?;
            out.push(policy);
        } else if let Ok(fields) = value.cast::<PyDict>() {
            // The rule is read first on its own, so its error points into the rule text.
            if let Some(rule) = fields.get_item("rule")?
                && let Ok(rule) = rule.cast::<PyString>()
            {
                Policy::new(name.clone(), rule.to_str()?).map_err(|e| policy_error(py, &e))?;
            }
            tables.insert(name, to_toml(fields.as_any(), &["policies"])?);
        } else {
            return Err(PyTypeError::new_err(format!(
                "policy `{name}` must be rule text or a dict of its fields"
            )));
        }
    }
    if !tables.is_empty() {
        let mut root = toml::Table::new();
        root.insert("policies".to_owned(), toml::Value::Table(tables));
        let text =
            toml::to_string(&root).map_err(|e| PyValueError::new_err(format!("policies: {e}")))?;
        let config = sluice_server::config::parse(Path::new("<policies>"), &text)
            .map_err(|e| config_error(py, &e))?;
        out.extend(config.policies);
    }
    Ok(out)
}

/// A Python value as TOML: str, int, float, bool, dict, list, and `timedelta` (as
/// milliseconds, which every duration field reads).
fn to_toml(value: &Bound<'_, PyAny>, at: &[&str]) -> PyResult<toml::Value> {
    if let Ok(b) = value.cast::<PyBool>() {
        return Ok(toml::Value::Boolean(b.is_true()));
    }
    if value.is_instance_of::<PyInt>() {
        return Ok(toml::Value::Integer(value.extract()?));
    }
    if value.is_instance_of::<PyFloat>() {
        return Ok(toml::Value::Float(value.extract()?));
    }
    if let Ok(s) = value.cast::<PyString>() {
        return Ok(toml::Value::String(s.to_str()?.to_owned()));
    }
    if let Ok(d) = value.cast::<PyDict>() {
        let mut table = toml::Table::new();
        for (k, v) in d.iter() {
            let k: String = k.extract()?;
            let mut path = at.to_vec();
            path.push(&k);
            table.insert(k.clone(), to_toml(&v, &path)?);
        }
        return Ok(toml::Value::Table(table));
    }
    if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
        let items = value
            .try_iter()?
            .map(|item| to_toml(&item?, at))
            .collect::<PyResult<Vec<_>>>()?;
        return Ok(toml::Value::Array(items));
    }
    if value.hasattr("total_seconds")? {
        let seconds: f64 = value.call_method0("total_seconds")?.extract()?;
        if seconds >= 0.0 && seconds.is_finite() {
            return Ok(toml::Value::String(format!(
                "{}ms",
                (seconds * 1000.0).round() as u64
            )));
        }
    }
    Err(PyTypeError::new_err(format!(
        "{}: cannot use a value of type {}",
        at.join("."),
        value.get_type().name()?
    )))
}

/// Selector names and values as Python strings, on the stack for the usual few (a decision
/// in memory takes a few hundred nanoseconds: two heap allocations would be a good part).
type Held<'py> = SmallVec<[(Bound<'py, PyString>, Bound<'py, PyString>); 4]>;

/// Selector names and values held as Python strings (ints are written as text).
fn held_selectors<'py>(selectors: Option<&Bound<'py, PyAny>>) -> PyResult<Held<'py>> {
    let Some(selectors) = selectors else {
        return Ok(Held::new());
    };
    if selectors.is_none() {
        return Ok(Held::new());
    }
    let dict = selectors
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err("selectors must be a dict of str to str"))?;
    let mut out = Held::with_capacity(dict.len());
    for (name, value) in dict.iter() {
        let name = name
            .cast_into::<PyString>()
            .map_err(|_| PyTypeError::new_err("selector names must be str"))?;
        let value = if value.is_instance_of::<PyString>() {
            value.cast_into::<PyString>()?
        } else if value.is_instance_of::<PyInt>() && !value.is_instance_of::<PyBool>() {
            value.str()?
        } else {
            return Err(PyTypeError::new_err(format!(
                "selector `{}` must be str or int, not {}",
                name.to_str()?,
                value.get_type().name()?
            )));
        };
        out.push((name, value));
    }
    Ok(out)
}

fn owned_selectors(selectors: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<(String, String)>> {
    held_selectors(selectors)?
        .iter()
        .map(|(k, v)| Ok((k.to_str()?.to_owned(), v.to_str()?.to_owned())))
        .collect()
}

/// Resolves the client address of a request behind proxies, and the key it is limited
/// under, with the tower layer's own rules: forwarding headers are believed only from
/// `trusted` networks, walked right to left; IPv6 clients are keyed by their /64.
#[pyclass(frozen, module = "sluice", name = "ClientIp")]
struct ClientIp {
    resolver: sluice_tower::ClientIpResolver,
}

#[pymethods]
impl ClientIp {
    #[new]
    #[pyo3(signature = (trusted = Vec::new(), *, header = "x-forwarded-for", ipv4_prefix = 32, ipv6_prefix = 64))]
    fn new(
        trusted: Vec<String>,
        header: &str,
        ipv4_prefix: u8,
        ipv6_prefix: u8,
    ) -> PyResult<ClientIp> {
        let networks = trusted
            .iter()
            .map(|net| parse_network(net))
            .collect::<PyResult<Vec<_>>>()?;
        let header = match header.to_ascii_lowercase().as_str() {
            "x-forwarded-for" => sluice_tower::ForwardedHeader::XForwardedFor,
            "forwarded" => sluice_tower::ForwardedHeader::Forwarded,
            other => {
                return Err(PyValueError::new_err(format!(
                    "header `{other}` is not x-forwarded-for or forwarded"
                )));
            }
        };
        if ipv4_prefix > 32 || ipv6_prefix > 128 {
            return Err(PyValueError::new_err(
                "ipv4_prefix is at most 32 and ipv6_prefix at most 128",
            ));
        }
        Ok(ClientIp {
            resolver: sluice_tower::ClientIpResolver::new()
                .trust(networks)
                .header(header)
                .ipv4_prefix(ipv4_prefix)
                .ipv6_prefix(ipv6_prefix),
        })
    }

    /// The client's address: `peer` (the socket's) unless a trusted proxy forwarded it.
    /// `headers` is a list of `(name, value)` pairs; only the forwarding header is read.
    #[pyo3(signature = (peer, headers = Vec::new()))]
    fn resolve(&self, peer: &str, headers: Vec<(String, String)>) -> PyResult<String> {
        let peer = parse_ip(peer)?;
        Ok(self
            .resolver
            .resolve(peer, &header_map(headers))
            .to_string())
    }

    /// The key the client is limited under: its address, or its network for IPv6.
    #[pyo3(signature = (peer, headers = Vec::new()))]
    fn key(&self, peer: &str, headers: Vec<(String, String)>) -> PyResult<String> {
        let peer = parse_ip(peer)?;
        let client = self.resolver.resolve(peer, &header_map(headers));
        Ok(self.resolver.key(client))
    }
}

fn parse_ip(text: &str) -> PyResult<std::net::IpAddr> {
    text.trim()
        .parse()
        .map_err(|_| PyValueError::new_err(format!("`{text}` is not an IP address")))
}

fn parse_network(text: &str) -> PyResult<ipnet::IpNet> {
    let text = text.trim();
    if let Ok(net) = text.parse() {
        return Ok(net);
    }
    parse_ip(text)
        .map(ipnet::IpNet::from)
        .map_err(|_| PyValueError::new_err(format!("`{text}` is not an IP network")))
}

/// Header pairs as a map; a pair whose name or value HTTP would refuse is left out.
fn header_map(headers: Vec<(String, String)>) -> http::HeaderMap {
    let mut map = http::HeaderMap::new();
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            map.append(name, value);
        }
    }
    map
}

/// The first 128 bits of SHA-256(`value`) in hex, as the tower layer keys form fields: a
/// stable name that does not reveal a submitted username to whoever reads the store.
#[pyfunction]
fn hashed(value: &str) -> String {
    sluice_tower::hashed(value)
}

/// Checks rule text, raising `RuleError` (a `ValueError`) with the column when it is wrong;
/// returns it as the printer writes it.
#[pyfunction]
fn parse_rule(py: Python<'_>, rule: &str) -> PyResult<String> {
    let policy = Policy::new("rule", rule).map_err(|e| policy_error(py, &e))?;
    Ok(policy.rule.to_string())
}

#[pymodule]
fn _sluice(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Limiter>()?;
    m.add_class::<Decision>()?;
    m.add_class::<ClientIp>()?;
    m.add_function(wrap_pyfunction!(hashed, m)?)?;
    m.add_function(wrap_pyfunction!(parse_rule, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
