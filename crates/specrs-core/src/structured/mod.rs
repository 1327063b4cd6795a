//! Structured outputs (vLLM's `StructuredOutputsParams`, OpenAI's `response_format`): the
//! output follows a JSON schema, any JSON object, a regex, one of a list of choices, a
//! context-free grammar, or a structural tag (free text with constrained regions).
//!
//! A request's constraint compiles to a byte automaton ([`json_grammar`] for any JSON,
//! [`regex_dfa`] for regexes, schemas through [`json_schema`], choices as an alternation,
//! EBNF and Lark grammars through [`ebnf`] and [`lark`] to [`pushdown`], structural tags
//! through [`structural_tag`] to the same recogniser)
//! bound to the vocabulary ([`vocab`]); at every position the tokens that would leave the
//! grammar are masked before sampling ([`guide`]). Speculation needs nothing more: position
//! `i` of a verify row is masked from the state after the drafts before it, exactly the mask
//! plain decoding would have used after accepting them, so a draft the grammar forbids is
//! rejected and the recovered token comes from the masked distribution.

pub mod ebnf;
mod free_text;
pub mod guide;
pub mod integer_range;
pub mod json_grammar;
pub mod json_schema;
pub mod lark;
pub mod pushdown;
pub mod regex_dfa;
pub mod structural_tag;
pub mod vocab;

use std::collections::VecDeque;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use guide::{CompiledGuide, Grammar, GuideCursor, GuideState, TokenGuide};
pub use vocab::{TokenSet, TokenVocabulary};

use crate::error::ConfigError;

const FIELD: &str = "structured_outputs";

/// What the output must look like; exactly one field is set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StructuredOutputs {
    /// A JSON schema (an object, or its JSON text) the output is an instance of.
    pub json: Option<Value>,
    /// A regex the whole output matches.
    pub regex: Option<String>,
    /// The output is exactly one of these strings.
    pub choice: Option<Vec<String>>,
    /// The output is any JSON object (OpenAI's `{"type": "json_object"}`).
    pub json_object: Option<bool>,
    /// A context-free grammar in EBNF (`root ::= ...`, the syntax of vLLM's xgrammar backend
    /// and llama.cpp's GBNF; see [`ebnf`]) or Lark (`start: ...`; see [`lark`]).
    pub grammar: Option<String>,
    /// A structural tag (an object, or its JSON text): xgrammar's `{"type":
    /// "structural_tag", "format": {...}}` or vLLM's earlier `structures` and `triggers`
    /// (see [`structural_tag`]).
    pub structural_tag: Option<Value>,
    /// The constraint holds once the model's reasoning is over (`<think>` ... `</think>`), as
    /// vLLM holds it where a reasoning parser runs; set by the server that runs one, never by
    /// a request.
    #[serde(skip)]
    pub after_reasoning: bool,
}

impl StructuredOutputs {
    /// Exactly one constraint is set (choices non-empty): what compiling needs checked first.
    fn check_one_constraint(&self) -> Result<(), ConfigError> {
        let set = [
            self.json.is_some(),
            self.regex.is_some(),
            self.choice.is_some(),
            self.json_object == Some(true),
            self.grammar.is_some(),
            self.structural_tag.is_some(),
        ];
        match set.iter().filter(|&&s| s).count() {
            1 => {}
            0 => {
                return Err(ConfigError::field(
                    FIELD,
                    "structured_outputs needs one of json, regex, choice, grammar, structural_tag or json_object",
                ));
            }
            _ => {
                return Err(ConfigError::field(
                    FIELD,
                    "structured_outputs takes exactly one of json, regex, choice, grammar, structural_tag or json_object",
                ));
            }
        }
        if let Some(choices) = &self.choice
            && (choices.is_empty() || choices.iter().any(String::is_empty))
        {
            return Err(ConfigError::field(FIELD, "structured_outputs.choice must list non-empty strings"));
        }
        Ok(())
    }

