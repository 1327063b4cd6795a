//! The draft shipped with the embedded default model: an EAGLE-3 head for
//! SmolLM2-135M-Instruct trained by `spec-rs train-draft` (see `drafters/README.md`). It is
//! compiled into the library and written to the cache directory on first use, so the cargo
//! binary and the Python wheel both carry it without data files of their own.

use std::path::{Path, PathBuf};

use specrs_core::model_alias::{DEFAULT_MODEL_ALIAS, find_alias};
use specrs_core::{SpeculativeConfig, SpeculativeMethod};

use crate::error::{EngineError, Result};
use crate::pipeline::PipelineConfig;

const NAME: &str = "smollm2-135m-instruct-eagle3";
const CONFIG: &[u8] = include_bytes!("../drafters/smollm2-135m-instruct-eagle3/config.json");
const WEIGHTS: &[u8] = include_bytes!("../drafters/smollm2-135m-instruct-eagle3/model.safetensors");

/// Drafts per step the shipped head runs at (the width it was trained and measured for).
pub const DEFAULT_NUM_SPECULATIVE_TOKENS: i64 = 3;

/// Where the shipped head's drafts are cut short (`draft_confidence_threshold`): drafts whose
/// running top-1 probability is below 20% are mostly rejected, and on CPUs without wide int8
/// products a verified position costs a third of a plain step (docs/BENCHMARKS.md,
/// 2026-12-03).
pub const DEFAULT_DRAFT_CONFIDENCE_THRESHOLD: f64 = 0.2;

/// The shipped draft of a model.
#[derive(Debug, Clone)]
pub struct DefaultDraft {
    /// Directory holding the head's `config.json` and `model.safetensors`.
    pub path: PathBuf,
    pub speculative: SpeculativeConfig,
}

/// Whether `model` names a model spec-rs ships a draft for.
pub fn has_default_draft(model: &str) -> bool {
    find_alias(model).is_some_and(|alias| alias.alias == DEFAULT_MODEL_ALIAS)
}

/// The shipped draft of `model`, written to the cache on first use; `None` when it has none.
pub fn default_draft(model: &str) -> Result<Option<DefaultDraft>> {
    if !has_default_draft(model) {
        return Ok(None);
    }
    Ok(Some(DefaultDraft { path: materialize()?, speculative: default_config() }))
}

/// The speculative configuration the shipped head runs with: up to 3 drafts, with the adaptive
/// controller choosing among widths 1..=3 and plain steps per batch size, so that a loaded
/// server (large, compute-bound batches, where verifying drafts costs more than they return)
/// is not slower than plain decoding; prompt lookup in front of the head, which copies
/// repeated spans (quoting, editing, lists) far better than the head predicts them; each row's
/// drafts cut where they become unlikely to be accepted; and repetition / frequency / presence
/// penalties applied at every draft position (`logit_penalties`): the user asked for no
/// speculation, so a request plain decoding runs must not be refused for it.
pub fn default_config() -> SpeculativeConfig {
    SpeculativeConfig {
        speculative_method: Some(SpeculativeMethod::Eagle),
        num_speculative_tokens: Some(DEFAULT_NUM_SPECULATIVE_TOKENS),
        adaptive_speculative_widths: Some("all".into()),
        enable_prompt_lookup: true,
        draft_confidence_threshold: DEFAULT_DRAFT_CONFIDENCE_THRESHOLD,
        logit_penalties: true,
        ..SpeculativeConfig::default()
    }
}

/// Gives `cfg` the shipped draft when the user asked for nothing speculative: the model has a
/// shipped draft, no draft checkpoint is named and the speculative config is all defaults.
/// Returns whether it did.
pub fn apply_default_draft(cfg: &mut PipelineConfig) -> Result<bool> {
    if cfg.draft_model.is_some() || cfg.speculative != SpeculativeConfig::default() {
        return Ok(false);
    }
    let Some(draft) = default_draft(&cfg.model)? else {
        return Ok(false);
    };
    cfg.draft_model = Some(draft.path.to_string_lossy().into_owned());
    cfg.speculative = draft.speculative;
    Ok(true)
}

