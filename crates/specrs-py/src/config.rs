//! Bindings for the configuration rules: the pydantic `SpeculativeConfig` calls these, so every
//! rule has one implementation (in `specrs_core`).

use std::path::Path;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use specrs_core::SpeculativeConfig;
use specrs_core::config::file::{deep_merge, load_config_file as load_file};
use specrs_core::config::flags::{FlagKind, SPECULATIVE_FLAGS};
use specrs_core::config::vllm;
use specrs_core::sampling::SamplingParams;
use specrs_core::width::{
    AdaptiveWidthController as CoreController, AdaptiveWidthParams, VerifyWidthRange, VerifyWidthSchedule,
    parse_adaptive_widths as parse_widths,
};

use crate::errors::{config_error, config_file_error};

fn json_arg(text: &str) -> PyResult<serde_json::Value> {
    serde_json::from_str(text).map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("invalid JSON: {e}")))
}

/// Validates a speculative config (a JSON object of its fields) and returns the normalised
/// config as JSON: defaults filled in, the method's width resolved, the schedule sorted.
#[pyfunction]
pub fn validate_speculative_config(config_json: &str) -> PyResult<String> {
    let cfg = SpeculativeConfig::from_json(&json_arg(config_json)?)
        .and_then(SpeculativeConfig::validated)
        .map_err(config_error)?;
    Ok(cfg.to_json().to_string())
}

/// Checks a request's sampling parameters (a JSON object of `SamplingParams` fields) by the
/// rules the engine applies to every request; the token-id range is checked per model, when a
/// request reaches one.
#[pyfunction]
pub fn validate_sampling_params(params_json: &str) -> PyResult<()> {
    let params: SamplingParams = serde_json::from_str(params_json)
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("invalid sampling parameters: {e}")))?;
    params.validate(usize::MAX).map_err(config_error)
}

/// Raises when the config combines acceptance rules no verifier can run.
#[pyfunction]
pub fn check_pipeline_combinations(config_json: &str) -> PyResult<()> {
    let cfg = SpeculativeConfig::from_json(&json_arg(config_json)?).map_err(config_error)?;
    cfg.check_pipeline_combinations().map_err(config_error)
}

/// The acceptance rule the config selects: "synthetic", "stochastic" or "greedy".
#[pyfunction]
pub fn acceptance_rule(config_json: &str) -> PyResult<&'static str> {
    let cfg = SpeculativeConfig::from_json(&json_arg(config_json)?).map_err(config_error)?;
    Ok(cfg.acceptance_rule().as_str())
}

/// Reads the keys of a speculative config given in vLLM's spelling (`dialect_json`, a JSON
/// object: `method`, `model`, ...) into spec-rs fields; `spec_fields` names the spec-rs fields
/// given beside them. Returns the fields as JSON and the draft checkpoint `model` names.
#[pyfunction]
pub fn translate_vllm_speculative_config(
    dialect_json: &str,
    spec_fields: Vec<String>,
) -> PyResult<(String, Option<String>)> {
    let serde_json::Value::Object(dialect) = json_arg(dialect_json)? else {
        return Err(pyo3::exceptions::PyTypeError::new_err("translate_vllm_speculative_config takes a JSON object"));
    };
    let names: Vec<&str> = spec_fields.iter().map(String::as_str).collect();
    let translated = vllm::translate(&dialect, &names).map_err(config_error)?;
    Ok((serde_json::Value::Object(translated.fields).to_string(), translated.draft_model))
}

/// Reads a YAML config file (optionally one section of it) and returns it as JSON.
#[pyfunction]
#[pyo3(signature = (path, section_name=None))]
pub fn load_config_file(path: &str, section_name: Option<&str>) -> PyResult<String> {
    let map = load_file(Path::new(path), section_name).map_err(config_file_error)?;
    Ok(serde_json::Value::Object(map).to_string())
}

/// Deep-merges `overrides_json` into `base_json` (both JSON objects) and returns the result.
#[pyfunction]
pub fn merge_config(base_json: &str, overrides_json: &str) -> PyResult<String> {
    let (serde_json::Value::Object(mut base), serde_json::Value::Object(over)) =
        (json_arg(base_json)?, json_arg(overrides_json)?)
    else {
        return Err(pyo3::exceptions::PyTypeError::new_err("merge_config takes two JSON objects"));
    };
    deep_merge(&mut base, &over);
    Ok(serde_json::Value::Object(base).to_string())
}

