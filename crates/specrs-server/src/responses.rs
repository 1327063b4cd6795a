//! OpenAI's Responses API: `POST /v1/responses` (whole or streamed as typed server-sent
//! events), `GET` and `DELETE /v1/responses/{id}`.
//!
//! A request is read into the same chat conversation, sampling parameters and message reader
//! as `/v1/chat/completions` (so both endpoints give the same text, tool calls and reasoning
//! for the same conversation), and its output is written as Responses output items:
//! `reasoning`, `message` (`output_text`) and `function_call`. One [`OutputItems`] builds
//! them for both forms of the response, so a streamed response's events add up to exactly
//! the object a whole one returns. Responses are kept (`store`, the default) in a bounded
//! in-memory [`ResponseStore`], which `previous_response_id` continues from and `GET` reads.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::stream::{self, Stream, StreamExt};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use specrs_engine::{
    ChatEnding, ChatMessage, Conversation, FinishReason, GenerationRequest, Prompt, RequestFailure, RequestMetrics,
    RequestOutput, TokenLogprob, text_messages,
};

use crate::error::ApiError;
use crate::message::{MessageDelta, MessageReader};
use crate::openai::{SamplingFields, Usage};
use crate::server::{
    AppState, InFlight, admit, chat_logprobs, check_model, collect, failure_type, now_secs, output_events, parse_body,
    penalty_field, reasoning_for, sampling_params, unique_suffix, usage_of,
};
use crate::tools::{CallStream, ToolChoice, ToolRequest};

/// How many responses the server keeps for `previous_response_id` and `GET` (the oldest go
/// first).
pub const STORED_RESPONSES: usize = 1024;

/// The `include` values a request may list.
const LOGPROBS_INCLUDE: &str = "message.output_text.logprobs";
/// Asked for by clients that keep no state (`store: false`); the reasoning comes back as text
/// in the item's `content`, as there is nothing hidden to encrypt.
const ENCRYPTED_REASONING_INCLUDE: &str = "reasoning.encrypted_content";

/// `POST /v1/responses`.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponsesRequest {
    pub model: String,
    /// Text (one user message) or a list of input items.
    pub input: ResponseInput,
    /// A system message put first; not carried over to a response that continues this one.
    pub instructions: Option<String>,
    pub max_output_tokens: Option<usize>,
    pub previous_response_id: Option<String>,
    /// Keep the response for `previous_response_id` and `GET` (the default).
    pub store: Option<bool>,
    /// `{"format": {"type": "text" | "json_object" | "json_schema", ...}}`.
    pub text: Option<Value>,
    /// `{"effort": ..., "summary": ...}`; the effort reaches the chat template as `reasoning_effort`.
    pub reasoning: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    pub top_logprobs: Option<usize>,
    pub include: Option<Vec<String>>,
    pub metadata: Option<Map<String, Value>>,
    pub truncation: Option<String>,
    pub background: Option<bool>,
    pub max_tool_calls: Option<usize>,
    pub conversation: Option<Value>,
    pub prompt: Option<Value>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum ResponseInput {
    Text(String),
    Items(Vec<Value>),
}

fn bad(message: impl Into<String>, field: &str) -> ApiError {
    ApiError::bad_request(message, Some(field))
}

impl ResponsesRequest {
    /// Refuses what this server does not do, naming the field, rather than ignoring it.
    fn check_supported(&self) -> Result<(), ApiError> {
        let f = &self.sampling;
        if f.n.is_some_and(|n| n != 1) || f.best_of.is_some_and(|n| n != 1) {
            let field = if f.n.is_some_and(|n| n != 1) { "n" } else { "best_of" };
            return Err(bad(format!("{field}: a response has one output; send one request per output"), field));
        }
        let refused: [(&str, bool, &str); 6] = [
            ("response_format", f.response_format.is_some(), "send text.format instead (the Responses API's field)"),
            ("prompt_logprobs", f.prompt_logprobs.is_some(), "prompt logprobs are served by /v1/chat/completions"),
            (
                "background",
                self.background == Some(true),
                "background responses are not supported; send background=false and keep the connection (or stream)",
            ),
            (
                "conversation",
                self.conversation.as_ref().is_some_and(|c| !c.is_null()),
                "the Conversations API is not supported; continue a response with previous_response_id",
            ),
            (
                "prompt",
                self.prompt.as_ref().is_some_and(|p| !p.is_null()),
                "stored prompt templates are not supported; send the input",
            ),
            (
                "max_tool_calls",
                self.max_tool_calls.is_some(),
                "is not supported; parallel_tool_calls=false allows one call",
            ),
        ];
        if let Some((field, _, why)) = refused.iter().find(|(_, given, _)| *given) {
            return Err(bad(format!("{field}: {why}"), field));
        }
        match self.truncation.as_deref() {
            None | Some("disabled") => {}
            Some("auto") => {
                return Err(bad(
                    "truncation 'auto' (dropping input items to fit the context) is not supported; send \
                     'disabled' and keep the input within the model's context",
                    "truncation",
                ));
            }
            Some(other) => {
                return Err(bad(format!("truncation must be 'disabled' or 'auto', got '{other}'"), "truncation"));
            }
        }
        for (i, item) in self.include.iter().flatten().enumerate() {
            if item != LOGPROBS_INCLUDE && item != ENCRYPTED_REASONING_INCLUDE {
                return Err(bad(
                    format!("include '{item}' is not supported; this server can include '{LOGPROBS_INCLUDE}'"),
                    &format!("include[{i}]"),
                ));
            }
        }
        if self.top_logprobs.is_some_and(|n| n > 20) {
            return Err(bad("top_logprobs must be at most 20", "top_logprobs"));
        }
        self.metadata.as_ref().map_or(Ok(()), check_metadata)
    }

    /// `Some(top)` when the output's logprobs are asked for, with `top` alternatives each.
    fn logprobs(&self) -> Option<usize> {
        let included = self.include.iter().flatten().any(|i| i == LOGPROBS_INCLUDE);
        (included || self.top_logprobs.is_some_and(|n| n > 0)).then(|| self.top_logprobs.unwrap_or(0))
    }

    /// The chat template's `reasoning_effort`, from `reasoning.effort`.
    fn template_kwargs(&self) -> Result<Map<String, Value>, ApiError> {
        let mut kwargs = Map::new();
        let Some(reasoning) = self.reasoning.as_ref().filter(|r| !r.is_null()) else { return Ok(kwargs) };
        let Some(reasoning) = reasoning.as_object() else {
            return Err(bad("reasoning must be an object: {\"effort\": \"low\" | \"medium\" | \"high\"}", "reasoning"));
        };
        if let Some(effort) = reasoning_effort(reasoning.get("effort"), "reasoning.effort")? {
            kwargs.insert("reasoning_effort".into(), json!(effort));
        }
        Ok(kwargs)
    }
}

/// OpenAI's reasoning effort (`reasoning.effort` here, chat's `reasoning_effort`), checked;
/// `None` when unset.
pub(crate) fn reasoning_effort<'a>(value: Option<&'a Value>, field: &str) -> Result<Option<&'a str>, ApiError> {
    const EFFORTS: [&str; 6] = ["none", "minimal", "low", "medium", "high", "xhigh"];
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(effort)) if EFFORTS.contains(&effort.as_str()) => Ok(Some(effort)),
        Some(other) => Err(bad(format!("{field} must be one of {}; got {other}", EFFORTS.join(", ")), field)),
    }
}

/// OpenAI's limits on `metadata`: at most 16 pairs, keys of at most 64 characters, string
/// values of at most 512 (the response echoes it, and clients index on it).
fn check_metadata(metadata: &Map<String, Value>) -> Result<(), ApiError> {
    const MAX_PAIRS: usize = 16;
    const MAX_KEY_CHARS: usize = 64;
    const MAX_VALUE_CHARS: usize = 512;
    if metadata.len() > MAX_PAIRS {
        return Err(bad(
            format!("metadata holds at most {MAX_PAIRS} key-value pairs, got {}", metadata.len()),
            "metadata",
        ));
    }
    for (key, value) in metadata {
        let field = format!("metadata.{key}");
        if key.chars().count() > MAX_KEY_CHARS {
            return Err(bad(format!("metadata keys are at most {MAX_KEY_CHARS} characters"), &field));
        }
        match value {
            Value::String(s) if s.chars().count() <= MAX_VALUE_CHARS => {}
            Value::String(_) => {
                return Err(bad(format!("metadata values are at most {MAX_VALUE_CHARS} characters"), &field));
            }
            other => {
                return Err(bad(format!("metadata values must be strings; '{key}' holds {other}"), &field));
            }
        }
    }
    Ok(())
}

