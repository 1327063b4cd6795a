//! Chat templates: the Jinja program a model ships (in `tokenizer_config.json`,
//! `chat_template.jinja` or GGUF `tokenizer.chat_template`) rendered with minijinja the way
//! transformers renders it: trimmed blocks, Python string methods, `raise_exception`,
//! `strftime_now`, and a `tojson` that does not HTML-escape.

use minijinja::value::Value as JinjaValue;
use minijinja::{Environment, Error as JinjaError, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

/// One chat message. `content` is a string or a list of content parts, as in the OpenAI API;
/// an assistant's `tool_calls` and a tool result's `tool_call_id` and `name` reach the template
/// as they came (each call's `function.arguments` as an object, the way templates expect it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: serde_json::Value::String(content.into()), ..Default::default() }
    }
}

/// How a rendered conversation ends (vLLM's `add_generation_prompt` and
/// `continue_final_message`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatEnding {
    /// The template's generation prompt opens the assistant's turn.
    #[default]
    GenerationPrompt,
    /// The final message is left open and the model continues it (prefilling the start of
    /// the answer).
    ContinueFinalMessage,
    /// The conversation as the template closes it, with no generation prompt.
    Closed,
}

impl ChatEnding {
    /// From vLLM's two flags; both on is a contradiction, refused with the message to show.
    pub fn from_flags(add_generation_prompt: bool, continue_final_message: bool) -> std::result::Result<Self, String> {
        match (add_generation_prompt, continue_final_message) {
            (true, true) => Err("continue_final_message leaves the final message open and add_generation_prompt \
                 opens a new turn after it; set add_generation_prompt to false to continue the final message"
                .into()),
            (true, false) => Ok(Self::GenerationPrompt),
            (false, true) => Ok(Self::ContinueFinalMessage),
            (false, false) => Ok(Self::Closed),
        }
    }
}

/// A conversation, how its rendering ends, and what else the template is given.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Conversation {
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub ending: ChatEnding,
    /// The tools the model may call (OpenAI's `tools`), given to the template as `tools`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<serde_json::Value>>,
    /// A Jinja chat template used instead of the model's own (vLLM's `chat_template`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
    /// More variables for the template (vLLM's `chat_template_kwargs`, e.g. `enable_thinking`).
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub chat_template_kwargs: serde_json::Map<String, serde_json::Value>,
}

impl From<Vec<ChatMessage>> for Conversation {
    /// Messages answered in a new assistant turn, with the model's template.
    fn from(messages: Vec<ChatMessage>) -> Self {
        Self { messages, ..Default::default() }
    }
}

/// The variables a template is rendered with besides the messages.
#[derive(Debug, Clone, Copy, Default)]
pub struct TemplateVars<'a> {
    pub bos_token: &'a str,
    pub eos_token: &'a str,
    pub tools: Option<&'a [serde_json::Value]>,
    pub extra: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

/// The names the renderer sets itself, which `chat_template_kwargs` may not replace.
pub const RESERVED_TEMPLATE_VARS: [&str; 5] = ["messages", "add_generation_prompt", "bos_token", "eos_token", "tools"];

/// The roles a conversation may use: OpenAI's, `developer` included.
pub const CHAT_ROLES: [&str; 5] = ["system", "user", "assistant", "tool", "developer"];

/// Why a conversation cannot be rendered. [`Self::param`] names the offending field the way
/// the OpenAI API does (`messages[2].role`).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ChatMessageError {
    #[error("messages must contain at least one message")]
    Empty,
    #[error("unknown role '{role}' in message {index}; expected system, user, assistant, tool or developer")]
    UnknownRole { index: usize, role: String },
    #[error("message {index}: only text content parts are supported")]
    NonTextPart { index: usize },
    #[error("message {index}: content must be a string or a list of text parts")]
    BadContent { index: usize },
    #[error("message {index}, tool call {call}: {reason}")]
    BadToolCall { index: usize, call: usize, reason: String },
}

