//! Rust errors as the Python exceptions of `sluice/_errors.py`, which carry each error's
//! parts as attributes (a rule error's column, a config error's file and line).

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use sluice_limiter::PolicyError;
use sluice_server::config::ConfigError;

/// An instance of `sluice._errors.NAME` built from `args` (the class is defined in Python so
/// that it documents itself and takes keyword attributes).
fn raise<'py, A>(py: Python<'py>, name: &str, args: A) -> PyErr
where
    A: pyo3::call::PyCallArgs<'py>,
{
    let made = py
        .import("sluice._errors")
        .and_then(|module| module.getattr(name))
        .and_then(|class| class.call1(args));
    match made {
        Ok(error) => PyErr::from_value(error),
        Err(e) => PyRuntimeError::new_err(format!("sluice: cannot raise {name}: {e}")),
    }
}

pub fn policy_error(py: Python<'_>, error: &PolicyError) -> PyErr {
    match error {
        PolicyError::Rule {
            policy,
            error: rule,
        } => raise(
            py,
            "RuleError",
            (
                error.to_string(),
                policy.as_str(),
                rule.column,
                rule.expected.as_str(),
                rule.found.as_str(),
            ),
        ),
        _ => raise(py, "PolicyError", (error.to_string(),)),
    }
}

pub fn config_error(py: Python<'_>, error: &ConfigError) -> PyErr {
    let file = error.file.display().to_string();
    // A policy given as a dict is read as generated TOML: its lines mean nothing to the
    // caller, so only the field and the reason are told.
    let (message, line, column) = if file == "<policies>" {
        let message = if error.field.is_empty() {
            error.message.clone()
        } else {
            format!("{}: {}", error.field, error.message)
        };
        (message, None, None)
    } else {
        (error.to_string(), Some(error.line), Some(error.column))
    };
    raise(
        py,
        "ConfigError",
        (message, file, line, column, error.field.as_str()),
    )
}

pub fn limiter_error(py: Python<'_>, error: &sluice_limiter::Error) -> PyErr {
    match error {
        sluice_limiter::Error::UnknownPolicy(name) => {
            raise(py, "UnknownPolicy", (error.to_string(), name.as_str()))
        }
        sluice_limiter::Error::MissingSelector { policy, selector } => raise(
            py,
            "MissingSelector",
            (error.to_string(), policy.as_str(), selector.as_str()),
        ),
        sluice_limiter::Error::Store(store) => {
            store_error(py, &store.to_string(), store.is_transient())
        }
        _ => raise(py, "SluiceError", (error.to_string(),)),
    }
}

/// A token that does not name a lease or reservation of the policy: a `SluiceError`, or the
/// limiter's own error (an unknown policy) as `limiter_error` raises it.
pub fn token_error(py: Python<'_>, error: &sluice_limiter::lease::TokenError) -> PyErr {
    match error {
        sluice_limiter::lease::TokenError::Limiter(e) => limiter_error(py, e),
        other => sluice_error(py, &other.to_string()),
    }
}

/// A `SluiceError` saying `message`.
pub fn sluice_error(py: Python<'_>, message: &str) -> PyErr {
    raise(py, "SluiceError", (message,))
}

pub fn store_error(py: Python<'_>, message: &str, transient: bool) -> PyErr {
    raise(py, "StoreError", (message, transient))
}
