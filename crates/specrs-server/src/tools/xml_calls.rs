//! XML tool calls whose values are raw text: Qwen3-Coder's (vLLM's `qwen3_coder` parser; Seed-OSS
//! writes the same inside `<seed:tool_call>` blocks, `seed_oss`), GLM-4.5's (`glm45`; GLM-4.7's
//! layout without line breaks, `glm47`, is read by the same), MiniMax-M2's (`minimax_m2`) and
//! Step 3's (`step3`: MiniMax's tags under `steptml:`, in DeepSeek-like call markers):
//!
//! ```text
//! Qwen3-Coder:              GLM-4.5:                          MiniMax-M2:
//! <tool_call>               <tool_call>get_weather            <minimax:tool_call>
//! <function=get_weather>    <arg_key>city</arg_key>           <invoke name="get_weather">
//! <parameter=city>          <arg_value>Paris</arg_value>      <parameter name="city">Paris</parameter>
//! Paris                     </tool_call>                      </invoke>
//! </parameter>                                                </minimax:tool_call>
//! </function>
//! </tool_call>
//! ```
//!
//! Values are raw text (Qwen3-Coder's with one line break trimmed at each end, MiniMax's with
//! all surrounding whitespace), turned into JSON by the type the tool's schema gives the
//! parameter: strings stay text, numbers and booleans are parsed, objects and arrays read as
//! JSON, `null` is null (MiniMax also takes `none` / `nil`, and `yes` / `no`, `on` / `off`,
//! `1` / `0` as booleans); a parameter the schema does not describe stays text for
//! Qwen3-Coder and is read as JSON where it parses for GLM and MiniMax (as vLLM's parsers
//! do). A call starts once its name is complete, and each argument is sent once its value
//! closes.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::Function;
use super::calls::{TextAroundCalls, send_content, stray_text};
use crate::message::{MessageDelta, held_prefix_len};

const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

/// The tags of one family's calls.
#[derive(Debug, Clone, Copy)]
pub struct Dialect {
    /// Around a block of calls.
    call_open: &'static str,
    call_close: &'static str,
    /// Opens a function inside a call block, its name up to `>` (Qwen3-Coder: several per
    /// block); `None`: the block is one call, named by its text up to a line break or the
    /// first key (GLM).
    function_open: Option<&'static str>,
    /// Closes a function (GLM: the block's close).
    function_close: &'static str,
    /// Around a parameter's name.
    key_open: &'static str,
    key_close: &'static str,
    /// Around its value (Qwen3-Coder's value starts right after its name's tag).
    value_open: &'static str,
    value_close: &'static str,
    /// What is trimmed from each end of a value.
    trim: ValueTrim,
    /// A parameter the schema does not describe is read as JSON where it parses.
    undescribed_as_json: bool,
    /// Function and parameter names may be quoted (`name="city"`: MiniMax-M2, Step 3).
    quoted_names: bool,
    /// MiniMax's looser literals are read (`none` / `nil` as null, `yes` / `on` / `1` as true).
    minimax: bool,
    /// Tags around each function inside a block that carry nothing (Step 3's
    /// `<｜tool_call_begin｜>function<｜tool_sep｜>` ... `<｜tool_call_end｜>`).
    wrappers: &'static [&'static str],
}

/// What a dialect trims from the ends of a raw value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueTrim {
    Nothing,
    /// One line break at each end (Qwen3-Coder).
    OneLineBreak,
    /// All whitespace (MiniMax-M2).
    Whitespace,
}

pub const QWEN3_CODER: Dialect = Dialect {
    call_open: CALL_OPEN,
    call_close: CALL_CLOSE,
    function_open: Some("<function="),
    function_close: "</function>",
    key_open: "<parameter=",
    key_close: ">",
    value_open: "",
    value_close: "</parameter>",
    trim: ValueTrim::OneLineBreak,
    undescribed_as_json: false,
    quoted_names: false,
    minimax: false,
    wrappers: &[],
};

