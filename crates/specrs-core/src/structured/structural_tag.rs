//! Structural tags (xgrammar's `structural_tag`; vLLM's `structured_outputs.structural_tag`
//! and `response_format: {"type": "structural_tag", ...}`): the output as a tree of formats,
//! free text where the model writes what it likes and constrained regions (a JSON schema, a
//! regex, a grammar) opened by a tag. This is how tool calls are kept well formed inside an
//! otherwise free answer.
//!
//! Both request shapes are read: xgrammar's `{"type": "structural_tag", "format": {...}}`
//! (or a bare format object), and vLLM's legacy `{"type": "structural_tag", "structures":
//! [{"begin", "schema", "end"}], "triggers": [...]}`, a `triggered_tags` over the structures.
//! Every format is lowered into one grammar for [`super::pushdown`], each format a rule
//! named by its place in the request (`format.tags[0].content`), so errors point there:
//! - `const_string`, `json_schema` (the layout of [`super::json_schema`]), `regex`, `grammar`
//!   (EBNF or Lark, its rules renamed apart), `any_text` (`excludes`, `max_chars`);
//! - `sequence`, `or`, `optional`, `plus`, `star`, `repeat`;
//! - `tag` (begin, content, one end or a list of them), `triggered_tags` (`at_least_one`,
//!   `stop_after_first`, `excludes`), `tags_with_separator`, `dispatch` (`loop`, `excludes`).
//!
//! Free text (`any_text`, and the text around the tags of `triggered_tags` and `dispatch`)
//! never contains the end of the nearest enclosing `tag` (xgrammar's end detection), nor a
//! trigger, pattern or exclude string ([`super::free_text`]): a region closes at the first
//! end written, and a trigger always opens a tag. Token-level formats (`token`,
//! `any_tokens`, ...), token budgets (`max_tokens`), the XML argument styles of `json_schema`
//! and `any_order` are refused by name.

use serde_json::{Map, Value};

use super::ebnf::{self, Definition, Expr, MAX_REPEAT, Position, Rules};
use super::{free_text, json_schema, lark};

/// The rule the output starts at.
const ROOT: &str = "structural_tag";

/// How deep formats may nest.
pub const MAX_FORMAT_DEPTH: usize = 64;

/// Why a structural tag cannot guide generation, at its place in the request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct StructuralTagError {
    pub path: String,
    pub message: String,
}

fn error<T>(path: &str, message: impl Into<String>) -> Result<T, StructuralTagError> {
    Err(StructuralTagError { path: path.to_string(), message: message.into() })
}

/// The grammar of a structural tag (an object, or its JSON text).
pub fn rules(spec: &Value) -> Result<Rules, StructuralTagError> {
    let parsed;
    let spec = match spec {
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text).or_else(|e| error(ROOT, format!("not valid JSON: {e}")))?;
            &parsed
        }
        other => other,
    };
    let Some(object) = spec.as_object() else {
        return error(ROOT, "a structural tag is an object: {\"type\": \"structural_tag\", \"format\": {...}}");
    };
    let mut builder = Builder { definitions: Vec::new() };
    let root = if object.contains_key("structures") {
        builder.legacy(object)?
    } else if object.get("type").and_then(Value::as_str) == Some("structural_tag") {
        only_fields(object, ROOT, "a structural tag", &["format"])?;
        let Some(format) = object.get("format") else {
            return error(
                ROOT,
                "needs `format` (xgrammar's structural tag) or `structures` and `triggers` (vLLM's earlier form)",
            );
        };
        builder.format(format, "format", &[], 0)?
    } else {
        builder.format(spec, "format", &[], 0)?
    };
    builder.definitions.push(Definition { name: ROOT.to_string(), at: Position::generated(), body: root });
    Rules::lower(&builder.definitions, ROOT).or_else(|e| error(ROOT, e.0))
}

struct Builder {
    definitions: Vec<Definition>,
}

/// A region free text may open: a tag of `triggered_tags`, or a pattern and its format.
struct Tagged {
    /// The text that opens it.
    begin: String,
    rule: Expr,
    /// Its place in the request.
    path: String,
}