impl ChatMessageError {
    pub fn param(&self) -> String {
        match self {
            Self::Empty => "messages".into(),
            Self::UnknownRole { index, .. } => format!("messages[{index}].role"),
            Self::NonTextPart { index } | Self::BadContent { index } => format!("messages[{index}].content"),
            Self::BadToolCall { index, call, .. } => format!("messages[{index}].tool_calls[{call}]"),
        }
    }
}

/// Checks a conversation and flattens each message's content to text: a string as is, `null`
/// as empty, a list of `{"type": "text", "text": ...}` parts joined by newlines (as vLLM joins
/// them for templates that read text). Every entry point (the
/// server, Python, the Rust API) goes through this, so a conversation one accepts the others do.
pub fn text_messages(messages: &[ChatMessage]) -> std::result::Result<Vec<ChatMessage>, ChatMessageError> {
    if messages.is_empty() {
        return Err(ChatMessageError::Empty);
    }
    messages
        .iter()
        .enumerate()
        .map(|(index, m)| {
            if !CHAT_ROLES.contains(&m.role.as_str()) {
                return Err(ChatMessageError::UnknownRole { index, role: m.role.clone() });
            }
            let content = match &m.content {
                serde_json::Value::Null => String::new(),
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Array(parts) => {
                    let mut texts = Vec::with_capacity(parts.len());
                    for part in parts {
                        match (part.get("type").and_then(|t| t.as_str()), part.get("text").and_then(|t| t.as_str())) {
                            (Some("text"), Some(t)) => texts.push(t),
                            _ => return Err(ChatMessageError::NonTextPart { index }),
                        }
                    }
                    texts.join("\n")
                }
                _ => return Err(ChatMessageError::BadContent { index }),
            };
            let tool_calls = m
                .tool_calls
                .as_ref()
                .map(|calls| {
                    calls
                        .iter()
                        .enumerate()
                        .map(|(call, c)| {
                            template_tool_call(c).map_err(|reason| ChatMessageError::BadToolCall {
                                index,
                                call,
                                reason,
                            })
                        })
                        .collect::<std::result::Result<Vec<_>, _>>()
                })
                .transpose()?;
            Ok(ChatMessage {
                role: m.role.clone(),
                content: serde_json::Value::String(content),
                tool_calls,
                tool_call_id: m.tool_call_id.clone(),
                name: m.name.clone(),
            })
        })
        .collect()
}

/// One of an assistant's past tool calls (`{"id", "type": "function", "function": {"name",
/// "arguments"}}`) as templates read it: `arguments` parsed from its JSON text into an object,
/// as transformers' templates and vLLM expect.
fn template_tool_call(call: &serde_json::Value) -> std::result::Result<serde_json::Value, String> {
    let function = call.get("function").and_then(|f| f.as_object()).ok_or("needs a `function` object")?;
    if !function.get("name").is_some_and(serde_json::Value::is_string) {
        return Err("function.name must be a string".into());
    }
    let mut call = call.clone();
    if let Some(text) = function.get("arguments").and_then(|a| a.as_str()) {
        let arguments: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| format!("function.arguments must be the JSON text of an object ({e})"))?;
        call["function"]["arguments"] = arguments;
    }
    Ok(call)
}

pub struct ChatTemplate {
    env: Environment<'static>,
}

const TEMPLATE_NAME: &str = "chat";

/// Template instructions one render may run: real templates spend a few hundred a message,
/// so this bounds a loop that never ends (a template from a request or a model repository)
/// at well under a second, not a conversation's length.
pub const RENDER_FUEL: u64 = 20_000_000;

/// Bytes one render may write: far past any context's worth of text, far short of the
/// memory a template that repeats its output could take.
pub const MAX_RENDER_BYTES: usize = 64 << 20;

/// The rendered prompt, refusing to grow past [`MAX_RENDER_BYTES`].
struct BoundedText(Vec<u8>);

