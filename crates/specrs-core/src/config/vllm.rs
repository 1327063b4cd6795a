//! vLLM's spelling of the speculative config (`{"method": "eagle3", "model": "<dir>", ...}`, as
//! `LLM(speculative_config=...)` and `vllm serve --speculative-config` take it), read into
//! spec-rs's fields, so a vLLM user's config runs unchanged where spec-rs has the capability and
//! is refused by key, with what to do instead, where it has not.
//!
//! Keys both vocabularies share (`num_speculative_tokens`, `prompt_lookup_min/max`, the
//! `suffix_decoding_*` family) need no translation: they are spec-rs fields already.

use serde_json::{Map, Value};

use super::SpeculativeConfig;
use super::method::SpeculativeMethod;
use crate::error::ConfigError;

/// vLLM keys that name something spec-rs does another way, with what to do instead.
const UNSUPPORTED_KEYS: [(&str, &str); 7] = [
    ("quantization", "the draft's weights load in the pipeline's dtype: pass dtype to the pipeline instead"),
    ("max_model_len", "the draft runs within the target's context: set max_model_len on the pipeline instead"),
    ("revision", "spec-rs loads local checkpoint directories only: pass the downloaded directory as model"),
    ("code_revision", "spec-rs runs no checkpoint code: pass the downloaded directory as model"),
    ("speculative_token_tree", "spec-rs verifies chains of drafts, not token trees: leave it out"),
    ("disable_padded_drafter_batch", "spec-rs batches draft rows by their own lengths: leave it out"),
    ("enforce_eager", "the draft follows the pipeline's device_graph_capture: set that instead"),
];

/// The vLLM keys [`translate`] reads (beside the fields both vocabularies share).
pub const VLLM_KEYS: [&str; 4] = ["method", "model", "draft_tensor_parallel_size", "disable_by_batch_size"];

/// A vLLM-spelled config read into spec-rs terms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VllmTranslation {
    /// spec-rs `SpeculativeConfig` fields, to merge over the ones given in spec-rs spelling.
    pub fields: Map<String, Value>,
    /// The draft checkpoint vLLM's `model` names; spec-rs takes it beside the config
    /// (`draft_model`, `--draft-model`).
    pub draft_model: Option<String>,
}

/// Splits a config mapping into its spec-rs fields and the keys in vLLM's spelling (everything
/// that is not a spec-rs field).
pub fn split_dialect(values: Map<String, Value>) -> (Map<String, Value>, Map<String, Value>) {
    let known = SpeculativeConfig::field_names();
    values.into_iter().partition(|(key, _)| known.contains(key))
}

/// Reads the keys in vLLM's spelling (`dialect`); `spec_fields` names the spec-rs fields given
/// beside them, so a value set twice (`method` and `speculative_method`) is refused rather than
/// one silently winning.
pub fn translate(dialect: &Map<String, Value>, spec_fields: &[&str]) -> Result<VllmTranslation, ConfigError> {
    let mut out = VllmTranslation::default();
    for (key, value) in dialect {
        match key.as_str() {
            "method" => {
                refuse_twice(key, "speculative_method", spec_fields)?;
                let method = vllm_method(value)?;
                out.fields.insert("speculative_method".into(), Value::String(method.as_str().into()));
            }
            "model" => match value {
                Value::Null => {}
                Value::String(dir) if !dir.trim().is_empty() => out.draft_model = Some(dir.clone()),
                other => {
                    return Err(ConfigError::field(
                        "model",
                        format!("model (vLLM's draft checkpoint) must be a directory path, got {other}"),
                    ));
                }
            },
            "draft_tensor_parallel_size" => match value.as_u64() {
                None if value.is_null() => {}
                Some(1) => {}
                _ => {
                    return Err(ConfigError::field(
                        key.as_str(),
                        format!(
                            "draft_tensor_parallel_size={value} is not supported: spec-rs runs the draft on one \
                             device; place it with draft_head_parallelism (\"device0\" or \"replica\") instead"
                        ),
                    ));
                }
            },
            "disable_by_batch_size" => {
                for field in ["num_speculative_tokens_per_batch_size", "adaptive_speculative_widths"] {
                    refuse_twice(key, field, spec_fields)?;
                }
                let schedule = disable_by_batch_size(value)?;
                out.fields.insert("num_speculative_tokens_per_batch_size".into(), schedule);
            }
            _ => return Err(unknown_key(key)),
        }
    }
    Ok(out)
}

/// vLLM's method names: its family-specific MTP names (`deepseek_mtp`, `qwen3_next_mtp`, ...)
/// are one MTP method here, and `eagle3` is `eagle` (the checkpoint tells EAGLE-1 from EAGLE-3).
fn vllm_method(value: &Value) -> Result<SpeculativeMethod, ConfigError> {
    let Value::String(name) = value else {
        return Err(ConfigError::field("method", format!("method must be a string, got {value}")));
    };
    match name.as_str() {
        "eagle3" => return Ok(SpeculativeMethod::Eagle),
        mtp if mtp.ends_with("_mtp") => return Ok(SpeculativeMethod::Mtp),
        "draft_model" | "medusa" | "mlp_speculator" => {
            let supported = ["eagle", "eagle3", "mtp", "ngram", "suffix", "dflash", "dflash2", "dspark"];
            return Err(ConfigError::field(
                "method",
                format!(
                    "method '{name}' (a vLLM method) is not supported by spec-rs; methods: {}",
                    supported.join(", ")
                ),
            ));
        }
        _ => {}
    }
    name.parse::<SpeculativeMethod>().map_err(|e| ConfigError::field("method", e.message))
}

