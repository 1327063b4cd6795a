//! The Rust mirror of `spec_rs.SpeculativeConfig` and every rule it is validated by.
//!
//! The pydantic model users hold calls [`SpeculativeConfig::validated`] through the extension,
//! and the `spec-rs` binary calls it directly, so each rule lives here once.

use serde::{Deserialize, Serialize};

use super::method::{DraftPlacement, DraftProposal, SpeculativeMethod};
use crate::error::ConfigError;
use crate::width::{VerifyWidthRange, normalize_schedule, parse_adaptive_widths};

/// Default lower bound of the n-gram match length (spec-rs extension).
pub const DEFAULT_PROMPT_LOOKUP_MIN: usize = 2;
/// Default upper bound of the n-gram match length (spec-rs extension).
pub const DEFAULT_PROMPT_LOOKUP_MAX: usize = 4;
/// Suffix decoding's defaults, vLLM's.
pub const DEFAULT_SUFFIX_MAX_TREE_DEPTH: usize = 24;
pub const DEFAULT_SUFFIX_MAX_CACHED_REQUESTS: usize = 10_000;
pub const DEFAULT_SUFFIX_MAX_SPEC_FACTOR: f64 = 1.0;
pub const DEFAULT_SUFFIX_MIN_TOKEN_PROB: f64 = 0.1;
/// With `enable_suffix_decoding`, a row takes the trees' draft (as long as they speculate, past
/// `num_speculative_tokens`) over the model's when the draft's score (its expected accepted
/// tokens) reaches this times `num_speculative_tokens`. SGLang's suffix-decoding fork uses 1.2;
/// in front of the shipped SmolLM2 head 0.5 measured better on first-time and repeated
/// requests alike (docs/BENCHMARKS.md, 2026-12-07 09:25): a copy that is longer than `K` is
/// worth taking at a lower expected count than `K` drafts the head would have made.
pub const DEFAULT_SUFFIX_MIN_SCORE_RATIO: f64 = 0.5;
/// Bound on `num_speculative_tokens` and `suffix_decoding_max_tree_depth`: the longest
/// contexts models serve. Widths past the model's own context are refused when the pipeline is
/// built; this bound keeps what validation expands (adaptive widths "all") finite before that.
pub const MAX_DRAFT_TOKENS: i64 = 1 << 20;

/// Configures speculative decoding for a pipeline. Field names, defaults and rules follow
/// Modular MAX's `SpeculativeConfig`; `prompt_lookup_min`/`prompt_lookup_max` configure the
/// spec-rs `ngram` method, `enable_prompt_lookup` puts that lookup in front of a model
/// drafter, and `draft_confidence_threshold` cuts a model's drafts short where they become
/// unlikely (both spec-rs's own); the `suffix_decoding_*` fields configure the `suffix` method
/// as vLLM names them, and `enable_suffix_decoding` puts its trees in front of a model drafter
/// instead of prompt lookup.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SpeculativeConfig {
    pub speculative_method: Option<SpeculativeMethod>,
    pub num_speculative_tokens: Option<i64>,
    pub num_speculative_tokens_per_batch_size: Option<Vec<VerifyWidthRange>>,
    pub adaptive_speculative_widths: Option<String>,
    pub adaptive_speculative_min_batch_size: i64,
    pub num_speculative_tokens_mixed_batch: Option<i64>,
    pub synthetic_acceptance_rate: Option<f64>,
    pub use_relaxed_acceptance_for_thinking: bool,
    pub relaxed_topk: i64,
    pub relaxed_delta: f64,
    pub use_greedy_acceptance: bool,
    pub draft_proposal: DraftProposal,
    pub draft_head_parallelism: DraftPlacement,
    pub draft_probs_layout: DraftPlacement,
    pub logit_penalties: bool,
    pub prompt_lookup_min: i64,
    pub prompt_lookup_max: i64,
    pub enable_prompt_lookup: bool,
    pub draft_confidence_threshold: f64,
    pub suffix_decoding_max_tree_depth: i64,
    pub suffix_decoding_max_cached_requests: i64,
    pub suffix_decoding_max_spec_factor: f64,
    pub suffix_decoding_min_token_prob: f64,
    pub enable_suffix_decoding: bool,
    pub suffix_decoding_min_score_ratio: f64,
}

