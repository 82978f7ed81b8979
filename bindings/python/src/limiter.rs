//! `Limiter`: named policies over a store, for Python threads and asyncio.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use sluice_limiter::{Checked, Limiter as RustLimiter, Policy, Released};
use smallvec::SmallVec;

use crate::decision::Decision;
use crate::errors::{config_error, limiter_error, policy_error, store_error, token_error};
use crate::lease::{Lease, Reservation, Side, seconds};
use crate::policies::policies_from_dict;
use crate::selectors::{held_selectors, owned_selectors};

/// Named policies over a store, shared by every thread of the process.
///
/// A remote store is opened twice, once per way of waiting. Calls from Python threads
/// (`check`) run on a current-thread runtime that the calling threads drive themselves
/// (`block_on`): the caller writes the request and reads the answer, where a multi-thread
/// runtime would wake a worker to write and be woken by it to return (measured on Redis:
/// client CPU per decision about 47 µs that way). Awaitables (`check_async`) run on the
/// runtime asyncio's bridge drives. Both are atomic on the store, so the two paths share
/// every counter exactly; each has its own near cache and failure counters (`stats` sums
/// them). The memory store is one, used by both.
#[pyclass(frozen, module = "sluice", name = "Limiter")]
pub struct Limiter {
    /// Decides for Python threads.
    threads: Arc<RustLimiter>,
    /// Drives `threads` for a remote store (shared with the leases and reservations taken
    /// through it); `None` for the memory store.
    runtime: Option<Arc<Driver>>,
    /// Decides awaitables: `threads` itself for the memory store.
    awaitables: Arc<RustLimiter>,
    /// The store URL with any password taken out.
    store: String,
    /// Whether the store decides in this process (no waiting, no GIL release).
    local: bool,
}

/// The current-thread runtime of a remote store's thread side, which the calling threads
/// drive themselves.
pub(crate) struct Driver(Option<tokio::runtime::Runtime>);