/// The Responses API's `text.format` as chat's `response_format` (which the sampling reads).
fn chat_response_format(text: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let text = match text {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(text)) => text,
        Some(_) => return Err(bad("text must be an object like {\"format\": {\"type\": \"text\"}}", "text")),
    };
    // A misspelt key would otherwise leave the output unconstrained without a word.
    if let Some(key) = text.keys().find(|k| !["format", "verbosity"].contains(&k.as_str())) {
        return Err(bad(
            format!("text has no field '{key}'; it takes 'format' and 'verbosity'"),
            &format!("text.{key}"),
        ));
    }
    let format = text.get("format").cloned().unwrap_or(Value::Null);
    if format.is_null() {
        return Ok(None);
    }
    let kind = format.get("type").and_then(Value::as_str);
    match kind {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => {
            let schema = format.get("schema").cloned().ok_or_else(|| {
                bad("text.format of type 'json_schema' needs its 'schema' (a JSON schema object)", "text.format.schema")
            })?;
            let mut inner = json!({"schema": schema});
            for key in ["name", "strict", "description"] {
                if let Some(v) = format.get(key) {
                    inner[key] = v.clone();
                }
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": inner})))
        }
        _ => Err(bad(
            "text.format must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": \"json_schema\", \
             \"name\": ..., \"schema\": {...}}",
            "text.format",
        )),
    }
}

/// Responses tools (`{"type": "function", "name", "description", "parameters", "strict"}`) in
/// chat's form (`{"type": "function", "function": {...}}`), which chat templates render.
fn chat_tools(tools: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let list = match tools {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(list)) => list,
        Some(_) => return Err(bad("tools must be a list of {\"type\": \"function\", \"name\": ...}", "tools")),
    };
    let converted = list
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            let field = format!("tools[{i}]");
            match tool.get("type").and_then(Value::as_str) {
                Some("function") => {}
                Some(other) => {
                    return Err(bad(
                        format!("tool type '{other}' is not supported: this server calls functions the client runs"),
                        &format!("{field}.type"),
                    ));
                }
                None => return Err(bad("a tool needs its type ('function')", &format!("{field}.type"))),
            }
            let name = tool
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("a function tool needs its 'name'", &format!("{field}.name")))?;
            let mut function = json!({"name": name});
            for key in ["description", "parameters", "strict"] {
                if let Some(v) = tool.get(key).filter(|v| !v.is_null()) {
                    function[key] = v.clone();
                }
            }
            Ok(json!({"type": "function", "function": function}))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(Value::Array(converted)))
}

/// A Responses `tool_choice` (`"none" | "auto" | "required"` or `{"type": "function", "name"}`)
/// in chat's form.
/// A tool error in the Responses API's own terms: chat's `tools[i].function.x` is
/// `tools[i].x` there, and a named choice is `{"type": "function", "name": ...}`.
fn in_responses_terms(mut e: ApiError) -> ApiError {
    e.param = e.param.map(|p| p.replacen(".function", "", 1));
    e.message = e
        .message
        .replace("{\"type\": \"function\", \"function\": {\"name\": ...}}", "{\"type\": \"function\", \"name\": ...}");
    e
}

fn chat_tool_choice(choice: Option<&Value>) -> Result<Option<Value>, ApiError> {
    match choice {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(json!(s))),
        Some(Value::Object(named)) => match (named.get("type").and_then(Value::as_str), named.get("name")) {
            (Some("function"), Some(Value::String(name))) => {
                Ok(Some(json!({"type": "function", "function": {"name": name}})))
            }
            _ => Err(bad(
                "tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": ...}",
                "tool_choice",
            )),
        },
        Some(_) => Err(bad("tool_choice must be a string or an object", "tool_choice")),
    }
}

/// The text of a message item's `content`: a string, or text parts joined by newlines (as
/// chat messages' parts are).
fn item_text(content: Option<&Value>, field: &str) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, part) in parts.iter().enumerate() {
                let at = format!("{field}[{j}]");
                match part.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text" | "reasoning_text") => texts.push(
                        part.get("text")
                            .and_then(Value::as_str)
                            .ok_or_else(|| bad("a text part needs its 'text'", &format!("{at}.text")))?,
                    ),
                    Some("refusal") => texts.push(part.get("refusal").and_then(Value::as_str).unwrap_or_default()),
                    Some(kind @ ("input_image" | "input_file" | "input_audio")) => {
                        return Err(bad(
                            format!("{kind} parts are not supported: this server runs text models; send input_text"),
                            &format!("{at}.type"),
                        ));
                    }
                    _ => {
                        return Err(bad(
                            "a content part is {\"type\": \"input_text\", \"text\": ...}",
                            &format!("{at}.type"),
                        ));
                    }
                }
            }
            Ok(texts.join("\n"))
        }
        Some(_) => Err(bad("content must be text or a list of content parts", field)),
    }
}

/// The input items as chat messages: messages keep their role; a model's `function_call`
/// items join the assistant turn before them (or start one); `function_call_output` items are
/// tool messages. Reasoning items are left out, as chat templates leave out earlier turns'
/// thinking. `earlier` is the conversation the input continues (a stored response's, or none):
/// an output must answer a call made there or earlier in the input, as OpenAI requires.
fn input_messages(input: &ResponseInput, earlier: &[ChatMessage]) -> Result<Vec<ChatMessage>, ApiError> {
    let items = match input {
        ResponseInput::Text(text) => return Ok(vec![ChatMessage::new("user", text.clone())]),
        ResponseInput::Items(items) => items,
    };
    let mut messages: Vec<ChatMessage> = Vec::with_capacity(items.len());
    // A call's function name by call id, for the tool message that answers it.
    let mut call_names: HashMap<String, String> = earlier_call_names(earlier);
    for (i, item) in items.iter().enumerate() {
        let field = format!("input[{i}]");
        let text_of = |key: &str| item.get(key).and_then(Value::as_str);
        let kind = text_of("type").or(item.get("role").map(|_| "message"));
        match kind {
            Some("message") => {
                let role = text_of("role").ok_or_else(|| bad("a message needs its role", &format!("{field}.role")))?;
                if !["user", "system", "developer", "assistant"].contains(&role) {
                    return Err(bad(
                        format!("role '{role}' is not one of user, system, developer, assistant"),
                        &format!("{field}.role"),
                    ));
                }
                let content = item_text(item.get("content"), &format!("{field}.content"))?;
                messages.push(ChatMessage::new(role, content));
            }
            Some("function_call") => {
                let need = |key: &str| {
                    text_of(key)
                        .ok_or_else(|| bad(format!("a function_call needs its '{key}'"), &format!("{field}.{key}")))
                };
                let (call_id, name, arguments) = (need("call_id")?, need("name")?, need("arguments")?);
                call_names.insert(call_id.to_string(), name.to_string());
                let call =
                    json!({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}});
                match messages.last_mut() {
                    Some(turn) if turn.role == "assistant" => turn.tool_calls.get_or_insert_default().push(call),
                    _ => messages.push(ChatMessage {
                        role: "assistant".into(),
                        content: Value::Null,
                        tool_calls: Some(vec![call]),
                        ..Default::default()
                    }),
                }
            }
            Some("function_call_output") => {
                let call_id = text_of("call_id")
                    .ok_or_else(|| bad("a function_call_output needs its 'call_id'", &format!("{field}.call_id")))?;
                let name = call_names.get(call_id).cloned().ok_or_else(|| {
                    bad(
                        format!(
                            "no function call with call_id '{call_id}' for this output to answer: send the \
                             function_call item before it, or continue the response that made the call with \
                             previous_response_id"
                        ),
                        &format!("{field}.call_id"),
                    )
                })?;
                let output = item_text(item.get("output"), &format!("{field}.output"))?;
                messages.push(ChatMessage {
                    role: "tool".into(),
                    content: Value::String(output),
                    tool_call_id: Some(call_id.to_string()),
                    name: Some(name),
                    ..Default::default()
                });
            }
            Some("reasoning") => {}
            Some(other) => {
                return Err(bad(
                    format!(
                        "input item type '{other}' is not supported; send message, function_call, \
                         function_call_output or reasoning items"
                    ),
                    &format!("{field}.type"),
                ));
            }
            None => return Err(bad("an input item needs its type (or a role, for a message)", &field)),
        }
    }
    Ok(messages)
}