impl Builder {
    /// vLLM's earlier shape: `structures` of `{begin, schema, end}` after `triggers`.
    fn legacy(&mut self, object: &Map<String, Value>) -> Result<Expr, StructuralTagError> {
        if object.get("type").is_some_and(|t| t.as_str() != Some("structural_tag")) {
            return error("type", "a structural tag's type is \"structural_tag\"");
        }
        only_fields(object, ROOT, "a structural tag with structures", &["structures", "triggers"])?;
        let triggers = strings(object, "triggers", "triggers")?;
        let Some(structures) = object.get("structures").and_then(Value::as_array).filter(|s| !s.is_empty()) else {
            return error("structures", "must list at least one {\"begin\", \"schema\", \"end\"}");
        };
        let mut tags = Vec::new();
        for (i, structure) in structures.iter().enumerate() {
            let path = format!("structures[{i}]");
            let Some(structure) = structure.as_object() else {
                return error(&path, "a structure is an object {\"begin\", \"schema\", \"end\"}");
            };
            only_fields(structure, &path, "a structure", &["begin", "schema", "end"])?;
            let begin = string(structure, "begin", &path)?.to_string();
            let end = string(structure, "end", &path)?.to_string();
            let Some(schema) = structure.get("schema") else {
                return error(&path, "needs `schema`, the JSON schema of what comes between begin and end");
            };
            let content = self.json_schema(schema, &format!("{path}.schema"))?;
            let body = Expr::Choice(vec![vec![Expr::Literal(begin.clone()), content, Expr::Literal(end)]]);
            let rule = self.define(&path, body);
            tags.push(Tagged { begin, rule, path });
        }
        self.triggered(&triggers, tags, &[], false, false, "structures")
    }