impl Default for SpeculativeConfig {
    fn default() -> Self {
        Self {
            speculative_method: None,
            num_speculative_tokens: None,
            num_speculative_tokens_per_batch_size: None,
            adaptive_speculative_widths: None,
            adaptive_speculative_min_batch_size: 1,
            num_speculative_tokens_mixed_batch: None,
            synthetic_acceptance_rate: None,
            use_relaxed_acceptance_for_thinking: false,
            relaxed_topk: 10,
            relaxed_delta: 0.6,
            use_greedy_acceptance: false,
            draft_proposal: DraftProposal::Argmax,
            draft_head_parallelism: DraftPlacement::Device0,
            draft_probs_layout: DraftPlacement::Device0,
            logit_penalties: false,
            prompt_lookup_min: DEFAULT_PROMPT_LOOKUP_MIN as i64,
            prompt_lookup_max: DEFAULT_PROMPT_LOOKUP_MAX as i64,
            enable_prompt_lookup: false,
            draft_confidence_threshold: 0.0,
            suffix_decoding_max_tree_depth: DEFAULT_SUFFIX_MAX_TREE_DEPTH as i64,
            suffix_decoding_max_cached_requests: DEFAULT_SUFFIX_MAX_CACHED_REQUESTS as i64,
            suffix_decoding_max_spec_factor: DEFAULT_SUFFIX_MAX_SPEC_FACTOR,
            suffix_decoding_min_token_prob: DEFAULT_SUFFIX_MIN_TOKEN_PROB,
            enable_suffix_decoding: false,
            suffix_decoding_min_score_ratio: DEFAULT_SUFFIX_MIN_SCORE_RATIO,
        }
    }
}

/// Which acceptance rule a pipeline runs, by the precedence synthetic > stochastic > greedy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AcceptanceRule {
    /// Benchmark-only calibrated acceptance that ignores the logits.
    Synthetic,
    /// Per-row: greedy rows match the argmax, sampled rows match a target sample (argmax
    /// drafts) or run rejection sampling against the draft distribution (sampled drafts).
    Stochastic,
    /// Every row matches the target argmax.
    Greedy,
}

impl AcceptanceRule {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Synthetic => "synthetic",
            Self::Stochastic => "stochastic",
            Self::Greedy => "greedy",
        }
    }
}

impl SpeculativeConfig {
    /// Every field's name, sorted, as the config serialises (what `from_json` accepts).
    pub fn field_names() -> Vec<String> {
        let serde_json::Value::Object(fields) = Self::default().to_json() else {
            unreachable!("a struct serialises to an object")
        };
        let mut names: Vec<String> = fields.into_iter().map(|(name, _)| name).collect();
        names.sort_unstable();
        names
    }

    /// Parses a JSON object (the pydantic model's dump or a config file section).
    ///
    /// Errors name the field at fault: unknown keys are rejected (extra fields are forbidden)
    /// and each value is checked on its own so a wrong type points at its key.
    pub fn from_json(value: &serde_json::Value) -> Result<Self, ConfigError> {
        let serde_json::Value::Object(map) = value else {
            return Err(ConfigError::new("a speculative config must be a mapping of field names to values"));
        };
        let known = Self::field_names();
        for (key, v) in map {
            if !known.contains(key) {
                return Err(ConfigError::field(
                    key.as_str(),
                    format!("unknown field '{key}' (extra fields are forbidden); known fields: {}", known.join(", ")),
                ));
            }
            if let serde_json::Value::String(s) = v {
                match key.as_str() {
                    "speculative_method" => {
                        s.parse::<SpeculativeMethod>()?;
                    }
                    "draft_proposal" => {
                        s.parse::<DraftProposal>()?;
                    }
                    "draft_head_parallelism" | "draft_probs_layout" => {
                        DraftPlacement::parse(key, s)?;
                    }
                    _ => {}
                }
            }
            let single = serde_json::json!({ key.clone(): v.clone() });
            serde_json::from_value::<Self>(single)
                .map_err(|e| ConfigError::field(key.as_str(), format!("invalid value for {key}: {e}")))?;
        }
        serde_json::from_value(value.clone()).map_err(|e| ConfigError::new(e.to_string()))
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("SpeculativeConfig serialises")
    }