/// `$XDG_CACHE_HOME/spec-rs/drafters` (or `~/.cache/...`), falling back to the temp dir.
fn cache_root() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("spec-rs").join("drafters")
}

/// The cache directory's name: the head's name and a hash of the embedded files, so releases
/// shipping different heads (even of the same size) never share or overwrite a directory.
fn cache_dir_name() -> &'static str {
    static NAME_WITH_HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    NAME_WITH_HASH.get_or_init(|| format!("{NAME}-{:016x}", fnv1a64(&[CONFIG, WEIGHTS])))
}

/// 64-bit FNV-1a over the parts in order: a stable content key (not a security boundary).
fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &byte in parts.iter().flat_map(|p| p.iter()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Writes the embedded files under the cache root once; later calls find them in place.
fn materialize() -> Result<PathBuf> {
    let dir = cache_root().join(cache_dir_name());
    match write_once(&dir) {
        Ok(()) => Ok(dir),
        Err(first) => {
            // A read-only home: the temp dir is the last resort.
            let fallback = std::env::temp_dir().join("spec-rs").join("drafters").join(cache_dir_name());
            write_once(&fallback).map_err(|second| {
                EngineError::Internal(format!(
                    "writing the default draft failed at {} ({first}) and at {} ({second}); \
                     set XDG_CACHE_HOME to a writable directory",
                    dir.display(),
                    fallback.display()
                ))
            })?;
            Ok(fallback)
        }
    }
}

fn write_once(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    write_if_different(&dir.join("config.json"), CONFIG)?;
    write_if_different(&dir.join("model.safetensors"), WEIGHTS)
}

/// Writes through a temporary name and a rename, so a concurrent reader never sees a partial
/// file; skips the write when the file already holds exactly `bytes`.
fn write_if_different(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    if std::fs::read(path).is_ok_and(|existing| existing == bytes) {
        return Ok(());
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_default_alias_has_a_shipped_draft() {
        assert!(has_default_draft("smollm2-135m-instruct"));
        assert!(has_default_draft(" SmolLM2-135M-Instruct "));
        assert!(!has_default_draft("/models/Qwen3-8B"));
    }

    #[test]
    fn explicit_choices_keep_the_default_draft_away() {
        let mut ngram = PipelineConfig::new("smollm2-135m-instruct");
        ngram.speculative.speculative_method = Some(SpeculativeMethod::Ngram);
        assert!(!apply_default_draft(&mut ngram).unwrap());
        assert_eq!(ngram.draft_model, None);

        let mut other_model = PipelineConfig::new("/models/llama");
        assert!(!apply_default_draft(&mut other_model).unwrap());
        assert_eq!(other_model.speculative, SpeculativeConfig::default());
    }

    #[test]
    fn the_shipped_head_is_written_once_and_reused() {
        let mut cfg = PipelineConfig::new("smollm2-135m-instruct");
        assert!(apply_default_draft(&mut cfg).unwrap());
        assert_eq!(cfg.speculative.speculative_method, Some(SpeculativeMethod::Eagle));
        let dir = PathBuf::from(cfg.draft_model.clone().unwrap());
        assert_eq!(std::fs::read(dir.join("model.safetensors")).unwrap(), WEIGHTS);
        let config: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        assert_eq!(config["speculators_model_type"], "eagle3");
        let again = default_draft("smollm2-135m-instruct").unwrap().unwrap();
        assert_eq!(again.path, dir);
    }

    #[test]
    fn the_cache_directory_is_keyed_by_the_embedded_content() {
        // FNV-1a's published test vectors, and the parts hashed as one stream.
        assert_eq!(fnv1a64(&[]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(&[b"a"]), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(&[b"foo", b"bar"]), fnv1a64(&[b"foobar"]));
        // A head of the same size but other bytes gets another directory.
        let mut other = WEIGHTS.to_vec();
        other[WEIGHTS.len() / 2] ^= 1;
        assert_ne!(fnv1a64(&[CONFIG, &other]), fnv1a64(&[CONFIG, WEIGHTS]));
        assert_eq!(cache_dir_name(), format!("{NAME}-{:016x}", fnv1a64(&[CONFIG, WEIGHTS])));
    }
}
