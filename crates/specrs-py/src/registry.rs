//! Bindings for the built-in architecture table and the speculator-selection rule
//! (`specrs_core::registry`). The Python registry (`spec_rs.registry`) declares its built-ins
//! from these tables and calls [`select_speculator`] for the rule, so the `spec-rs` binary and
//! Python pick the same speculator and fail with the same message.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use specrs_core::SpeculativeMethod;
use specrs_core::registry::{self, PipelineKind};

use crate::errors::{config_error, raise};

/// The built-in target architectures, as dicts with keys `name`, `example_repo_ids`,
/// `default_weights_format`, `pipeline` (the extension class name),
/// `supports_spec_decode_mixed_batches` and `supports_device_graph_capture`.
#[pyfunction]
pub fn builtin_architectures(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let list = PyList::empty(py);
    for arch in registry::BUILTIN_ARCHITECTURES {
        let d = PyDict::new(py);
        d.set_item("name", arch.name)?;
        d.set_item("example_repo_ids", arch.example_repo_ids.to_vec())?;
        d.set_item("default_weights_format", arch.default_weights_format)?;
        // A target architecture on its own decodes without a drafter.
        d.set_item("pipeline", PipelineKind::Plain.class_name())?;
        d.set_item("supports_spec_decode_mixed_batches", arch.supports_spec_decode_mixed_batches)?;
        d.set_item("supports_device_graph_capture", arch.supports_device_graph_capture)?;
        list.append(d)?;
    }
    Ok(list)
}

/// The built-in speculators, per target in declaration order, as dicts with keys `name`,
/// `base`, `draft_arch`, `method`, `pipeline` (the extension class name),
/// `supports_spec_decode_mixed_batches` and `supports_device_graph_capture` (`None`
/// inherits), `checkpoint_draft_width` (whether the draft checkpoint fixes the width) and
/// `example_repo_ids` (`None` inherits).
#[pyfunction]
pub fn builtin_speculators(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let list = PyList::empty(py);
    for spec in registry::builtin_speculators() {
        let d = PyDict::new(py);
        d.set_item("name", &spec.name)?;
        d.set_item("base", spec.base)?;
        d.set_item("draft_arch", spec.draft_arch)?;
        d.set_item("method", spec.method.as_str())?;
        d.set_item("pipeline", spec.pipeline.class_name())?;
        d.set_item("supports_spec_decode_mixed_batches", spec.supports_spec_decode_mixed_batches)?;
        d.set_item("supports_device_graph_capture", spec.supports_device_graph_capture)?;
        d.set_item("checkpoint_draft_width", spec.checkpoint_draft_width)?;
        d.set_item("example_repo_ids", spec.example_repo_ids.map(<[&str]>::to_vec))?;
        list.append(d)?;
    }
    Ok(list)
}

/// The index in `declared` (`(method, draft_arch)` per speculator of `target`, in declaration
/// order) of the first speculator running `method` with `draft_arch`; `None` when the target
/// declares no speculators. Raises `SpeculatorSelectionError` when none matches.
#[pyfunction]
#[pyo3(signature = (target, method, draft_arch, declared))]
pub fn select_speculator(
    target: &str,
    method: &str,
    draft_arch: Option<&str>,
    declared: Vec<(String, Option<String>)>,
) -> PyResult<Option<usize>> {
    registry::select_speculator(target, method, draft_arch, &declared)
        .map_err(|e| raise("SpeculatorSelectionError", e.to_string(), &[]))
}

/// The draft architecture name selection matches against: a one-layer `LlamaForCausalLM`
/// EAGLE draft is rewritten to `LlamaForCausalLMEagle`, or to `LlamaForCausalLMEagle3` when it
/// carries a reduced draft vocabulary; every other name is kept.
#[pyfunction]
pub fn canonical_draft_arch(method: &str, draft_arch: &str, has_draft_vocab: bool) -> PyResult<String> {
    let method: SpeculativeMethod = method.parse().map_err(config_error)?;
    Ok(registry::canonical_draft_arch(method, draft_arch, has_draft_vocab))
}
