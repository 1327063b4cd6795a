//! OpenAI's harmony format (gpt-oss; vLLM's `openai` tool-call parser and `openai_gptoss`
//! reasoning parser). The output is a run of messages, each a header, `<|message|>`, its text
//! and an end marker:
//!
//! ```text
//! <|channel|>analysis<|message|>The user wants the weather in Paris.<|end|>
//! <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>
//! ```
//!
//! The `analysis` channel is reasoning; `final`, and `commentary` without a recipient (a
//! preamble), are content; a message to `functions.NAME` is a call of NAME whose text is its
//! arguments, streamed as written (the recipient may stand before or after the channel).
//! Messages to other recipients (gpt-oss's built-in browser and python tools) are left out,
//! as vLLM leaves them. The prompt ends with `<|start|>assistant`, so the first header comes
//! without it. Text that does not open like a header is content, so a model that answers
//! without harmony loses nothing.

use super::calls::send_content;
use crate::message::{MessageDelta, held_prefix_len};

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
/// What ends a message: its end, a call's end, the answer's end.
const ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];
/// What a header may open with.
const HEADER_OPENINGS: [&str; 3] = ["assistant", CHANNEL, "to="];
/// The recipient prefix of the request's functions.
const FUNCTIONS: &str = "functions.";
/// A header longer than this is not one: its text is content.
const MAX_HEADER: usize = 512;

/// Reads harmony messages out of the output.
#[derive(Debug)]
pub struct HarmonyScanner {
    /// Whether messages to `functions.*` are read as calls (tools offered with `"auto"`);
    /// otherwise they are left out with the other recipients'.
    reads_calls: bool,
    buffer: String,
    at: Place,
    calls: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Before a message's `<|message|>`.
    Header,
    Body(Body),
    /// After a message's end, before the next one's `<|start|>`.
    Between,
}

/// Where a message's text goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    Reasoning,
    Content,
    /// The arguments of the latest call.
    Arguments,
    Dropped,
}

impl HarmonyScanner {
    pub fn new(reads_calls: bool) -> Self {
        Self { reads_calls, buffer: String::new(), at: Place::Header, calls: 0 }
    }

    pub fn push(&mut self, text: &str, out: &mut Vec<MessageDelta>) {
        self.buffer.push_str(text);
        while self.step(out) {}
    }

    /// Reads what the buffer completes at the current place; whether it moved on.
    fn step(&mut self, out: &mut Vec<MessageDelta>) -> bool {
        match self.at {
            Place::Header => {
                if let Some(at) = self.buffer.find(MESSAGE) {
                    let header: String = self.buffer.drain(..at + MESSAGE.len()).collect();
                    self.at = Place::Body(self.open(&header[..at], out));
                    return true;
                }
                let start = self.buffer.trim_start();
                let may_be_header =
                    HEADER_OPENINGS.iter().any(|opening| start.starts_with(opening) || opening.starts_with(start));
                if !may_be_header || self.buffer.len() > MAX_HEADER {
                    self.at = Place::Body(Body::Content);
                    return true;
                }
                false
            }
            Place::Body(body) => {
                let ends = ENDS.iter().chain([&START]).filter_map(|m| self.buffer.find(m).map(|at| (at, *m)));
                match ends.min() {
                    Some((at, marker)) => {
                        let text: String = self.buffer.drain(..at).collect();
                        self.send(body, text, out);
                        self.buffer.drain(..marker.len());
                        self.at = if marker == START { Place::Header } else { Place::Between };
                        true
                    }
                    None => {
                        let held = ENDS.iter().chain([&START]).map(|m| held_prefix_len(&self.buffer, m)).max();
                        let text: String = self.buffer.drain(..self.buffer.len() - held.unwrap_or(0)).collect();
                        self.send(body, text, out);
                        false
                    }
                }
            }
            Place::Between => {
                let rest = self.buffer.trim_start();
                if let Some(after) = rest.strip_prefix(START) {
                    self.buffer = after.to_string();
                    self.at = Place::Header;
                    return true;
                }
                if START.starts_with(rest) {
                    return false;
                }
                // A message that left out its start: its header (or content) follows.
                self.at = Place::Header;
                true
            }
        }
    }

    /// Opens the message whose header is `header`: where its text goes.
    fn open(&mut self, header: &str, out: &mut Vec<MessageDelta>) -> Body {
        let word_after = |marker: &str| {
            header.find(marker).map(|at| {
                let rest = &header[at + marker.len()..];
                rest[..rest.find(|c: char| c.is_whitespace() || c == '<').unwrap_or(rest.len())].to_string()
            })
        };
        match (word_after("to="), word_after(CHANNEL).as_deref()) {
            (Some(recipient), _) => match recipient.strip_prefix(FUNCTIONS) {
                Some(name) if self.reads_calls => {
                    out.push(MessageDelta::CallStart { index: self.calls, id: String::new(), name: name.to_string() });
                    self.calls += 1;
                    Body::Arguments
                }
                _ => Body::Dropped,
            },
            (None, Some("analysis")) => Body::Reasoning,
            (None, _) => Body::Content,
        }
    }

