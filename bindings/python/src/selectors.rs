//! Selector values from a Python dict: borrowed for a decision made at once, copied for one
//! that waits on a store.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};
use smallvec::SmallVec;

/// Selector names and values as Python strings, on the stack for the usual few (a decision
/// in memory takes a few hundred nanoseconds: two heap allocations would be a good part).
pub type Held<'py> = SmallVec<[(Bound<'py, PyString>, Bound<'py, PyString>); 4]>;

/// Selector names and values held as Python strings (ints are written as text).
pub fn held_selectors<'py>(selectors: Option<&Bound<'py, PyAny>>) -> PyResult<Held<'py>> {
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

pub fn owned_selectors(selectors: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<(String, String)>> {
    held_selectors(selectors)?
        .iter()
        .map(|(k, v)| Ok((k.to_str()?.to_owned(), v.to_str()?.to_owned())))
        .collect()
}