/// Qwen3-Coder's functions inside Seed-OSS's own block tags.
pub const SEED_OSS: Dialect = Dialect { call_open: "<seed:tool_call>", call_close: "</seed:tool_call>", ..QWEN3_CODER };

pub const GLM: Dialect = Dialect {
    call_open: CALL_OPEN,
    call_close: CALL_CLOSE,
    function_open: None,
    function_close: CALL_CLOSE,
    key_open: "<arg_key>",
    key_close: "</arg_key>",
    value_open: "<arg_value>",
    value_close: "</arg_value>",
    trim: ValueTrim::Nothing,
    undescribed_as_json: true,
    quoted_names: false,
    minimax: false,
    wrappers: &[],
};

pub const MINIMAX_M2: Dialect = Dialect {
    call_open: "<minimax:tool_call>",
    call_close: "</minimax:tool_call>",
    function_open: Some("<invoke name="),
    function_close: "</invoke>",
    key_open: "<parameter name=",
    key_close: ">",
    value_open: "",
    value_close: "</parameter>",
    trim: ValueTrim::Whitespace,
    undescribed_as_json: true,
    quoted_names: true,
    minimax: true,
    wrappers: &[],
};

/// StepFun's Step 3: `<steptml:invoke name="f"><steptml:parameter name="k">v</steptml:parameter>
/// </steptml:invoke>`, each call wrapped in `<｜tool_call_begin｜>function<｜tool_sep｜>` and
/// `<｜tool_call_end｜>` inside `<｜tool_calls_begin｜>` ... `<｜tool_calls_end｜>`; values trimmed
/// and typed by the schema, undescribed ones left as text (vLLM's `step3`).
pub const STEP3: Dialect = Dialect {
    call_open: "<｜tool_calls_begin｜>",
    call_close: "<｜tool_calls_end｜>",
    function_open: Some("<steptml:invoke name="),
    function_close: "</steptml:invoke>",
    key_open: "<steptml:parameter name=",
    key_close: ">",
    value_open: "",
    value_close: "</steptml:parameter>",
    trim: ValueTrim::Whitespace,
    undescribed_as_json: false,
    quoted_names: true,
    minimax: false,
    wrappers: &["<｜tool_call_begin｜>", "function<｜tool_sep｜>", "<｜tool_call_end｜>"],
};

/// Reads XML calls out of free text: text outside `<tool_call>` blocks is content (what could
/// begin a block is held back until it cannot).
#[derive(Debug)]
pub struct XmlCallScanner {
    dialect: Dialect,
    /// Each offered function's `parameters` schema, by name.
    schemas: HashMap<String, Value>,
    buffer: String,
    text: TextAroundCalls,
    at: Place,
    calls: usize,
}

#[derive(Debug, Clone, PartialEq)]
enum Place {
    Text,
    /// Inside `<tool_call>`, between functions.
    Block,
    /// Inside `<function=name>`, between parameters; whether an argument was sent.
    Function {
        name: String,
        first: bool,
    },
    /// Inside `<parameter=key>`, reading its value.
    Parameter {
        name: String,
        key: String,
        first: bool,
    },
}

/// Where `tag` is in `text`, or (`Err`) how much of `text`'s end could begin it.
fn find_tag(text: &str, tag: &str) -> Result<usize, usize> {
    text.find(tag).ok_or_else(|| held_prefix_len(text, tag))
}

impl XmlCallScanner {
    pub fn new(dialect: Dialect, functions: &[Function]) -> Self {
        let schemas = functions.iter().map(|f| (f.name.clone(), f.parameters.clone())).collect();
        Self { dialect, schemas, buffer: String::new(), text: TextAroundCalls::default(), at: Place::Text, calls: 0 }
    }

    pub fn push(&mut self, text: &str, out: &mut Vec<MessageDelta>) {
        self.buffer.push_str(text);
        while self.step(out) {}
    }

