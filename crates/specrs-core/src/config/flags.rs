//! The command-line surface of [`SpeculativeConfig`](super::SpeculativeConfig), generated from
//! its fields: `snake_case` → `--kebab-case`, booleans as `--x/--no-x` pairs, literals as
//! case-insensitive choices, the schedule as a JSON string. The `spec-rs` binary builds its
//! parser from this table and the Python package checks its pydantic fields against it.

/// How a field is spelled on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlagKind {
    /// `--x` / `--no-x`.
    Bool,
    Int,
    Float,
    Str,
    /// One of a fixed set, case-insensitive.
    Choice(&'static [&'static str]),
    /// A JSON value (`'[{"batch_start": 1, ...}]'`) or a path to a YAML/JSON file holding it.
    Json,
}

/// One configuration field exposed as a flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldFlag {
    pub field: &'static str,
    pub kind: FlagKind,
    pub help: &'static str,
}

impl FieldFlag {
    /// `--num-speculative-tokens` for `num_speculative_tokens`.
    pub fn flag(&self) -> String {
        format!("--{}", self.field.replace('_', "-"))
    }

    /// The negative spelling of a boolean flag.
    pub fn negated_flag(&self) -> Option<String> {
        (self.kind == FlagKind::Bool).then(|| format!("--no-{}", self.field.replace('_', "-")))
    }
}

pub const METHOD_CHOICES: &[&str] = &["eagle", "mtp", "dflash", "dflash2", "dspark", "ngram", "suffix"];
pub const PROPOSAL_CHOICES: &[&str] = &["argmax", "sampled"];
pub const PLACEMENT_CHOICES: &[&str] = &["device0", "replica"];

/// Every user-settable field of `SpeculativeConfig`, in declaration order.
pub const SPECULATIVE_FLAGS: &[FieldFlag] = &[
    FieldFlag {
        field: "speculative_method",
        kind: FlagKind::Choice(METHOD_CHOICES),
        help: "Speculative decoding method (ngram and suffix are spec-rs extensions); unset disables speculation",
    },
    FieldFlag {
        field: "num_speculative_tokens",
        kind: FlagKind::Int,
        help: "Tokens drafted per step, at most (eagle/mtp default 2, ngram 4, suffix the tree depth, block drafters: the checkpoint's width)",
    },
    FieldFlag {
        field: "num_speculative_tokens_per_batch_size",
        kind: FlagKind::Json,
        help: "Verify width by decode batch size, as JSON: '[{\"batch_start\":1,\"batch_end\":16,\"num_tokens\":3}, ...]'",
    },
    FieldFlag {
        field: "adaptive_speculative_widths",
        kind: FlagKind::Str,
        help: "Verify widths a throughput-driven controller chooses among: \"1,3,5\" or \"all\"",
    },
    FieldFlag {
        field: "adaptive_speculative_min_batch_size",
        kind: FlagKind::Int,
        help: "Decode batch size below which only the widest adaptive width is used",
    },
    FieldFlag {
        field: "num_speculative_tokens_mixed_batch",
        kind: FlagKind::Int,
        help: "Verify width on mixed prefill+decode steps (needs --enable-spec-decode-mixed-batches)",
    },
    FieldFlag {
        field: "synthetic_acceptance_rate",
        kind: FlagKind::Float,
        help: "Benchmark-only: accept drafts with a calibrated probability, ignoring the logits (0.0-1.0)",
    },
    FieldFlag {
        field: "use_relaxed_acceptance_for_thinking",
        kind: FlagKind::Bool,
        help: "Inside reasoning spans, accept drafts among the target's top-k close to its top-1 (lossy)",
    },
    FieldFlag {
        field: "relaxed_topk",
        kind: FlagKind::Int,
        help: "Candidates considered by relaxed acceptance (>= 1)",
    },
    FieldFlag {
        field: "relaxed_delta",
        kind: FlagKind::Float,
        help: "Relaxed acceptance takes candidates with p >= p_top1 - delta (0.0-1.0)",
    },
    FieldFlag {
        field: "use_greedy_acceptance",
        kind: FlagKind::Bool,
        help: "Accept drafts by argmax match only (greedy serving)",
    },
    FieldFlag {
        field: "draft_proposal",
        kind: FlagKind::Choice(PROPOSAL_CHOICES),
        help: "argmax drafts, or drafts sampled with their distribution kept for rejection sampling",
    },
    FieldFlag {
        field: "draft_head_parallelism",
        kind: FlagKind::Choice(PLACEMENT_CHOICES),
        help: "Where the draft head runs with several devices: device0 or per replica",
    },
    FieldFlag {
        field: "draft_probs_layout",
        kind: FlagKind::Choice(PLACEMENT_CHOICES),
        help: "Where sampled-draft distributions live with several devices: device0 or per replica",
    },
    FieldFlag {
        field: "logit_penalties",
        kind: FlagKind::Bool,
        help: "Apply repetition/frequency/presence penalties at every draft position during verification",
    },
    FieldFlag {
        field: "prompt_lookup_min",
        kind: FlagKind::Int,
        help: "ngram: shortest suffix n-gram matched in the context",
    },
    FieldFlag {
        field: "prompt_lookup_max",
        kind: FlagKind::Int,
        help: "ngram: longest suffix n-gram matched in the context (tried first)",
    },
    FieldFlag {
        field: "enable_prompt_lookup",
        kind: FlagKind::Bool,
        help: "With a draft model: rows whose latest tokens repeat an earlier n-gram draft its continuation instead",
    },
    FieldFlag {
        field: "draft_confidence_threshold",
        kind: FlagKind::Float,
        help: "Rows drafting the argmax stop where the running product of the drafter's top-1 probabilities falls below this (0 = off, < 1)",
    },
    FieldFlag {
        field: "suffix_decoding_max_tree_depth",
        kind: FlagKind::Int,
        help: "suffix: longest substring the suffix trees count; bounds match length plus draft length",
    },
    FieldFlag {
        field: "suffix_decoding_max_cached_requests",
        kind: FlagKind::Int,
        help: "suffix: earlier requests whose outputs are matched, evicted oldest first (0 = own request only)",
    },
    FieldFlag {
        field: "suffix_decoding_max_spec_factor",
        kind: FlagKind::Float,
        help: "suffix: a match of n tokens drafts at most n times this",
    },
    FieldFlag {
        field: "suffix_decoding_min_token_prob",
        kind: FlagKind::Float,
        help: "suffix: stop drafting before a token whose frequency-estimated probability is below this",
    },
    FieldFlag {
        field: "enable_suffix_decoding",
        kind: FlagKind::Bool,
        help: "With a draft model: rows whose suffix-tree draft scores high enough take it; the model drafts the rest",
    },
    FieldFlag {
        field: "suffix_decoding_min_score_ratio",
        kind: FlagKind::Float,
        help: "With --enable-suffix-decoding: a suffix draft is taken when its score reaches this times num_speculative_tokens",
    },
];

