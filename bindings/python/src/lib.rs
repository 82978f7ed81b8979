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

use pyo3::prelude::*;
use sluice_limiter::Policy;

mod client_ip;
mod decision;
mod errors;
mod lease;
mod limiter;
mod policies;
mod selectors;

use client_ip::ClientIp;
use decision::Decision;
use errors::policy_error;
use lease::{Lease, Reservation};
use limiter::Limiter;

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
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(1).enable_all();
    pyo3_async_runtimes::tokio::init(builder);
    m.add_class::<Limiter>()?;
    m.add_class::<Decision>()?;
    m.add_class::<Lease>()?;
    m.add_class::<Reservation>()?;
    m.add_class::<ClientIp>()?;
    m.add_function(wrap_pyfunction!(hashed, m)?)?;
    m.add_function(wrap_pyfunction!(parse_rule, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