    /// Reads what the buffer completes at the current place; whether it moved on.
    fn step(&mut self, out: &mut Vec<MessageDelta>) -> bool {
        let d = self.dialect;
        match self.at.clone() {
            Place::Text => match find_tag(&self.buffer, d.call_open) {
                Ok(start) => {
                    let before: String = self.buffer.drain(..start + d.call_open.len()).collect();
                    self.send_text(&before[..start], out);
                    self.text.drop_held();
                    self.at = Place::Block;
                    true
                }
                Err(held) => {
                    let text: String = self.buffer.drain(..self.buffer.len() - held).collect();
                    self.send_text(&text, out);
                    false
                }
            },
            Place::Block => {
                let rest = self.buffer.trim_start();
                let Some(function_open) = d.function_open else {
                    // GLM: the block is the call, its name the text before a line break or
                    // the first key (or the close, for a call without arguments).
                    let ends = ["\n", d.key_open, d.function_close].map(|t| rest.find(t));
                    let Some(end) = ends.into_iter().flatten().min() else { return false };
                    let name = rest[..end].trim().to_string();
                    self.buffer = rest[end..].to_string();
                    self.start_call(name, out);
                    return true;
                };
                if let Some(after) = rest.strip_prefix(d.call_close) {
                    self.buffer = after.to_string();
                    self.at = Place::Text;
                    return true;
                }
                if let Some(after) = rest.strip_prefix(function_open)
                    && let Some(end) = after.find('>')
                {
                    let name = self.name(&after[..end]);
                    self.buffer = after[end + 1..].to_string();
                    self.start_call(name, out);
                    return true;
                }
                if let Some(after) = d.wrappers.iter().find_map(|w| rest.strip_prefix(w)) {
                    self.buffer = after.to_string();
                    return true;
                }
                // Neither a function nor the block's end: text, up to the next tag.
                let tags: Vec<&str> =
                    [d.call_close, function_open].into_iter().chain(d.wrappers.iter().copied()).collect();
                let Some((text, rest)) = stray_text(rest, &tags) else { return false };
                let text = text.to_string();
                self.buffer = rest.to_string();
                send_content(text, out);
                true
            }
            Place::Function { name, first } => {
                let rest = self.buffer.trim_start();
                if let Some(after) = rest.strip_prefix(d.function_close) {
                    self.buffer = after.to_string();
                    self.send_arguments(if first { "{}" } else { "}" }, out);
                    // GLM's function close is its block's.
                    self.at = if d.function_open.is_some() { Place::Block } else { Place::Text };
                    return true;
                }
                if let Some(after) = rest.strip_prefix(d.key_open)
                    && let Some(end) = after.find(d.key_close)
                {
                    let key = self.name(&after[..end]);
                    let after_key = &after[end + d.key_close.len()..];
                    // The value's open tag, after any whitespace; a model that left it out
                    // starts its value right after the key.
                    let opened = after_key.trim_start();
                    let value = match opened.strip_prefix(d.value_open) {
                        Some(value) => value,
                        None if d.value_open.starts_with(opened) => return false,
                        None => after_key,
                    };
                    self.buffer = value.to_string();
                    self.at = Place::Parameter { name, key, first };
                    return true;
                }
                // Stray text inside the function: dropped up to the next tag, as vLLM does.
                let Some((_, rest)) = stray_text(rest, &[d.function_close, d.key_open]) else { return false };
                self.buffer = rest.to_string();
                true
            }
            Place::Parameter { name, key, first } => {
                // A value ends at its close tag, or (a model that forgot it) at the next
                // parameter or the function's end.
                let ends = [d.value_close, d.key_open, d.function_close].map(|t| (self.buffer.find(t), t));
                let Some((end, tag)) = ends.iter().filter_map(|&(at, t)| at.map(|a| (a, t))).min_by_key(|&(a, _)| a)
                else {
                    return false;
                };
                let value: String = self.buffer.drain(..end).collect();
                if tag == d.value_close {
                    self.buffer.drain(..d.value_close.len());
                }
                self.send_argument(&name, &key, &value, first, out);
                self.at = Place::Function { name, first: false };
                true
            }
        }
    }

