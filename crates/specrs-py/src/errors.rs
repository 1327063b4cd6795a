//! Raising `spec_rs.errors` exceptions from Rust.
//!
//! The hierarchy is declared in Python (`python/spec_rs/errors.py`) because its classes need
//! two bases (`ConfigError` is both a `SpecRsError` and a `ValueError`, so pydantic turns it
//! into a `ValidationError` inside validators); Rust looks the classes up when it raises.

use pyo3::prelude::*;
use pyo3::types::PyType;

/// The `spec_rs.errors` class `name`, falling back to `RuntimeError` if the package is broken.
fn exception_type<'py>(py: Python<'py>, name: &str) -> Bound<'py, PyType> {
    py.import("spec_rs.errors")
        .and_then(|m| m.getattr(name))
        .and_then(|t| t.cast_into::<PyType>().map_err(Into::into))
        .unwrap_or_else(|_| py.get_type::<pyo3::exceptions::PyRuntimeError>())
}

/// An exception of `spec_rs.errors.<name>` with `message`, and `attrs` set on it.
pub fn raise(name: &str, message: String, attrs: &[(&str, Option<String>)]) -> PyErr {
    Python::attach(|py| {
        let ty = exception_type(py, name);
        let err = PyErr::from_type(ty, (message,));
        for (key, value) in attrs {
            let _ = err.value(py).setattr(*key, value.clone());
        }
        err
    })
}

/// A broken configuration rule, carrying the offending field.
pub fn config_error(err: specrs_core::ConfigError) -> PyErr {
    raise("ConfigError", err.message, &[("field", err.field)])
}

pub fn config_file_error(err: specrs_core::ConfigFileError) -> PyErr {
    use specrs_core::ConfigFileError as E;
    let message = err.to_string();
    match err {
        E::NotFound { .. } => pyo3::exceptions::PyFileNotFoundError::new_err(message),
        E::MissingSection { .. } => pyo3::exceptions::PyKeyError::new_err(message),
        E::NotAMapping { .. } | E::SectionNotAMapping { .. } => pyo3::exceptions::PyTypeError::new_err(message),
        E::Io { .. } => pyo3::exceptions::PyOSError::new_err(message),
        E::Yaml { .. } | E::NonFinite { .. } => pyo3::exceptions::PyValueError::new_err(message),
    }
}
