//! Per-request sampling parameters and their validation.
//!
//! Field names and meanings follow vLLM's `SamplingParams` / the OpenAI API so the server and
//! the Python API pass values through unchanged. `validate` runs once at admission; the
//! acceptance and sampling code then trusts the values but never panics on invalid ones.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::rng::{GOLDEN_GAMMA, splitmix64_mix};
use crate::error::ConfigError;
use crate::structured::{CompiledGuide, StructuredOutputs};

/// Temperatures below this sample greedily (argmax), as in Modular MAX and vLLM.
pub const GREEDY_TEMPERATURE: f32 = 1e-5;

/// The most top-n logprobs a request may ask for per emitted token (OpenAI's limit).
pub const MAX_LOGPROBS: usize = 20;

/// Bound on |frequency_penalty| and |presence_penalty| (OpenAI's range).
pub const MAX_ABS_ADDITIVE_PENALTY: f32 = 2.0;

/// Bound on each |logit_bias| value (OpenAI's range: -100 bans a token, 100 forces it).
pub const MAX_ABS_LOGIT_BIAS: f32 = 100.0;

/// How one request samples and when it stops.
///
/// Off values: `top_k <= 0` (or `>= vocab_size`), `top_p == 1`, `min_p == 0`,
/// `repetition_penalty == 1`, `frequency_penalty == presence_penalty == 0`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SamplingParams {
    /// Softmax temperature; below [`GREEDY_TEMPERATURE`] the request decodes greedily.
    pub temperature: f32,
    /// Keep the `top_k` highest logits; `0` (the default) or any value `<= 0` means off, as
    /// does a value `>= vocab_size`. Tokens tied with the k-th logit are kept too.
    pub top_k: i64,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose mass reaches
    /// `top_p`. `1.0` means off.
    pub top_p: f32,
    /// Keep tokens whose probability is at least `min_p` times the top token's; `0` is off.
    pub min_p: f32,
    /// Seed of the request's random streams; the engine draws one when unset. With `n > 1`
    /// choice 0 uses it as is and every other choice a seed derived from it and its index.
    pub seed: Option<u64>,
    /// Independent completions of the prompt (vLLM's parallel sampling; OpenAI's `n`). Each
    /// choice is sampled as a request of its own; greedy decoding allows only 1.
    pub n: usize,
    /// Divides positive (multiplies negative) logits of every token seen in the prompt or
    /// the output. `1.0` means off.
    pub repetition_penalty: f32,
    /// Subtracted from a token's logit once per occurrence in the output.
    pub frequency_penalty: f32,
    /// Subtracted from a token's logit once if it occurs in the output.
    pub presence_penalty: f32,
    /// Stop after this many generated tokens; `None` runs to the context limit.
    pub max_tokens: Option<usize>,
    /// Refuse a `max_tokens` the prompt leaves no room for in the context, rather than
    /// shortening it to the room left (vLLM's OpenAI server refuses; its offline `LLM`, and
    /// spec-rs's, shortens).
    pub max_tokens_must_fit: bool,
    /// Stop when the detokenized output contains one of these strings.
    pub stop: Vec<String>,
    /// Stop after emitting one of these token ids (in addition to EOS).
    pub stop_token_ids: Vec<u32>,
    /// Keep generating past EOS.
    pub ignore_eos: bool,
    /// Return this many top logprobs (from the raw target logits) per emitted token.
    pub logprobs: Option<usize>,
    /// Return the logprob of every prompt token after the first (given the tokens before it)
    /// with this many top logprobs at each position (vLLM's `prompt_logprobs`).
    pub prompt_logprobs: Option<usize>,
    /// Do not stop (EOS or stop ids) before this many generated tokens.
    pub min_tokens: usize,
    /// Added to the named tokens' logits at every position before the penalties (OpenAI's
    /// `logit_bias`; JSON keys are token ids as strings).
    pub logit_bias: BTreeMap<u32, f32>,
    /// Sample only among these tokens: every other logit is masked at every position.
    pub allowed_token_ids: Option<Vec<u32>>,
    /// Keep the stop string (or the stop token's text) that ended the output in its text.
    pub include_stop_str_in_output: bool,
    /// Leave special tokens (EOS, chat markers) out of the output text; the token ids keep
    /// them either way.
    pub skip_special_tokens: bool,
    /// Keep only the last this many prompt tokens (left truncation) before generating.
    pub truncate_prompt_tokens: Option<usize>,
    /// Words the output never contains (vLLM's `bad_words`): the token completing one is
    /// masked wherever the output so far ends with the rest of it.
    pub bad_words: Vec<String>,
    /// `bad_words` as token sequences ([`super::bad_word_token_ids`]): the engine fills them
    /// in at admission with its tokenizer; they are what the logits processing reads.
    #[serde(skip)]
    pub bad_word_ids: Vec<Vec<u32>>,
    /// The output follows a JSON schema, is any JSON object, matches a regex or is one of a
    /// list of choices (vLLM's `structured_outputs`; OpenAI's `response_format`).
    pub structured_outputs: Option<StructuredOutputs>,
    /// `structured_outputs` compiled against the vocabulary: the engine handle fills it in
    /// before admission (an engine driven directly, at admission); it is what masks the logits.
    #[serde(skip)]
    pub guide: Option<CompiledGuide>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: None,
            n: 1,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            max_tokens: None,
            max_tokens_must_fit: false,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            prompt_logprobs: None,
            min_tokens: 0,
            logit_bias: BTreeMap::new(),
            allowed_token_ids: None,
            include_stop_str_in_output: false,
            skip_special_tokens: true,
            truncate_prompt_tokens: None,
            bad_words: Vec::new(),
            bad_word_ids: Vec::new(),
            structured_outputs: None,
            guide: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: `temperature = 0`.
    pub fn greedy() -> Self {
        Self { temperature: 0.0, ..Self::default() }
    }

    /// True when the request decodes by argmax. NaN counts as greedy so a bad value can never
    /// reach a division.
    pub fn is_greedy(&self) -> bool {
        self.temperature.is_nan() || self.temperature < GREEDY_TEMPERATURE
    }

    /// True when any of the repetition, frequency or presence penalties is on.
    pub fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0 || self.frequency_penalty != 0.0 || self.presence_penalty != 0.0
    }

    /// True when the target's logits are changed before sampling (penalties, a logit bias,
    /// allowed tokens, bad words or a structured-output guide): such rows are processed on
    /// their logit rows, where the adjustments are applied.
    pub fn adjusts_logits(&self) -> bool {
        self.has_penalties()
            || !self.logit_bias.is_empty()
            || self.allowed_token_ids.is_some()
            || !self.bad_word_ids.is_empty()
            || self.guide.is_some()
    }

    /// True when the request masks tokens outright (allowed tokens, bad words, a
    /// structured-output guide), so that together with the engine's own masks it may leave
    /// a position no token at all.
    pub fn masks_tokens(&self) -> bool {
        self.allowed_token_ids.is_some() || !self.bad_word_ids.is_empty() || self.guide.is_some()
    }

    /// The request fields that may mask tokens outright, in the order they are named to the
    /// client when together they leave no token to generate; `holds_back_stops` adds
    /// `min_tokens`, which masks the stop tokens while it is unmet.
    pub fn masking_fields(&self, holds_back_stops: bool) -> Vec<&'static str> {
        let mut fields = Vec::new();
        if self.allowed_token_ids.is_some() {
            fields.push("allowed_token_ids");
        }
        if !self.bad_word_ids.is_empty() {
            fields.push("bad_words");
        }
        if self.guide.is_some() {
            fields.push("structured_outputs");
        }
        if holds_back_stops {
            fields.push("min_tokens");
        }
        fields
    }

    /// The top-k cut for a vocabulary of `vocab_size` tokens, or `None` when it keeps
    /// everything.
    pub fn top_k_for(&self, vocab_size: usize) -> Option<usize> {
        usize::try_from(self.top_k).ok().filter(|&k| k > 0 && k < vocab_size)
    }

    /// The parameters choice `index` of an `n`-choice request runs with: one choice (`n = 1`);
    /// choice 0 keeps the seed, the others derive theirs from it and their index (see
    /// [`choice_seed`]); only choice 0 scores the prompt, which every choice shares.
    pub fn for_choice(&self, index: usize) -> Self {
        Self {
            n: 1,
            seed: self.seed.map(|seed| choice_seed(seed, index)),
            prompt_logprobs: if index == 0 { self.prompt_logprobs } else { None },
            ..self.clone()
        }
    }

    /// Checks every field; errors name the field at fault.
    pub fn validate(&self, vocab_size: usize) -> Result<(), ConfigError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(ConfigError::field(
                "temperature",
                format!("temperature must be a finite number >= 0 (0 decodes greedily), got {}", self.temperature),
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ConfigError::field(
                "top_p",
                format!("top_p must be in (0, 1] (1 disables it), got {}", self.top_p),
            ));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(ConfigError::field(
                "min_p",
                format!("min_p must be in [0, 1] (0 disables it), got {}", self.min_p),
            ));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(ConfigError::field(
                "repetition_penalty",
                format!(
                    "repetition_penalty must be a finite number > 0 (1 disables it), got {}",
                    self.repetition_penalty
                ),
            ));
        }
        for (field, value) in
            [("frequency_penalty", self.frequency_penalty), ("presence_penalty", self.presence_penalty)]
        {
            if !(-MAX_ABS_ADDITIVE_PENALTY..=MAX_ABS_ADDITIVE_PENALTY).contains(&value) {
                return Err(ConfigError::field(
                    field,
                    format!("{field} must be in [-2, 2] (0 disables it), got {value}"),
                ));
            }
        }
        for (field, n) in [("logprobs", self.logprobs), ("prompt_logprobs", self.prompt_logprobs)] {
            if let Some(n) = n
                && n > MAX_LOGPROBS
            {
                return Err(ConfigError::field(field, format!("{field} must be <= {MAX_LOGPROBS}, got {n}")));
            }
        }
        if self.n == 0 {
            return Err(ConfigError::field("n", "n (the number of choices) must be >= 1, got 0"));
        }
        if self.n > 1 && self.is_greedy() {
            return Err(ConfigError::field(
                "n",
                format!(
                    "n must be 1 when decoding greedily (temperature 0 gives {} identical choices), got {}; \
                     set a temperature > 0 to sample several",
                    self.n, self.n
                ),
            ));
        }
        if self.max_tokens == Some(0) {
            return Err(ConfigError::field("max_tokens", "max_tokens must be >= 1 when set, got 0"));
        }
        if let Some(max) = self.max_tokens
            && self.min_tokens > max
        {
            return Err(ConfigError::field(
                "min_tokens",
                format!("min_tokens ({}) must not exceed max_tokens ({max})", self.min_tokens),
            ));
        }
        if let Some((&id, &bias)) =
            self.logit_bias.iter().find(|&(_, &b)| !(b.is_finite() && b.abs() <= MAX_ABS_LOGIT_BIAS))
        {
            return Err(ConfigError::field(
                "logit_bias",
                format!("logit_bias values must be in [-100, 100], got {bias} for token {id}"),
            ));
        }
        if let Some(&id) = self.logit_bias.keys().find(|&&id| id as usize >= vocab_size) {
            return Err(ConfigError::field(
                "logit_bias",
                format!("logit_bias names token {id}, outside the vocabulary of {vocab_size} tokens"),
            ));
        }
        if let Some(&id) = self.stop_token_ids.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(ConfigError::field(
                "stop_token_ids",
                format!("stop_token_ids contains {id}, outside the vocabulary of {vocab_size} tokens"),
            ));
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(ConfigError::field("stop", "stop strings must not be empty"));
        }
        match &self.allowed_token_ids {
            Some(allowed) if allowed.is_empty() => {
                return Err(ConfigError::field(
                    "allowed_token_ids",
                    "allowed_token_ids must name at least one token (leave it unset to allow all)",
                ));
            }
            Some(allowed) => {
                if let Some(&id) = allowed.iter().find(|&&id| id as usize >= vocab_size) {
                    return Err(ConfigError::field(
                        "allowed_token_ids",
                        format!("allowed_token_ids contains {id}, outside the vocabulary of {vocab_size} tokens"),
                    ));
                }
            }
            None => {}
        }
        if self.truncate_prompt_tokens == Some(0) {
            return Err(ConfigError::field(
                "truncate_prompt_tokens",
                "truncate_prompt_tokens must be >= 1 when set (the prompt tokens to keep), got 0",
            ));
        }
        if self.bad_words.iter().any(|w| w.trim().is_empty()) {
            return Err(ConfigError::field("bad_words", "bad_words entries must not be empty or only spaces"));
        }
        if let Some(&id) = self.bad_word_ids.iter().flatten().find(|&&id| id as usize >= vocab_size) {
            return Err(ConfigError::field(
                "bad_words",
                format!("a bad word tokenizes to {id}, outside the vocabulary of {vocab_size} tokens"),
            ));
        }
        if let Some(constraint) = &self.structured_outputs {
            // A compiled guide was checked when it was compiled (compiling refuses whatever
            // validation does): a grammar is not lowered again on the engine thread.
            if self.guide.is_none() {
                constraint.validate()?;
            }
            // A constraint decides where its output may end; these would overrule it.
            if self.min_tokens > 0 || self.ignore_eos {
                return Err(ConfigError::field(
                    "structured_outputs",
                    "structured_outputs ends the output where the constraint is complete; drop min_tokens and \
                     ignore_eos",
                ));
            }
        }
        Ok(())
    }
}