    /// What is left once the output is complete: text held back, or a value cut short.
    pub fn finish(&mut self, out: &mut Vec<MessageDelta>) {
        let rest = std::mem::take(&mut self.buffer);
        match std::mem::replace(&mut self.at, Place::Text) {
            Place::Text => self.send_text(&rest, out),
            Place::Parameter { name, key, first } => self.send_argument(&name, &key, &rest, first, out),
            Place::Block | Place::Function { .. } => {}
        }
    }

    fn start_call(&mut self, name: String, out: &mut Vec<MessageDelta>) {
        out.push(MessageDelta::CallStart { index: self.calls, id: String::new(), name: name.clone() });
        self.calls += 1;
        self.at = Place::Function { name, first: true };
    }

    fn send_text(&mut self, text: &str, out: &mut Vec<MessageDelta>) {
        self.text.send(text, self.calls, out);
    }

    fn send_arguments(&self, text: &str, out: &mut Vec<MessageDelta>) {
        out.push(MessageDelta::Arguments { index: self.calls - 1, text: text.to_string() });
    }

    /// A function's or parameter's name as written in its tag: trimmed, and unquoted where the
    /// dialect quotes names.
    fn name(&self, written: &str) -> String {
        let name = written.trim();
        let quoted = |q: char| name.len() >= 2 && name.starts_with(q) && name.ends_with(q);
        match self.dialect.quoted_names && (quoted('"') || quoted('\'')) {
            true => name[1..name.len() - 1].to_string(),
            false => name.to_string(),
        }
    }

    fn send_argument(&self, function: &str, key: &str, value: &str, first: bool, out: &mut Vec<MessageDelta>) {
        let value = match self.dialect.trim {
            ValueTrim::Nothing => value,
            ValueTrim::OneLineBreak => {
                let value = value.strip_prefix('\n').unwrap_or(value);
                value.strip_suffix('\n').unwrap_or(value)
            }
            ValueTrim::Whitespace => value.trim(),
        };
        let ty = self.parameter_type(function, key);
        let typed = match minimax_literal(value, ty.as_deref()).filter(|_| self.dialect.minimax) {
            Some(literal) => literal,
            None if ty.is_none() && self.dialect.undescribed_as_json => {
                serde_json::from_str(value.trim()).unwrap_or_else(|_| Value::String(value.to_string()))
            }
            None => typed_value(value, ty.as_deref()),
        };
        let opening = if first { "{" } else { ", " };
        self.send_arguments(&format!("{opening}{}: {}", Value::String(key.to_string()), dumps(&typed)), out);
    }

    /// The JSON type the function's schema gives `key` (the first besides `null`, of a list).
    fn parameter_type(&self, function: &str, key: &str) -> Option<String> {
        let schema = self.schemas.get(function)?.get("properties")?.get(key)?;
        let ty = match schema.get("type")? {
            Value::Array(types) => types.iter().filter_map(Value::as_str).find(|t| *t != "null")?,
            other => other.as_str()?,
        };
        Some(ty.to_ascii_lowercase())
    }
}

/// MiniMax-M2's looser literals: `none` / `nil` (any case) as null whatever the type, and
/// `yes` / `on` / `1` and `no` / `off` / `0` for booleans.
fn minimax_literal(value: &str, ty: Option<&str>) -> Option<Value> {
    let lower = value.trim().to_ascii_lowercase();
    if matches!(lower.as_str(), "none" | "nil") {
        return Some(Value::Null);
    }
    match (ty, lower.as_str()) {
        (Some("boolean" | "bool"), "yes" | "on" | "1") => Some(Value::Bool(true)),
        (Some("boolean" | "bool"), "no" | "off" | "0") => Some(Value::Bool(false)),
        _ => None,
    }
}

