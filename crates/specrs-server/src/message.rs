//! One choice's output text read into an assistant message: its reasoning, its content and its
//! tool calls.
//!
//! The same reader serves streamed and whole responses: it takes the text delta by delta and
//! yields [`MessageDelta`]s, which a stream sends as they come and a whole response gathers
//! into one [`AssistantMessage`]. So both report the same reasoning, content and calls, with
//! the same argument text.

use serde_json::{Value, json};

use crate::reasoning::{Part, ReasoningParser, ReasoningSplitter};
use crate::tools::CallStream;

/// A piece of an assistant message, in the order it was written.
#[derive(Debug, Clone, PartialEq)]
pub enum MessageDelta {
    /// Text for the message's `reasoning_content`.
    Reasoning(String),
    /// Text for the message's `content`.
    Content(String),
    /// A new call: its place in the message's `tool_calls`, its id and function name.
    CallStart { index: usize, id: String, name: String },
    /// More of a call's `arguments` (JSON text).
    Arguments { index: usize, text: String },
}

impl MessageDelta {
    /// The chunk `delta` OpenAI (and vLLM, for reasoning) streams for this piece.
    pub fn to_json(&self) -> Value {
        match self {
            Self::Reasoning(text) => json!({"reasoning_content": text}),
            Self::Content(text) => json!({"content": text}),
            Self::CallStart { index, id, name } => json!({"tool_calls": [{
                "index": index, "id": id, "type": "function", "function": {"name": name, "arguments": ""},
            }]}),
            Self::Arguments { index, text } => {
                json!({"tool_calls": [{"index": index, "function": {"arguments": text}}]})
            }
        }
    }
}

/// Reads a choice's text: reasoning first (when the server splits it), then the answer
/// through the request's tool-call reader. gpt-oss's harmony output is read whole by the
/// harmony reader, which splits its reasoning off itself.
#[derive(Debug)]
pub struct MessageReader {
    reasoning: Option<ReasoningParser>,
    splitter: Option<ReasoningSplitter>,
    /// Whether reasoning is sent (vLLM's `include_reasoning`); it is split off either way.
    include_reasoning: bool,
    calls: CallStream,
}

impl MessageReader {
    pub fn new(reasoning: Option<ReasoningParser>, include_reasoning: bool, calls: CallStream) -> Self {
        let harmony = reasoning.is_some_and(ReasoningParser::reads_harmony);
        let calls = if harmony && calls.is_text() { CallStream::harmony(false) } else { calls };
        let splitter = reasoning.filter(|_| !harmony).map(ReasoningSplitter::new);
        Self { reasoning, splitter, include_reasoning, calls }
    }

    /// Whether messages carry `reasoning_content` (null when the model did not reason).
    pub fn reports_reasoning(&self) -> bool {
        self.reasoning.is_some() && self.include_reasoning
    }

    /// The message pieces `text` (the next part of the output) completes.
    pub fn push(&mut self, text: &str) -> Vec<MessageDelta> {
        let parts = match &mut self.splitter {
            Some(splitter) => splitter.push(text),
            None => vec![Part::Answer(text.to_string())],
        };
        self.read(parts, false)
    }

    /// What is left once the output is complete.
    pub fn finish(&mut self) -> Vec<MessageDelta> {
        let parts = self.splitter.as_mut().map(ReasoningSplitter::finish).unwrap_or_default();
        self.read(parts, true)
    }

    fn read(&mut self, parts: Vec<Part>, last: bool) -> Vec<MessageDelta> {
        let mut out = Vec::new();
        for part in parts {
            match part {
                Part::Reasoning(text) => out.push(MessageDelta::Reasoning(text)),
                Part::Answer(text) => out.extend(self.calls.push(&text)),
            }
        }
        if last {
            out.extend(self.calls.finish());
        }
        // Reasoning (split here, or by the harmony reader) goes out only where it is reported.
        if !self.reports_reasoning() {
            out.retain(|d| !matches!(d, MessageDelta::Reasoning(_)));
        }
        coalesce(out)
    }

    /// The whole message of a finished output. Calls the model wrote on its own must each have
    /// a JSON object for arguments, or the answer is the text as written (as vLLM's parsers
    /// fall back): a call cut short or written broken is no call a client could make.
    pub fn read_all(self, text: &str) -> AssistantMessage {
        let mut message =
            AssistantMessage { reasoning: self.reports_reasoning().then(String::new), ..Default::default() };
        for delta in self.read_whole(text) {
            message.add(delta);
        }
        message
    }