    /// `value` as a rule named `path`; `ends` are the end strings of the nearest enclosing
    /// tag, which free text inside it must not contain.
    fn format(&mut self, value: &Value, path: &str, ends: &[String], depth: usize) -> Result<Expr, StructuralTagError> {
        if depth > MAX_FORMAT_DEPTH {
            return error(path, format!("formats nest more than {MAX_FORMAT_DEPTH} deep"));
        }
        let Some(object) = value.as_object() else {
            return error(path, "a format is an object with a `type`");
        };
        let Some(kind) = object.get("type").and_then(Value::as_str) else {
            return error(path, "a format needs a `type` (const_string, json_schema, tag, triggered_tags, ...)");
        };
        let fields = |allowed: &[&str]| only_fields(object, path, &format!("a {kind} format"), allowed);
        let child = |key: &str| format!("{path}.{key}");
        let body = match kind {
            "const_string" => {
                fields(&["value"])?;
                Expr::Literal(string(object, "value", path)?.to_string())
            }
            "json_schema" => {
                fields(&["json_schema", "style", "any_order"])?;
                if let Some(style) = object.get("style").filter(|s| s.as_str() != Some("json")) {
                    return error(
                        &child("style"),
                        format!("style {style} is not supported; arguments are written as JSON (\"json\")"),
                    );
                }
                if object.get("any_order").is_some_and(|a| a != &Value::Bool(false)) {
                    return error(
                        &child("any_order"),
                        "any_order is not supported: properties come in the schema's order",
                    );
                }
                let Some(schema) = object.get("json_schema") else {
                    return error(path, "needs `json_schema`, the schema the text is an instance of");
                };
                self.json_schema(schema, &child("json_schema"))?
            }
            "regex" => {
                fields(&["pattern"])?;
                lark::regex_expr(string(object, "pattern", path)?, "").or_else(|e| error(&child("pattern"), e))?
            }
            "grammar" => {
                fields(&["grammar"])?;
                self.grammar(string(object, "grammar", path)?, path)?
            }
            "any_text" => {
                fields(&["excludes", "max_chars", "max_tokens"])?;
                if object.get("max_tokens").is_some_and(|m| !m.is_null()) {
                    return error(
                        &child("max_tokens"),
                        "a token budget is not supported (the grammar reads text, not tokens); use max_chars, or \
                         the request's max_tokens",
                    );
                }
                let max_chars = match object.get("max_chars") {
                    None | Some(Value::Null) => None,
                    Some(m) => Some(
                        m.as_u64()
                            .and_then(|m| u32::try_from(m).ok())
                            .map_or_else(|| error(&child("max_chars"), "must be a non-negative integer"), Ok)?,
                    ),
                };
                let mut excluded = optional_strings(object, "excludes", &child("excludes"))?;
                excluded.extend_from_slice(ends);
                self.free_text(path, &excluded, max_chars)?
            }
            "sequence" | "or" => {
                fields(&["elements"])?;
                let Some(elements) = object.get("elements").and_then(Value::as_array).filter(|e| !e.is_empty()) else {
                    return error(path, "needs `elements`, a non-empty list of formats");
                };
                let elements = elements
                    .iter()
                    .enumerate()
                    .map(|(i, e)| self.format(e, &format!("{path}.elements[{i}]"), ends, depth + 1))
                    .collect::<Result<Vec<_>, _>>()?;
                if kind == "sequence" {
                    Expr::Choice(vec![elements])
                } else {
                    Expr::Choice(elements.into_iter().map(|e| vec![e]).collect())
                }
            }
            "optional" | "plus" | "star" | "repeat" => {
                let (min, max) = match kind {
                    "optional" => (0, Some(1)),
                    "plus" => (1, None),
                    "star" => (0, None),
                    _ => {
                        fields(&["content", "min", "max"])?;
                        repeat_bounds(object, path)?
                    }
                };
                if kind != "repeat" {
                    fields(&["content"])?;
                }
                let Some(content) = object.get("content") else {
                    return error(path, "needs `content`, the format repeated");
                };
                let content = self.format(content, &child("content"), ends, depth + 1)?;
                Expr::Repeat { item: Box::new(content), min, max }
            }
            "tag" => self.tag(object, path, depth)?.1,
            "triggered_tags" => {
                fields(&["triggers", "tags", "at_least_one", "stop_after_first", "excludes"])?;
                let triggers = strings(object, "triggers", &child("triggers"))?;
                let tags = self.tags(object, path, depth)?;
                let mut excluded = optional_strings(object, "excludes", &child("excludes"))?;
                excluded.extend_from_slice(ends);
                let at_least_one = flag(object, "at_least_one", false, path)?;
                let stop_after_first = flag(object, "stop_after_first", false, path)?;
                self.triggered(&triggers, tags, &excluded, at_least_one, stop_after_first, path)?
            }
            "tags_with_separator" => {
                fields(&["tags", "separator", "at_least_one", "stop_after_first"])?;
                let tags: Vec<Expr> = self.tags(object, path, depth)?.into_iter().map(|t| t.rule).collect();
                let separator = string(object, "separator", path)?.to_string();
                let tag = self.define(&child("tags"), Expr::Choice(tags.into_iter().map(|t| vec![t]).collect()));
                let list = if flag(object, "stop_after_first", false, path)? {
                    tag
                } else {
                    let more = Expr::Choice(vec![vec![Expr::Literal(separator), tag.clone()]]);
                    Expr::Choice(vec![vec![tag, Expr::Repeat { item: Box::new(more), min: 0, max: None }]])
                };
                if flag(object, "at_least_one", false, path)? {
                    list
                } else {
                    Expr::Repeat { item: Box::new(list), min: 0, max: Some(1) }
                }
            }
            "dispatch" => {
                fields(&["rules", "loop", "excludes"])?;
                let Some(rules) = object.get("rules").and_then(Value::as_array).filter(|r| !r.is_empty()) else {
                    return error(path, "needs `rules`, a non-empty list of [pattern, format] pairs");
                };
                let mut patterns = Vec::new();
                let mut dispatched = Vec::new();
                for (i, rule) in rules.iter().enumerate() {
                    let at = format!("{path}.rules[{i}]");
                    let Some([Value::String(pattern), format]) = rule.as_array().map(Vec::as_slice) else {
                        return error(&at, "a rule is a pair [pattern, format]");
                    };
                    let format = self.format(format, &format!("{at}[1]"), ends, depth + 1)?;
                    let rule = Expr::Choice(vec![vec![Expr::Literal(pattern.clone()), format]]);
                    dispatched.push(Tagged { begin: pattern.clone(), rule, path: at });
                    patterns.push(pattern.clone());
                }
                let mut excluded = optional_strings(object, "excludes", &child("excludes"))?;
                excluded.extend_from_slice(ends);
                let stop_after_first = !flag(object, "loop", true, path)?;
                self.triggered(&patterns, dispatched, &excluded, false, stop_after_first, path)?
            }
            "token" | "exclude_token" | "any_tokens" | "token_triggered_tags" | "token_dispatch" => {
                return error(
                    path,
                    format!(
                        "the token-level format `{kind}` is not supported (the grammar reads text); write the \
                         token's text with const_string, any_text or triggered_tags"
                    ),
                );
            }
            other => {
                return error(
                    path,
                    format!(
                        "unknown format type `{other}`; use const_string, json_schema, regex, grammar, any_text, \
                         sequence, or, optional, plus, star, repeat, tag, triggered_tags, tags_with_separator or \
                         dispatch"
                    ),
                );
            }
        };
        Ok(self.define(path, body))
    }

