//! Policies given as a Python dict, read by the config file's own reader.

use std::path::Path;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use sluice_limiter::Policy;

use crate::errors::{config_error, policy_error};

/// Policies from `{"name": "rule"}` or `{"name": {"rule": ..., "algorithm": ...}}`. A dict
/// goes through the config file's own reader (written out as its TOML table), so it takes
/// exactly the fields and checks a config file does.
pub fn policies_from_dict(py: Python<'_>, policies: &Bound<'_, PyDict>) -> PyResult<Vec<Policy>> {
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