    /// The pieces of a finished output's whole message, read as [`Self::read_all`] reads it.
    pub fn read_whole(mut self, text: &str) -> Vec<MessageDelta> {
        let (reasoning, include_reasoning) = (self.reasoning, self.include_reasoning);
        let checks_arguments = self.calls.reads_model_written_json();
        let mut deltas = self.push(text);
        deltas.extend(self.finish());
        let mut calls = AssistantMessage::default();
        deltas.iter().cloned().for_each(|d| calls.add(d));
        let broken = |arguments: &str| serde_json::from_str::<Value>(arguments).map_or(true, |v| !v.is_object());
        if checks_arguments && calls.tool_calls.iter().any(|(_, _, arguments)| broken(arguments)) {
            let mut as_text = Self::new(reasoning, include_reasoning, CallStream::text());
            deltas = as_text.push(text);
            deltas.extend(as_text.finish());
        }
        deltas
    }
}

/// Merges neighbouring pieces of the same kind, so a delta of many tokens is one chunk.
fn coalesce(deltas: Vec<MessageDelta>) -> Vec<MessageDelta> {
    let mut out: Vec<MessageDelta> = Vec::with_capacity(deltas.len());
    for d in deltas {
        match (out.last_mut(), d) {
            (Some(MessageDelta::Reasoning(a)), MessageDelta::Reasoning(b)) => a.push_str(&b),
            (Some(MessageDelta::Content(a)), MessageDelta::Content(b)) => a.push_str(&b),
            (Some(MessageDelta::Arguments { index: i, text: a }), MessageDelta::Arguments { index: j, text: b })
                if *i == j =>
            {
                a.push_str(&b)
            }
            (_, d) => out.push(d),
        }
    }
    out
}

/// An assistant message gathered from its pieces.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AssistantMessage {
    /// `Some` when the message reports reasoning (possibly empty: `null` in the response).
    pub reasoning: Option<String>,
    pub content: String,
    /// `(id, function name, arguments)` per call.
    pub tool_calls: Vec<(String, String, String)>,
}

impl AssistantMessage {
    pub fn add(&mut self, delta: MessageDelta) {
        match delta {
            MessageDelta::Reasoning(text) => self.reasoning.get_or_insert_default().push_str(&text),
            MessageDelta::Content(text) => self.content.push_str(&text),
            MessageDelta::CallStart { id, name, .. } => self.tool_calls.push((id, name, String::new())),
            MessageDelta::Arguments { index, text } => {
                if let Some(call) = self.tool_calls.get_mut(index) {
                    call.2.push_str(&text);
                }
            }
        }
    }

    /// The response's `message`: `content` is null when the model only called tools, or only
    /// reasoned (as vLLM's).
    pub fn to_json(&self) -> Value {
        let only_reasoned = self.content.is_empty() && self.reasoning.as_ref().is_some_and(|r| !r.is_empty());
        let mut message = if only_reasoned && self.tool_calls.is_empty() {
            json!({"role": "assistant", "content": Value::Null})
        } else if self.tool_calls.is_empty() {
            json!({"role": "assistant", "content": self.content})
        } else {
            let content = if self.content.trim().is_empty() { Value::Null } else { json!(self.content) };
            let calls: Vec<Value> = self
                .tool_calls
                .iter()
                .map(|(id, name, arguments)| {
                    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
                })
                .collect();
            json!({"role": "assistant", "content": content, "tool_calls": calls})
        };
        if let Some(reasoning) = &self.reasoning {
            message["reasoning_content"] = if reasoning.is_empty() { Value::Null } else { json!(reasoning) };
        }
        message
    }
}

