//! Tool calls between special-token markers: DeepSeek's (vLLM's `deepseek_v3` and
//! `deepseek_v31` parsers, one reader for both layouts) and Kimi K2's (`kimi_k2`):
//!
//! ```text
//! V3:   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
//!       ```json
//!       {"city": "Paris"}
//!       ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//! V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>
//! Kimi: <|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>
//! ```
//!
//! Text before the calls is content. A call starts once its name is complete (V3: the line
//! after the separator; V3.1 and Kimi: the text before it, Kimi's being the call's id, whose
//! middle is the name), and its arguments stream as written.

use super::calls::{JsonLayout, Laid, send_content, stray_text};
use crate::message::{MessageDelta, held_prefix_len};

/// The markers of one family's calls.
#[derive(Debug, Clone, Copy)]
pub struct Markers {
    calls_begin: &'static str,
    calls_end: &'static str,
    call_begin: &'static str,
    call_end: &'static str,
    /// Between a call's head (its name or id) and its arguments.
    separator: &'static str,
}

pub const DEEPSEEK: Markers = Markers {
    calls_begin: "<｜tool▁calls▁begin｜>",
    calls_end: "<｜tool▁calls▁end｜>",
    call_begin: "<｜tool▁call▁begin｜>",
    call_end: "<｜tool▁call▁end｜>",
    separator: "<｜tool▁sep｜>",
};

pub const KIMI: Markers = Markers {
    calls_begin: "<|tool_calls_section_begin|>",
    calls_end: "<|tool_calls_section_end|>",
    call_begin: "<|tool_call_begin|>",
    call_end: "<|tool_call_end|>",
    separator: "<|tool_call_argument_begin|>",
};

/// What DeepSeek V3 writes before the separator, with the name after it.
const V3_CALL_TYPE: &str = "function";

/// Reads marker-delimited calls out of free text.
#[derive(Debug)]
pub struct MarkedCallScanner {
    markers: Markers,
    buffer: String,
    at: Place,
    calls: usize,
}

#[derive(Debug)]
enum Place {
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

impl MarkedCallScanner {
    pub fn new(markers: Markers) -> Self {
        Self { markers, buffer: String::new(), at: Place::Text, calls: 0 }
    }

    pub fn push(&mut self, text: &str, out: &mut Vec<MessageDelta>) {
        self.buffer.push_str(text);
        while self.step(out) {}
    }

    /// What is left once the output is complete: text held back stays text, and so does a
    /// call's head that never reached its separator or name line.
    pub fn finish(&mut self, out: &mut Vec<MessageDelta>) {
        let rest = std::mem::take(&mut self.buffer);
        if matches!(self.at, Place::Text | Place::Done | Place::Calls | Place::Head | Place::Name) {
            send_content(rest, out);
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
                if let Some(before) = self.take_until(self.markers.calls_begin) {
                    send_content(before, out);
                    self.at = Place::Calls;
                    return true;
                }
                let keep = held_prefix_len(&self.buffer, self.markers.calls_begin);
                let text: String = self.buffer.drain(..self.buffer.len() - keep).collect();
                send_content(text, out);
                false
            }
            Place::Calls => {
                let trimmed = self.buffer.trim_start();
                if let Some(rest) = trimmed.strip_prefix(self.markers.call_begin) {
                    self.buffer = rest.to_string();
                    self.at = Place::Head;
                    return true;
                }
                if let Some(rest) = trimmed.strip_prefix(self.markers.calls_end) {
                    self.buffer = rest.to_string();
                    self.at = Place::Done;
                    return true;
                }
                // Neither a call nor the calls' end: text, up to the next marker.
                let markers = [self.markers.call_begin, self.markers.calls_end];
                let Some((text, rest)) = stray_text(trimmed, &markers) else { return false };
                let text = text.to_string();
                self.buffer = rest.to_string();
                send_content(text, out);
                true
            }
            Place::Head => {
                let Some(head) = self.take_until(self.markers.separator) else { return false };
                let head = head.trim();
                match kimi_call_id(head) {
                    _ if head == V3_CALL_TYPE => self.at = Place::Name,
                    Some(name) => self.start_call(name, head, out),
                    None => self.start_call(head, "", out),
                }
                true
            }
            Place::Name => {
                let Some(name) = self.take_until("\n") else { return false };
                self.start_call(name.trim(), "", out);
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
                if self.take_until(self.markers.call_end).is_none() {
                    return false;
                }
                self.at = Place::Calls;
                true
            }
            Place::Done => {
                let text = std::mem::take(&mut self.buffer);
                if !text.trim().is_empty() {
                    send_content(text, out);
                }
                false
            }
        }
    }

    /// Starts a call; an empty `id` is given one by the stream.
    fn start_call(&mut self, name: &str, id: &str, out: &mut Vec<MessageDelta>) {
        out.push(MessageDelta::CallStart { index: self.calls, id: id.to_string(), name: name.to_string() });
        self.calls += 1;
        self.at = Place::BeforeArguments;
    }
}

/// The name inside a Kimi call id, `functions.<name>:<index>` (Kimi's templates want the id
/// back as written, so it stays the call's id).
fn kimi_call_id(head: &str) -> Option<&str> {
    let (name, index) = head.strip_prefix("functions.")?.rsplit_once(':')?;
    index.parse::<usize>().ok().map(|_| name)
}