    /// Exactly one constraint, and each usable: a parseable schema, a valid regex, a
    /// non-empty list of choices.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_one_constraint()?;
        if let Some(grammar) = &self.grammar {
            ebnf::Rules::parse(grammar).map_err(|e| grammar_error(&e))?;
        }
        if let Some(tag) = &self.structural_tag {
            structural_tag::rules(tag).map_err(|e| structural_tag_error(&e))?;
        }
        if let GrammarSource::Regex(pattern) = self.source()? {
            regex_syntax::Parser::new().parse(&pattern).map_err(|e| {
                ConfigError::field(FIELD, format!("structured_outputs.regex is not a valid regex: {e}"))
            })?;
        }
        Ok(())
    }

    /// The grammar to build: a regex, the JSON automaton, a context-free grammar or a
    /// structural tag.
    fn source(&self) -> Result<GrammarSource, ConfigError> {
        if let Some(tag) = &self.structural_tag {
            return Ok(GrammarSource::StructuralTag(tag.clone()));
        }
        if let Some(grammar) = &self.grammar {
            return Ok(GrammarSource::ContextFree(grammar.clone()));
        }
        if self.json_object == Some(true) {
            return Ok(GrammarSource::AnyJsonObject);
        }
        if let Some(regex) = &self.regex {
            return Ok(GrammarSource::Regex(regex.clone()));
        }
        if let Some(choices) = &self.choice {
            let escaped: Vec<String> = choices.iter().map(|c| regex_syntax::escape(c)).collect();
            return Ok(GrammarSource::Regex(escaped.join("|")));
        }
        let schema = match &self.json {
            Some(Value::String(text)) => serde_json::from_str(text).map_err(|e| {
                ConfigError::field(FIELD, format!("structured_outputs.json is a string but not JSON: {e}"))
            })?,
            Some(schema) => schema.clone(),
            None => return Err(ConfigError::field(FIELD, "structured_outputs needs a constraint")),
        };
        json_schema::schema_to_regex(&schema)
            .map(GrammarSource::Regex)
            .map_err(|e| ConfigError::field(FIELD, format!("structured_outputs.json: {e}")))
    }

    /// Compiles the constraint against `vocabulary`.
    pub fn compile(&self, vocabulary: &Arc<TokenVocabulary>) -> Result<CompiledGuide, ConfigError> {
        self.check_one_constraint()?;
        let grammar = match self.source()? {
            GrammarSource::AnyJsonObject => Grammar::Json(json_grammar::JsonGrammar { object_only: true }),
            GrammarSource::Regex(pattern) => Grammar::Regex(Box::new(
                regex_dfa::RegexGrammar::new(&pattern)
                    .map_err(|e| ConfigError::field(FIELD, format!("structured_outputs: {e}")))?,
            )),
            GrammarSource::ContextFree(text) => {
                Grammar::Cfg(Box::new(pushdown::PushdownGrammar::new(&text).map_err(|e| grammar_error(&e))?))
            }
            GrammarSource::StructuralTag(tag) => {
                let rules = structural_tag::rules(&tag).map_err(|e| structural_tag_error(&e))?;
                let grammar = pushdown::PushdownGrammar::from_rules(rules).map_err(|e| {
                    structural_tag_error(&structural_tag::StructuralTagError {
                        path: "structural_tag".into(),
                        message: e.0,
                    })
                })?;
                Grammar::Cfg(Box::new(grammar))
            }
        };
        let guide = TokenGuide::new(grammar, vocabulary.clone());
        Ok(CompiledGuide(Arc::new(if self.after_reasoning { guide.after_reasoning() } else { guide })))
    }
}

enum GrammarSource {
    Regex(String),
    AnyJsonObject,
    /// EBNF or Lark text.
    ContextFree(String),
    StructuralTag(Value),
}

fn grammar_error(error: &ebnf::EbnfError) -> ConfigError {
    ConfigError::field(FIELD, format!("structured_outputs.grammar: {error}"))
}