    fn send(&self, body: Body, text: String, out: &mut Vec<MessageDelta>) {
        if text.is_empty() {
            return;
        }
        match body {
            Body::Reasoning => out.push(MessageDelta::Reasoning(text)),
            Body::Content => send_content(text, out),
            Body::Arguments => out.push(MessageDelta::Arguments { index: self.calls - 1, text }),
            Body::Dropped => {}
        }
    }

    /// What is left once the output is complete: a message cut short, or text that never
    /// became a header (content).
    pub fn finish(&mut self, out: &mut Vec<MessageDelta>) {
        let rest = std::mem::take(&mut self.buffer);
        match self.at {
            Place::Body(body) => self.send(body, rest, out),
            Place::Header | Place::Between if !START.starts_with(rest.trim()) => send_content(rest, out),
            Place::Header | Place::Between => {}
        }
        self.at = Place::Between;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of `size` characters; the deltas, joined.
    fn read(text: &str, size: usize, reads_calls: bool) -> Vec<MessageDelta> {
        let mut scanner = HarmonyScanner::new(reads_calls);
        let chars: Vec<char> = text.chars().collect();
        let mut out = Vec::new();
        for piece in chars.chunks(size) {
            scanner.push(&piece.iter().collect::<String>(), &mut out);
        }
        scanner.finish(&mut out);
        out
    }

    /// Reasoning, content, and each call's name and arguments.
    fn message(deltas: &[MessageDelta]) -> (String, String, Vec<(String, String)>) {
        super::super::gather(deltas)
    }

    const CALLS: &str = "<|channel|>analysis<|message|>Need the weather, then the time.<|end|>\
        <|start|>assistant<|channel|>commentary<|message|>Checking both.<|end|>\
        <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>\
        <|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}<|call|>";

    #[test]
    fn channels_split_into_reasoning_content_and_calls_whatever_the_pieces() {
        for size in [1, 2, 5, 13, 10_000] {
            let (reasoning, content, calls) = message(&read(CALLS, size, true));
            assert_eq!(reasoning, "Need the weather, then the time.", "pieces of {size}");
            assert_eq!(content, "Checking both.", "the preamble is content (pieces of {size})");
            assert_eq!(
                calls,
                vec![("get_weather".into(), "{\"city\": \"Paris\"}".into()), ("get_time".into(), "{}".into())],
                "the recipient before or after the channel (pieces of {size})"
            );
        }
        let answer =
            "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>4<|return|>";
        for size in [1, 3, 100] {
            assert_eq!(message(&read(answer, size, true)), ("Easy.".into(), "4".into(), vec![]), "pieces of {size}");
        }
    }

    #[test]
    fn calls_are_left_out_where_tools_are_not_read_and_other_recipients_always() {
        let (reasoning, content, calls) = message(&read(CALLS, 4, false));
        assert_eq!(
            (reasoning.as_str(), content.as_str(), calls.len()),
            ("Need the weather, then the time.", "Checking both.", 0)
        );
        let browser = "<|channel|>analysis<|message|>Search.<|end|><|start|>assistant<|channel|>analysis to=browser.search<|message|>{\"query\": \"x\"}<|call|>";
        assert_eq!(message(&read(browser, 3, true)), ("Search.".into(), String::new(), vec![]));
    }

    #[test]
    fn streamed_pieces_come_as_soon_as_no_marker_can_hide_in_them() {
        let mut scanner = HarmonyScanner::new(true);
        let mut out = Vec::new();
        scanner.push("<|channel|>analysis<|mess", &mut out);
        assert!(out.is_empty());
        scanner.push("age|>Thinking <", &mut out);
        assert_eq!(out, vec![MessageDelta::Reasoning("Thinking ".into())], "`<` could begin an end marker");
        scanner
            .push("|end|><|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>{\"ci", &mut out);
        assert!(matches!(&out[1], MessageDelta::CallStart { index: 0, name, .. } if name == "get_weather"));
        assert_eq!(out[2], MessageDelta::Arguments { index: 0, text: "{\"ci".into() });
    }

    #[test]
    fn text_that_is_not_harmony_is_content_and_a_cut_message_keeps_what_it_wrote() {
        for size in [1, 4, 100] {
            assert_eq!(message(&read("Plain answer, no channels.", size, true)).1, "Plain answer, no channels.");
            let cut = message(&read("<|channel|>final<|message|>The answer is", size, true));
            assert_eq!(cut.1, "The answer is", "pieces of {size}");
            let header_only = message(&read("<|channel|>fin", size, true));
            assert_eq!(header_only.1, "<|channel|>fin", "an unfinished header is kept as content");
        }
        let long = "a".repeat(MAX_HEADER + 10);
        assert_eq!(message(&read(&format!("assistant{long}"), 50, true)).1, format!("assistant{long}"));
    }
}
