//! `Lease` and `Reservation`: what `Limiter.acquire` and `Limiter.reserve` answer, as Python
//! holds them.
//!
//! Each remembers which side of the limiter made it (see `Limiter`): a remote store is opened
//! once for Python threads, on a current-thread runtime the callers drive, and once for
//! awaitables, on the shared runtime. A lease's later calls go through its own side's
//! connection, whichever way they are made: a sync call blocks on its side (the GIL
//! released), an awaitable of a lease taken by a thread drives the thread side from a
//! blocking task of the shared runtime, so no connection waits for a runtime nobody drives.

use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use sluice_limiter::{Lease as RustLease, Released, Reservation as RustReservation};
use tokio::sync::Mutex;

use crate::decision::Decision;
use crate::errors::limiter_error;
use crate::limiter::{Driver, shared_runtime};

/// Where a lease's or reservation's store calls run.
#[derive(Clone)]
pub(crate) enum Side {
    /// The memory store: every call completes at once.
    Memory,
    /// A remote store's thread side, driven by whoever blocks on it.
    Threads(Arc<Driver>),
    /// A remote store's awaitable side, on the shared runtime.
    Shared,
}

impl Side {
    /// Runs `work` to its end from a Python thread, the GIL released while a remote store
    /// answers.
    pub(crate) fn block<T: Send>(&self, py: Python<'_>, work: impl Future<Output = T> + Send) -> T {
        match self {
            // The memory store never waits: no GIL release, and no runtime, for nothing.
            // Polled once in place (its futures are ready at once), a runtime only if not.
            Side::Memory => {
                let mut work = std::pin::pin!(work);
                let mut context = Context::from_waker(Waker::noop());
                match work.as_mut().poll(&mut context) {
                    Poll::Ready(out) => out,
                    Poll::Pending => shared_runtime().block_on(work),
                }
            }
            Side::Threads(driver) => py.detach(|| driver.block_on(work)),
            Side::Shared => py.detach(|| shared_runtime().block_on(work)),
        }
    }

    /// `work` as an awaitable for asyncio.
    fn awaitable<'py, T>(
        &self,
        py: Python<'py>,
        work: impl Future<Output = PyResult<T>> + Send + 'static,
    ) -> PyResult<Bound<'py, PyAny>>
    where
        T: for<'a> IntoPyObject<'a> + Send + 'static,
    {
        match self {
            Side::Memory | Side::Shared => pyo3_async_runtimes::tokio::future_into_py(py, work),
            Side::Threads(driver) => {
                let driver = driver.clone();
                pyo3_async_runtimes::tokio::future_into_py(py, async move {
                    tokio::task::spawn_blocking(move || driver.block_on(work))
                        .await
                        .map_err(|e| PyRuntimeError::new_err(format!("sluice: {e}")))?
                })
            }
        }
    }
}

/// A lease and the side it runs on. The last owner (the Python object, or an awaitable
/// still running) lets go of a lease not yet released by releasing it in the background:
/// on the memory store at once, on a remote store by a task of the shared runtime, never
/// blocking the thread that drops it.
struct Held {
    lease: Mutex<Option<RustLease>>,
    side: Side,
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some(lease) = self.lease.get_mut().take() else {
            return;
        };
        match &self.side {
            // Released by the lease's own drop, in place.
            Side::Memory => drop(lease),
            Side::Shared => {
                shared_runtime().spawn(async move {
                    let _ = lease.release().await;
                });
            }
            Side::Threads(driver) => {
                let driver = driver.clone();
                shared_runtime().spawn_blocking(move || {
                    let _ = driver.block_on(lease.release());
                });
            }
        }
    }
}

/// `Limiter.acquire`'s answer: the decision and, while admitted and not released, the slot
/// it holds. `bool(lease)` is `lease.allowed`. As a context manager (`with`, `async with`)
/// it releases when the block ends.
#[pyclass(frozen, module = "sluice", name = "Lease")]
pub struct Lease {
    decision: Py<Decision>,
    held: Arc<Held>,
    id: Option<String>,
    token: Option<String>,
}

impl Lease {
    pub(crate) fn new(
        py: Python<'_>,
        decision: Decision,
        lease: Option<RustLease>,
        side: Side,
    ) -> PyResult<Lease> {
        let (id, token) = match &lease {
            Some(lease) => (Some(lease.id().to_string()), Some(lease.token())),
            None => (None, None),
        };
        Ok(Lease {
            decision: Py::new(py, decision)?,
            held: Arc::new(Held {
                lease: Mutex::new(lease),
                side,
            }),
            id,
            token,
        })
    }
}