impl Driver {
    pub(crate) fn block_on<F: Future>(&self, work: F) -> F::Output {
        self.0
            .as_ref()
            .expect("a driver holds its runtime until dropped")
            .block_on(work)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        // Never wait for the store's background tasks when Python lets go of the last
        // limiter, lease or reservation on it.
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
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
        let pairs = borrow(&owned);
        let reset = self.threads.reset(policy, &pairs);
        let result = match &self.runtime {
            Some(runtime) => py.detach(|| runtime.block_on(reset)),
            // The memory store never waits.
            None => shared_runtime().block_on(reset),
        };
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
        let limiter = self.awaitables.clone();
        let policy = policy.to_owned();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let result = limiter.reset(&*policy, &borrow(&owned)).await;
            result.map_err(|e| Python::attach(|py| limiter_error(py, &e)))
        })
    }

    /// Takes a slot of `policy`'s concurrency leaves for `selectors`, deciding its rate
    /// leaves as `check` does: a `Lease`, admitted or not (`bool(lease)`), that holds the
    /// slot until released (`release()`, the end of a `with` block, or the lease time).
    #[pyo3(signature = (policy, selectors = None))]
    fn acquire(
        &self,
        py: Python<'_>,
        policy: &str,
        selectors: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Lease> {
        let owned = owned_selectors(selectors)?;
        let side = self.thread_side();
        let acquired = side.block(py, async {
            self.threads.acquire(policy, &borrow(&owned)).await
        });
        let acquired = acquired.map_err(|e| limiter_error(py, &e))?;
        Lease::new(py, Decision::new(acquired.checked), acquired.lease, side)
    }

    /// `acquire` as an awaitable.
    #[pyo3(signature = (policy, selectors = None))]
    fn acquire_async<'py>(
        &self,
        py: Python<'py>,
        policy: &str,
        selectors: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let owned = owned_selectors(selectors)?;
        let (limiter, side) = (self.awaitables.clone(), self.awaitable_side());
        let policy = policy.to_owned();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let acquired = limiter.acquire(&*policy, &borrow(&owned)).await;
            Python::attach(|py| {
                let acquired = acquired.map_err(|e| limiter_error(py, &e))?;
                Lease::new(py, Decision::new(acquired.checked), acquired.lease, side)
            })
        })
    }

    /// Admits or refuses a hit of cost `estimate` on `policy` for `selectors`, charging the
    /// estimate when admitted: a `Reservation` to `settle` with the actual cost once known.
    #[pyo3(signature = (policy, selectors = None, estimate = 1))]
    fn reserve(
        &self,
        py: Python<'_>,
        policy: &str,
        selectors: Option<&Bound<'_, PyAny>>,
        estimate: u64,
    ) -> PyResult<Reservation> {
        let owned = owned_selectors(selectors)?;
        let side = self.thread_side();
        let reserved = side.block(py, async {
            self.threads
                .reserve(policy, &borrow(&owned), estimate)
                .await
        });
        let reserved = reserved.map_err(|e| limiter_error(py, &e))?;
        let decision = Decision::new(reserved.checked);
        Reservation::new(py, decision, reserved.reservation, side, estimate)
    }

    /// `reserve` as an awaitable.
    #[pyo3(signature = (policy, selectors = None, estimate = 1))]
    fn reserve_async<'py>(
        &self,
        py: Python<'py>,
        policy: &str,
        selectors: Option<&Bound<'py, PyAny>>,
        estimate: u64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let owned = owned_selectors(selectors)?;
        let (limiter, side) = (self.awaitables.clone(), self.awaitable_side());
        let policy = policy.to_owned();
        pyo3_async_runtimes::tokio::future_into_py(py, async move {
            let reserved = limiter.reserve(&*policy, &borrow(&owned), estimate).await;
            Python::attach(|py| {
                let reserved = reserved.map_err(|e| limiter_error(py, &e))?;
                let decision = Decision::new(reserved.checked);
                Reservation::new(py, decision, reserved.reservation, side, estimate)
            })
        })
    }

    /// Releases the lease `token` (a `Lease.token`, from any process on the same store and
    /// policy): `"released"`, `"expired"` or `"not_held"`, as `Lease.release` answers.
    fn release(&self, py: Python<'_>, policy: &str, token: &str) -> PyResult<&'static str> {
        let lease = self
            .threads
            .lease(policy, token)
            .map_err(|e| token_error(py, &e))?;
        let released = self.thread_side().block(py, lease.release());
        released
            .map(Released::name)
            .map_err(|e| limiter_error(py, &e))
    }

    /// Renews the lease `token`: the seconds it has left, or None when it had expired.
    fn renew(&self, py: Python<'_>, policy: &str, token: &str) -> PyResult<Option<f64>> {
        let lease = self
            .threads
            .lease(policy, token)
            .map_err(|e| token_error(py, &e))?;
        let renewed = self.thread_side().block(py, async {
            let left = lease.renew().await;
            // Not released by this handle: the holder still holds it.
            let _ = lease.forget();
            left
        });
        renewed.map(seconds).map_err(|e| limiter_error(py, &e))
    }

    /// Settles the reservation `token` (a `Reservation.token`, from any process on the same
    /// store and policy) with the `actual` cost.
    fn settle(&self, py: Python<'_>, policy: &str, token: &str, actual: u64) -> PyResult<()> {
        let reservation = self
            .threads
            .reservation(policy, token)
            .map_err(|e| token_error(py, &e))?;
        let settled = self.thread_side().block(py, reservation.settle(actual));
        settled.map_err(|e| limiter_error(py, &e))
    }

    /// Every policy's rule text, by name.
    #[getter]
    fn policies(&self) -> std::collections::BTreeMap<String, String> {
        self.threads
            .policies()
            .iter()
            .map(|p| (p.name().to_owned(), p.policy.rule.to_string()))
            .collect()
    }

    /// Whether a policy's rule has a concurrency leaf: it is taken with `acquire`, not
    /// `check`.
    fn concurrent(&self, py: Python<'_>, policy: &str) -> PyResult<bool> {
        let policy = self.compiled(py, policy)?;
        Ok(policy.leaves.iter().any(|leaf| leaf.leaf.is_concurrency()))
    }

    /// The selector names a policy's rule uses, sorted.
    fn selectors(&self, py: Python<'_>, policy: &str) -> PyResult<Vec<String>> {
        let policy = self.compiled(py, policy)?;
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

    /// Near-cache answers, store errors, decisions taken without the store and prefetched
    /// blocks, as a dict.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let mut all = vec![self.threads.stats()];
        if !Arc::ptr_eq(&self.threads, &self.awaitables) {
            all.push(self.awaitables.stats());
        }
        let sum = |f: fn(&sluice_limiter::LimiterStats) -> u64| all.iter().map(f).sum::<u64>();
        let out = PyDict::new(py);
        out.set_item("near_cache_hits", sum(|s| s.near_cache_hits))?;
        out.set_item("store_errors", sum(|s| s.store_errors))?;
        out.set_item("failed_open", sum(|s| s.failed_open))?;
        out.set_item("failed_closed", sum(|s| s.failed_closed))?;
        out.set_item("failed_local", sum(|s| s.failed_local))?;
        out.set_item("prefetch_blocks", sum(|s| s.prefetch_blocks))?;
        out.set_item("prefetch_spent", sum(|s| s.prefetch_spent))?;
        Ok(out)
    }

    fn __repr__(&self) -> String {
        format!(
            "Limiter(store={:?}, policies={})",
            self.store,
            self.threads.policy_count()
        )
    }
}