/// The command-line flags generated from the config fields, as dicts with keys
/// `field`, `flag`, `negated_flag`, `kind`, `choices` and `help`.
#[pyfunction]
pub fn speculative_flags(py: Python<'_>) -> PyResult<Bound<'_, PyList>> {
    let list = PyList::empty(py);
    for f in SPECULATIVE_FLAGS {
        let d = PyDict::new(py);
        d.set_item("field", f.field)?;
        d.set_item("flag", f.flag())?;
        d.set_item("negated_flag", f.negated_flag())?;
        let (kind, choices): (&str, Option<Vec<&str>>) = match f.kind {
            FlagKind::Bool => ("bool", None),
            FlagKind::Int => ("int", None),
            FlagKind::Float => ("float", None),
            FlagKind::Str => ("str", None),
            FlagKind::Choice(c) => ("choice", Some(c.to_vec())),
            FlagKind::Json => ("json", None),
        };
        d.set_item("kind", kind)?;
        d.set_item("choices", choices)?;
        d.set_item("help", f.help)?;
        list.append(d)?;
    }
    Ok(list)
}

/// Parses `"1,3,5"` or `"all"` into sorted distinct widths, checking them against `limit`.
#[pyfunction]
#[pyo3(signature = (value, limit=None))]
pub fn parse_adaptive_widths(value: &str, limit: Option<usize>) -> PyResult<Vec<usize>> {
    parse_widths(value, limit).map_err(config_error)
}

/// The dense verify-width table: entry `b` is the width at decode batch size `b` (entry 0 unused).
#[pyfunction]
pub fn schedule_lookup(ranges: Vec<(i64, i64, i64)>, max_batch_size: usize, max_width: usize) -> PyResult<Vec<usize>> {
    let ranges: Vec<VerifyWidthRange> = ranges.into_iter().map(|(s, e, n)| VerifyWidthRange::new(s, e, n)).collect();
    let schedule = VerifyWidthSchedule::build(&ranges, max_batch_size, max_width).map_err(config_error)?;
    Ok((0..=max_batch_size).map(|b| schedule.width_for(b)).collect())
}

/// The throughput-driven adaptive verify-width controller.
#[pyclass(module = "spec_rs._spec_rs", name = "AdaptiveWidthController")]
pub struct PyAdaptiveWidthController {
    inner: CoreController,
}

#[pymethods]
impl PyAdaptiveWidthController {
    #[new]
    #[pyo3(signature = (widths, *, ema_alpha=0.2, update_interval=5, probe_interval=50, margin=0.02, min_batch_size=1))]
    fn new(
        widths: Vec<usize>,
        ema_alpha: f64,
        update_interval: usize,
        probe_interval: usize,
        margin: f64,
        min_batch_size: usize,
    ) -> PyResult<Self> {
        let params = AdaptiveWidthParams { ema_alpha, update_interval, probe_interval, margin, min_batch_size };
        Ok(Self { inner: CoreController::new(widths, params).map_err(config_error)? })
    }

    #[getter]
    fn widths(&self) -> Vec<usize> {
        self.inner.widths().to_vec()
    }

    /// The width the next decode step at this batch size verifies.
    fn next_step_width(&mut self, batch_size: usize) -> usize {
        self.inner.next_step_width(batch_size)
    }

    /// The width currently chosen for the batch size's bucket.
    fn chosen_width(&self, batch_size: usize) -> usize {
        self.inner.chosen_width(batch_size)
    }

    /// Records a verify step; returns `(from, to)` when the controller switched widths.
    #[pyo3(signature = (batch_size, width, accepted_per_position, num_verifications, step_time_s=None))]
    fn record_step(
        &mut self,
        batch_size: usize,
        width: usize,
        accepted_per_position: Vec<u64>,
        num_verifications: u64,
        step_time_s: Option<f64>,
    ) -> Option<(usize, usize)> {
        self.inner
            .record_step(batch_size, width, &accepted_per_position, num_verifications, step_time_s)
            .map(|s| (s.from, s.to))
    }

    /// Estimated share of sequences accepting at least k + 1 drafts, per position.
    fn acceptance_estimate(&self) -> Vec<f64> {
        self.inner.acceptance_estimate()
    }
}