/// The seed of choice `index` of a request seeded with `seed`: `seed` itself for choice 0 (so a
/// seeded request's first choice equals the same request with `n = 1`), a SplitMix64 mix of
/// both for the others, so no two choices' streams are related by a simple offset (vLLM's
/// `seed + index` would make choice seeds differ by one).
pub fn choice_seed(seed: u64, index: usize) -> u64 {
    if index == 0 {
        return seed;
    }
    splitmix64_mix(seed ^ (index as u64).wrapping_mul(GOLDEN_GAMMA))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_turn_every_filter_off() {
        let p = SamplingParams::default();
        assert!(!p.is_greedy());
        assert!(!p.has_penalties());
        assert_eq!(p.top_k_for(100), None);
        assert!(p.validate(100).is_ok());
    }

    #[test]
    fn greedy_below_threshold_and_for_nan() {
        for t in [0.0, 9e-6, -1.0, f32::NAN] {
            assert!(SamplingParams { temperature: t, ..Default::default() }.is_greedy(), "{t}");
        }
        assert!(!SamplingParams { temperature: 1e-5, ..Default::default() }.is_greedy());
    }

    #[test]
    fn top_k_is_off_at_or_below_zero_and_at_vocab_size() {
        let k = |top_k| SamplingParams { top_k, ..Default::default() }.top_k_for(10);
        assert_eq!(k(-1), None);
        assert_eq!(k(0), None);
        assert_eq!(k(10), None);
        assert_eq!(k(3), Some(3));
    }

    #[test]
    fn partial_json_fills_defaults_and_unknown_keys_are_rejected() {
        let p: SamplingParams = serde_json::from_str(r#"{"temperature": 0.5, "seed": 7}"#).unwrap();
        assert_eq!(p, SamplingParams { temperature: 0.5, seed: Some(7), ..Default::default() });
        assert!(serde_json::from_str::<SamplingParams>(r#"{"temprature": 0.5}"#).is_err());
    }

    #[test]
    fn logit_bias_reads_openai_json_and_is_checked_for_range_and_vocabulary() {
        let p: SamplingParams = serde_json::from_str(r#"{"logit_bias": {"7": -100, "3": 2.5}}"#).unwrap();
        assert_eq!(p.logit_bias, BTreeMap::from([(3, 2.5), (7, -100.0)]));
        assert!(p.adjusts_logits() && !p.has_penalties());
        assert!(p.validate(8).is_ok());
        let e = p.validate(5).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("logit_bias"));
        assert!(e.message.contains("token 7, outside the vocabulary of 5"), "{}", e.message);
        let loud = SamplingParams { logit_bias: BTreeMap::from([(1, 101.0)]), ..Default::default() };
        assert!(loud.validate(8).unwrap_err().message.contains("[-100, 100], got 101 for token 1"));
        let nan = SamplingParams { logit_bias: BTreeMap::from([(1, f32::NAN)]), ..Default::default() };
        assert!(nan.validate(8).is_err());
    }

    #[test]
    fn allowed_tokens_must_be_some_and_inside_the_vocabulary_and_truncation_keeps_a_token() {
        let allowed = |ids: Vec<u32>| SamplingParams { allowed_token_ids: Some(ids), ..Default::default() };
        assert!(allowed(vec![3, 5]).validate(8).is_ok());
        assert!(allowed(vec![3]).adjusts_logits(), "masking happens on the logit rows");
        for (ids, message) in [(vec![], "at least one token"), (vec![2, 8], "contains 8, outside the vocabulary of 8")]
        {
            let e = allowed(ids).validate(8).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("allowed_token_ids"));
            assert!(e.message.contains(message), "{}", e.message);
        }
        let e = SamplingParams { truncate_prompt_tokens: Some(0), ..Default::default() }.validate(8).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("truncate_prompt_tokens"));
        assert!(SamplingParams::default().skip_special_tokens, "special tokens are skipped by default, as in vLLM");
    }

    #[test]
    fn structured_outputs_are_validated_and_leave_the_end_to_the_constraint() {
        let choice = StructuredOutputs { choice: Some(vec!["a".into()]), ..Default::default() };
        let guided = SamplingParams { structured_outputs: Some(choice), ..Default::default() };
        assert!(guided.validate(8).is_ok());
        for params in [
            SamplingParams { min_tokens: 2, ..guided.clone() },
            SamplingParams { ignore_eos: true, ..guided.clone() },
            SamplingParams { structured_outputs: Some(StructuredOutputs::default()), ..Default::default() },
        ] {
            assert_eq!(params.validate(8).unwrap_err().field.as_deref(), Some("structured_outputs"));
        }
        assert!(!guided.adjusts_logits(), "until the engine compiles the constraint");
    }

    #[test]
    fn a_compiled_guide_is_not_validated_again_but_the_end_rules_still_hold() {
        use std::sync::Arc;

        use crate::structured::TokenVocabulary;
        let vocabulary = Arc::new(TokenVocabulary::new(vec![None, Some(b"a".to_vec())], vec![0]));
        let choice = StructuredOutputs { choice: Some(vec!["a".into()]), ..Default::default() };
        let guide = choice.compile(&vocabulary).unwrap();
        // A grammar that would not parse: the compiled guide stands for the constraint.
        let unparsed = StructuredOutputs { grammar: Some("root ::= missing".into()), ..Default::default() };
        let compiled = SamplingParams { structured_outputs: Some(unparsed), guide: Some(guide), ..Default::default() };
        assert!(compiled.validate(8).is_ok());
        let err = SamplingParams { ignore_eos: true, ..compiled }.validate(8).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("structured_outputs"));
    }

    #[test]
    fn bad_words_must_say_something_and_their_tokens_fit_the_vocabulary() {
        let words = |w: &[&str], ids: Vec<Vec<u32>>| SamplingParams {
            bad_words: w.iter().map(|s| s.to_string()).collect(),
            bad_word_ids: ids,
            ..Default::default()
        };
        assert!(words(&["cat"], vec![vec![3]]).validate(8).is_ok());
        assert!(!words(&["cat"], vec![]).adjusts_logits(), "until the engine tokenizes them");
        assert!(words(&["cat"], vec![vec![3]]).adjusts_logits());
        for (p, message) in [
            (words(&["cat", " "], vec![]), "must not be empty"),
            (words(&["cat"], vec![vec![2, 9]]), "tokenizes to 9, outside the vocabulary of 8"),
        ] {
            let e = p.validate(8).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("bad_words"));
            assert!(e.message.contains(message), "{}", e.message);
        }
        let json = serde_json::to_value(words(&["cat"], vec![vec![3]])).unwrap();
        assert_eq!(json["bad_words"], serde_json::json!(["cat"]));
        assert!(json.get("bad_word_ids").is_none(), "the engine's tokenization stays internal");
    }

    #[test]
    fn n_must_be_positive_and_greedy_requests_take_one_choice() {
        let sampled = SamplingParams { n: 4, ..Default::default() };
        assert!(sampled.validate(8).is_ok());
        let none = SamplingParams { n: 0, ..Default::default() }.validate(8).unwrap_err();
        assert_eq!(none.field.as_deref(), Some("n"));
        let greedy = SamplingParams { n: 2, ..SamplingParams::greedy() }.validate(8).unwrap_err();
        assert_eq!(greedy.field.as_deref(), Some("n"));
        assert!(greedy.message.contains("n must be 1 when decoding greedily"), "{}", greedy.message);
        assert!(SamplingParams::greedy().validate(8).is_ok());
    }

    #[test]
    fn choices_run_alone_with_distinct_seeds_and_only_the_first_scores_the_prompt() {
        let p = SamplingParams { n: 3, seed: Some(7), prompt_logprobs: Some(2), ..Default::default() };
        let choices: Vec<SamplingParams> = (0..3).map(|i| p.for_choice(i)).collect();
        assert!(choices.iter().all(|c| c.n == 1 && c.temperature == p.temperature));
        assert_eq!(choices[0].seed, Some(7), "choice 0 keeps the request's seed");
        let seeds: Vec<u64> = choices.iter().map(|c| c.seed.unwrap()).collect();
        // Not merely distinct: far from each other, so `seed + position` streams never meet.
        for (i, a) in seeds.iter().enumerate() {
            for b in &seeds[i + 1..] {
                assert!(a.abs_diff(*b) > 1 << 20, "{seeds:?}");
            }
        }
        assert_eq!(choices.iter().map(|c| c.prompt_logprobs).collect::<Vec<_>>(), [Some(2), None, None]);
        assert_eq!(SamplingParams::default().for_choice(1).seed, None, "unseeded choices draw their own");
    }
}
