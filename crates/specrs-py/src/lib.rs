//! `spec_rs._spec_rs`: thin PyO3 wrappers over the spec-rs crates. No logic lives here that a
//! Rust user could not reach through the crates themselves.

mod config;
mod errors;
mod registry;

use pyo3::prelude::*;

#[pymodule(gil_used = false)]
fn _spec_rs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(config::validate_speculative_config, m)?)?;
    m.add_function(wrap_pyfunction!(config::check_pipeline_combinations, m)?)?;
    m.add_function(wrap_pyfunction!(config::acceptance_rule, m)?)?;
    m.add_function(wrap_pyfunction!(config::load_config_file, m)?)?;
    m.add_function(wrap_pyfunction!(config::merge_config, m)?)?;
    m.add_function(wrap_pyfunction!(config::speculative_flags, m)?)?;
    m.add_function(wrap_pyfunction!(config::parse_adaptive_widths, m)?)?;
    m.add_function(wrap_pyfunction!(config::schedule_lookup, m)?)?;
    m.add_class::<config::PyAdaptiveWidthController>()?;
    m.add_function(wrap_pyfunction!(registry::builtin_architectures, m)?)?;
    m.add_function(wrap_pyfunction!(registry::builtin_speculators, m)?)?;
    m.add_function(wrap_pyfunction!(registry::select_speculator, m)?)?;
    m.add_function(wrap_pyfunction!(registry::canonical_draft_arch, m)?)?;
    Ok(())
}