fn structural_tag_error(error: &structural_tag::StructuralTagError) -> ConfigError {
    ConfigError::field(FIELD, format!("structured_outputs.structural_tag at {error}"))
}

/// Recently compiled guides by their constraint, so repeated requests (the same schema on
/// every call) compile once and share their allowed-token caches.
#[derive(Debug)]
pub struct GuideCache {
    vocabulary: Arc<TokenVocabulary>,
    recent: VecDeque<(String, CompiledGuide)>,
    capacity: usize,
}

impl GuideCache {
    pub fn new(vocabulary: Arc<TokenVocabulary>, capacity: usize) -> Self {
        Self { vocabulary, recent: VecDeque::new(), capacity: capacity.max(1) }
    }

    pub fn vocabulary(&self) -> &Arc<TokenVocabulary> {
        &self.vocabulary
    }

    /// The guide of `constraint`, compiled now or reused.
    pub fn get(&mut self, constraint: &StructuredOutputs) -> Result<CompiledGuide, ConfigError> {
        if let Some(guide) = self.lookup(constraint) {
            return Ok(guide);
        }
        let guide = constraint.compile(&self.vocabulary)?;
        self.insert(constraint, guide.clone());
        Ok(guide)
    }

    /// The guide of `constraint` if one is kept (it becomes the most recent).
    pub fn lookup(&mut self, constraint: &StructuredOutputs) -> Option<CompiledGuide> {
        let key = Self::key(constraint);
        let at = self.recent.iter().position(|(k, _)| *k == key)?;
        let entry = self.recent.remove(at).expect("position is in range");
        let guide = entry.1.clone();
        self.recent.push_back(entry);
        Some(guide)
    }

    /// Keeps `guide` (compiled elsewhere, against this cache's vocabulary) for `constraint`,
    /// forgetting the least recently used past the capacity.
    pub fn insert(&mut self, constraint: &StructuredOutputs, guide: CompiledGuide) {
        let key = Self::key(constraint);
        self.recent.retain(|(k, _)| *k != key);
        if self.recent.len() == self.capacity {
            self.recent.pop_front();
        }
        self.recent.push_back((key, guide));
    }