#[pymethods]
impl Lease {
    /// The acquire's decision.
    #[getter]
    fn decision(&self, py: Python<'_>) -> Py<Decision> {
        self.decision.clone_ref(py)
    }

    /// Whether the acquire was admitted (a shadow policy admits without a slot: see
    /// `decision.shadow_denied` and `held`).
    #[getter]
    fn allowed(&self) -> bool {
        self.decision.get().is_allowed()
    }

    fn __bool__(&self) -> bool {
        self.allowed()
    }

    /// Whether this object still holds a slot: admitted with one, and not yet released.
    #[getter]
    fn held(&self) -> bool {
        match self.held.lease.try_lock() {
            Ok(lease) => lease.is_some(),
            // A call on the lease is running: it still held the slot when it began.
            Err(_) => true,
        }
    }

    /// The lease's id (16 hex digits), or None when no slot was taken.
    #[getter]
    fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// The lease as text, for `Limiter.release` and `Limiter.renew` in another process (as
    /// `/v1/release` takes it); None when no slot was taken.
    #[getter]
    fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Gives the slot back now: `"released"`, `"expired"` when the lease had expired (its
    /// slot was free already), or `"not_held"` when there was nothing to release (released
    /// before, denied, or unknown to the store). The last two are harmless.
    fn release(&self, py: Python<'_>) -> PyResult<&'static str> {
        let held = self.held.clone();
        let answer = self.held.side.block(py, release(held));
        answer.map_err(|e| limiter_error(py, &e))
    }

    /// `release` as an awaitable.
    fn release_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let held = self.held.clone();
        self.held.side.awaitable(py, async move {
            release(held)
                .await
                .map_err(|e| Python::attach(|py| limiter_error(py, &e)))
        })
    }

    /// Extends the lease to one lease time from now: the seconds it has left, or None when
    /// it had expired or is not held (it cannot come back: acquire again).
    fn renew(&self, py: Python<'_>) -> PyResult<Option<f64>> {
        let held = self.held.clone();
        let answer = self.held.side.block(py, renew(held));
        answer.map_err(|e| limiter_error(py, &e))
    }

    /// `renew` as an awaitable.
    fn renew_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let held = self.held.clone();
        self.held.side.awaitable(py, async move {
            renew(held)
                .await
                .map_err(|e| Python::attach(|py| limiter_error(py, &e)))
        })
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Releases when the `with` block ends, however it ends. A store error of the release is
    /// raised when the block ended normally; when the block raised, its exception goes on
    /// and the slot frees itself at the lease time. Never suppresses an exception.
    #[pyo3(signature = (*exc))]
    fn __exit__(&self, py: Python<'_>, exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        let raised = raising(exc);
        match self.release(py) {
            Err(_) if raised => Ok(false),
            released => released.map(|_| false),
        }
    }

    fn __aenter__<'py>(slf: Py<Self>, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        pyo3_async_runtimes::tokio::future_into_py(py, async move { Ok(slf) })
    }

    /// Releases when the `async with` block ends, as `__exit__` does.
    #[pyo3(signature = (*exc))]
    fn __aexit__<'py>(
        &self,
        py: Python<'py>,
        exc: &Bound<'py, PyTuple>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let raised = raising(exc);
        let held = self.held.clone();
        self.held.side.awaitable(py, async move {
            match release(held).await {
                Err(_) if raised => Ok(false),
                released => released
                    .map(|_| false)
                    .map_err(|e| Python::attach(|py| limiter_error(py, &e))),
            }
        })
    }

    fn __repr__(&self) -> String {
        match &self.id {
            Some(id) if self.held() => format!("Lease(id={id}, held)"),
            Some(id) => format!("Lease(id={id}, released)"),
            None => format!("Lease(allowed={}, no slot)", self.allowed()),
        }
    }
}

/// Whether `__exit__`'s arguments carry an exception the block raised.
fn raising(exc: &Bound<'_, PyTuple>) -> bool {
    exc.get_item(0).is_ok_and(|kind| !kind.is_none())
}