    /// A `tag`: its begin and its body (`begin content end`).
    fn tag(
        &mut self,
        object: &Map<String, Value>,
        path: &str,
        depth: usize,
    ) -> Result<(String, Expr), StructuralTagError> {
        only_fields(object, path, "a tag", &["begin", "content", "end"])?;
        let token_refused = |field: &str| {
            error(
                &format!("{path}.{field}"),
                "a token as a tag's delimiter is not supported (the grammar reads text); give the token's text as a \
                 string",
            )
        };
        let begin = match object.get("begin") {
            Some(Value::String(begin)) => begin.clone(),
            Some(Value::Object(_)) => return token_refused("begin"),
            _ => return error(path, "a tag needs `begin`, the string that opens it"),
        };
        let ends = match object.get("end") {
            Some(Value::String(end)) => vec![end.clone()],
            Some(Value::Array(ends)) if !ends.is_empty() => ends
                .iter()
                .map(|e| e.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .map_or_else(|| error(&format!("{path}.end"), "a list of ends holds strings"), Ok)?,
            Some(Value::Object(_)) => return token_refused("end"),
            _ => return error(path, "a tag needs `end`, the string (or non-empty list of strings) that closes it"),
        };
        let Some(content) = object.get("content") else {
            return error(path, "a tag needs `content`, the format between begin and end");
        };
        let content = self.format(content, &format!("{path}.content"), &ends, depth + 1)?;
        let end = Expr::Choice(ends.into_iter().map(|e| vec![Expr::Literal(e)]).collect());
        Ok((begin.clone(), Expr::Choice(vec![vec![Expr::Literal(begin), content, end]])))
    }

    /// The `tags` list of `triggered_tags` or `tags_with_separator`: each a `tag` with a
    /// string begin (`"type": "tag"` may be left out, as xgrammar's `TagFormat` defaults it).
    fn tags(
        &mut self,
        object: &Map<String, Value>,
        path: &str,
        depth: usize,
    ) -> Result<Vec<Tagged>, StructuralTagError> {
        let Some(tags) = object.get("tags").and_then(Value::as_array).filter(|t| !t.is_empty()) else {
            return error(path, "needs `tags`, a non-empty list of tag formats");
        };
        tags.iter()
            .enumerate()
            .map(|(i, tag)| {
                let at = format!("{path}.tags[{i}]");
                match tag.as_object() {
                    Some(tag) if tag.get("type").is_none_or(|t| t.as_str() == Some("tag")) => {
                        let (begin, body) = self.tag(tag, &at, depth + 1)?;
                        let rule = self.define(&at, body);
                        Ok(Tagged { begin, rule, path: at })
                    }
                    _ => error(&at, "each of `tags` is a format of type \"tag\""),
                }
            })
            .collect()
    }

    /// Free text that never holds a trigger (nor `excluded`), where each trigger opens one
    /// of the tags it begins: `text (tag text)*`; `at_least_one` starts with a tag (no text
    /// before it), `stop_after_first` ends after the first tag.
    fn triggered(
        &mut self,
        triggers: &[String],
        tags: Vec<Tagged>,
        excluded: &[String],
        at_least_one: bool,
        stop_after_first: bool,
        path: &str,
    ) -> Result<Expr, StructuralTagError> {
        if let Some(empty) = triggers.iter().position(String::is_empty) {
            return error(&format!("{path}.triggers[{empty}]"), "a trigger is a non-empty string");
        }
        for a in triggers {
            if let Some(b) = triggers.iter().find(|b| *b != a && b.starts_with(a.as_str())) {
                return error(
                    path,
                    format!("trigger {a:?} begins trigger {b:?}, so a tag could be opened by either; keep them apart"),
                );
            }
        }
        for tag in &tags {
            if !triggers.iter().any(|t| tag.begin.starts_with(t.as_str())) {
                return error(
                    &tag.path,
                    format!(
                        "begin {:?} starts with none of the triggers {triggers:?}; each tag opens with one",
                        tag.begin
                    ),
                );
            }
        }
        let mut never = triggers.to_vec();
        never.extend_from_slice(excluded);
        let text = self.free_text(&format!("{path}.text"), &never, None)?;
        let tag = self.define(&format!("{path}.tag"), Expr::Choice(tags.into_iter().map(|t| vec![t.rule]).collect()));
        let sequence = |items: Vec<Expr>| Expr::Choice(vec![items]);
        let any_number = |item: Expr| Expr::Repeat { item: Box::new(item), min: 0, max: None };
        Ok(match (at_least_one, stop_after_first) {
            (false, false) => sequence(vec![text.clone(), any_number(sequence(vec![tag, text]))]),
            (false, true) => sequence(vec![text, Expr::Repeat { item: Box::new(tag), min: 0, max: Some(1) }]),
            (true, false) => sequence(vec![tag.clone(), any_number(sequence(vec![text.clone(), tag])), text]),
            (true, true) => tag,
        })
    }

    fn json_schema(&mut self, schema: &Value, path: &str) -> Result<Expr, StructuralTagError> {
        let parsed;
        let schema = match schema {
            Value::String(text) => {
                parsed = serde_json::from_str(text).or_else(|e| error(path, format!("a string but not JSON: {e}")))?;
                &parsed
            }
            other => other,
        };
        let regex = json_schema::schema_to_regex(schema).or_else(|e| error(path, e.to_string()))?;
        lark::regex_expr(&regex, "").or_else(|e| error(path, e))
    }

    /// A `grammar` format: its rules, renamed under `path` so they never meet another's.
    fn grammar(&mut self, text: &str, path: &str) -> Result<Expr, StructuralTagError> {
        let at = format!("{path}.grammar");
        let (definitions, root) = ebnf::definitions(text).or_else(|e| error(&at, e.0))?;
        if !definitions.iter().any(|d| d.name == root) {
            return error(&at, format!("the grammar has no `{root}` rule, where its text starts"));
        }
        let prefix = format!("{path}:");
        for mut definition in definitions {
            definition.name.insert_str(0, &prefix);
            rename(&mut definition.body, &prefix);
            self.definitions.push(definition);
        }
        Ok(Expr::Reference { name: format!("{prefix}{root}"), at: Position::generated() })
    }

    fn free_text(
        &mut self,
        path: &str,
        excluded: &[String],
        max_chars: Option<u32>,
    ) -> Result<Expr, StructuralTagError> {
        let name = format!("{path}#text");
        let definitions = free_text::definitions(&name, excluded, max_chars).or_else(|e| error(path, e))?;
        self.definitions.extend(definitions);
        Ok(Expr::Reference { name, at: Position::generated() })
    }

    /// `body` as the rule `name`, referred to by the returned expression.
    fn define(&mut self, name: &str, body: Expr) -> Expr {
        self.definitions.push(Definition { name: name.to_string(), at: Position::generated(), body });
        Expr::Reference { name: name.to_string(), at: Position::generated() }
    }
}

/// Prefixes every rule `expr` refers to.
fn rename(expr: &mut Expr, prefix: &str) {
    match expr {
        Expr::Reference { name, .. } => name.insert_str(0, prefix),
        Expr::Choice(alternatives) => alternatives.iter_mut().flatten().for_each(|e| rename(e, prefix)),
        Expr::Repeat { item, .. } | Expr::Token(item) => rename(item, prefix),
        Expr::Literal(_) | Expr::Class(_) => {}
    }
}

fn only_fields(
    object: &Map<String, Value>,
    path: &str,
    what: &str,
    allowed: &[&str],
) -> Result<(), StructuralTagError> {
    match object.keys().find(|k| *k != "type" && !allowed.contains(&k.as_str())) {
        Some(unknown) => error(path, format!("unknown field `{unknown}`; {what} takes {}", allowed.join(", "))),
        None => Ok(()),
    }
}

fn string<'a>(object: &'a Map<String, Value>, key: &str, path: &str) -> Result<&'a str, StructuralTagError> {
    object.get(key).and_then(Value::as_str).map_or_else(|| error(path, format!("needs `{key}`, a string")), Ok)
}