    fn key(constraint: &StructuredOutputs) -> String {
        format!(
            "{}{}",
            if constraint.after_reasoning { "after reasoning: " } else { "" },
            serde_json::to_string(constraint).expect("constraints serialise")
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Single characters, a few words and EOS (id 0, no bytes).
    fn vocabulary() -> (Arc<TokenVocabulary>, Vec<String>) {
        let mut texts: Vec<String> = vec!["<eos>".into()];
        texts.extend(
            ["{", "}", "\"", ":", " ", ",", "a", "b", "1", "2", "yes", "no", "{\"", "\":", "\"a", "[", "]"]
                .map(String::from),
        );
        let bytes = texts.iter().enumerate().map(|(i, t)| (i > 0).then(|| t.as_bytes().to_vec())).collect();
        (Arc::new(TokenVocabulary::new(bytes, vec![0])), texts)
    }

    fn allowed_texts(guide: &CompiledGuide, state: GuideState, texts: &[String]) -> Vec<String> {
        guide.allowed(state).iter().map(|t| texts[t as usize].clone()).collect()
    }

    fn guide(constraint: StructuredOutputs) -> (CompiledGuide, Vec<String>) {
        let (vocab, texts) = vocabulary();
        (constraint.compile(&vocab).unwrap(), texts)
    }

    #[test]
    fn choices_allow_their_prefixes_then_only_eos() {
        let (g, texts) =
            guide(StructuredOutputs { choice: Some(vec!["yes".into(), "no".into()]), ..Default::default() });
        assert_eq!(allowed_texts(&g, g.start(), &texts), ["yes", "no"]);
        let done = g.advance(g.start(), 11);
        assert!(g.accepts(done));
        assert_eq!(allowed_texts(&g, done, &texts), ["<eos>"]);
        assert_eq!(g.advance(done, 0), done, "end of sequence keeps a final state");
        assert_eq!(g.advance(g.start(), 0), GuideState::Dead, "nothing chosen yet: EOS cannot end it");
        assert_eq!(allowed_texts(&g, GuideState::Dead, &texts), ["<eos>"], "a dead state can still finish");
    }

    #[test]
    fn forced_bytes_run_until_the_grammar_offers_a_choice_or_may_end() {
        let (g, _) = guide(StructuredOutputs { regex: Some("ab(c|d)ef|abx".into()), ..Default::default() });
        assert_eq!(g.forced_bytes(g.start(), 16), b"ab");
        assert_eq!(g.forced_bytes(g.start(), 1), b"a");
        let after_ab = [7, 8].iter().fold(g.start(), |s, &t| g.advance(s, t));
        assert!(g.forced_bytes(after_ab, 16).is_empty(), "c, d or x: a choice");
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
        let (j, _) = guide(StructuredOutputs { json: Some(schema), ..Default::default() });
        assert_eq!(j.forced_bytes(j.start(), 64), b"{", "then a space or not: the model's choice");
        let open = j.advance(j.start(), 13); // {"
        assert_eq!(j.forced_bytes(open, 64), br#"a": "#, "the key, up to its value");
        let (c, _) = guide(StructuredOutputs { choice: Some(vec!["yes".into()]), ..Default::default() });
        let done = c.advance(c.start(), 11);
        assert!(c.forced_bytes(done, 16).is_empty(), "an output that may end forces nothing");
        assert_eq!(c.forced_end(done), Some(0), "but a complete one forces its end");
        assert_eq!(c.forced_end(c.start()), None);
        let (open_ended, _) = guide(StructuredOutputs { regex: Some("a+".into()), ..Default::default() });
        assert_eq!(open_ended.forced_end(open_ended.advance(open_ended.start(), 7)), None, "more a's may follow");
    }

    #[test]
    fn a_grammar_guide_masks_by_nesting_and_forces_what_only_one_way_allows() {
        // Balanced brackets around a list of `a`/`b` words, which no regex can describe.
        let grammar = "root ::= list\nlist ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= \"a\" | \"b\" | list";
        let (g, texts) = guide(StructuredOutputs { grammar: Some(grammar.into()), ..Default::default() });
        assert_eq!(g.forced_bytes(g.start(), 8), b"[");
        let ids = |text: &str| -> Vec<u32> {
            text.chars().map(|c| texts.iter().position(|t| *t == c.to_string()).unwrap() as u32).collect()
        };
        let inner = ids("[[a,b").iter().fold(g.start(), |s, &t| g.advance(s, t));
        assert_eq!(allowed_texts(&g, inner, &texts), [",", "]"], "an item ends: a comma or a close");
        let closed_once = g.advance(inner, ids("]")[0]);
        assert!(!g.accepts(closed_once), "one bracket is still open");
        assert_eq!(allowed_texts(&g, closed_once, &texts), [",", "]"]);
        let done = g.advance(closed_once, ids("]")[0]);
        assert!(g.accepts(done));
        assert_eq!(allowed_texts(&g, done, &texts), ["<eos>"]);
        assert_eq!(g.forced_end(done), Some(0));
        assert_eq!(g.advance(done, ids("]")[0]), GuideState::Dead, "nothing is left to close");
    }

    #[test]
    fn a_cursor_follows_the_output_and_masks_the_next_logits() {
        let (g, texts) = guide(StructuredOutputs { regex: Some("a+b".into()), ..Default::default() });
        let mut cursor = GuideCursor::after(&g, &[], &[7, 7]);
        let mut logits = vec![0.0f32; texts.len()];
        cursor.mask_logits(&mut logits);
        let kept: Vec<&str> = (0..texts.len()).filter(|&i| logits[i] == 0.0).map(|i| texts[i].as_str()).collect();
        assert_eq!(kept, ["a", "b"]);
        cursor.push(8);
        assert!(g.accepts(cursor.state()));
    }

    #[test]
    fn json_object_allows_multi_byte_tokens_that_keep_the_text_valid() {
        let (g, texts) = guide(StructuredOutputs { json_object: Some(true), ..Default::default() });
        assert_eq!(allowed_texts(&g, g.start(), &texts), ["{", " ", "{\""]);
        let open = g.advance(g.start(), 13); // {"
        let inside_key: Vec<String> = texts[1..].iter().filter(|t| *t != "\"a").cloned().collect();
        assert_eq!(allowed_texts(&g, open, &texts), inside_key, "a key's characters, or its end then `:`");
        let after_key = [8, 14, 9].iter().fold(open, |s, &t| g.advance(s, t)); // {"b":1
        let closed = g.advance(after_key, 2);
        assert!(g.accepts(closed));
        assert_eq!(allowed_texts(&g, closed, &texts), ["<eos>", " "]);
    }

    #[test]
    fn schemas_compile_through_their_regex_and_bad_constraints_name_the_field() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]});
        let (g, _) = guide(StructuredOutputs { json: Some(schema.clone()), ..Default::default() });
        let text = [13, 7, 14, 5, 9, 10, 2]; // {"a": 12}
        let end = text.iter().fold(g.start(), |s, &t| g.advance(s, t));
        assert!(g.accepts(end));
        let as_text = StructuredOutputs { json: Some(Value::String(schema.to_string())), ..Default::default() };
        assert!(as_text.validate().is_ok());
        let cases = [
            (StructuredOutputs::default(), "needs one of"),
            (
                StructuredOutputs { regex: Some("a".into()), choice: Some(vec!["b".into()]), ..Default::default() },
                "exactly one",
            ),
            (
                StructuredOutputs {
                    grammar: Some("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"".into()),
                    ..Default::default()
                },
                "structured_outputs.grammar: rule `expr` is left-recursive",
            ),
            (StructuredOutputs { choice: Some(vec![]), ..Default::default() }, "non-empty"),
            (StructuredOutputs { json: Some(Value::String("{".into())), ..Default::default() }, "not JSON"),
            (
                StructuredOutputs { json: Some(json!({"type": "number", "maximum": 3})), ..Default::default() },
                "`maximum`",
            ),
        ];
        for (constraint, expected) in cases {
            let err = constraint.validate().unwrap_err();
            assert_eq!(err.field.as_deref(), Some(FIELD));
            assert!(err.message.contains(expected), "{}", err.message);
        }
        let bad_regex = StructuredOutputs { regex: Some("(".into()), ..Default::default() };
        assert!(bad_regex.compile(&vocabulary().0).unwrap_err().message.contains("not a valid regex"));
    }