/// The function name of each call the assistant turns of `conversation` made, by call id.
fn earlier_call_names(conversation: &[ChatMessage]) -> HashMap<String, String> {
    conversation
        .iter()
        .flat_map(|turn| turn.tool_calls.iter().flatten())
        .filter_map(|call| {
            let id = call.get("id")?.as_str()?;
            let name = call.get("function")?.get("name")?.as_str()?;
            Some((id.to_string(), name.to_string()))
        })
        .collect()
}

/// The input as OpenAI lists it back: items, each with an id (given, or made here), text input
/// as a user message, and a message's text content as one text part.
fn listed_input_items(input: &ResponseInput) -> Vec<Value> {
    let items = match input {
        ResponseInput::Text(text) => vec![json!({"type": "message", "role": "user", "content": text})],
        ResponseInput::Items(items) => items.clone(),
    };
    items
        .into_iter()
        .map(|mut item| {
            let kind = item.get("type").and_then(Value::as_str).unwrap_or("message").to_string();
            let Some(fields) = item.as_object_mut() else { return item };
            fields.insert("type".into(), json!(kind));
            if let Some(Value::String(text)) = fields.get("content") {
                let part = if fields.get("role").and_then(Value::as_str) == Some("assistant") {
                    "output_text"
                } else {
                    "input_text"
                };
                let content = json!([{"type": part, "text": text}]);
                fields.insert("content".into(), content);
            }
            if !fields.contains_key("id") {
                let prefix = match kind.as_str() {
                    "function_call" => "fc",
                    "function_call_output" => "fco",
                    "reasoning" => "rs",
                    _ => "msg",
                };
                fields.insert("id".into(), json!(item_id(prefix)));
            }
            item
        })
        .collect()
}

/// One item of a response's `output`, as it is being written.
#[derive(Debug, Clone, PartialEq)]
enum Item {
    Reasoning { id: String, text: String },
    Message { id: String, text: String },
    Call { id: String, call_id: String, name: String, arguments: String },
}

impl Item {
    fn id(&self) -> &str {
        match self {
            Self::Reasoning { id, .. } | Self::Message { id, .. } | Self::Call { id, .. } => id,
        }
    }

    /// The item's JSON with `status`; a message's text carries `logprobs`.
    fn to_json(&self, status: &str, logprobs: &[Value]) -> Value {
        match self {
            Self::Reasoning { id, text } => json!({
                "id": id, "type": "reasoning", "status": status, "summary": [],
                "content": [{"type": "reasoning_text", "text": text}],
            }),
            Self::Message { id, text } => json!({
                "id": id, "type": "message", "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}],
            }),
            Self::Call { id, call_id, name, arguments } => json!({
                "id": id, "type": "function_call", "status": status, "call_id": call_id, "name": name,
                "arguments": arguments,
            }),
        }
    }

    /// The item as `response.output_item.added` announces it: no text yet.
    fn opening(&self) -> Value {
        match self {
            Self::Reasoning { id, .. } => {
                json!({"id": id, "type": "reasoning", "status": "in_progress", "summary": [], "content": []})
            }
            Self::Message { id, .. } => {
                json!({"id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": []})
            }
            Self::Call { .. } => {
                let mut item = self.to_json("in_progress", &[]);
                item["arguments"] = json!("");
                item
            }
        }
    }