impl std::io::Write for BoundedText {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_RENDER_BYTES {
            return Err(std::io::Error::other("the rendered prompt passed its size limit"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn raise_exception(message: String) -> std::result::Result<JinjaValue, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    strftime(&format, secs)
}

/// Python's `strftime` for the instant `secs` after the epoch, in UTC (deterministic without
/// a timezone database): the C directives templates use (dates, weekdays, times, day of year);
/// others are written as they stand, as Python leaves them.
fn strftime(format: &str, secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const WEEKDAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
    let days = secs.div_euclid(86_400);
    let seconds = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hour, minute, second) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = WEEKDAYS[(days + 3).rem_euclid(7) as usize];
    let month = MONTHS[(m - 1) as usize];
    let day_of_year = (1..m).map(|month| days_in_month(y, month)).sum::<i64>() + d;
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:>2}")),
            Some('B') => out.push_str(month),
            Some('b' | 'h') => out.push_str(&month[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('H') => out.push_str(&format!("{hour:02}")),
            Some('I') => out.push_str(&format!("{hour12:02}")),
            Some('M') => out.push_str(&format!("{minute:02}")),
            Some('S') => out.push_str(&format!("{second:02}")),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('j') => out.push_str(&format!("{day_of_year:03}")),
            Some('Z') => out.push_str("UTC"),
            Some('z') => out.push_str("+0000"),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

fn days_in_month(year: i64, month: i64) -> i64 {
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// transformers' `{% generation %}` ... `{% endgeneration %}` (its assistant-mask extension)
/// marks text without changing it; minijinja has no such tag, so each becomes a block that
/// always renders, with the same whitespace control.
fn without_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        // The tag's end after its opening (`{%}` opens a tag and does not close it).
        let Some(end) = tag[2..].find("%}").map(|e| e + 2) else { break };
        let inner = &tag[2..end];
        let (open, body) = inner.strip_prefix('-').map_or(("", inner), |b| ("-", b));
        let (body, close) = body.strip_suffix('-').map_or((body, ""), |b| (b, "-"));
        match body.trim() {
            "generation" => out.push_str(&format!("{{%{open} if true {close}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{open} endif {close}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// transformers' `tojson`: `json.dumps(value, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`, its arguments by position or name, no HTML escaping.
fn tojson(
    value: JinjaValue,
    args: minijinja::value::Rest<JinjaValue>,
    kwargs: minijinja::value::Kwargs,
) -> std::result::Result<JinjaValue, JinjaError> {
    const NAMES: [&str; 4] = ["ensure_ascii", "indent", "separators", "sort_keys"];
    let invalid = |message: String| JinjaError::new(ErrorKind::InvalidOperation, message);
    if args.len() > NAMES.len() {
        return Err(invalid(format!("tojson takes at most {} arguments, got {}", NAMES.len(), args.len())));
    }
    let mut given: [Option<JinjaValue>; 4] = Default::default();
    for (slot, arg) in given.iter_mut().zip(args.iter()) {
        *slot = Some(arg.clone());
    }
    for (slot, name) in given.iter_mut().zip(NAMES) {
        if let Some(value) = kwargs.get::<Option<JinjaValue>>(name)? {
            if slot.is_some() {
                return Err(invalid(format!("tojson got `{name}` twice")));
            }
            *slot = Some(value);
        }
    }
    kwargs.assert_all_used()?;
    let [ensure_ascii, indent, separators, sort_keys] = given.map(|v| v.filter(|v| !v.is_none() && !v.is_undefined()));
    let indent = match indent {
        None => None,
        Some(v) if v.as_str().is_some() => Some(v.as_str().unwrap_or_default().to_string()),
        Some(v) => match i64::try_from(v.clone()) {
            Ok(n) => Some(" ".repeat(n.clamp(0, 64) as usize)),
            Err(_) => return Err(invalid(format!("tojson's indent must be a number or a string, not {v}"))),
        },
    };
    let separators = match separators {
        None => None,
        Some(v) => {
            let pair: Vec<JinjaValue> = v.try_iter().map(Iterator::collect).unwrap_or_default();
            match &pair[..] {
                [item, key] if item.as_str().is_some() && key.as_str().is_some() => {
                    Some((item.to_string(), key.to_string()))
                }
                _ => return Err(invalid(format!("tojson's separators must be two strings, not {v}"))),
            }
        }
    };
    let options = crate::python_json::DumpOptions {
        ensure_ascii: ensure_ascii.is_some_and(|v| v.is_true()),
        indent,
        separators,
        sort_keys: sort_keys.is_some_and(|v| v.is_true()),
    };
    let json = serde_json::to_value(&value).map_err(|e| invalid(e.to_string()))?;
    Ok(JinjaValue::from_safe_string(crate::python_json::dumps(&json, &options)))
}

impl ChatTemplate {
    pub fn new(source: String) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_fuel(Some(RENDER_FUEL));
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, without_generation_tags(&source))
            .map_err(|e| EngineError::Tokenizer(format!("invalid chat template: {e}")))?;
        Ok(Self { env })
    }

    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool, vars: TemplateVars) -> Result<String> {
        let template = self.env.get_template(TEMPLATE_NAME).expect("added at construction");
        let mut extra = vars.extra.cloned().unwrap_or_default();
        // transformers passes `documents` (RAG templates test `documents is not none`).
        extra.entry("documents").or_insert(serde_json::Value::Null);
        if let Some(reserved) = extra.keys().find(|k| RESERVED_TEMPLATE_VARS.contains(&k.as_str())) {
            return Err(EngineError::Request(format!(
                "chat_template_kwargs may not set '{reserved}': the request's own fields set it"
            )));
        }
        let context = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => vars.bos_token,
            eos_token => vars.eos_token,
            tools => vars.tools.map_or(JinjaValue::from(()), JinjaValue::from_serialize),
            ..JinjaValue::from_serialize(&extra)
        };
        let mut text = BoundedText(Vec::new());
        template.render_captured_to(context, &mut text).map_err(|e| match e.kind() {
            ErrorKind::InvalidOperation => {
                EngineError::Request(format!("the chat template rejected the messages: {}", e.detail().unwrap_or("")))
            }
            ErrorKind::OutOfFuel => EngineError::Request(format!(
                "the chat template ran past its budget of {RENDER_FUEL} instructions (a loop that does not end?)"
            )),
            ErrorKind::WriteFailure => EngineError::Request(format!(
                "the chat template wrote more than {} MiB, past any context's worth of prompt",
                MAX_RENDER_BYTES >> 20
            )),
            _ => EngineError::Request(format!("rendering the chat template failed: {e}")),
        })?;
        String::from_utf8(text.0).map_err(|_| EngineError::Request("the chat template wrote invalid UTF-8".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml_with_default_system_prompt() {
        let t = ChatTemplate::new(CHATML.into()).unwrap();
        let out = t.render(&[ChatMessage::new("user", "Hi")], true, TemplateVars::default()).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let out = t.render(&[ChatMessage::new("user", "Hi")], false, TemplateVars::default()).unwrap();
        assert!(out.ends_with("Hi<|im_end|>\n"));
    }

    #[test]
    fn a_template_that_loops_without_end_or_writes_without_bound_fails_fast() {
        let hi = [ChatMessage::new("user", "hi")];
        // 10^15 steps: runs out of instructions long before.
        let endless = "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}\
                       {% endfor %}{% endfor %}{% endfor %}";
        let started = std::time::Instant::now();
        let e = ChatTemplate::new(endless.into()).unwrap().render(&hi, true, TemplateVars::default()).unwrap_err();
        assert!(e.to_string().contains("budget of 20000000 instructions"), "{e}");
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "took {:?}", started.elapsed());
        // 10 MB a line, 100 lines: a GB of prompt, cut at 64 MiB.
        let flood = "{% set s = 'x' * 10000000 %}{% for i in range(100) %}{{ s }}{% endfor %}";
        let e = ChatTemplate::new(flood.into()).unwrap().render(&hi, true, TemplateVars::default()).unwrap_err();
        assert!(e.to_string().contains("more than 64 MiB"), "{e}");
        // A long real conversation stays far inside both limits.
        let long: Vec<ChatMessage> = (0..2000).map(|i| ChatMessage::new("user", format!("message {i}"))).collect();
        let text = ChatTemplate::new(CHATML.into()).unwrap().render(&long, true, TemplateVars::default()).unwrap();
        assert!(text.contains("message 1999"));
    }

    #[test]
    fn python_methods_tojson_and_raise_exception() {
        let t =
            ChatTemplate::new("{{ messages[0]['content'].strip().upper() }}|{{ messages | tojson }}".into()).unwrap();
        let out = t.render(&[ChatMessage::new("user", "  a<b  ")], false, TemplateVars::default()).unwrap();
        assert_eq!(out, r#"A<B|[{"role": "user", "content": "  a<b  "}]"#);
        // transformers' arguments, by name or position (`ensure_ascii` first), and Python's
        // reversal by slicing.
        let t = ChatTemplate::new(
            "{{ {'b': [1, 2.5e-5], 'a': 'é'} | tojson(indent=2, sort_keys=true) }}|{{ 'é' | tojson(true) }}|\
             {{ messages[::-1][0].content }}|{{ documents is none }}"
                .into(),
        )
        .unwrap();
        let two = [ChatMessage::new("user", "first"), ChatMessage::new("assistant", "last")];
        // transformers' assistant-mask tags render their contents, whitespace control kept.
        // An unclosed tag is the template's syntax error, not a panic.
        assert!(ChatTemplate::new("{%}".into()).is_err());
        let masked = "{% for m in messages %}{% if m.role == 'assistant' %}{%- generation -%}\n  {{ m.content }}\n{%- endgeneration %}{% else %}{{ m.content }};{% endif %}{% endfor %}";
        assert_eq!(
            ChatTemplate::new(masked.into()).unwrap().render(&two, false, TemplateVars::default()).unwrap(),
            "first;last"
        );
        let out = t.render(&two, false, TemplateVars::default()).unwrap();
        assert_eq!(out, "{\n  \"a\": \"é\",\n  \"b\": [\n    1,\n    2.5e-05\n  ]\n}|\"\\u00e9\"|last|True");
        for bad in
            ["{{ 1 | tojson(indent=[1]) }}", "{{ 1 | tojson(color=1) }}", "{{ 1 | tojson(false, ensure_ascii=true) }}"]
        {
            let rendered = ChatTemplate::new(bad.into()).and_then(|t| t.render(&two, false, TemplateVars::default()));
            assert!(rendered.is_err(), "{bad}: {rendered:?}");
        }
        let t = ChatTemplate::new("{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}".into()).unwrap();
        let e =
            t.render(&[ChatMessage::new("assistant", "x")], false, TemplateVars::default()).unwrap_err().to_string();
        assert!(e.contains("Conversation roles must alternate"), "{e}");
    }

    #[test]
    fn text_messages_join_text_parts_and_name_the_field_at_fault() {
        let parts = ChatMessage {
            role: "user".into(),
            content: serde_json::json!([{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]),
            ..Default::default()
        };
        let system = ChatMessage { role: "system".into(), content: serde_json::Value::Null, ..Default::default() };
        let out = text_messages(&[system, parts]).unwrap();
        assert_eq!(out, vec![ChatMessage::new("system", ""), ChatMessage::new("user", "Hi \nthere")]);

        let e = text_messages(&[ChatMessage::new("user", "a"), ChatMessage::new("wizard", "b")]).unwrap_err();
        assert_eq!(e, ChatMessageError::UnknownRole { index: 1, role: "wizard".into() });
        assert_eq!(e.param(), "messages[1].role");
        assert!(e.to_string().contains("expected system, user"), "{e}");

        let image = ChatMessage {
            role: "user".into(),
            content: serde_json::json!([{"type": "image_url"}]),
            ..Default::default()
        };
        assert_eq!(text_messages(&[image]).unwrap_err().param(), "messages[0].content");
        let number = ChatMessage { role: "user".into(), content: serde_json::json!(3), ..Default::default() };
        assert_eq!(text_messages(&[number]).unwrap_err(), ChatMessageError::BadContent { index: 0 });
        assert_eq!(text_messages(&[]).unwrap_err().param(), "messages");
    }

    const TOOLS_TEMPLATE: &str = "{% if tools %}[{% for t in tools %}{{ t.function.name }};{% endfor %}]{% endif %}\
        {% for m in messages %}{{ m.role }}:{{ m.content }}\
        {% for c in m.tool_calls or [] %}<call {{ c.function.name }} {{ c.function.arguments.city }} {{ c.function.arguments | tojson }}>{% endfor %}\
        {% if m.tool_call_id %}<answers {{ m.tool_call_id }}>{% endif %}|{% endfor %}{% if greeting %}{{ greeting }}{% endif %}";

    #[test]
    fn tools_calls_and_tool_results_reach_the_template_with_arguments_as_objects() {
        let t = ChatTemplate::new(TOOLS_TEMPLATE.into()).unwrap();
        let call = serde_json::json!({"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}});
        let messages = text_messages(&[
            ChatMessage::new("user", "Weather?"),
            ChatMessage { role: "assistant".into(), tool_calls: Some(vec![call]), ..Default::default() },
            ChatMessage { tool_call_id: Some("c1".into()), ..ChatMessage::new("tool", "3 C") },
        ])
        .unwrap();
        let tools = [serde_json::json!({"type": "function", "function": {"name": "get_weather"}})];
        let mut extra = serde_json::Map::new();
        extra.insert("greeting".into(), "hello".into());
        let vars = TemplateVars { tools: Some(&tools), extra: Some(&extra), ..Default::default() };
        let out = t.render(&messages, false, vars).unwrap();
        assert_eq!(
            out,
            r#"[get_weather;]user:Weather?|assistant:<call get_weather Oslo {"city": "Oslo"}>|tool:3 C<answers c1>|hello"#
        );
        // Flattening twice changes nothing (the server checks messages before the engine does).
        assert_eq!(text_messages(&messages).unwrap(), messages);
    }

    #[test]
    fn bad_tool_calls_and_reserved_template_variables_are_refused_by_name() {
        let bad = |function: serde_json::Value| {
            let call = serde_json::json!({"id": "c1", "type": "function", "function": function});
            let message = ChatMessage { role: "assistant".into(), tool_calls: Some(vec![call]), ..Default::default() };
            text_messages(&[ChatMessage::new("user", "x"), message]).unwrap_err()
        };
        let e = bad(serde_json::json!({"name": "f", "arguments": "{not json"}));
        assert_eq!(e.param(), "messages[1].tool_calls[0]");
        assert!(e.to_string().contains("JSON text of an object"), "{e}");
        assert!(bad(serde_json::json!({"arguments": "{}"})).to_string().contains("function.name"));

        let t = ChatTemplate::new(TOOLS_TEMPLATE.into()).unwrap();
        let mut extra = serde_json::Map::new();
        extra.insert("messages".into(), serde_json::json!([]));
        let vars = TemplateVars { extra: Some(&extra), ..Default::default() };
        let e = t.render(&[ChatMessage::new("user", "x")], false, vars).unwrap_err().to_string();
        assert!(e.contains("chat_template_kwargs may not set 'messages'"), "{e}");
    }

    #[test]
    fn civil_dates_are_right() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_819), (2027, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
    }

    /// As Python's `datetime.fromtimestamp(secs, timezone.utc).strftime(format)` writes them.
    #[test]
    fn strftime_writes_the_directives_templates_use() {
        // 2024-03-01 13:05:09 UTC, a Friday, the 61st day of a leap year.
        let secs = 1_709_298_309;
        assert_eq!(strftime("%d %b %Y", secs), "01 Mar 2024");
        assert_eq!(strftime("%A, %B %e %y", secs), "Friday, March  1 24");
        assert_eq!(
            strftime("%a %H:%M:%S %I%p day %j %Z%z 100%% %Q", secs),
            "Fri 13:05:09 01PM day 061 UTC+0000 100% %Q"
        );
        assert_eq!(strftime("%Y-%m-%d %H:%M", 0), "1970-01-01 00:00");
    }
}