    #[test]
    fn the_cache_compiles_each_constraint_once_and_forgets_the_oldest() {
        let mut cache = GuideCache::new(vocabulary().0, 2);
        let c = |r: &str| StructuredOutputs { regex: Some(r.into()), ..Default::default() };
        let first = cache.get(&c("a")).unwrap();
        assert_eq!(cache.get(&c("a")).unwrap(), first);
        cache.get(&c("b")).unwrap();
        cache.get(&c("a")).unwrap();
        cache.get(&c("c")).unwrap(); // evicts "b", the least recently used
        assert_eq!(cache.get(&c("a")).unwrap(), first);
        assert_eq!(cache.recent.iter().map(|(k, _)| k.contains("\"a\"")).filter(|&x| x).count(), 1);
        let after_reasoning = StructuredOutputs { after_reasoning: true, ..c("a") };
        assert_ne!(cache.get(&after_reasoning).unwrap(), first, "waiting for the reasoning is another guide");
    }

    #[test]
    fn a_guide_compiled_outside_the_cache_is_kept_once_and_found_again() {
        let mut cache = GuideCache::new(vocabulary().0, 2);
        let c = |r: &str| StructuredOutputs { regex: Some(r.into()), ..Default::default() };
        assert!(cache.lookup(&c("a")).is_none());
        let compiled = c("a").compile(cache.vocabulary()).unwrap();
        cache.insert(&c("a"), compiled.clone());
        cache.insert(&c("a"), compiled.clone()); // a second compile of the same constraint
        assert_eq!(cache.recent.len(), 1, "kept once");
        assert_eq!(cache.lookup(&c("a")), Some(compiled.clone()));
        assert_eq!(cache.get(&c("a")).unwrap(), compiled, "`get` finds it without compiling");
        cache.insert(&c("b"), c("b").compile(cache.vocabulary()).unwrap());
        cache.insert(&c("c"), c("c").compile(cache.vocabulary()).unwrap()); // evicts "a"
        assert!(cache.lookup(&c("a")).is_none());
    }