#[derive(Clone, Copy)]
enum Mode {
    Check,
    Peek,
}

impl Limiter {
    /// The compiled policy named `name`, or `UnknownPolicy`.
    fn compiled(&self, py: Python<'_>, name: &str) -> PyResult<sluice_limiter::PolicyRef> {
        self.threads
            .policy(name)
            .ok_or_else(|| limiter_error(py, &sluice_limiter::Error::unknown_policy(name)))
    }

    /// Where the leases and reservations a Python thread takes run.
    fn thread_side(&self) -> Side {
        match &self.runtime {
            Some(driver) => Side::Threads(driver.clone()),
            None => Side::Memory,
        }
    }

    /// Where those an awaitable takes run.
    fn awaitable_side(&self) -> Side {
        if self.local {
            Side::Memory
        } else {
            Side::Shared
        }
    }

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
                Mode::Check => self.threads.try_check_now(policy, &pairs, cost),
                Mode::Peek => self.threads.try_peek_now(policy, &pairs, cost),
            };
            if let Some(result) = now {
                return result.map(Decision::new).map_err(|e| limiter_error(py, &e));
            }
        }
        let owned = owned_selectors(selectors)?;
        let decided = run(&self.threads, policy, &owned, cost, mode);
        let result = match &self.runtime {
            Some(runtime) => py.detach(|| runtime.block_on(decided)),
            None => shared_runtime().block_on(decided),
        };
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
        let limiter = self.awaitables.clone();
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

/// The runtime asyncio's bridge drives (one per process, one worker: it only carries the
/// awaitables' I/O; asyncio itself runs on its own thread).
pub(crate) fn shared_runtime() -> &'static tokio::runtime::Runtime {
    pyo3_async_runtimes::tokio::get_runtime()
}

fn build(
    py: Python<'_>,
    store: &str,
    policies: Vec<Policy>,
    near_cache: Option<(usize, f64)>,
) -> PyResult<Limiter> {
    let near_cache = near_cache
        .map(|(entries, seconds)| {
            Duration::try_from_secs_f64(seconds)
                .ok()
                .filter(|ttl| !ttl.is_zero())
                .map(|ttl| (entries, ttl))
                .ok_or_else(|| PyValueError::new_err("near_cache seconds must be positive"))
        })
        .transpose()?;
    let make = |opened: sluice_limiter::DynStore| {
        let mut builder = RustLimiter::builder(opened).policies(policies.clone());
        if let Some((entries, ttl)) = near_cache {
            builder = builder.near_cache(entries, ttl);
        }
        builder
            .build()
            .map(Arc::new)
            .map_err(|e| policy_error(py, &e))
    };
    let open = |runtime: &tokio::runtime::Runtime| {
        py.detach(|| runtime.block_on(sluice_server::open_store(store)))
            .map_err(|message| store_error(py, &message, false))
    };
    let local = store.starts_with("memory://");
    let (threads, runtime, awaitables) = if local {
        let limiter = make(open(shared_runtime())?)?;
        (limiter.clone(), None, limiter)
    } else {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| store_error(py, &format!("cannot start a runtime: {e}"), false))?;
        let threads = make(open(&runtime)?)?;
        let awaitables = make(open(shared_runtime())?)?;
        (threads, Some(Arc::new(Driver(Some(runtime)))), awaitables)
    };
    Ok(Limiter {
        threads,
        runtime,
        awaitables,
        store: sluice_redis::redact_url(store),
        local,
    })
}