/// Coerces loosely typed values (YAML files, environment) to each field's kind, as MAX's
/// non-strict pydantic model does: numbers and booleans written as strings, whole floats for
/// integers, choices in any case, the schedule as a JSON string. Values that do not coerce are
/// left as they are, for the typed reader to name.
pub fn coerce_loose_values(values: &mut serde_json::Map<String, serde_json::Value>) {
    use serde_json::Value;
    for flag in SPECULATIVE_FLAGS {
        let Some(value) = values.get_mut(flag.field) else { continue };
        let coerced = match (flag.kind, &*value) {
            (FlagKind::Int, Value::String(s)) => s.trim().parse::<i64>().ok().map(Value::from),
            (FlagKind::Int, Value::Number(n)) => n
                .as_f64()
                .filter(|x| !n.is_i64() && x.fract() == 0.0 && x.abs() < 9.0e15)
                .map(|x| Value::from(x as i64)),
            (FlagKind::Float, Value::String(s)) => {
                s.trim().parse::<f64>().ok().and_then(serde_json::Number::from_f64).map(Value::Number)
            }
            (FlagKind::Bool, Value::String(s)) => match s.trim().to_ascii_lowercase().as_str() {
                "true" | "t" | "yes" | "y" | "on" | "1" => Some(Value::Bool(true)),
                "false" | "f" | "no" | "n" | "off" | "0" => Some(Value::Bool(false)),
                _ => None,
            },
            (FlagKind::Bool, Value::Number(n)) => match n.as_i64() {
                Some(0) => Some(Value::Bool(false)),
                Some(1) => Some(Value::Bool(true)),
                _ => None,
            },
            (FlagKind::Choice(_), Value::String(s)) => Some(Value::String(s.trim().to_lowercase())),
            (FlagKind::Json, Value::String(s)) => serde_json::from_str(s).ok(),
            _ => None,
        };
        if let Some(coerced) = coerced {
            *value = coerced;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::SpeculativeConfig;

    #[test]
    fn loose_values_coerce_to_each_fields_kind_and_the_rest_stay_for_the_reader() {
        let mut values = serde_json::json!({
            "speculative_method": " Ngram ",
            "num_speculative_tokens": "3",
            "relaxed_topk": 5.0,
            "relaxed_delta": "0.25",
            "use_greedy_acceptance": "yes",
            "logit_penalties": 0,
            "num_speculative_tokens_per_batch_size": "[[1, 8, 3]]",
            "adaptive_speculative_min_batch_size": "three",
        });
        coerce_loose_values(values.as_object_mut().unwrap());
        assert_eq!(
            values,
            serde_json::json!({
                "speculative_method": "ngram",
                "num_speculative_tokens": 3,
                "relaxed_topk": 5,
                "relaxed_delta": 0.25,
                "use_greedy_acceptance": true,
                "logit_penalties": false,
                "num_speculative_tokens_per_batch_size": [[1, 8, 3]],
                "adaptive_speculative_min_batch_size": "three",
            })
        );
    }

    #[test]
    fn table_covers_every_config_field_in_order() {
        let json = SpeculativeConfig::default().to_json();
        let fields: Vec<&str> = json.as_object().unwrap().keys().map(String::as_str).collect();
        let table: Vec<&str> = SPECULATIVE_FLAGS.iter().map(|f| f.field).collect();
        let mut a = fields.clone();
        let mut b = table.clone();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b);
    }

    #[test]
    fn flags_are_kebab_case_with_negations_for_booleans() {
        let greedy = SPECULATIVE_FLAGS.iter().find(|f| f.field == "use_greedy_acceptance").unwrap();
        assert_eq!(greedy.flag(), "--use-greedy-acceptance");
        assert_eq!(greedy.negated_flag().as_deref(), Some("--no-use-greedy-acceptance"));
        let k = SPECULATIVE_FLAGS.iter().find(|f| f.field == "num_speculative_tokens").unwrap();
        assert_eq!(k.negated_flag(), None);
    }
}