    #[test]
    fn a_guide_after_reasoning_lets_the_model_think_then_holds_from_the_answer() {
        let (_, mut texts) = vocabulary();
        texts.extend(["<think>", "</think>", "\n\n", "hmm"].map(String::from));
        let (open, close, blank, hmm) = (18, 19, 20, 21);
        let bytes = texts.iter().enumerate().map(|(i, t)| (i > 0).then(|| t.as_bytes().to_vec())).collect();
        let vocab = Arc::new(TokenVocabulary::new(bytes, vec![0]).with_thinking_tokens(Some((open, close))));
        let yes_or_no = StructuredOutputs { choice: Some(vec!["yes".into(), "no".into()]), ..Default::default() };
        let g = StructuredOutputs { after_reasoning: true, ..yes_or_no.clone() }.compile(&vocab).unwrap();

        // The prompt opened the reasoning (DeepSeek-R1's template): anything, until `</think>`.
        let thinking = g.start_after(&[7, open]);
        assert_eq!(thinking, GuideState::Thinking);
        assert_eq!(g.allowed(thinking).len(), texts.len());
        assert!(g.forced_bytes(thinking, 8).is_empty() && g.forced_end(thinking).is_none());
        assert_eq!(g.advance(thinking, 0), thinking, "ending while thinking is the model's call, as unguided");
        let done = [hmm, 1, 7, close].iter().fold(thinking, |s, &t| g.advance(s, t));
        assert_eq!(done, GuideState::ReasoningDone);
        assert_eq!(allowed_texts(&g, done, &texts), [" ", "yes", "no", "\n\n"], "line breaks, then the grammar");
        let answered = [blank, 11].iter().fold(done, |s, &t| g.advance(s, t));
        assert_eq!(allowed_texts(&g, answered, &texts), ["<eos>"]);
        assert_eq!(g.advance(done, 7), GuideState::Dead, "the answer keeps to the grammar");

        // Nothing open (Qwen3 thinking on): the model may open its reasoning or answer at once.
        let start = g.start_after(&[7]);
        assert_eq!(start, GuideState::MayThink);
        assert_eq!(allowed_texts(&g, start, &texts), ["yes", "no", "<think>"]);
        assert!(g.forced_bytes(start, 8).is_empty());
        assert_eq!(g.advance(start, open), GuideState::Thinking);
        assert!(g.accepts(g.advance(start, 12)));
        assert_eq!(g.start_after(&[open, hmm, close, 7]), GuideState::MayThink, "an earlier turn's reasoning");

        // The prompt closed it (Qwen3's `enable_thinking: false`): the grammar from the first token.
        assert_eq!(g.start_after(&[7, open, blank, close, blank]), g.start());

        // Without the flag, or without markers in the vocabulary, the grammar holds from the start.
        let plain = yes_or_no.compile(&vocab).unwrap();
        assert_eq!(plain.start_after(&[open]), plain.start());
        let unmarked = StructuredOutputs { after_reasoning: true, ..yes_or_no }.compile(&vocabulary().0).unwrap();
        assert_eq!(unmarked.start_after(&[open]), unmarked.start());
    }
}