    /// Applies every construction-time rule and returns the normalised config: the method's
    /// default width filled in and the schedule sorted.
    pub fn validated(mut self) -> Result<Self, ConfigError> {
        if let Some(k) = self.num_speculative_tokens
            && !(1..=MAX_DRAFT_TOKENS).contains(&k)
        {
            return Err(ConfigError::field(
                "num_speculative_tokens",
                format!("num_speculative_tokens must be between 1 and {MAX_DRAFT_TOKENS}, got {k}"),
            ));
        }
        self.check_suffix_decoding()?;
        if self.num_speculative_tokens.is_none()
            && let Some(k) = self.speculative_method.and_then(SpeculativeMethod::default_num_speculative_tokens)
        {
            self.num_speculative_tokens = Some(k as i64);
        }
        if self.num_speculative_tokens.is_none() && self.is_suffix() {
            // Drafts are as long as the trees support: the depth bounds match plus drafts.
            self.num_speculative_tokens = Some(self.suffix_decoding_max_tree_depth);
        }
        if let Some(rate) = self.synthetic_acceptance_rate
            && !(0.0..=1.0).contains(&rate)
        {
            return Err(ConfigError::field(
                "synthetic_acceptance_rate",
                format!("synthetic_acceptance_rate must be between 0.0 and 1.0, got {rate}"),
            ));
        }
        if self.relaxed_topk < 1 {
            return Err(ConfigError::field(
                "relaxed_topk",
                format!("relaxed_topk must be >= 1, got {}", self.relaxed_topk),
            ));
        }
        if !(0.0..=1.0).contains(&self.relaxed_delta) {
            return Err(ConfigError::field(
                "relaxed_delta",
                format!("relaxed_delta must be between 0.0 and 1.0, got {}", self.relaxed_delta),
            ));
        }
        if self.draft_proposal == DraftProposal::Sampled && self.use_relaxed_acceptance_for_thinking {
            return Err(ConfigError::field(
                "draft_proposal",
                "draft_proposal='sampled' cannot be combined with use_relaxed_acceptance_for_thinking: \
                 relaxed acceptance assumes each drafted token is the draft's argmax; use draft_proposal='argmax'",
            ));
        }
        if let Some(ranges) = &self.num_speculative_tokens_per_batch_size {
            self.num_speculative_tokens_per_batch_size = Some(normalize_schedule(ranges)?);
        }
        if self.num_speculative_tokens_per_batch_size.is_some() && self.adaptive_speculative_widths.is_some() {
            return Err(ConfigError::field(
                "adaptive_speculative_widths",
                "num_speculative_tokens_per_batch_size and adaptive_speculative_widths both choose the verify width; set only one",
            ));
        }
        if self.adaptive_speculative_min_batch_size < 1 {
            return Err(ConfigError::field(
                "adaptive_speculative_min_batch_size",
                format!(
                    "adaptive_speculative_min_batch_size must be >= 1, got {}",
                    self.adaptive_speculative_min_batch_size
                ),
            ));
        }
        if self.adaptive_speculative_min_batch_size != 1 && self.adaptive_speculative_widths.is_none() {
            return Err(ConfigError::field(
                "adaptive_speculative_min_batch_size",
                "adaptive_speculative_min_batch_size requires adaptive_speculative_widths to be set",
            ));
        }
        if let Some(widths) = &self.adaptive_speculative_widths {
            parse_adaptive_widths(widths, self.known_width())?;
        }
        if let Some(m) = self.num_speculative_tokens_mixed_batch
            && m < 0
        {
            return Err(ConfigError::field(
                "num_speculative_tokens_mixed_batch",
                format!("num_speculative_tokens_mixed_batch must be >= 0 (0 verifies nothing on mixed steps), got {m}"),
            ));
        }
        if self.prompt_lookup_min < 1 || self.prompt_lookup_max < self.prompt_lookup_min {
            return Err(ConfigError::field(
                "prompt_lookup_min",
                format!(
                    "prompt_lookup_min and prompt_lookup_max must satisfy 1 <= min <= max, got min={} max={}",
                    self.prompt_lookup_min, self.prompt_lookup_max
                ),
            ));
        }
        if self.enable_prompt_lookup {
            match self.speculative_method {
                None => {
                    return Err(ConfigError::field(
                        "enable_prompt_lookup",
                        "enable_prompt_lookup puts prompt lookup in front of a draft model, but no \
                         speculative_method is set; set one (eagle, mtp, dflash, dflash2, dspark)",
                    ));
                }
                Some(method @ (SpeculativeMethod::Ngram | SpeculativeMethod::Suffix)) => {
                    return Err(ConfigError::field(
                        "enable_prompt_lookup",
                        format!(
                            "speculative_method='{method}' already drafts by matching the request's own text; \
                             enable_prompt_lookup combines prompt lookup with a draft model (eagle, mtp, dflash, \
                             dflash2, dspark)"
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        if self.enable_suffix_decoding {
            match self.speculative_method {
                None => {
                    return Err(ConfigError::field(
                        "enable_suffix_decoding",
                        "enable_suffix_decoding puts suffix decoding in front of a draft model, but no \
                         speculative_method is set; set one (eagle, mtp, dflash, dflash2, dspark), or \
                         speculative_method='suffix' for suffix decoding alone",
                    ));
                }
                Some(method) if method.is_model_free() => {
                    return Err(ConfigError::field(
                        "enable_suffix_decoding",
                        format!(
                            "enable_suffix_decoding combines suffix decoding with a draft model (eagle, mtp, \
                             dflash, dflash2, dspark); speculative_method='{method}' has none: use \
                             speculative_method='suffix' for suffix decoding alone"
                        ),
                    ));
                }
                Some(_) => {}
            }
            if self.enable_prompt_lookup {
                return Err(ConfigError::field(
                    "enable_suffix_decoding",
                    "enable_suffix_decoding and enable_prompt_lookup both draft copies in front of the draft model; \
                     set one (suffix decoding also matches the request's own text)",
                ));
            }
        }
        let threshold = self.draft_confidence_threshold;
        if !(0.0..1.0).contains(&threshold) {
            return Err(ConfigError::field(
                "draft_confidence_threshold",
                format!(
                    "draft_confidence_threshold must be >= 0.0 and < 1.0 (0.0 drafts every position; 1.0 would \
                     draft nothing), got {threshold}"
                ),
            ));
        }
        if threshold > 0.0 {
            let why = match self.speculative_method {
                None | Some(SpeculativeMethod::Ngram) => Some("n-gram copies carry no probabilities"),
                Some(SpeculativeMethod::Suffix) => {
                    Some("suffix decoding cuts its drafts by suffix_decoding_min_token_prob instead")
                }
                Some(SpeculativeMethod::Dflash2) => {
                    Some("dflash2's selector walk scores a few candidates, not the vocabulary")
                }
                Some(_) => None,
            };
            if let Some(why) = why {
                return Err(ConfigError::field(
                    "draft_confidence_threshold",
                    format!(
                        "draft_confidence_threshold cuts a draft model's chain where its probability falls below \
                         the threshold, and needs a drafter with token probabilities: set speculative_method to \
                         eagle, mtp, dflash or dspark ({why})"
                    ),
                ));
            }
        }
        Ok(self)
    }

    /// The `suffix_decoding_*` rules (vLLM's bounds), and that they are set only for the
    /// `suffix` method, where they mean something.
    fn check_suffix_decoding(&self) -> Result<(), ConfigError> {
        let defaults = Self::default();
        let set: Vec<&str> = [
            (
                "suffix_decoding_max_tree_depth",
                self.suffix_decoding_max_tree_depth != defaults.suffix_decoding_max_tree_depth,
            ),
            (
                "suffix_decoding_max_cached_requests",
                self.suffix_decoding_max_cached_requests != defaults.suffix_decoding_max_cached_requests,
            ),
            (
                "suffix_decoding_max_spec_factor",
                self.suffix_decoding_max_spec_factor != defaults.suffix_decoding_max_spec_factor,
            ),
            (
                "suffix_decoding_min_token_prob",
                self.suffix_decoding_min_token_prob != defaults.suffix_decoding_min_token_prob,
            ),
        ]
        .into_iter()
        .filter_map(|(field, changed)| changed.then_some(field))
        .collect();
        if let Some(&field) = set.first()
            && !(self.is_suffix() || self.enable_suffix_decoding)
        {
            return Err(ConfigError::field(
                field,
                format!(
                    "{} configure suffix decoding: set speculative_method='suffix' (or enable_suffix_decoding with a \
                     draft model), or leave them unset",
                    set.join(", ")
                ),
            ));
        }
        let ratio = self.suffix_decoding_min_score_ratio;
        if ratio != defaults.suffix_decoding_min_score_ratio && !self.enable_suffix_decoding {
            return Err(ConfigError::field(
                "suffix_decoding_min_score_ratio",
                "suffix_decoding_min_score_ratio decides between suffix drafts and a draft model's: it needs \
                 enable_suffix_decoding (speculative_method='suffix' alone always takes the trees' drafts)",
            ));
        }
        if !(ratio >= 0.0 && ratio.is_finite()) {
            return Err(ConfigError::field(
                "suffix_decoding_min_score_ratio",
                format!("suffix_decoding_min_score_ratio must be a finite number >= 0, got {ratio}"),
            ));
        }
        if !(1..=MAX_DRAFT_TOKENS).contains(&self.suffix_decoding_max_tree_depth) {
            return Err(ConfigError::field(
                "suffix_decoding_max_tree_depth",
                format!(
                    "suffix_decoding_max_tree_depth must be between 1 and {MAX_DRAFT_TOKENS}, got {}",
                    self.suffix_decoding_max_tree_depth
                ),
            ));
        }
        if self.suffix_decoding_max_cached_requests < 0 {
            return Err(ConfigError::field(
                "suffix_decoding_max_cached_requests",
                format!(
                    "suffix_decoding_max_cached_requests must be >= 0 (0 caches no earlier outputs), got {}",
                    self.suffix_decoding_max_cached_requests
                ),
            ));
        }
        let factor = self.suffix_decoding_max_spec_factor;
        if !(factor >= 0.0 && factor.is_finite()) {
            return Err(ConfigError::field(
                "suffix_decoding_max_spec_factor",
                format!("suffix_decoding_max_spec_factor must be a finite number >= 0, got {factor}"),
            ));
        }
        let prob = self.suffix_decoding_min_token_prob;
        if !(0.0..=1.0).contains(&prob) {
            return Err(ConfigError::field(
                "suffix_decoding_min_token_prob",
                format!("suffix_decoding_min_token_prob must be between 0.0 and 1.0, got {prob}"),
            ));
        }
        Ok(())
    }

    /// `num_speculative_tokens` when it is known (set, or resolved from the method).
    pub fn known_width(&self) -> Option<usize> {
        self.num_speculative_tokens.map(|k| k as usize)
    }

    /// The number of tokens drafted per step. Set for every config a pipeline builds.
    pub fn draft_width(&self) -> Result<usize, ConfigError> {
        self.known_width().ok_or_else(|| {
            ConfigError::field(
                "num_speculative_tokens",
                "num_speculative_tokens is not resolved yet: block drafters take it from the draft checkpoint when the pipeline is built",
            )
        })
    }

    /// The validated schedule as sorted `(start, end, count)` triples.
    pub fn verify_width_schedule(&self) -> Option<Vec<(i64, i64, i64)>> {
        self.num_speculative_tokens_per_batch_size.as_ref().map(|r| r.iter().map(VerifyWidthRange::as_triple).collect())
    }

    /// Adaptive candidate widths once the draft width is known.
    pub fn adaptive_widths(&self) -> Result<Option<Vec<usize>>, ConfigError> {
        match &self.adaptive_speculative_widths {
            None => Ok(None),
            Some(s) => parse_adaptive_widths(s, Some(self.draft_width()?)).map(Some),
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.speculative_method.is_some()
    }

    pub fn is_eagle(&self) -> bool {
        self.speculative_method == Some(SpeculativeMethod::Eagle)
    }

    pub fn is_mtp(&self) -> bool {
        self.speculative_method == Some(SpeculativeMethod::Mtp)
    }

    /// True for DFlash and DFlash2: v2 keeps v1's block-drafting contract.
    pub fn is_dflash(&self) -> bool {
        matches!(self.speculative_method, Some(SpeculativeMethod::Dflash | SpeculativeMethod::Dflash2))
    }

    pub fn is_dflash2(&self) -> bool {
        self.speculative_method == Some(SpeculativeMethod::Dflash2)
    }

    pub fn is_dspark(&self) -> bool {
        self.speculative_method == Some(SpeculativeMethod::Dspark)
    }

    pub fn is_ngram(&self) -> bool {
        self.speculative_method == Some(SpeculativeMethod::Ngram)
    }

    pub fn is_suffix(&self) -> bool {
        self.speculative_method == Some(SpeculativeMethod::Suffix)
    }

    pub fn is_block_draft(&self) -> bool {
        self.speculative_method.is_some_and(SpeculativeMethod::is_block_draft)
    }

    /// The rule verification runs, by precedence synthetic > stochastic > greedy.
    pub fn acceptance_rule(&self) -> AcceptanceRule {
        if self.synthetic_acceptance_rate.is_some() {
            AcceptanceRule::Synthetic
        } else if self.use_greedy_acceptance {
            AcceptanceRule::Greedy
        } else {
            AcceptanceRule::Stochastic
        }
    }

    /// Rules checked when a pipeline is built: combinations that construct fine but that no
    /// verifier can run.
    pub fn check_pipeline_combinations(&self) -> Result<(), ConfigError> {
        let greedy = self.use_greedy_acceptance;
        let synthetic = self.synthetic_acceptance_rate.is_some();
        let sampled = self.draft_proposal == DraftProposal::Sampled;
        let relaxed = self.use_relaxed_acceptance_for_thinking;
        if greedy && relaxed {
            return Err(ConfigError::field(
                "use_greedy_acceptance",
                "Greedy acceptance has no relaxed rule: unset use_greedy_acceptance or use_relaxed_acceptance_for_thinking",
            ));
        }
        if greedy && synthetic {
            return Err(ConfigError::field(
                "use_greedy_acceptance",
                "use_greedy_acceptance cannot be combined with synthetic_acceptance_rate: synthetic acceptance replaces the acceptance rule",
            ));
        }
        if sampled && synthetic {
            return Err(ConfigError::field(
                "draft_proposal",
                "draft_proposal='sampled' cannot be combined with synthetic_acceptance_rate: synthetic acceptance ignores the draft distribution",
            ));
        }
        if sampled && greedy {
            return Err(ConfigError::field(
                "draft_proposal",
                "draft_proposal='sampled' cannot be combined with use_greedy_acceptance: greedy acceptance never reads the draft distribution",
            ));
        }
        if let Some(method) = self.speculative_method.filter(|m| sampled && m.is_model_free()) {
            return Err(ConfigError::field(
                "draft_proposal",
                format!(
                    "draft_proposal='sampled' needs a drafter with a distribution; the {method} method proposes copied tokens, use draft_proposal='argmax'"
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eagle_and_mtp_default_to_two_block_drafters_stay_unset() {
        let c = |m| SpeculativeConfig { speculative_method: Some(m), ..Default::default() }.validated().unwrap();
        assert_eq!(c(SpeculativeMethod::Eagle).num_speculative_tokens, Some(2));
        assert_eq!(c(SpeculativeMethod::Mtp).num_speculative_tokens, Some(2));
        assert_eq!(c(SpeculativeMethod::Ngram).num_speculative_tokens, Some(4));
        assert_eq!(c(SpeculativeMethod::Suffix).num_speculative_tokens, Some(24), "the tree depth");
        assert_eq!(c(SpeculativeMethod::Dflash).num_speculative_tokens, None);
        assert!(c(SpeculativeMethod::Dspark).draft_width().is_err());
    }

    #[test]
    fn precedence_is_synthetic_then_stochastic_then_greedy() {
        let mut c = SpeculativeConfig::default();
        assert_eq!(c.acceptance_rule(), AcceptanceRule::Stochastic);
        c.use_greedy_acceptance = true;
        assert_eq!(c.acceptance_rule(), AcceptanceRule::Greedy);
        c.synthetic_acceptance_rate = Some(0.5);
        assert_eq!(c.acceptance_rule(), AcceptanceRule::Synthetic);
    }

    #[test]
    fn prompt_lookup_goes_in_front_of_draft_models_only() {
        let c = |m| SpeculativeConfig { speculative_method: m, enable_prompt_lookup: true, ..Default::default() };
        for m in
            [SpeculativeMethod::Eagle, SpeculativeMethod::Mtp, SpeculativeMethod::Dflash, SpeculativeMethod::Dspark]
        {
            assert!(c(Some(m)).validated().unwrap().enable_prompt_lookup);
        }
        for (method, says) in
            [(None, "no speculative_method is set"), (Some(SpeculativeMethod::Ngram), "already drafts")]
        {
            let err = c(method).validated().unwrap_err();
            assert_eq!(err.field.as_deref(), Some("enable_prompt_lookup"));
            assert!(err.to_string().contains(says), "{err}");
        }
    }

    #[test]
    fn suffix_fields_are_bounded_and_belong_to_the_suffix_method() {
        let suffix = |f: fn(&mut SpeculativeConfig)| {
            let mut c = SpeculativeConfig { speculative_method: Some(SpeculativeMethod::Suffix), ..Default::default() };
            f(&mut c);
            c.validated()
        };
        let c = suffix(|c| c.suffix_decoding_max_tree_depth = 32).unwrap();
        assert_eq!(c.num_speculative_tokens, Some(32), "unset width follows the depth");
        assert_eq!(suffix(|c| c.num_speculative_tokens = Some(8)).unwrap().num_speculative_tokens, Some(8));
        assert!(suffix(|c| c.suffix_decoding_max_cached_requests = 0).is_ok(), "0 keeps only per-request trees");
        for (f, field) in [
            (
                (|c| c.suffix_decoding_max_tree_depth = 0) as fn(&mut SpeculativeConfig),
                "suffix_decoding_max_tree_depth",
            ),
            (|c| c.suffix_decoding_max_cached_requests = -1, "suffix_decoding_max_cached_requests"),
            (|c| c.suffix_decoding_max_spec_factor = -0.5, "suffix_decoding_max_spec_factor"),
            (|c| c.suffix_decoding_max_spec_factor = f64::NAN, "suffix_decoding_max_spec_factor"),
            (|c| c.suffix_decoding_min_token_prob = 1.5, "suffix_decoding_min_token_prob"),
            (|c| c.draft_confidence_threshold = 0.5, "draft_confidence_threshold"),
        ] {
            assert_eq!(suffix(f).unwrap_err().field.as_deref(), Some(field));
        }
        let eagle = SpeculativeConfig {
            speculative_method: Some(SpeculativeMethod::Eagle),
            suffix_decoding_min_token_prob: 0.3,
            ..Default::default()
        };
        let err = eagle.validated().unwrap_err();
        assert_eq!(err.field.as_deref(), Some("suffix_decoding_min_token_prob"));
        assert!(err.to_string().contains("speculative_method='suffix'"), "{err}");
    }

    #[test]
    fn suffix_decoding_goes_in_front_of_draft_models_instead_of_prompt_lookup() {
        let c = |method, f: fn(&mut SpeculativeConfig)| {
            let mut c =
                SpeculativeConfig { speculative_method: method, enable_suffix_decoding: true, ..Default::default() };
            f(&mut c);
            c.validated()
        };
        let tuned = c(Some(SpeculativeMethod::Eagle), |c| {
            c.suffix_decoding_min_score_ratio = 0.5;
            c.suffix_decoding_max_tree_depth = 16;
        })
        .unwrap();
        assert_eq!(tuned.num_speculative_tokens, Some(2), "the model's width, not the tree depth");
        assert_eq!((tuned.suffix_decoding_min_score_ratio, tuned.suffix_decoding_max_tree_depth), (0.5, 16));
        for (method, says) in [
            (None, "no speculative_method is set"),
            (Some(SpeculativeMethod::Ngram), "has none"),
            (Some(SpeculativeMethod::Suffix), "has none"),
        ] {
            let err = c(method, |_| {}).unwrap_err();
            assert_eq!(err.field.as_deref(), Some("enable_suffix_decoding"));
            assert!(err.to_string().contains(says), "{err}");
        }
        let both = c(Some(SpeculativeMethod::Mtp), |c| c.enable_prompt_lookup = true).unwrap_err();
        assert!(both.to_string().contains("set one"), "{both}");
        let negative = c(Some(SpeculativeMethod::Eagle), |c| c.suffix_decoding_min_score_ratio = -1.0);
        assert_eq!(negative.unwrap_err().field.as_deref(), Some("suffix_decoding_min_score_ratio"));
        let alone = SpeculativeConfig {
            speculative_method: Some(SpeculativeMethod::Suffix),
            suffix_decoding_min_score_ratio: 2.0,
            ..Default::default()
        };
        assert!(alone.validated().unwrap_err().to_string().contains("needs enable_suffix_decoding"));
    }
}