async fn release(held: Arc<Held>) -> Result<&'static str, sluice_limiter::Error> {
    let lease = held.lease.lock().await.take();
    match lease {
        Some(lease) => lease.release().await.map(Released::name),
        None => Ok(Released::name(Released::NotHeld)),
    }
}

async fn renew(held: Arc<Held>) -> Result<Option<f64>, sluice_limiter::Error> {
    let lease = held.lease.lock().await;
    match lease.as_ref() {
        Some(lease) => Ok(seconds(lease.renew().await?)),
        None => Ok(None),
    }
}

/// `Limiter.reserve`'s answer: the decision on the estimate and, when admitted, the charge
/// to settle with the actual cost. `bool(reservation)` is `reservation.allowed`. One never
/// settled keeps its estimate charged.
#[pyclass(frozen, module = "sluice", name = "Reservation")]
pub struct Reservation {
    decision: Py<Decision>,
    reservation: Arc<Mutex<Option<RustReservation>>>,
    side: Side,
    estimate: u64,
    token: Option<String>,
}

impl Reservation {
    pub(crate) fn new(
        py: Python<'_>,
        decision: Decision,
        reservation: Option<RustReservation>,
        side: Side,
        estimate: u64,
    ) -> PyResult<Reservation> {
        let token = reservation.as_ref().map(RustReservation::token);
        Ok(Reservation {
            decision: Py::new(py, decision)?,
            reservation: Arc::new(Mutex::new(reservation)),
            side,
            estimate,
            token,
        })
    }
}

#[pymethods]
impl Reservation {
    /// The decision on the estimate.
    #[getter]
    fn decision(&self, py: Python<'_>) -> Py<Decision> {
        self.decision.clone_ref(py)
    }

    #[getter]
    fn allowed(&self) -> bool {
        self.decision.get().is_allowed()
    }

    fn __bool__(&self) -> bool {
        self.allowed()
    }

    /// The cost asked for (charged when admitted).
    #[getter]
    fn estimate(&self) -> u64 {
        self.estimate
    }

    /// The reservation as text, for `Limiter.settle` in another process (as `/v1/settle`
    /// takes it); None when nothing was charged.
    #[getter]
    fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// Whether it still waits for `settle`: admitted with a charge, not settled yet.
    #[getter]
    fn pending(&self) -> bool {
        match self.reservation.try_lock() {
            Ok(reservation) => reservation.is_some(),
            Err(_) => true,
        }
    }

    /// Charges the actual cost: refunds what the estimate took too much, or charges the
    /// excess as debt that delays the next admissions (never refused). Raises
    /// `SluiceError` when there is nothing to settle (denied, or settled already).
    fn settle(&self, py: Python<'_>, actual: u64) -> PyResult<()> {
        let reservation = self.reservation.clone();
        let settled = self.side.block(py, settle(reservation, actual));
        settled.map_err(|e| settle_error(py, e))
    }

    /// `settle` as an awaitable.
    fn settle_async<'py>(&self, py: Python<'py>, actual: u64) -> PyResult<Bound<'py, PyAny>> {
        let reservation = self.reservation.clone();
        self.side.awaitable(py, async move {
            settle(reservation, actual)
                .await
                .map_err(|e| Python::attach(|py| settle_error(py, e)))
        })
    }

    fn __repr__(&self) -> String {
        format!(
            "Reservation(estimate={}, allowed={}, pending={})",
            self.estimate,
            self.allowed(),
            self.pending()
        )
    }
}

/// Why a settle did not charge.
enum SettleError {
    Nothing,
    Limiter(sluice_limiter::Error),
}

fn settle_error(py: Python<'_>, error: SettleError) -> PyErr {
    match error {
        SettleError::Nothing => crate::errors::sluice_error(
            py,
            "nothing to settle: the reservation was denied or is settled already",
        ),
        SettleError::Limiter(e) => limiter_error(py, &e),
    }
}

async fn settle(
    reservation: Arc<Mutex<Option<RustReservation>>>,
    actual: u64,
) -> Result<(), SettleError> {
    let taken = reservation.lock().await.take();
    match taken {
        Some(reservation) => reservation
            .settle(actual)
            .await
            .map_err(SettleError::Limiter),
        None => Err(SettleError::Nothing),
    }
}

/// How long a `Duration` is in Python's seconds.
pub(crate) fn seconds(left: Option<Duration>) -> Option<f64> {
    left.map(|left| left.as_secs_f64())
}