/// vLLM turns speculation off once more than `n` requests run; here that is a verify-width
/// schedule: full width up to `n` rows, nothing verified past them.
fn disable_by_batch_size(value: &Value) -> Result<Value, ConfigError> {
    let n = value.as_i64().filter(|n| (2..i64::MAX).contains(n)).ok_or_else(|| {
        ConfigError::field(
            "disable_by_batch_size",
            format!("disable_by_batch_size must be an integer >= 2, got {value}"),
        )
    })?;
    // Widths are capped at num_speculative_tokens, so the largest allowed means "all of them".
    let all = super::speculative::MAX_DRAFT_TOKENS;
    Ok(serde_json::json!([[1, n, all], [n + 1, n + 1, 0]]))
}

fn refuse_twice(vllm_key: &str, field: &str, spec_fields: &[&str]) -> Result<(), ConfigError> {
    if spec_fields.contains(&field) {
        return Err(ConfigError::field(
            vllm_key,
            format!("{vllm_key} (vLLM's spelling) and {field} both set the same thing: set only one"),
        ));
    }
    Ok(())
}

fn unknown_key(key: &str) -> ConfigError {
    if let Some((_, instead)) = UNSUPPORTED_KEYS.iter().find(|(name, _)| *name == key) {
        return ConfigError::field(key, format!("{key} (a vLLM speculative_config key) is not supported: {instead}"));
    }
    let known = SpeculativeConfig::field_names();
    let mut names: Vec<&str> = known.iter().map(String::as_str).collect();
    names.extend(VLLM_KEYS);
    names.sort_unstable();
    ConfigError::field(
        key,
        format!(
            "unknown field '{key}' (extra fields are forbidden); known fields (spec-rs and vLLM): {}",
            names.join(", ")
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(values: Value) -> Result<(SpeculativeConfig, Option<String>), ConfigError> {
        let Value::Object(map) = values else { unreachable!() };
        let (mut fields, dialect) = split_dialect(map);
        let names: Vec<String> = fields.keys().cloned().collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let translated = translate(&dialect, &names)?;
        fields.extend(translated.fields);
        let config = SpeculativeConfig::from_json(&Value::Object(fields))?.validated()?;
        Ok((config, translated.draft_model))
    }

    #[test]
    fn vllm_eagle3_config_reads_as_eagle_with_its_draft() {
        let (config, draft) =
            read(json!({"method": "eagle3", "model": "/ckpt/eagle3", "num_speculative_tokens": 3})).unwrap();
        assert_eq!(config.speculative_method, Some(SpeculativeMethod::Eagle));
        assert_eq!(config.num_speculative_tokens, Some(3));
        assert_eq!(draft.as_deref(), Some("/ckpt/eagle3"));
    }

    #[test]
    fn vllm_family_mtp_names_and_model_free_methods_map() {
        for (name, method) in [
            ("deepseek_mtp", SpeculativeMethod::Mtp),
            ("qwen3_next_mtp", SpeculativeMethod::Mtp),
            ("mtp", SpeculativeMethod::Mtp),
            ("ngram", SpeculativeMethod::Ngram),
            ("suffix", SpeculativeMethod::Suffix),
            ("eagle", SpeculativeMethod::Eagle),
        ] {
            let (config, _) = read(json!({"method": name, "prompt_lookup_max": 5})).unwrap();
            assert_eq!(config.speculative_method, Some(method), "{name}");
            assert_eq!(config.prompt_lookup_max, 5);
        }
    }

    #[test]
    fn disable_by_batch_size_verifies_nothing_past_it() {
        let (config, _) =
            read(json!({"method": "ngram", "num_speculative_tokens": 4, "disable_by_batch_size": 8})).unwrap();
        let schedule = crate::width::VerifyWidthSchedule::build(
            config.num_speculative_tokens_per_batch_size.as_deref().unwrap(),
            32,
            4,
        )
        .unwrap();
        assert_eq!(schedule.width_for(1), 4);
        assert_eq!(schedule.width_for(8), 4);
        assert_eq!(schedule.width_for(9), 0);
        assert_eq!(schedule.width_for(32), 0);
    }

    #[test]
    fn vllm_methods_spec_rs_lacks_are_refused_by_name() {
        for name in ["draft_model", "medusa", "mlp_speculator"] {
            let e = read(json!({"method": name})).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("method"));
            assert!(e.message.contains(name) && e.message.contains("eagle3"), "{}", e.message);
        }
        let e = read(json!({"method": "lookahead"})).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("method"));
    }

    #[test]
    fn a_value_given_in_both_spellings_is_refused() {
        let e = read(json!({"method": "ngram", "speculative_method": "ngram"})).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("method"));
        assert!(e.message.contains("speculative_method"), "{}", e.message);
        let e = read(json!({"disable_by_batch_size": 4, "adaptive_speculative_widths": "1,3"})).unwrap_err();
        assert!(e.message.contains("adaptive_speculative_widths"), "{}", e.message);
    }

    #[test]
    fn unsupported_and_unknown_keys_say_what_to_do() {
        let e = read(json!({"method": "eagle3", "quantization": "fp8"})).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("quantization"));
        assert!(e.message.contains("dtype"), "{}", e.message);
        let e = read(json!({"method": "ngram", "draft_tensor_parallel_size": 2})).unwrap_err();
        assert!(e.message.contains("draft_head_parallelism"), "{}", e.message);
        read(json!({"method": "ngram", "draft_tensor_parallel_size": 1})).unwrap();
        let e = read(json!({"methd": "ngram"})).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("methd"));
        assert!(e.message.contains("speculative_method") && e.message.contains("method"), "{}", e.message);
        for bad in [json!(1), json!(0), json!("8"), json!(2.5)] {
            let e = read(json!({"disable_by_batch_size": bad})).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("disable_by_batch_size"));
        }
        let e = read(json!({"model": 3})).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("model"));
    }
}