/// How many bytes at the end of `text` could be the start of `marker`.
pub fn held_prefix_len(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasoning_comes_first_and_the_answer_goes_through_the_tool_reader() {
        let text = "<think>Need the weather.</think>\n<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}</tool_call>";
        let message = MessageReader::new(Some(ReasoningParser::Qwen3), true, CallStream::hermes()).read_all(text);
        assert_eq!(message.reasoning.as_deref(), Some("Need the weather."));
        assert_eq!(message.tool_calls.len(), 1);
        let json = message.to_json();
        assert_eq!(json["reasoning_content"], "Need the weather.");
        assert_eq!(json["content"], Value::Null, "only whitespace besides the call");

        let hidden = MessageReader::new(Some(ReasoningParser::Qwen3), false, CallStream::text()).read_all(text);
        assert_eq!(hidden.reasoning, None);
        assert!(hidden.to_json().get("reasoning_content").is_none());
        assert!(hidden.content.starts_with("\n<tool_call>"));

        let plain = MessageReader::new(Some(ReasoningParser::Qwen3), true, CallStream::text()).read_all("Hi.");
        assert_eq!(plain.to_json(), json!({"role": "assistant", "content": "Hi.", "reasoning_content": null}));
        let none = MessageReader::new(None, true, CallStream::text()).read_all("Hi.");
        assert_eq!(none.to_json(), json!({"role": "assistant", "content": "Hi."}));
        // Thinking that never ended: all reasoning, and no content (null, as vLLM's).
        let thinking = MessageReader::new(Some(ReasoningParser::Qwen3), true, CallStream::text()).read_all("<think>Hm");
        assert_eq!(thinking.to_json(), json!({"role": "assistant", "content": null, "reasoning_content": "Hm"}));
        // A broken call after the thinking leaves the answer as written, the thinking split off.
        let broken =
            "<think>Need the time.</think><tool_call>{\"name\": \"t\", \"arguments\": {\"tz\": UTC}}</tool_call>";
        let message = MessageReader::new(Some(ReasoningParser::Qwen3), true, CallStream::hermes()).read_all(broken);
        assert_eq!(message.reasoning.as_deref(), Some("Need the time."));
        assert!(message.tool_calls.is_empty() && message.content.starts_with("<tool_call>"), "{message:?}");
    }

    #[test]
    fn gpt_oss_channels_split_with_or_without_the_tool_reader() {
        let text = "<|channel|>analysis<|message|>Weather needed.<|end|><|start|>assistant<|channel|>commentary \
                    to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>";
        let calls = MessageReader::new(Some(ReasoningParser::GptOss), true, CallStream::harmony(true)).read_all(text);
        assert_eq!(calls.reasoning.as_deref(), Some("Weather needed."));
        assert_eq!(calls.tool_calls.len(), 1);
        assert_eq!(
            (calls.tool_calls[0].1.as_str(), calls.tool_calls[0].2.as_str()),
            ("get_weather", "{\"city\": \"Oslo\"}")
        );
        assert_eq!(calls.to_json()["content"], Value::Null);
        // No tools: the harmony reader still splits the channels and leaves the call out.
        let answer = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>4";
        let plain = MessageReader::new(Some(ReasoningParser::GptOss), true, CallStream::text()).read_all(answer);
        assert_eq!((plain.reasoning.as_deref(), plain.content.as_str()), (Some("Easy."), "4"));
        // The tool reader without the reasoning parser: reasoning is split off but not reported.
        let unreported = MessageReader::new(None, true, CallStream::harmony(true)).read_all(answer);
        assert_eq!((unreported.reasoning, unreported.content.as_str()), (None, "4"));
        let hidden = MessageReader::new(Some(ReasoningParser::GptOss), false, CallStream::text()).read_all(answer);
        assert_eq!((hidden.reasoning, hidden.content.as_str()), (None, "4"));
    }

    #[test]
    fn deltas_serialise_as_openai_and_vllm_stream_them() {
        let start = MessageDelta::CallStart { index: 1, id: "call-1".into(), name: "f".into() };
        assert_eq!(
            start.to_json(),
            json!({"tool_calls": [{"index": 1, "id": "call-1", "type": "function", "function": {"name": "f", "arguments": ""}}]})
        );
        let arguments = MessageDelta::Arguments { index: 1, text: "{}".into() };
        assert_eq!(arguments.to_json(), json!({"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]}));
        assert_eq!(MessageDelta::Reasoning("hm".into()).to_json(), json!({"reasoning_content": "hm"}));
    }

    #[test]
    fn held_text_is_the_longest_end_that_could_begin_the_marker() {
        assert_eq!(held_prefix_len("Hi <tool", "<tool_call>"), 5);
        assert_eq!(held_prefix_len("é<", "<tool_call>"), 1);
        assert_eq!(held_prefix_len("é", "<tool_call>"), 0);
    }
}