    /// The content part a reasoning or message item opens with, holding `text`.
    fn part(&self, text: &str, logprobs: &[Value]) -> Option<Value> {
        match self {
            Self::Reasoning { .. } => Some(json!({"type": "reasoning_text", "text": text})),
            Self::Message { .. } => {
                Some(json!({"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}))
            }
            Self::Call { .. } => None,
        }
    }
}

/// One streamed event: its `type` and fields (the sequence number is added when sent).
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseEvent {
    pub kind: &'static str,
    pub body: Value,
}

fn event(kind: &'static str, body: Value) -> ResponseEvent {
    ResponseEvent { kind, body }
}

/// A response's output items, built from the message reader's deltas, with the events that
/// stream them.
///
/// Whitespace before a message's first visible text is held until that text comes: text of
/// only whitespace beside tool calls (a newline before a call marker) is no message, as in chat
/// completions, where it reads as `content: null`.
#[derive(Debug, Default)]
struct OutputItems {
    items: Vec<Item>,
    /// Whether the last item is still being written.
    open: bool,
    held: String,
    /// Item index of each call, by the reader's call index.
    calls: HashMap<usize, usize>,
    /// Logprobs of every output token, for the message's text.
    logprobs: Vec<Value>,
    /// Logprobs not yet sent with a text delta.
    unsent_logprobs: Vec<Value>,
    /// Each closed item as `response.output_item.done` sent it.
    closed: Vec<Value>,
}

impl OutputItems {
    fn push(&mut self, deltas: Vec<MessageDelta>, logprobs: Vec<Value>, out: &mut Vec<ResponseEvent>) {
        self.logprobs.extend(logprobs.iter().cloned());
        self.unsent_logprobs.extend(logprobs);
        for delta in deltas {
            match delta {
                MessageDelta::Reasoning(text) => {
                    if !matches!(self.current(), Some(Item::Reasoning { .. })) {
                        self.open_item(Item::Reasoning { id: item_id("rs"), text: String::new() }, out);
                    }
                    self.append(&text, out);
                }
                MessageDelta::Content(text) => {
                    if matches!(self.current(), Some(Item::Message { .. })) {
                        self.append(&text, out);
                    } else {
                        self.held.push_str(&text);
                        if !self.held.trim().is_empty() {
                            let text = std::mem::take(&mut self.held);
                            self.open_item(Item::Message { id: item_id("msg"), text: String::new() }, out);
                            self.append(&text, out);
                        }
                    }
                }
                MessageDelta::CallStart { index, id, name } => {
                    let item = Item::Call { id: item_id("fc"), call_id: id, name, arguments: String::new() };
                    self.open_item(item, out);
                    self.calls.insert(index, self.items.len() - 1);
                }
                MessageDelta::Arguments { index, text } => {
                    let Some(&at) = self.calls.get(&index) else { continue };
                    if let Item::Call { id, arguments, .. } = &mut self.items[at] {
                        arguments.push_str(&text);
                        out.push(event(
                            "response.function_call_arguments.delta",
                            json!({"item_id": id, "output_index": at, "delta": text}),
                        ));
                    }
                }
            }
        }
    }

    /// Closes the output: held whitespace becomes the message when nothing else was written.
    fn finish(&mut self, status: &str, out: &mut Vec<ResponseEvent>) {
        let wrote = self.items.iter().any(|i| matches!(i, Item::Message { .. } | Item::Call { .. }));
        let held = std::mem::take(&mut self.held);
        if !wrote {
            self.open_item(Item::Message { id: item_id("msg"), text: String::new() }, out);
            self.append(&held, out);
        }
        self.close(status, out);
    }

    fn current(&self) -> Option<&Item> {
        self.items.last().filter(|_| self.open)
    }

    fn open_item(&mut self, item: Item, out: &mut Vec<ResponseEvent>) {
        self.close("completed", out);
        self.held.clear();
        let output_index = self.items.len();
        out.push(event("response.output_item.added", json!({"output_index": output_index, "item": item.opening()})));
        if let Some(part) = item.part("", &[]) {
            out.push(event(
                "response.content_part.added",
                json!({"item_id": item.id(), "output_index": output_index, "content_index": 0, "part": part}),
            ));
        }
        self.items.push(item);
        self.open = true;
    }

    /// Adds text to the open reasoning or message item.
    fn append(&mut self, text: &str, out: &mut Vec<ResponseEvent>) {
        let output_index = self.items.len() - 1;
        let logprobs = std::mem::take(&mut self.unsent_logprobs);
        match self.items.last_mut() {
            Some(Item::Reasoning { id, text: all }) if !text.is_empty() => {
                all.push_str(text);
                out.push(event(
                    "response.reasoning_text.delta",
                    json!({"item_id": id, "output_index": output_index, "content_index": 0, "delta": text}),
                ));
                self.unsent_logprobs = logprobs;
            }
            Some(Item::Message { id, text: all }) if !text.is_empty() => {
                all.push_str(text);
                out.push(event(
                    "response.output_text.delta",
                    json!({"item_id": id, "output_index": output_index, "content_index": 0, "delta": text,
                           "logprobs": logprobs}),
                ));
            }
            _ => self.unsent_logprobs = logprobs,
        }
    }

    fn close(&mut self, status: &str, out: &mut Vec<ResponseEvent>) {
        if !self.open {
            return;
        }
        self.open = false;
        let output_index = self.items.len() - 1;
        let item = &self.items[output_index];
        let id = item.id();
        match item {
            Item::Reasoning { text, .. } => out.push(event(
                "response.reasoning_text.done",
                json!({"item_id": id, "output_index": output_index, "content_index": 0, "text": text}),
            )),
            Item::Message { text, .. } => out.push(event(
                "response.output_text.done",
                json!({"item_id": id, "output_index": output_index, "content_index": 0, "text": text,
                       "logprobs": self.logprobs}),
            )),
            Item::Call { name, arguments, .. } => out.push(event(
                "response.function_call_arguments.done",
                json!({"item_id": id, "output_index": output_index, "name": name, "arguments": arguments}),
            )),
        }
        let text = match item {
            Item::Reasoning { text, .. } | Item::Message { text, .. } => text.as_str(),
            Item::Call { .. } => "",
        };
        if let Some(part) = item.part(text, &self.logprobs) {
            out.push(event(
                "response.content_part.done",
                json!({"item_id": id, "output_index": output_index, "content_index": 0, "part": part}),
            ));
        }
        let done = item.to_json(status, &self.logprobs);
        out.push(event("response.output_item.done", json!({"output_index": output_index, "item": done})));
        self.closed.push(done);
    }

    /// The `output` list of the finished response: each item as it closed (the last with the
    /// response's status, those before it completed).
    fn to_json(&self) -> Vec<Value> {
        self.closed.clone()
    }

    /// The assistant turn these items make, for a response that continues this one.
    fn assistant_message(&self) -> ChatMessage {
        let mut message = ChatMessage::new("assistant", "");
        let mut text = String::new();
        for item in &self.items {
            match item {
                Item::Message { text: t, .. } => text.push_str(t),
                Item::Call { call_id, name, arguments, .. } => {
                    message.tool_calls.get_or_insert_default().push(json!({
                        "id": call_id, "type": "function", "function": {"name": name, "arguments": arguments},
                    }));
                }
                Item::Reasoning { .. } => {}
            }
        }
        message.content = if text.is_empty() && message.tool_calls.is_some() { Value::Null } else { json!(text) };
        message
    }

    fn reasoning_text(&self) -> String {
        self.items
            .iter()
            .filter_map(|i| match i {
                Item::Reasoning { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// Refuses to continue a stored response whose output ends in a function call cut short
/// (`max_output_tokens` stopped it inside the arguments): no chat template can render its
/// arguments, and the client cannot mend what the server stored.
fn check_continuable(id: &str, response: &Value) -> Result<(), ApiError> {
    let cut = response["output"].as_array().into_iter().flatten().find(|item| {
        item["type"] == "function_call"
            && item["arguments"].as_str().is_none_or(|a| serde_json::from_str::<Value>(a).is_err())
    });
    match cut {
        Some(call) => Err(bad(
            format!(
                "response {id} ended inside function call {}: its arguments are not a whole JSON object \
                 (max_output_tokens cut them short, or the model wrote them broken), so it cannot be continued; \
                 send its input again (with a larger max_output_tokens if it was cut)",
                call["call_id"]
            ),
            "previous_response_id",
        )),
        None => Ok(()),
    }
}

/// `{prefix}_{unique}`, as OpenAI names responses and their items.
fn item_id(prefix: &str) -> String {
    format!("{prefix}_{}", unique_suffix())
}

/// The response's status and, where it did not complete, why.
fn status_of(reason: FinishReason) -> (&'static str, Value) {
    match reason {
        FinishReason::Stop => ("completed", Value::Null),
        FinishReason::Length => ("incomplete", json!({"reason": "max_output_tokens"})),
        FinishReason::Abort => ("cancelled", Value::Null),
        FinishReason::Error => ("failed", Value::Null),
    }
}

/// The Responses API's `usage`, with the speculative statistics chat completions report.
fn responses_usage(usage: Usage, reasoning_tokens: usize) -> Value {
    let mut out = json!({
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.prompt_tokens_details.map_or(0, |d| d.cached_tokens)},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": usage.total_tokens,
    });
    if let Some(spec) = usage.spec_decode {
        out["spec_decode"] = serde_json::to_value(spec).unwrap_or(Value::Null);
    }
    out
}

/// A stored response and the conversation a response continuing it starts from.
#[derive(Debug, Clone)]
struct Stored {
    response: Value,
    /// The input's messages (instructions aside) and the response's assistant turn.
    conversation: Vec<ChatMessage>,
    /// The request's own input items, each with an id (`GET .../input_items`).
    input_items: Vec<Value>,
}

/// The server's kept responses, oldest evicted first beyond its capacity.
#[derive(Debug)]
pub struct ResponseStore {
    capacity: usize,
    entries: Mutex<(HashMap<String, Stored>, VecDeque<String>)>,
}

impl Default for ResponseStore {
    fn default() -> Self {
        Self::with_capacity(STORED_RESPONSES)
    }
}

impl ResponseStore {
    pub fn with_capacity(capacity: usize) -> Self {
        Self { capacity, entries: Mutex::new((HashMap::new(), VecDeque::new())) }
    }

    fn insert(&self, id: String, stored: Stored) {
        let mut guard = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (map, order) = &mut *guard;
        if map.insert(id.clone(), stored).is_none() {
            order.push_back(id);
        }
        while order.len() > self.capacity {
            if let Some(oldest) = order.pop_front() {
                map.remove(&oldest);
            }
        }
    }

    fn get(&self, id: &str) -> Option<Stored> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).0.get(id).cloned()
    }

    fn remove(&self, id: &str) -> bool {
        let mut guard = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (map, order) = &mut *guard;
        order.retain(|k| k != id);
        map.remove(id).is_some()
    }

    pub fn len(&self) -> usize {
        self.entries.lock().unwrap_or_else(|e| e.into_inner()).0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn not_found(id: &str, field: Option<&str>) -> ApiError {
    let message = format!(
        "no stored response with id '{id}': it was never made, was made with store=false, was deleted, or is \
         older than the {STORED_RESPONSES} responses this server keeps"
    );
    let mut e = ApiError::status(StatusCode::NOT_FOUND, message);
    e.param = field.map(str::to_string);
    e.with_code("response_not_found")
}

/// Everything a response needs besides its output, read from the request.
struct Pending {
    /// The response object so far: the request's settings echoed, `output` empty.
    base: Value,
    store: bool,
    /// The conversation (instructions aside), for the stored response.
    conversation: Vec<ChatMessage>,
    input_items: Vec<Value>,
    logprobs: bool,
}

impl Pending {
    /// The finished response object.
    fn finish(&self, items: &OutputItems, reason: FinishReason, usage: Value, error: Option<&RequestFailure>) -> Value {
        let (status, incomplete) = status_of(reason);
        let mut response = self.base.clone();
        response["status"] = json!(status);
        response["incomplete_details"] = incomplete;
        response["output"] = Value::Array(items.to_json());
        response["usage"] = usage;
        if let Some(failure) = error {
            response["error"] = json!({"code": failure_type(failure), "message": failure.message});
        }
        response
    }

    fn store(&self, state: &AppState, response: &Value, items: &OutputItems) {
        if !self.store || response["status"] == "failed" {
            return;
        }
        let mut conversation = self.conversation.clone();
        conversation.push(items.assistant_message());
        let id = response["id"].as_str().unwrap_or_default().to_string();
        let input_items = self.input_items.clone();
        state.responses.insert(id, Stored { response: response.clone(), conversation, input_items });
    }
}

/// `POST /v1/responses`.
pub(crate) async fn create_response(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ResponsesRequest = parse_body(body)?;
    check_model(&state, &req.model)?;
    req.check_supported()?;
    let mut conversation = match &req.previous_response_id {
        Some(id) => {
            let stored = state.responses.get(id).ok_or_else(|| not_found(id, Some("previous_response_id")))?;
            check_continuable(id, &stored.response)?;
            stored.conversation
        }
        None => Vec::new(),
    };
    let input = input_messages(&req.input, &conversation)?;
    conversation.extend(input);
    if conversation.is_empty() {
        return Err(bad("input must hold at least one item", "input"));
    }
    let mut messages: Vec<ChatMessage> =
        req.instructions.iter().map(|i| ChatMessage::new("system", i.clone())).collect();
    messages.extend(conversation.iter().cloned());
    let messages = text_messages(&messages).map_err(|e| bad(e.to_string(), "input"))?;

    let chat_tools = chat_tools(req.sampling.tools.as_ref())?;
    let chat_choice = chat_tool_choice(req.sampling.tool_choice.as_ref())?;
    let tools =
        ToolRequest::parse(chat_tools.as_ref(), chat_choice.as_ref(), req.parallel_tool_calls, state.auto_tool_parser)
            .map_err(in_responses_terms)?;
    let fields = SamplingFields {
        response_format: chat_response_format(req.text.as_ref())?,
        tools: chat_tools,
        tool_choice: chat_choice,
        ..req.sampling.clone()
    };
    let top = req.logprobs();
    let mut params = sampling_params(&fields, req.max_output_tokens, "max_output_tokens", top, &state, tools.as_ref())
        .map_err(|mut e| {
            if e.param.as_deref() == Some("response_format") {
                e.param = Some("text.format".into());
            }
            e
        })?;
    if req.sampling.skip_special_tokens.is_none()
        && state.reasoning_parser.is_some_and(crate::reasoning::ReasoningParser::keeps_special_tokens)
    {
        params.skip_special_tokens = false;
    }
    let conversation_prompt = Conversation {
        messages,
        ending: ChatEnding::default(),
        tools: tools
            .as_ref()
            .filter(|t| !(state.exclude_tools_when_tool_choice_none && t.choice == ToolChoice::None))
            .map(|t| t.tools.clone()),
        chat_template: state.chat_template.clone(),
        chat_template_kwargs: req.template_kwargs()?,
    };
    let reasoning = reasoning_for(&state, &conversation_prompt, params.structured_outputs.is_some());
    let calls = tools.as_ref().map_or_else(CallStream::text, ToolRequest::call_stream);
    let id = item_id("resp");
    let base = json!({
        "id": id, "object": "response", "created_at": now_secs(), "status": "in_progress", "background": false,
        "error": null, "incomplete_details": null, "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": null, "metadata": req.metadata.clone().unwrap_or_default(), "model": req.model,
        "output": [], "parallel_tool_calls": req.parallel_tool_calls.unwrap_or(true),
        "previous_response_id": req.previous_response_id, "reasoning": req.reasoning.clone().unwrap_or(json!({"effort": null, "summary": null})),
        "store": req.store.unwrap_or(true), "temperature": params.temperature, "text": req.text.clone().unwrap_or(json!({"format": {"type": "text"}})),
        "tool_choice": req.sampling.tool_choice.clone().unwrap_or(json!("auto")), "tools": req.sampling.tools.clone().unwrap_or(json!([])),
        "top_logprobs": req.top_logprobs.unwrap_or(0), "top_p": params.top_p, "truncation": "disabled", "usage": null,
        "user": req.sampling.user,
    });
    let pending = Pending {
        base,
        store: req.store.unwrap_or(true),
        conversation,
        input_items: listed_input_items(&req.input),
        logprobs: top.is_some(),
    };
    let reader = MessageReader::new(reasoning, true, calls);
    let guards = admit(&state, 1, "input")?;
    let mut request = GenerationRequest::new(Prompt::Chat(conversation_prompt), params);
    request.trace = req.sampling.trace.unwrap_or(false);
    let penalty = penalty_field(&req.sampling);
    let (_, stream) = state.handle.submit_async(request).await.map_err(|e| {
        ApiError::from_engine(e, "input").for_penalty(penalty).for_max_tokens_field("max_output_tokens")
    })?;
    if req.sampling.stream.unwrap_or(false) {
        let events = response_stream(state, stream, pending, reader, guards);
        return Ok(Sse::new(events).keep_alive(KeepAlive::default()).into_response());
    }
    let outs = collect(stream).await?;
    drop(guards);
    let out = &outs[0];
    let mut items = OutputItems::default();
    let logprobs = if pending.logprobs { token_logprobs(&state, &out.logprobs) } else { Vec::new() };
    let mut ignored = Vec::new();
    let deltas = reader.read_whole(&out.text);
    items.push(deltas, logprobs, &mut ignored);
    let (status, _) = status_of(out.finish_reason);
    items.finish(status, &mut ignored);
    let usage = output_usage(&state, &items, out.num_prompt_tokens, out.token_ids.len(), Some(&out.metrics));
    let response = pending.finish(&items, out.finish_reason, usage, None);
    pending.store(&state, &response, &items);
    Ok(axum::Json(response).into_response())
}

fn output_usage(
    state: &AppState,
    items: &OutputItems,
    prompt_tokens: usize,
    output_tokens: usize,
    metrics: Option<&RequestMetrics>,
) -> Value {
    let mut usage = usage_of(prompt_tokens, output_tokens, metrics);
    usage.prompt_tokens_details =
        Some(crate::openai::PromptTokensDetails { cached_tokens: metrics.map_or(0, |m| m.num_cached_tokens) });
    let reasoning = items.reasoning_text();
    let reasoning_tokens = if reasoning.is_empty() {
        0
    } else {
        state.handle.tokenizer().encode(&reasoning, false).map_or(0, |t| t.len())
    };
    responses_usage(usage, reasoning_tokens)
}

/// Output-token logprobs in the Responses form (chat's `logprobs.content` entries).
fn token_logprobs(state: &AppState, lps: &[TokenLogprob]) -> Vec<Value> {
    match chat_logprobs(state, lps).get_mut("content").map(Value::take) {
        Some(Value::Array(entries)) => entries,
        _ => Vec::new(),
    }
}

fn sse_event(e: &ResponseEvent, sequence_number: &mut usize) -> Event {
    let mut body = json!({"type": e.kind, "sequence_number": *sequence_number});
    if let (Some(out), Value::Object(fields)) = (body.as_object_mut(), &e.body) {
        out.extend(fields.clone());
    }
    *sequence_number += 1;
    Event::default().event(e.kind).data(body.to_string())
}

fn response_stream(
    state: Arc<AppState>,
    stream: specrs_engine::request::OutputStream,
    pending: Pending,
    mut reader: MessageReader,
    guards: Vec<InFlight>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let mut sequence_number = 0;
    let mut items = OutputItems::default();
    let mut generated = 0;
    let opening = vec![
        event("response.created", json!({"response": pending.base})),
        event("response.in_progress", json!({"response": pending.base})),
    ];
    let body = output_events(stream).map(move |o: RequestOutput| {
        let mut out = Vec::new();
        let logprobs = if pending.logprobs { token_logprobs(&state, &o.logprobs) } else { Vec::new() };
        generated += o.token_ids.len();
        let mut deltas = reader.push(&o.text);
        if let Some(reason) = o.finish_reason {
            deltas.extend(reader.finish());
            items.push(deltas, logprobs, &mut out);
            let (status, _) = status_of(reason);
            items.finish(status, &mut out);
            let output_tokens = o.metrics.as_ref().map_or(generated, |m| m.num_generated_tokens);
            let usage = output_usage(&state, &items, o.num_prompt_tokens, output_tokens, o.metrics.as_ref());
            let response = pending.finish(&items, reason, usage, o.error.as_ref());
            pending.store(&state, &response, &items);
            let kind = match status {
                "completed" => "response.completed",
                "incomplete" => "response.incomplete",
                "cancelled" => "response.cancelled",
                _ => "response.failed",
            };
            out.push(event(kind, json!({"response": response})));
        } else {
            items.push(deltas, logprobs, &mut out);
        }
        out
    });
    let _guards = guards;
    stream::iter(opening).chain(body.flat_map(stream::iter)).map(move |e| {
        let _ = &_guards;
        Ok(sse_event(&e, &mut sequence_number))
    })
}

/// `GET /v1/responses/{id}`.
pub(crate) async fn retrieve_response(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let stored = state.responses.get(&id).ok_or_else(|| not_found(&id, None))?;
    Ok(axum::Json(stored.response).into_response())
}

/// `GET /v1/responses/{id}/input_items`'s query.
#[derive(Debug, Deserialize)]
pub(crate) struct ListQuery {
    after: Option<String>,
    limit: Option<usize>,
    order: Option<String>,
}

/// `GET /v1/responses/{id}/input_items`: a page of the response's input items, newest first
/// unless `order=asc`, `limit` (1–100, default 20) after the item `after`.
pub(crate) async fn list_input_items(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| bad(format!("bad query string: {}", e.body_text()), "query"))?;
    let stored = state.responses.get(&id).ok_or_else(|| not_found(&id, None))?;
    Ok(axum::Json(input_items_page(stored.input_items, &query)?).into_response())
}

fn input_items_page(mut items: Vec<Value>, query: &ListQuery) -> Result<Value, ApiError> {
    let limit = query.limit.unwrap_or(20);
    if !(1..=100).contains(&limit) {
        return Err(bad(format!("limit must be between 1 and 100, got {limit}"), "limit"));
    }
    match query.order.as_deref() {
        None | Some("desc") => items.reverse(),
        Some("asc") => {}
        Some(other) => return Err(bad(format!("order must be 'asc' or 'desc', got '{other}'"), "order")),
    }
    let start = match &query.after {
        None => 0,
        Some(after) => items
            .iter()
            .position(|i| i["id"] == after.as_str())
            .map(|at| at + 1)
            .ok_or_else(|| bad(format!("after names no input item of this response: '{after}'"), "after"))?,
    };
    let page: Vec<Value> = items.iter().skip(start).take(limit).cloned().collect();
    Ok(json!({
        "object": "list",
        "first_id": page.first().map(|i| i["id"].clone()),
        "last_id": page.last().map(|i| i["id"].clone()),
        "has_more": start + page.len() < items.len(),
        "data": page,
    }))
}

/// `DELETE /v1/responses/{id}`.
pub(crate) async fn delete_response(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    if !state.responses.remove(&id) {
        return Err(not_found(&id, None));
    }
    Ok(axum::Json(json!({"id": id, "object": "response", "deleted": true})).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(value: Value) -> ResponseInput {
        ResponseInput::Items(value.as_array().unwrap().clone())
    }

    #[test]
    fn input_items_become_the_chat_turns_they_stand_for() {
        let input = items(json!([
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in"}, {"type": "input_text", "text": "Oslo?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Need a call."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"},
            {"type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "12 C"},
            {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "noon"}]},
        ]));
        let messages = input_messages(&input, &[]).unwrap();
        let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(
            roles,
            ["developer", "user", "assistant", "tool", "tool"],
            "reasoning left out, calls join the turn"
        );
        assert_eq!(messages[1].content, json!("Weather in\nOslo?"), "parts joined as chat parts are");
        assert_eq!(messages[2].content, json!("Checking."));
        let calls = messages[2].tool_calls.as_ref().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(
            calls[0],
            json!({"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}})
        );
        assert_eq!(
            (messages[3].tool_call_id.as_deref(), messages[3].name.as_deref()),
            (Some("call_1"), Some("get_weather"))
        );
        assert_eq!((messages[4].content.clone(), messages[4].name.as_deref()), (json!("noon"), Some("get_time")));

        let text = input_messages(&ResponseInput::Text("Hi".into()), &[]).unwrap();
        assert_eq!(text, vec![ChatMessage::new("user", "Hi")]);
        let bare_call = input_messages(
            &items(json!([
                {"role": "user", "content": "Go"},
                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
            ])),
            &[],
        )
        .unwrap();
        assert_eq!(
            (bare_call[1].role.as_str(), &bare_call[1].content),
            ("assistant", &Value::Null),
            "a call opens a turn"
        );
    }

    #[test]
    fn input_items_spec_rs_cannot_serve_are_refused_naming_where() {
        let cases = [
            (
                json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
                "input[0].content[0].type",
            ),
            (json!([{"role": "wizard", "content": "hi"}]), "input[0].role"),
            (json!([{"role": "user", "content": "hi"}, {"type": "web_search_call", "id": "ws"}]), "input[1].type"),
            (json!([{"type": "function_call", "call_id": "c", "name": "f"}]), "input[0].arguments"),
            (json!([{"type": "function_call_output", "output": "x"}]), "input[0].call_id"),
            (json!([{"type": "function_call_output", "call_id": "nowhere", "output": "x"}]), "input[0].call_id"),
            (
                json!([
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "C", "output": "x"},
                ]),
                "input[1].call_id",
            ),
            (json!([{"content": "no role or type"}]), "input[0]"),
            (json!([{"role": "user", "content": 7}]), "input[0].content"),
        ];
        for (input, field) in cases {
            let e = input_messages(&items(input.clone()), &[]).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{input}: {}", e.message);
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn an_output_answering_a_stored_call_is_named_after_its_function() {
        let earlier = vec![
            ChatMessage::new("user", "Weather in Oslo?"),
            ChatMessage {
                role: "assistant".into(),
                content: Value::Null,
                tool_calls: Some(vec![
                    json!({"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}),
                ]),
                ..Default::default()
            },
        ];
        let answer = items(json!([{"type": "function_call_output", "call_id": "call_9", "output": "12 C"}]));
        let messages = input_messages(&answer, &earlier).unwrap();
        assert_eq!(
            (messages[0].role.as_str(), messages[0].tool_call_id.as_deref(), messages[0].name.as_deref()),
            ("tool", Some("call_9"), Some("get_weather"))
        );
        let e = input_messages(&answer, &earlier[..1]).unwrap_err();
        assert!(e.message.contains("previous_response_id"), "{}", e.message);
    }

    #[test]
    fn tools_and_tool_choice_take_chats_form() {
        let tools = json!([{"type": "function", "name": "get_weather", "description": "Weather.", "parameters": {"type": "object"}, "strict": true}]);
        assert_eq!(
            chat_tools(Some(&tools)).unwrap().unwrap(),
            json!([{"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": {"type": "object"}, "strict": true}}])
        );
        let e = chat_tools(Some(&json!([{"type": "web_search"}]))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].type"));
        let e = chat_tools(Some(&json!([{"type": "function"}]))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].name"));
        assert_eq!(
            chat_tool_choice(Some(&json!({"type": "function", "name": "f"}))).unwrap(),
            Some(json!({"type": "function", "function": {"name": "f"}}))
        );
        assert_eq!(chat_tool_choice(Some(&json!("required"))).unwrap(), Some(json!("required")));
        assert!(chat_tool_choice(Some(&json!({"type": "allowed_tools", "tools": []}))).is_err());
    }

    #[test]
    fn a_response_cut_inside_a_call_cannot_be_continued() {
        let response = |arguments: &str| {
            json!({"status": "incomplete", "output": [
                {"type": "message", "content": [{"type": "output_text", "text": "Checking."}]},
                {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": arguments},
            ]})
        };
        assert!(check_continuable("resp_1", &response(r#"{"city": "Oslo"}"#)).is_ok());
        for cut in ["", r#"{"city": "Os"#] {
            let e = check_continuable("resp_1", &response(cut)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("previous_response_id"));
            assert!(e.message.contains("resp_1") && e.message.contains("call_1"), "{}", e.message);
        }
        assert!(check_continuable("resp_2", &json!({"status": "completed", "output": []})).is_ok());
    }

    #[test]
    fn tool_errors_name_the_responses_fields() {
        let parse = |tools: Value, choice: Option<Value>| {
            let tools = chat_tools(Some(&tools)).unwrap();
            let choice = chat_tool_choice(choice.as_ref()).unwrap();
            ToolRequest::parse(tools.as_ref(), choice.as_ref(), None, Some(crate::tools::ToolCallParser::Hermes))
                .map_err(in_responses_terms)
                .unwrap_err()
        };
        let named = |name: &str| json!([{"type": "function", "name": name}]);
        assert_eq!(parse(named("get weather"), None).param.as_deref(), Some("tools[0].name"));
        let schema_not_object = json!([{"type": "function", "name": "f", "parameters": "x"}]);
        assert_eq!(parse(schema_not_object, None).param.as_deref(), Some("tools[0].parameters"));
        let e = parse(named("f"), Some(json!("bogus")));
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        assert!(e.message.contains(r#"{"type": "function", "name": ...}"#), "{}", e.message);
    }

    #[test]
    fn text_format_is_chats_response_format() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let format = json!({"format": {"type": "json_schema", "name": "thing", "schema": schema, "strict": true}});
        assert_eq!(
            chat_response_format(Some(&format)).unwrap(),
            Some(json!({"type": "json_schema", "json_schema": {"name": "thing", "schema": schema, "strict": true}}))
        );
        assert_eq!(chat_response_format(Some(&json!({"format": {"type": "text"}}))).unwrap(), None);
        assert_eq!(
            chat_response_format(Some(&json!({"format": {"type": "json_object"}}))).unwrap(),
            Some(json!({"type": "json_object"}))
        );
        let e = chat_response_format(Some(&json!({"format": {"type": "json_schema", "name": "x"}}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("text.format.schema"));
        assert_eq!(
            chat_response_format(Some(&json!({"format": {"type": "yaml"}}))).unwrap_err().param.as_deref(),
            Some("text.format")
        );
        // Shapes that would leave the output unconstrained without a word.
        for (text, param) in [
            (json!("json_object"), "text"),
            (json!({"fromat": {"type": "json_object"}}), "text.fromat"),
            (json!({"format": "json_object"}), "text.format"),
        ] {
            assert_eq!(chat_response_format(Some(&text)).unwrap_err().param.as_deref(), Some(param), "{text}");
        }
        assert_eq!(chat_response_format(Some(&json!({"verbosity": "low"}))).unwrap(), None);
    }

    fn request(body: Value) -> ResponsesRequest {
        let mut full = json!({"model": "m", "input": "hi"});
        full.as_object_mut().unwrap().extend(body.as_object().unwrap().clone());
        serde_json::from_value(full).unwrap()
    }

    #[test]
    fn unsupported_request_fields_are_refused_by_name() {
        for (body, field) in [
            (json!({"background": true}), "background"),
            (json!({"n": 2}), "n"),
            (json!({"response_format": {"type": "json_object"}}), "response_format"),
            (json!({"truncation": "auto"}), "truncation"),
            (json!({"include": ["message.output_text.logprobs", "file_search_call.results"]}), "include[1]"),
            (json!({"top_logprobs": 21}), "top_logprobs"),
            (json!({"max_tool_calls": 2}), "max_tool_calls"),
            (json!({"conversation": "conv_1"}), "conversation"),
            (json!({"metadata": {"k": {"nested": 1}}}), "metadata.k"),
            (json!({"metadata": {"k": "v".repeat(513)}}), "metadata.k"),
            (json!({"metadata": {"k".repeat(65): "v"}}), &*format!("metadata.{}", "k".repeat(65))),
            (json!({"metadata": (0..17).map(|i| (i.to_string(), json!("v"))).collect::<Map<_, _>>()}), "metadata"),
        ] {
            let e = request(body.clone()).check_supported().unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{body}: {}", e.message);
        }
        let fine =
            request(json!({"truncation": "disabled", "background": false, "include": ["reasoning.encrypted_content"],
                                  "metadata": {"user": "u-1"}}));
        assert!(fine.check_supported().is_ok());
        assert_eq!(fine.logprobs(), None);
        assert_eq!(request(json!({"include": ["message.output_text.logprobs"]})).logprobs(), Some(0));
        assert_eq!(request(json!({"top_logprobs": 3})).logprobs(), Some(3));
        let effort = request(json!({"reasoning": {"effort": "low", "summary": "auto"}})).template_kwargs().unwrap();
        assert_eq!(effort.get("reasoning_effort"), Some(&json!("low")));
        let e = request(json!({"reasoning": {"effort": "max"}})).template_kwargs().unwrap_err();
        assert_eq!(e.param.as_deref(), Some("reasoning.effort"));
    }

    /// Replays a stream's events into the `output` they describe, checking their order.
    fn replay(events: &[ResponseEvent]) -> Vec<Value> {
        let mut output: Vec<Value> = Vec::new();
        let mut open: Option<usize> = None;
        for e in events {
            let b = &e.body;
            match e.kind {
                "response.output_item.added" => {
                    assert_eq!(open, None, "an item opens after the last one closed");
                    assert_eq!(b["output_index"], output.len());
                    assert_eq!(b["item"]["status"], "in_progress");
                    output.push(b["item"].clone());
                    open = Some(output.len() - 1);
                }
                "response.content_part.added" => {
                    let at = open.unwrap();
                    assert_eq!(b["item_id"], output[at]["id"]);
                    output[at]["content"] = json!([b["part"]]);
                }
                "response.output_text.delta" | "response.reasoning_text.delta" => {
                    let at = open.unwrap();
                    assert_eq!((b["output_index"].as_u64(), &b["item_id"]), (Some(at as u64), &output[at]["id"]));
                    let text = format!(
                        "{}{}",
                        output[at]["content"][0]["text"].as_str().unwrap(),
                        b["delta"].as_str().unwrap()
                    );
                    output[at]["content"][0]["text"] = json!(text);
                }
                "response.function_call_arguments.delta" => {
                    let at = b["output_index"].as_u64().unwrap() as usize;
                    let text = format!("{}{}", output[at]["arguments"].as_str().unwrap(), b["delta"].as_str().unwrap());
                    output[at]["arguments"] = json!(text);
                }
                "response.output_text.done" | "response.reasoning_text.done" => {
                    assert_eq!(b["text"], output[open.unwrap()]["content"][0]["text"], "done repeats the deltas");
                }
                "response.function_call_arguments.done" => {
                    assert_eq!(b["arguments"], output[open.unwrap()]["arguments"]);
                }
                "response.content_part.done" => {
                    assert_eq!(b["part"]["text"], output[open.unwrap()]["content"][0]["text"])
                }
                "response.output_item.done" => {
                    let at = open.take().unwrap();
                    assert_eq!(b["output_index"], at);
                    output[at] = b["item"].clone();
                }
                other => panic!("unexpected event {other}"),
            }
        }
        assert_eq!(open, None, "every item closed");
        output
    }

    fn build(pieces: Vec<Vec<MessageDelta>>, status: &str) -> (OutputItems, Vec<ResponseEvent>) {
        let mut items = OutputItems::default();
        let mut events = Vec::new();
        for deltas in pieces {
            items.push(deltas, Vec::new(), &mut events);
        }
        items.finish(status, &mut events);
        (items, events)
    }

    fn without_ids(mut items: Vec<Value>) -> Vec<Value> {
        for item in &mut items {
            item.as_object_mut().unwrap().remove("id");
        }
        items
    }

    #[test]
    fn streamed_events_add_up_to_the_output_a_whole_response_returns() {
        use MessageDelta::*;
        let pieces = vec![
            vec![Reasoning("Need ".into())],
            vec![Reasoning("weather.".into()), Content("\n".into())],
            vec![CallStart { index: 0, id: "call_a".into(), name: "get_weather".into() }],
            vec![Arguments { index: 0, text: "{\"city\": ".into() }, Arguments { index: 0, text: "\"Oslo\"}".into() }],
            vec![Content("\n\n".into()), Content("Done".into()), Content(".".into())],
        ];
        let (items, events) = build(pieces.clone(), "completed");
        let output = items.to_json();
        assert_eq!(replay(&events), output);
        assert_eq!(
            without_ids(output.clone()),
            vec![
                json!({"type": "reasoning", "status": "completed", "summary": [], "content": [{"type": "reasoning_text", "text": "Need weather."}]}),
                json!({"type": "function_call", "status": "completed", "call_id": "call_a", "name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}),
                json!({"type": "message", "status": "completed", "role": "assistant", "content": [{"type": "output_text", "text": "\n\nDone.", "annotations": [], "logprobs": []}]}),
            ],
            "the newline before the call is no message; text after it is one"
        );
        // The same deltas pushed at once (a whole response) give the same items.
        let (whole, _) = build(vec![pieces.into_iter().flatten().collect()], "completed");
        assert_eq!(without_ids(whole.to_json()), without_ids(output));
        let turn = items.assistant_message();
        assert_eq!(turn.content, json!("\n\nDone."));
        assert_eq!(turn.tool_calls.unwrap()[0]["function"]["arguments"], "{\"city\": \"Oslo\"}");
    }

    #[test]
    fn an_incomplete_response_marks_only_its_last_item_incomplete_in_events_and_output() {
        use MessageDelta::*;
        let (items, events) = build(vec![vec![Reasoning("Hm.".into())], vec![Content("Cut sh".into())]], "incomplete");
        let output = items.to_json();
        assert_eq!(replay(&events), output);
        let statuses: Vec<&str> = output.iter().map(|i| i["status"].as_str().unwrap()).collect();
        assert_eq!(statuses, ["completed", "incomplete"]);
    }

    #[test]
    fn an_output_with_no_text_and_no_calls_is_one_empty_message() {
        let (items, events) = build(vec![vec![MessageDelta::Content("  ".into())]], "incomplete");
        let output = items.to_json();
        assert_eq!(replay(&events), output);
        assert_eq!(output.len(), 1);
        assert_eq!((output[0]["type"].as_str(), output[0]["status"].as_str()), (Some("message"), Some("incomplete")));
        assert_eq!(output[0]["content"][0]["text"], "  ");
        let (empty, _) = build(vec![], "completed");
        assert_eq!(empty.to_json()[0]["content"][0]["text"], "");
        assert_eq!(empty.assistant_message().content, json!(""));
    }

    #[test]
    fn logprobs_ride_the_next_text_delta_and_the_whole_text() {
        let mut items = OutputItems::default();
        let mut events = Vec::new();
        let lp = |t: &str| json!({"token": t, "logprob": -0.5, "bytes": t.as_bytes(), "top_logprobs": []});
        items.push(vec![MessageDelta::Content(" ".into())], vec![lp(" ")], &mut events);
        items.push(vec![MessageDelta::Content("Hi".into())], vec![lp("Hi")], &mut events);
        items.finish("completed", &mut events);
        let deltas: Vec<&Value> =
            events.iter().filter(|e| e.kind == "response.output_text.delta").map(|e| &e.body).collect();
        assert_eq!(deltas.len(), 1);
        assert_eq!((deltas[0]["delta"].as_str(), deltas[0]["logprobs"].as_array().unwrap().len()), (Some(" Hi"), 2));
        assert_eq!(items.to_json()[0]["content"][0]["logprobs"], json!([lp(" "), lp("Hi")]));
    }

    #[test]
    fn the_store_keeps_the_newest_responses_up_to_its_capacity() {
        let store = ResponseStore::with_capacity(2);
        let stored = |n: u64| Stored {
            response: json!({"n": n}),
            conversation: vec![ChatMessage::new("user", "x")],
            input_items: vec![],
        };
        for (i, id) in ["a", "b", "c"].iter().enumerate() {
            store.insert(id.to_string(), stored(i as u64));
        }
        assert!(store.get("a").is_none(), "the oldest went first");
        assert_eq!(store.get("c").unwrap().response, json!({"n": 2}));
        assert_eq!(store.len(), 2);
        assert!(store.remove("b"));
        assert!(!store.remove("b"));
        store.insert("d".into(), stored(3));
        store.insert("e".into(), stored(4));
        assert_eq!((store.get("c").is_none(), store.len()), (true, 2), "a deleted id frees its place in the order");
    }

    #[test]
    fn statuses_follow_the_finish_reason() {
        assert_eq!(status_of(FinishReason::Stop), ("completed", Value::Null));
        assert_eq!(status_of(FinishReason::Length), ("incomplete", json!({"reason": "max_output_tokens"})));
        assert_eq!(status_of(FinishReason::Abort).0, "cancelled");
        assert_eq!(status_of(FinishReason::Error).0, "failed");
    }
}

#[cfg(test)]
mod input_item_tests {
    use super::*;

    fn query(after: Option<&str>, limit: Option<usize>, order: Option<&str>) -> ListQuery {
        ListQuery { after: after.map(str::to_string), limit, order: order.map(str::to_string) }
    }

    #[test]
    fn input_items_are_listed_with_ids_and_text_parts() {
        let items = listed_input_items(&ResponseInput::Text("Hi".into()));
        assert_eq!(items.len(), 1);
        assert!(items[0]["id"].as_str().unwrap().starts_with("msg_"));
        assert_eq!(items[0]["content"], json!([{"type": "input_text", "text": "Hi"}]));
        let given = ResponseInput::Items(vec![
            json!({"role": "assistant", "content": "Sure."}),
            json!({"type": "function_call_output", "call_id": "c", "output": "12 C", "id": "mine"}),
        ]);
        let items = listed_input_items(&given);
        assert_eq!(
            (items[0]["type"].as_str(), &items[0]["content"][0]["type"]),
            (Some("message"), &json!("output_text"))
        );
        assert_eq!(items[1]["id"], "mine", "a given id is kept");
    }

    #[test]
    fn pages_run_newest_first_by_default_and_continue_after_a_cursor() {
        let items: Vec<Value> = (0..5).map(|i| json!({"id": format!("i{i}")})).collect();
        let ids = |page: &Value| {
            page["data"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap().to_string()).collect::<Vec<_>>()
        };
        let first = input_items_page(items.clone(), &query(None, Some(2), None)).unwrap();
        assert_eq!((ids(&first), first["has_more"].as_bool()), (vec!["i4".to_string(), "i3".into()], Some(true)));
        assert_eq!(first["last_id"], "i3");
        let next = input_items_page(items.clone(), &query(Some("i3"), Some(2), None)).unwrap();
        assert_eq!(ids(&next), ["i2", "i1"]);
        let last = input_items_page(items.clone(), &query(Some("i1"), None, None)).unwrap();
        assert_eq!((ids(&last), last["has_more"].as_bool()), (vec!["i0".to_string()], Some(false)));
        let asc = input_items_page(items.clone(), &query(None, None, Some("asc"))).unwrap();
        assert_eq!(ids(&asc), ["i0", "i1", "i2", "i3", "i4"]);
        for (q, field) in [
            (query(None, Some(0), None), "limit"),
            (query(None, Some(101), None), "limit"),
            (query(None, None, Some("newest")), "order"),
            (query(Some("nope"), None, None), "after"),
        ] {
            assert_eq!(input_items_page(items.clone(), &q).unwrap_err().param.as_deref(), Some(field));
        }
    }
}
