//! Bindings for the drafters: the draft width a block-drafter checkpoint runs at.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyString;
use specrs_core::SpeculativeConfig;

use crate::errors::config_error;
use crate::pipeline::engine_error;

/// A Python argument as JSON: `str` is JSON text already, a pydantic model dumps itself
/// (`model_dump_json()`), anything else (the Hugging Face config dicts) goes through
/// `json.dumps`.
fn json_of(obj: &Bound<'_, PyAny>) -> PyResult<serde_json::Value> {
    let text: String = if let Ok(s) = obj.cast::<PyString>() {
        s.to_string()
    } else if obj.hasattr("model_dump_json")? {
        obj.call_method0("model_dump_json")?.extract()?
    } else {
        obj.py().import("json")?.call_method1("dumps", (obj,))?.extract()?
    };
    serde_json::from_str(&text).map_err(|e| PyValueError::new_err(format!("invalid JSON: {e}")))
}

/// The draft width of a block-drafter pipeline (MAX's `checkpoint_draft_width`): the width
/// the draft checkpoint was trained for, or the explicit `num_speculative_tokens` (at least 1;
/// above the trained width it widens the block, with a warning). `config` is a
/// `SpeculativeConfig` or its JSON; the Hugging Face configs are dicts (`{}` when the target
/// has none, e.g. a GGUF file) or JSON text. Draft configs are checked in full.
#[pyfunction]
pub fn checkpoint_draft_width(
    config: &Bound<'_, PyAny>,
    target_hf_config: &Bound<'_, PyAny>,
    draft_hf_config: &Bound<'_, PyAny>,
) -> PyResult<usize> {
    let mut config = json_of(config)?;
    // The file-loading fields are consumed by the pydantic model; the rules never see them.
    if let Some(fields) = config.as_object_mut() {
        fields.remove("config_file");
        fields.remove("section_name");
    }
    let spec = SpeculativeConfig::from_json(&config).map_err(config_error)?;
    let (target, draft) = (json_of(target_hf_config)?, json_of(draft_hf_config)?);
    specrs_engine::proposer::block::checkpoint_draft_width(&spec, &target, &draft).map_err(engine_error)
}