fn strings(object: &Map<String, Value>, key: &str, path: &str) -> Result<Vec<String>, StructuralTagError> {
    object
        .get(key)
        .and_then(Value::as_array)
        .filter(|list| !list.is_empty())
        .and_then(|list| list.iter().map(|s| s.as_str().map(str::to_string)).collect::<Option<Vec<_>>>())
        .map_or_else(|| error(path, format!("`{key}` must be a non-empty list of strings")), Ok)
}

fn optional_strings(object: &Map<String, Value>, key: &str, path: &str) -> Result<Vec<String>, StructuralTagError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) if list.is_empty() => Ok(Vec::new()),
        Some(_) => strings(object, key, path),
    }
}

fn flag(object: &Map<String, Value>, key: &str, default: bool, path: &str) -> Result<bool, StructuralTagError> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => error(&format!("{path}.{key}"), "must be true or false"),
    }
}

/// `repeat`'s `min` and `max` (`-1`: no upper bound), each at most [`MAX_REPEAT`].
fn repeat_bounds(object: &Map<String, Value>, path: &str) -> Result<(u32, Option<u32>), StructuralTagError> {
    let bound = |key: &str| object.get(key).and_then(Value::as_i64);
    let (Some(min), Some(max)) = (bound("min"), bound("max")) else {
        return error(path, "a repeat needs integer `min` and `max` (-1 for no upper bound)");
    };
    let limit = i64::from(MAX_REPEAT);
    if !(0..=limit).contains(&min) || !(max == -1 || (min..=limit).contains(&max)) {
        return error(path, format!("repeat bounds must satisfy 0 <= min <= max <= {MAX_REPEAT} (or max = -1)"));
    }
    Ok((min as u32, u32::try_from(max).ok()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::pushdown::PushdownGrammar;
    use super::*;

    fn grammar(spec: Value) -> PushdownGrammar {
        PushdownGrammar::from_rules(rules(&spec).unwrap()).unwrap()
    }

    fn refusal(spec: Value) -> StructuralTagError {
        rules(&spec).expect_err("the structural tag should be refused")
    }

    fn weather_tag() -> Value {
        json!({
            "type": "tag",
            "begin": "<function=get_weather>",
            "content": {"type": "json_schema", "json_schema": {
                "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
            "end": "</function>"
        })
    }

    fn time_tag() -> Value {
        json!({
            "type": "tag",
            "begin": "<function=get_time>",
            "content": {"type": "json_schema", "json_schema": {
                "type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}},
            "end": "</function>"
        })
    }

    fn tool_calls(at_least_one: bool, stop_after_first: bool) -> PushdownGrammar {
        grammar(json!({"type": "structural_tag", "format": {
            "type": "triggered_tags",
            "triggers": ["<function="],
            "tags": [weather_tag(), time_tag()],
            "at_least_one": at_least_one,
            "stop_after_first": stop_after_first,
        }}))
    }

    const WEATHER_CALL: &str = r#"<function=get_weather>{"city": "San Francisco"}</function>"#;
    const TIME_CALL: &str = r#"<function=get_time>{"timezone": "UTC"}</function>"#;

    #[test]
    fn triggered_tags_allow_free_text_and_hold_each_call_to_its_schema() {
        let calls = tool_calls(false, false);
        for allowed in [
            String::new(),
            "Just an answer, no tools.".to_string(),
            format!("I will call a tool now. {WEATHER_CALL}"),
            format!("{WEATHER_CALL} and then {TIME_CALL} done <function"),
            "a <function mention without the trigger's '='".to_string(),
        ] {
            assert!(calls.matches(allowed.as_bytes()), "{allowed:?} should be allowed");
        }
        for refused in [
            r#"<function=get_time>{"city": "Paris"}</function>"#.to_string(),
            r#"<function=get_news>{"topic": "x"}</function>"#.to_string(),
            r#"text <function=get_weather>{"city": "Paris"}"#.to_string(),
            r#"<function=get_weather>{"city": 3}</function>"#.to_string(),
        ] {
            assert!(!calls.matches(refused.as_bytes()), "{refused:?} should be refused");
        }
    }

    #[test]
    fn at_least_one_and_stop_after_first_shape_the_calls() {
        let text_then_one = format!("Sure. {WEATHER_CALL}");
        let one_then_text = format!("{WEATHER_CALL} there");
        let two = format!("{WEATHER_CALL}{TIME_CALL}");
        let cases = [
            // (at_least_one, stop_after_first): [none, text_then_one, one_then_text, two, one]
            ((false, false), [true, true, true, true, true]),
            ((false, true), [true, true, false, false, true]),
            ((true, false), [false, false, true, true, true]),
            ((true, true), [false, false, false, false, true]),
        ];
        for ((at_least_one, stop_after_first), expected) in cases {
            let calls = tool_calls(at_least_one, stop_after_first);
            let texts = ["no call", &text_then_one, &one_then_text, &two, WEATHER_CALL];
            for (text, expected) in texts.iter().zip(expected) {
                assert_eq!(
                    calls.matches(text.as_bytes()),
                    expected,
                    "at_least_one {at_least_one}, stop_after_first {stop_after_first}: {text:?}"
                );
            }
        }
    }

    #[test]
    fn vllm_legacy_structures_read_as_triggered_tags() {
        let legacy = grammar(json!({
            "type": "structural_tag",
            "structures": [
                {"begin": "<function=get_weather>", "schema": weather_tag()["content"]["json_schema"], "end": "</function>"},
                {"begin": "<function=get_time>", "schema": time_tag()["content"]["json_schema"], "end": "</function>"},
            ],
            "triggers": ["<function="],
        }));
        let current = tool_calls(false, false);
        for text in [
            format!("Let me check. {WEATHER_CALL} Done."),
            TIME_CALL.to_string(),
            r#"<function=get_time>{"city": "Paris"}</function>"#.to_string(),
            "plain".to_string(),
        ] {
            assert_eq!(legacy.matches(text.as_bytes()), current.matches(text.as_bytes()), "{text:?}");
        }
        // The same object as JSON text, as vLLM's `structured_outputs.structural_tag` carries it.
        let text = json!({"structures": [{"begin": "<a>", "schema": {"type": "integer"}, "end": "</a>"}],
                          "triggers": ["<a>"]})
        .to_string();
        let from_text = grammar(Value::String(text));
        assert!(from_text.matches(b"x <a>12</a> y"));
        assert!(!from_text.matches(b"x <a>1.5</a> y"));
        // A tag of `tags` may leave out `"type": "tag"`, as xgrammar's `TagFormat` defaults it.
        let untyped = grammar(json!({"type": "triggered_tags", "triggers": ["<a>"], "tags": [
            {"begin": "<a>", "content": {"type": "json_schema", "json_schema": {"type": "integer"}}, "end": "</a>"}
        ]}));
        assert!(untyped.matches(b"x <a>12</a> y") && !untyped.matches(b"x <a>1.5</a> y"));
    }

    #[test]
    fn free_text_inside_a_tag_closes_at_the_first_end() {
        let thinking = grammar(json!({"type": "sequence", "elements": [
            {"type": "tag", "begin": "<think>", "content": {"type": "any_text"}, "end": "</think>"},
            {"type": "const_string", "value": "Answer: "},
            {"type": "regex", "pattern": "[0-9]+"},
        ]}));
        assert!(thinking.matches(b"<think>2 + 2 < 5, so </thin k</think>Answer: 4"));
        assert!(!thinking.matches(b"<think>a</think>b</think>Answer: 4"));
        assert!(!thinking.matches(b"<think>a</think>Answer: four"));
        // A list of ends: either closes it, and neither may appear inside.
        let either = grammar(json!({"type": "tag", "begin": "<r>",
            "content": {"type": "any_text", "excludes": ["STOP"]}, "end": ["</r>", "</answer>"]}));
        assert!(either.matches(b"<r>text</answer>"));
        assert!(either.matches(b"<r>text</r>"));
        assert!(!either.matches(b"<r>te</r>xt</r>"));
        assert!(!either.matches(b"<r>STOP</r>"));
    }

    #[test]
    fn triggered_tags_inside_a_tag_stop_at_its_end() {
        let response = grammar(json!({"type": "tag", "begin": "<response>", "end": "</response>", "content": {
            "type": "triggered_tags", "triggers": ["<function="], "tags": [weather_tag()]}}));
        assert!(response.matches(format!("<response>Calling. {WEATHER_CALL} Done.</response>").as_bytes()));
        assert!(!response.matches(b"<response>a</response>b</response>"));
    }

    #[test]
    fn composition_formats_repeat_and_choose() {
        let items = grammar(json!({"type": "sequence", "elements": [
            {"type": "optional", "content": {"type": "const_string", "value": "Items: "}},
            {"type": "repeat", "min": 1, "max": 3, "content": {"type": "or", "elements": [
                {"type": "const_string", "value": "a"}, {"type": "const_string", "value": "b"}]}},
            {"type": "star", "content": {"type": "const_string", "value": "!"}},
            {"type": "plus", "content": {"type": "const_string", "value": "."}},
        ]}));
        for allowed in ["a.", "Items: ab!!..", "bbb."] {
            assert!(items.matches(allowed.as_bytes()), "{allowed:?}");
        }
        for refused in ["", "a", "abab.", "Items: .", "c."] {
            assert!(!items.matches(refused.as_bytes()), "{refused:?}");
        }
        let unbounded = grammar(json!({"type": "repeat", "min": 2, "max": -1,
            "content": {"type": "const_string", "value": "x"}}));
        assert!(!unbounded.matches(b"x"));
        assert!(unbounded.matches("x".repeat(50).as_bytes()));
    }

    #[test]
    fn grammar_formats_keep_their_rules_apart() {
        // Both grammars name rules `root` and `item`; each keeps its own.
        let both = grammar(json!({"type": "sequence", "elements": [
            {"type": "grammar", "grammar": "root ::= item+\nitem ::= [0-9]"},
            {"type": "const_string", "value": ";"},
            {"type": "grammar", "grammar": "root ::= item (\",\" item)*\nitem ::= [a-z]+"},
            {"type": "grammar", "grammar": "start: WORD\n%import common.WORD"},
        ]}));
        assert!(both.matches(b"123;ab,cdXY"));
        assert!(!both.matches(b"12a;ab,cdXY"));
        assert!(!both.matches(b"123;1,2XY"));
    }

    #[test]
    fn tags_with_separator_are_a_pure_list() {
        let list = |at_least_one: bool, stop_after_first: bool| {
            grammar(json!({"type": "tags_with_separator", "tags": [weather_tag(), time_tag()], "separator": ",",
                "at_least_one": at_least_one, "stop_after_first": stop_after_first}))
        };
        let two = format!("{WEATHER_CALL},{TIME_CALL}");
        assert!(list(false, false).matches(b""));
        assert!(list(false, false).matches(two.as_bytes()));
        assert!(!list(false, false).matches(format!("x{WEATHER_CALL}").as_bytes()));
        assert!(!list(true, false).matches(b""));
        assert!(!list(true, true).matches(two.as_bytes()));
        assert!(list(true, true).matches(TIME_CALL.as_bytes()));
    }

    #[test]
    fn dispatch_opens_a_format_at_each_pattern() {
        let dispatch = |looping: bool| {
            grammar(json!({"type": "dispatch", "loop": looping, "excludes": ["<end>"], "rules": [
                ["<num>", {"type": "regex", "pattern": "[0-9]+;"}],
                ["<yes>", {"type": "or", "elements": [{"type": "const_string", "value": "y"},
                                                       {"type": "const_string", "value": "n"}]}],
            ]}))
        };
        assert!(dispatch(true).matches(b"free <num>42; text <yes>y and more"));
        assert!(!dispatch(true).matches(b"free <num>x"));
        assert!(!dispatch(true).matches(b"free <end>"));
        assert!(dispatch(false).matches(b"free <num>42;"));
        assert!(!dispatch(false).matches(b"free <num>42; more"));
    }

    #[test]
    fn a_character_budget_bounds_free_text() {
        let short = grammar(json!({"type": "tag", "begin": "(", "end": ")",
            "content": {"type": "any_text", "max_chars": 5}}));
        assert!(short.matches("(héllo)".as_bytes()));
        assert!(!short.matches(b"(hello!)"));
    }

    #[test]
    fn unsupported_and_malformed_tags_are_refused_at_their_place() {
        let cases = [
            (json!({"type": "structural_tag"}), "structural_tag", "needs `format`"),
            (json!({"type": "structural_tag", "format": {"type": "token", "token": "<|a|>"}}), "format", "token-level"),
            (json!({"type": "any_tokens"}), "format", "token-level"),
            (json!({"type": "blob"}), "format", "unknown format type `blob`"),
            (json!({"type": "const_string", "value": "a", "extra": 1}), "format", "unknown field `extra`"),
            (
                json!({"type": "sequence", "elements": [{"type": "any_text", "max_tokens": 4}]}),
                "format.elements[0].max_tokens",
                "token budget",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"type": "object"}, "style": "qwen_xml"}),
                "format.style",
                "not supported",
            ),
            (
                json!({"type": "json_schema", "json_schema": {"type": "string", "uniqueItems": true}}),
                "format.json_schema",
                "uniqueItems",
            ),
            (
                json!({"type": "triggered_tags", "triggers": ["<tool>"], "tags": [weather_tag()]}),
                "format.tags[0]",
                "starts with none of the triggers",
            ),
            (
                json!({"type": "triggered_tags", "triggers": ["<f", "<fun"], "tags": [weather_tag()]}),
                "format",
                "begins trigger",
            ),
            (
                json!({"type": "triggered_tags", "triggers": [], "tags": [weather_tag()]}),
                "format.triggers",
                "non-empty",
            ),
            (
                json!({"type": "tag", "begin": {"type": "token", "token": 7}, "content": {"type": "any_text"}, "end": "x"}),
                "format.begin",
                "token",
            ),
            (json!({"type": "grammar", "grammar": "root ::= root \"a\" | \"a\""}), "structural_tag", "left-recursive"),
            (json!({"type": "grammar", "grammar": "start ::= \"a\""}), "format.grammar", "no `root` rule"),
            (json!({"type": "repeat", "min": 3, "max": 2, "content": {"type": "any_text"}}), "format", "repeat bounds"),
            (json!({"type": "star", "content": {"type": "any_text"}}), "structural_tag", "can match nothing"),
            (json!({"structures": [], "triggers": ["<a>"]}), "structures", "at least one"),
            (Value::String("{not json".into()), "structural_tag", "not valid JSON"),
        ];
        for (spec, path, message) in cases {
            let error = refusal(spec.clone());
            assert_eq!(error.path, path, "{spec}: {error}");
            assert!(error.message.contains(message), "{spec}: {error}");
        }
    }

    #[test]
    fn formats_nested_past_the_limit_are_refused() {
        let mut spec = json!({"type": "const_string", "value": "x"});
        for _ in 0..=MAX_FORMAT_DEPTH {
            spec = json!({"type": "optional", "content": spec});
        }
        assert!(refusal(spec).message.contains("nest more than"));
    }
}