/// A raw value as JSON of its parameter's type; text where it does not parse as that type,
/// and for parameters the schema does not describe.
fn typed_value(value: &str, ty: Option<&str>) -> Value {
    if value.eq_ignore_ascii_case("null") {
        return Value::Null;
    }
    let text = || Value::String(value.to_string());
    let Some(ty) = ty else { return text() };
    match ty {
        "string" | "str" | "text" | "varchar" | "char" | "enum" => text(),
        t if t.starts_with("int") || t.starts_with("uint") || t == "long" || t == "short" => {
            value.trim().parse::<i64>().map_or_else(|_| text(), |n| json!(n))
        }
        t if t.starts_with("num") || t.starts_with("float") || t == "double" => {
            let trimmed = value.trim();
            match (trimmed.parse::<i64>(), trimmed.parse::<f64>()) {
                (Ok(n), _) => json!(n),
                (_, Ok(x)) if x.is_finite() => json!(x),
                _ => text(),
            }
        }
        "boolean" | "bool" | "binary" => match value.trim().to_ascii_lowercase().as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => text(),
        },
        _ => serde_json::from_str(value.trim()).unwrap_or_else(|_| text()),
    }
}

/// JSON text in Python's `json.dumps` layout (`, ` and `: ` separators), the layout vLLM sends
/// arguments in.
fn dumps(value: &Value) -> String {
    specrs_engine::python_json::dumps(value, &Default::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn functions() -> Vec<Function> {
        let weather = json!({"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": ["boolean", "null"]},
            "ratio": {"type": "number"}, "hours": {"type": "array"}, "where": {"type": "object"}
        }});
        vec![
            Function { name: "get_weather".into(), parameters: weather },
            Function { name: "get_time".into(), parameters: json!({"type": "object", "properties": {}}) },
        ]
    }

    /// Feeds `text` in pieces of `size` characters; the deltas, each list per piece, joined.
    fn read(text: &str, size: usize) -> Vec<MessageDelta> {
        read_as(QWEN3_CODER, text, size)
    }

    fn read_as(dialect: Dialect, text: &str, size: usize) -> Vec<MessageDelta> {
        let mut scanner = XmlCallScanner::new(dialect, &functions());
        let chars: Vec<char> = text.chars().collect();
        let mut out = Vec::new();
        for piece in chars.chunks(size) {
            scanner.push(&piece.iter().collect::<String>(), &mut out);
        }
        scanner.finish(&mut out);
        out
    }

    /// Content, and each call's name and whole arguments.
    fn message(deltas: &[MessageDelta]) -> (String, Vec<(String, String)>) {
        let (reasoning, content, calls) = super::super::gather(deltas);
        assert!(reasoning.is_empty(), "no reasoning in XML calls: {reasoning:?}");
        (content, calls)
    }

    #[test]
    fn calls_and_their_values_are_read_by_the_schemas_types_whatever_the_pieces() {
        let text = "I will check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York, \"NY\"\n</parameter>\n\
                    <parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=ratio>\n0.5\n\
                    </parameter>\n<parameter=hours>\n[1, 2]\n</parameter>\n<parameter=where>\n{\"lat\":1}\n</parameter>\n\
                    <parameter=extra>\n42\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n\
                    </function>\n</tool_call>";
        let want = r#"{"city": "New York, \"NY\"", "days": 3, "metric": true, "ratio": 0.5, "hours": [1, 2], "where": {"lat": 1}, "extra": "42"}"#;
        for size in [1, 2, 5, 1000] {
            let (content, calls) = message(&read(text, size));
            assert_eq!(content, "I will check.\n", "pieces of {size}");
            assert_eq!(
                calls,
                vec![("get_weather".to_string(), want.to_string()), ("get_time".to_string(), "{}".to_string())],
                "pieces of {size}"
            );
        }
    }

    #[test]
    fn seed_oss_calls_are_qwen3_coders_inside_their_own_block_tags() {
        let text = "Checking.\n<seed:tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n\
                    <parameter=days>\n2\n</parameter>\n</function>\n</seed:tool_call>";
        for size in [1, 3, 1000] {
            let (content, calls) = message(&read_as(SEED_OSS, text, size));
            assert_eq!(content, "Checking.\n", "pieces of {size}");
            assert_eq!(calls, vec![("get_weather".to_string(), r#"{"city": "Oslo", "days": 2}"#.to_string())]);
        }
        // Qwen3-Coder's own block is text to Seed-OSS.
        let (content, calls) = message(&read_as(SEED_OSS, "<tool_call><function=get_time></function></tool_call>", 4));
        assert_eq!((content.as_str(), calls.len()), ("<tool_call><function=get_time></function></tool_call>", 0));
    }

    #[test]
    fn a_call_starts_at_its_function_tag_and_each_argument_comes_when_its_value_closes() {
        let mut scanner = XmlCallScanner::new(QWEN3_CODER, &functions());
        let mut out = Vec::new();
        scanner.push("<tool_call>\n<function=get_wea", &mut out);
        assert!(out.is_empty());
        scanner.push("ther>\n<parameter=city>\nOs", &mut out);
        assert!(matches!(&out[..], [MessageDelta::CallStart { index: 0, name, .. }] if name == "get_weather"));
        scanner.push("lo\n</parameter>\n", &mut out);
        assert_eq!(out[1], MessageDelta::Arguments { index: 0, text: r#"{"city": "Oslo""#.into() });
        scanner.push("</function>", &mut out);
        assert_eq!(out[2], MessageDelta::Arguments { index: 0, text: "}".into() });
    }

    #[test]
    fn unparseable_values_stay_text_null_is_null_and_a_forgotten_close_tag_is_tolerated() {
        let text =
            "<tool_call><function=get_weather><parameter=days>a few<parameter=metric>null</function></tool_call>";
        let (_, calls) = message(&read(text, 3));
        assert_eq!(calls[0].1, r#"{"days": "a few", "metric": null}"#);
        let (content, calls) = message(&read("No call: a <tool or <b>bold</b>.", 4));
        assert_eq!((content.as_str(), calls.len()), ("No call: a <tool or <b>bold</b>.", 0));
        let (content, calls) = message(&read("<tool_call>\né?\n<function=get_time></function></tool_call>", 1));
        assert_eq!((content.as_str(), calls.len()), ("é?", 1), "stray text in a block is content");
        let (_, cut) = message(&read("<tool_call><function=get_time><parameter=zone>UT", 2));
        assert_eq!(
            cut[0],
            ("get_time".to_string(), r#"{"zone": "UT""#.to_string()),
            "a cut value is sent as far as it got"
        );
    }

    #[test]
    fn minimax_m2_calls_read_quoted_names_trimmed_values_and_its_literals_whatever_the_pieces() {
        let text = "Let me check.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n\
                    <parameter name=\"city\">\n  New York, \"NY\"  \n</parameter>\n<parameter name='days'>3</parameter>\n\
                    <parameter name=\"metric\">yes</parameter>\n<parameter name=\"where\">nil</parameter>\n\
                    <parameter name=\"extra\">[1, 2]</parameter>\n<parameter name=\"note\">free text</parameter>\n\
                    </invoke>\n<invoke name=get_time>\n</invoke>\n</minimax:tool_call>";
        let want = r#"{"city": "New York, \"NY\"", "days": 3, "metric": true, "where": null, "extra": [1, 2], "note": "free text"}"#;
        for size in [1, 3, 7, 1000] {
            let (content, calls) = message(&read_as(MINIMAX_M2, text, size));
            assert_eq!(content, "Let me check.\n", "pieces of {size}");
            assert_eq!(
                calls,
                vec![("get_weather".to_string(), want.to_string()), ("get_time".to_string(), "{}".to_string())],
                "pieces of {size}"
            );
        }
        // Qwen3-Coder's looser literals stay text: `none` for an integer is no number.
        let (_, calls) = message(&read(
            "<tool_call><function=get_weather><parameter=days>none</parameter></function></tool_call>",
            4,
        ));
        assert_eq!(calls[0].1, r#"{"days": "none"}"#);
    }

    #[test]
    fn step3_calls_skip_their_wrappers_and_type_their_values_whatever_the_pieces() {
        let text = "Let me check.<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜>\
                    <steptml:invoke name=\"get_weather\"><steptml:parameter name=\"city\"> Oslo </steptml:parameter>\
                    <steptml:parameter name=\"days\">3</steptml:parameter><steptml:parameter name=\"metric\">true</steptml:parameter>\
                    <steptml:parameter name=\"note\">[1, 2]</steptml:parameter></steptml:invoke><｜tool_call_end｜>\
                    <｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"get_time\"></steptml:invoke>\
                    <｜tool_call_end｜><｜tool_calls_end｜> Done.";
        let want = r#"{"city": "Oslo", "days": 3, "metric": true, "note": "[1, 2]"}"#;
        for size in [1, 3, 7, 1000] {
            let (content, calls) = message(&read_as(STEP3, text, size));
            assert_eq!(content, "Let me check. Done.", "pieces of {size}");
            assert_eq!(
                calls,
                vec![("get_weather".to_string(), want.to_string()), ("get_time".to_string(), "{}".to_string())],
                "pieces of {size}"
            );
        }
        // MiniMax's loose literals are its own: Step 3 keeps `yes` as text.
        let (_, calls) = message(&read_as(
            STEP3,
            "<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"get_weather\">\
             <steptml:parameter name=\"metric\">yes</steptml:parameter></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>",
            5,
        ));
        assert_eq!(calls[0].1, r#"{"metric": "yes"}"#);
    }

    #[test]
    fn glm_calls_in_both_layouts_read_alike_whatever_the_pieces() {
        // GLM-4.5 puts line breaks between the parts, GLM-4.7 none; values are raw, typed by
        // the schema, and an undescribed parameter is read as JSON where it parses.
        let glm45 = "Let me look.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>New York, \"NY\"</arg_value>\n\
                     <arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>hours</arg_key>\n<arg_value>[1, 2]</arg_value>\n\
                     <arg_key>extra</arg_key>\n<arg_value>42</arg_value>\n<arg_key>note</arg_key>\n<arg_value>\nfree text\n</arg_value>\n\
                     </tool_call>\n<tool_call>get_time\n</tool_call>";
        let glm47 = glm45.replace("\n<arg", "<arg").replace(">\n<", "><").replace("get_time\n", "get_time");
        let want = r#"{"city": "New York, \"NY\"", "days": 3, "hours": [1, 2], "extra": 42, "note": "\nfree text\n"}"#;
        for text in [glm45, &glm47] {
            for size in [1, 3, 7, 1000] {
                let (content, calls) = message(&read_as(GLM, text, size));
                assert_eq!(content, "Let me look.", "pieces of {size}: {text:?}");
                assert_eq!(
                    calls,
                    vec![("get_weather".to_string(), want.to_string()), ("get_time".to_string(), "{}".to_string())],
                    "pieces of {size}: {text:?}"
                );
            }
        }
    }

    #[test]
    fn a_glm_call_starts_at_its_name_and_each_argument_comes_when_its_value_closes() {
        let mut scanner = XmlCallScanner::new(GLM, &functions());
        let mut out = Vec::new();
        scanner.push("<tool_call>get_wea", &mut out);
        assert!(out.is_empty(), "the name may go on");
        scanner.push("ther\n<arg_key>city</arg_key>\n<arg_va", &mut out);
        assert!(matches!(&out[..], [MessageDelta::CallStart { index: 0, name, .. }] if name == "get_weather"));
        scanner.push("lue>Os", &mut out);
        assert_eq!(out.len(), 1);
        scanner.push("lo</arg_value>", &mut out);
        assert_eq!(out[1], MessageDelta::Arguments { index: 0, text: r#"{"city": "Oslo""#.into() });
        scanner.push("</tool_call>After.", &mut out);
        assert_eq!(out[2], MessageDelta::Arguments { index: 0, text: "}".into() });
        scanner.finish(&mut out);
        assert_eq!(out[3], MessageDelta::Content("After.".into()));
        // A value whose open tag was left out starts after its key; a missing close ends at
        // the next key.
        let (_, calls) = message(&read_as(
            GLM,
            "<tool_call>get_weather<arg_key>days</arg_key>5<arg_key>city</arg_key><arg_value>Rome</tool_call>",
            2,
        ));
        assert_eq!(calls[0].1, r#"{"days": 5, "city": "Rome"}"#);
    }
}
