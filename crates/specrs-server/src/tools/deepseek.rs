//! DeepSeek's tool calls (vLLM's `deepseek_v3` and `deepseek_v31` parsers), one reader for
//! both layouts:
//!
//! ```text
//! V3:   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
//!       ```json
//!       {"city": "Paris"}
//!       ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//! V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//! ```
//!
//! Text before the calls is content. A call starts once its name is complete (V3: the line
//! after the separator; V3.1: the text before it), and its arguments stream as written.

use super::calls::{JsonLayout, Laid};
use crate::message::{MessageDelta, held_prefix_len};

const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEPARATOR: &str = "<｜tool▁sep｜>";
/// What V3 writes before the separator, with the name after it.
const V3_CALL_TYPE: &str = "function";

/// Reads DeepSeek calls out of free text.
#[derive(Debug, Default)]
pub struct DeepSeekScanner {
    buffer: String,
    at: Place,
    calls: usize,
}

#[derive(Debug, Default)]
enum Place {
    #[default]
    Text,
    /// Inside the calls, between one call and the next.
    Calls,
    /// After a call's begin marker, before its separator.
    Head,
    /// V3: after the separator, reading the name's line.
    Name,
    /// Before the arguments' first character (V3's code fence is skipped).
    BeforeArguments,
    Arguments(JsonLayout),
    /// After the arguments, up to the call's end marker.
    AfterArguments,
    /// After the calls' end: anything more is content.
    Done,
}

impl DeepSeekScanner {
    pub fn push(&mut self, text: &str, out: &mut Vec<MessageDelta>) {
        self.buffer.push_str(text);
        while self.step(out) {}
    }

    /// What is left once the output is complete: text held back stays text.
    pub fn finish(&mut self, out: &mut Vec<MessageDelta>) {
        let rest = std::mem::take(&mut self.buffer);
        if matches!(self.at, Place::Text | Place::Done) && !rest.is_empty() {
            out.push(MessageDelta::Content(rest));
        }
    }

    /// Takes the buffer up to `marker` when it holds it; `None` (keeping the buffer) otherwise.
    fn take_until(&mut self, marker: &str) -> Option<String> {
        let at = self.buffer.find(marker)?;
        let before = self.buffer[..at].to_string();
        self.buffer.drain(..at + marker.len());
        Some(before)
    }

    /// Reads what the buffer completes at the current place; whether it moved on.
    fn step(&mut self, out: &mut Vec<MessageDelta>) -> bool {
        match &mut self.at {
            Place::Text => {
                if let Some(before) = self.take_until(CALLS_BEGIN) {
                    content(before, out);
                    self.at = Place::Calls;
                    return true;
                }
                let keep = held_prefix_len(&self.buffer, CALLS_BEGIN);
                let text: String = self.buffer.drain(..self.buffer.len() - keep).collect();
                content(text, out);
                false
            }
            Place::Calls => {
                let trimmed = self.buffer.trim_start();
                if let Some(rest) = trimmed.strip_prefix(CALL_BEGIN) {
                    self.buffer = rest.to_string();
                    self.at = Place::Head;
                    return true;
                }
                if let Some(rest) = trimmed.strip_prefix(CALLS_END) {
                    self.buffer = rest.to_string();
                    self.at = Place::Done;
                    return true;
                }
                false
            }
            Place::Head => {
                let Some(head) = self.take_until(SEPARATOR) else { return false };
                let head = head.trim();
                if head == V3_CALL_TYPE {
                    self.at = Place::Name;
                } else {
                    self.start_call(head, out);
                }
                true
            }
            Place::Name => {
                let Some(name) = self.take_until("\n") else { return false };
                self.start_call(name.trim(), out);
                true
            }
            Place::BeforeArguments => {
                // V3's fence (```json) and the line breaks around it come before the value.
                let Some(start) = self.buffer.find(['{', '[']) else { return false };
                self.buffer.drain(..start);
                self.at = Place::Arguments(JsonLayout::default());
                true
            }
            Place::Arguments(layout) => {
                let mut arguments = String::new();
                let mut used = self.buffer.len();
                let mut closed = false;
                for (i, c) in self.buffer.char_indices() {
                    if layout.push(c, &mut arguments) != Laid::More {
                        used = i + c.len_utf8();
                        closed = true;
                        break;
                    }
                }
                self.buffer.drain(..used);
                if !arguments.is_empty() {
                    out.push(MessageDelta::Arguments { index: self.calls - 1, text: arguments });
                }
                if closed {
                    self.at = Place::AfterArguments;
                }
                closed
            }
            Place::AfterArguments => {
                if self.take_until(CALL_END).is_none() {
                    return false;
                }
                self.at = Place::Calls;
                true
            }
            Place::Done => {
                let text = std::mem::take(&mut self.buffer);
                if !text.trim().is_empty() {
                    content(text, out);
                }
                false
            }
        }
    }

    fn start_call(&mut self, name: &str, out: &mut Vec<MessageDelta>) {
        out.push(MessageDelta::CallStart { index: self.calls, id: String::new(), name: name.to_string() });
        self.calls += 1;
        self.at = Place::BeforeArguments;
    }
}

fn content(text: String, out: &mut Vec<MessageDelta>) {
    if !text.is_empty() {
        out.push(MessageDelta::Content(text));
    }
}
