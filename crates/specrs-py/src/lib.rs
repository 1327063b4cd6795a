//! `spec_rs._spec_rs`: thin PyO3 wrappers over the spec-rs crates. No logic lives here that a
//! Rust user could not reach through the crates themselves.

mod config;
mod drafters;
mod errors;
mod pipeline;
mod registry;

use std::path::Path;
use std::sync::Arc;

use pyo3::prelude::*;
use specrs_core::SpeculativeMethod;

/// The Hugging Face architecture of a target checkpoint (GGUF, safetensors file or
/// directory), read without loading weights.
#[pyfunction]
fn peek_architecture(py: Python<'_>, path: &str) -> PyResult<String> {
    py.detach(|| specrs_engine::pipeline::peek_architecture(Path::new(path))).map_err(pipeline::load_error)
}

/// A draft checkpoint's `architectures[0]`, rewritten as MAX does for one-layer EAGLE drafts.
#[pyfunction]
fn draft_architecture(method: &str, path: &str) -> PyResult<String> {
    let method: SpeculativeMethod = method.parse().map_err(errors::config_error)?;
    specrs_engine::pipeline::draft_architecture(method, Path::new(path)).map_err(pipeline::load_error)
}

/// The method a draft checkpoint's config names (`speculators_model_type` or its
/// architecture), for a draft given without a `speculative_method`; `None` when it names none.
#[pyfunction]
fn draft_method(path: &str) -> PyResult<Option<&'static str>> {
    let method = specrs_engine::pipeline::draft_method(Path::new(path)).map_err(pipeline::load_error)?;
    Ok(method.map(|m| m.as_str()))
}

/// The engine's own name of a dtype spelled any way it reads (`bfloat16` is `bf16`).
#[pyfunction]
fn canonical_dtype(name: &str) -> PyResult<&'static str> {
    pipeline::parse_dtype(name).map(|d| d.as_str())
}

/// Resolves a model alias to its file (paths are returned as given).
#[pyfunction]
fn resolve_model(py: Python<'_>, name: &str) -> PyResult<String> {
    py.detach(|| specrs_engine::pipeline::resolve_model_path(name))
        .map(|p| p.display().to_string())
        .map_err(pipeline::engine_error)
}

/// The draft spec-rs ships for `model`, written to the cache on first use: `(directory,
/// speculative config as JSON)`, or `None` when the model has none.
#[pyfunction]
fn default_draft(py: Python<'_>, model: &str) -> PyResult<Option<(String, String)>> {
    let draft = py.detach(|| specrs_engine::default_draft(model)).map_err(pipeline::load_error)?;
    Ok(draft.map(|d| (d.path.display().to_string(), d.speculative.to_json().to_string())))
}

/// Runs the `spec-rs` command line. `factory`, when given, builds the pipeline for the parsed
/// arguments (a JSON string) and returns it; the Python console script passes one so that
/// custom architectures registered in Python are honoured.
#[pyfunction]
#[pyo3(signature = (argv, factory=None))]
fn cli_main(py: Python<'_>, argv: Vec<String>, factory: Option<Py<PyAny>>) -> i32 {
    let Some(factory) = factory else {
        return py.detach(|| specrs_server::main_with_args(argv, None));
    };
    let build = move |args: &specrs_server::cli::PipelineArgs| -> Result<Arc<specrs_engine::EngineHandle>, String> {
        let json = args.to_json().map_err(|e| e.to_string())?.to_string();
        Python::attach(|py| {
            let obj = factory.call1(py, (json,)).map_err(|e| e.to_string())?;
            let pipe = obj.extract::<PyRef<'_, pipeline::PyPipeline>>(py).map_err(|e| e.to_string())?;
            Ok(pipe.handle.clone())
        })
    };
    py.detach(|| specrs_server::main_with_args(argv, Some(&build)))
}

#[pymodule(gil_used = false)]
fn _spec_rs(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The engine logs through `tracing`, as `spec-rs serve` does; from Python only on request
    // (`SPEC_RS_LOG=info`, or a filter such as `specrs_engine=debug`), so imports stay quiet.
    if std::env::var_os("SPEC_RS_LOG").is_some() {
        specrs_server::init_logging("info");
    }
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(config::validate_speculative_config, m)?)?;
    m.add_function(wrap_pyfunction!(config::validate_sampling_params, m)?)?;
    m.add_function(wrap_pyfunction!(config::check_pipeline_combinations, m)?)?;
    m.add_function(wrap_pyfunction!(config::acceptance_rule, m)?)?;
    m.add_function(wrap_pyfunction!(config::load_config_file, m)?)?;
    m.add_function(wrap_pyfunction!(config::merge_config, m)?)?;
    m.add_function(wrap_pyfunction!(config::translate_vllm_speculative_config, m)?)?;
    m.add_function(wrap_pyfunction!(config::speculative_flags, m)?)?;
    m.add_function(wrap_pyfunction!(config::parse_adaptive_widths, m)?)?;
    m.add_function(wrap_pyfunction!(config::schedule_lookup, m)?)?;
    m.add_class::<config::PyAdaptiveWidthController>()?;
    m.add_function(wrap_pyfunction!(registry::builtin_architectures, m)?)?;
    m.add_function(wrap_pyfunction!(registry::builtin_speculators, m)?)?;
    m.add_function(wrap_pyfunction!(registry::select_speculator, m)?)?;
    m.add_function(wrap_pyfunction!(registry::canonical_draft_arch, m)?)?;
    m.add_function(wrap_pyfunction!(drafters::checkpoint_draft_width, m)?)?;
    m.add_function(wrap_pyfunction!(peek_architecture, m)?)?;
    m.add_function(wrap_pyfunction!(draft_architecture, m)?)?;
    m.add_function(wrap_pyfunction!(draft_method, m)?)?;
    m.add_function(wrap_pyfunction!(canonical_dtype, m)?)?;
    m.add_function(wrap_pyfunction!(resolve_model, m)?)?;
    m.add_function(wrap_pyfunction!(default_draft, m)?)?;
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    pipeline::register(m)?;
    Ok(())
}
