//! Reading the tool calls in a choice's text, in each format a request may get them: the
//! named function's arguments, a `"required"` list of calls, or calls a model writes on its
//! own (Hermes blocks, Llama 3 and Mistral JSON; Python call lists in [`super::pythonic`],
//! Qwen3-Coder's XML in [`super::xml_calls`], DeepSeek's and Kimi's in [`super::marked_calls`]).
//! Text is taken delta by delta and turned into [`MessageDelta`]s as soon as they are certain.

use super::Function;
use super::harmony::HarmonyScanner;
use super::marked_calls::{DEEPSEEK, KIMI, MarkedCallScanner};
use super::pythonic::{Layout as PythonicLayout, PythonicScanner};
use super::xml_calls::{self, XmlCallScanner};
use crate::message::{MessageDelta, held_prefix_len};

/// Reads a choice's output as the request's tool choice says it is written.
#[derive(Debug)]
pub struct CallStream {
    format: Format,
    ids: CallIds,
    /// `parallel_tool_calls: false`: the model's first call is the message's only one (as
    /// vLLM keeps it); later calls are dropped, the text around them kept.
    first_call_only: bool,
}

/// How tool call ids are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CallIds {
    /// `chatcmpl-tool-...`, as vLLM writes them.
    #[default]
    OpenAi,
    /// Nine letters and digits: Mistral's chat templates refuse any other id in a later turn.
    Mistral,
}

impl CallIds {
    fn make(self) -> String {
        match self {
            Self::OpenAi => crate::server::request_id("chatcmpl-tool"),
            Self::Mistral => {
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let count = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let nanos =
                    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
                let mut x =
                    (nanos as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ count.wrapping_mul(0xBF58_476D_1CE4_E5B9);
                const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
                (0..9)
                    .map(|_| {
                        let d = DIGITS[(x % 62) as usize] as char;
                        x /= 62;
                        d
                    })
                    .collect()
            }
        }
    }
}

#[derive(Debug)]
enum Format {
    /// Plain text (`tool_choice: "none"`).
    Text,
    /// The whole output is the named function's arguments.
    Named { name: String, started: bool },
    /// The output is a JSON list of `{"name", "parameters"}` (`tool_choice: "required"`).
    CallList(CallListScanner),
    /// Text with JSON call blocks, `<tool_call>{"name", "arguments"}</tool_call>` (`"auto"`:
    /// Hermes, and the same reader with Jamba's, MiniMax's, InternLM2's or Phi-4-mini's markers).
    Blocks(BlockScanner),
    /// JSON call objects after a marker: Llama 3's `<|python_tag|>`? `{...}; {...}`,
    /// Mistral's `[TOOL_CALLS][{...}, ...]` or Granite's `<|tool_call|>[{...}, ...]` (`"auto"`).
    JsonCalls(JsonCallsScanner),
    /// A Python list of calls, `[f(a=1), g()]` (`"auto"`, Llama 3.2 / 4).
    Pythonic(PythonicScanner),
    /// Qwen3-Coder's `<function=...>` XML blocks (`"auto"`).
    Xml(XmlCallScanner),
    /// DeepSeek V3 / V3.1's and Kimi K2's marker-delimited calls (`"auto"`).
    Marked(MarkedCallScanner),
    /// gpt-oss's harmony messages: reasoning, content and (`"auto"`) calls.
    Harmony(HarmonyScanner),
    /// xLAM's call list, bare or in blocks (`"auto"`).
    Xlam(XlamScanner),
}

impl CallStream {
    fn of(format: Format) -> Self {
        Self { format, ids: CallIds::default(), first_call_only: false }
    }

    pub fn text() -> Self {
        Self::of(Format::Text)
    }

    pub fn named(name: &str) -> Self {
        Self::of(Format::Named { name: name.to_string(), started: false })
    }

    pub fn call_list() -> Self {
        Self::of(Format::CallList(CallListScanner::default()))
    }

    pub fn hermes() -> Self {
        Self::blocks(&[HERMES])
    }

    /// Calls in JSON blocks of the `kinds` a family writes (Hermes, Jamba, MiniMax, InternLM2,
    /// Phi-4-mini, granite-20b-functioncalling: one kind each).
    pub fn blocks(kinds: &'static [Block]) -> Self {
        Self::of(Format::Blocks(BlockScanner::new(kinds)))
    }

    /// Salesforce xLAM's call list: bare at the output's start, or in any of its blocks.
    pub fn xlam() -> Self {
        Self::of(Format::Xlam(XlamScanner::default()))
    }

    pub fn llama_json() -> Self {
        Self::of(Format::JsonCalls(JsonCallsScanner::new(JsonCallsStyle::Llama)))
    }

    pub fn mistral() -> Self {
        Self::of(Format::JsonCalls(JsonCallsScanner::new(JsonCallsStyle::Mistral)))
    }

    pub fn granite() -> Self {
        Self::of(Format::JsonCalls(JsonCallsScanner::new(JsonCallsStyle::Granite)))
    }

    pub fn pythonic() -> Self {
        Self::of(Format::Pythonic(PythonicScanner::new(PythonicLayout::List)))
    }

    /// OLMo 3's Python-style calls, one a line, in `<function_calls>` tags.
    pub fn olmo3() -> Self {
        Self::of(Format::Pythonic(PythonicScanner::new(PythonicLayout::Lines)))
    }

    pub fn deepseek() -> Self {
        Self::of(Format::Marked(MarkedCallScanner::new(DEEPSEEK)))
    }

    pub fn kimi() -> Self {
        Self::of(Format::Marked(MarkedCallScanner::new(KIMI)))
    }

    /// Qwen3-Coder's XML calls, their values typed by `functions`' schemas.
    pub fn qwen3_coder(functions: &[Function]) -> Self {
        Self::of(Format::Xml(XmlCallScanner::new(xml_calls::QWEN3_CODER, functions)))
    }

    pub fn seed_oss(functions: &[Function]) -> Self {
        Self::of(Format::Xml(XmlCallScanner::new(xml_calls::SEED_OSS, functions)))
    }

    pub fn minimax_m2(functions: &[Function]) -> Self {
        Self::of(Format::Xml(XmlCallScanner::new(xml_calls::MINIMAX_M2, functions)))
    }

    pub fn step3(functions: &[Function]) -> Self {
        Self::of(Format::Xml(XmlCallScanner::new(xml_calls::STEP3, functions)))
    }

    pub fn glm(functions: &[Function]) -> Self {
        Self::of(Format::Xml(XmlCallScanner::new(xml_calls::GLM, functions)))
    }

    /// gpt-oss's harmony messages, their calls read where `reads_calls`.
    pub fn harmony(reads_calls: bool) -> Self {
        Self::of(Format::Harmony(HarmonyScanner::new(reads_calls)))
    }

    /// Whether the output is read as plain text (no tool reader).
    pub fn is_text(&self) -> bool {
        matches!(self.format, Format::Text)
    }

    /// Whether the calls are ones the model chose to write (`tool_choice: "auto"`), in a
    /// format whose arguments are JSON text as written: unconstrained, so possibly broken.
    pub fn reads_model_written_json(&self) -> bool {
        matches!(self.format, Format::Blocks(_) | Format::JsonCalls(_) | Format::Xlam(_))
    }

    /// The same reader writing its calls' ids as `ids` says.
    pub fn with_ids(mut self, ids: CallIds) -> Self {
        self.ids = ids;
        self
    }

    /// The same reader keeping only the first call the model writes.
    pub fn first_call_only(mut self) -> Self {
        self.first_call_only = true;
        self
    }

    /// The pieces the message gets: each new call with its id, unless the model wrote one
    /// (Kimi's); without the calls after the first when only one is wanted.
    fn emit(&self, mut out: Vec<MessageDelta>) -> Vec<MessageDelta> {
        if self.first_call_only {
            out.retain(|d| !matches!(d, MessageDelta::CallStart { index, .. } | MessageDelta::Arguments { index, .. } if *index > 0));
        }
        for delta in &mut out {
            if let MessageDelta::CallStart { id, .. } = delta
                && id.is_empty()
            {
                *id = self.ids.make();
            }
        }
        out
    }

    /// The message pieces `text` (the next part of the output) completes.
    pub fn push(&mut self, text: &str) -> Vec<MessageDelta> {
        let mut out = Vec::new();
        match &mut self.format {
            Format::Text if !text.is_empty() => out.push(MessageDelta::Content(text.to_string())),
            Format::Text => {}
            Format::Named { name, started } => {
                if !*started && !text.is_empty() {
                    *started = true;
                    out.push(MessageDelta::CallStart { index: 0, id: String::new(), name: name.clone() });
                }
                if !text.is_empty() {
                    out.push(MessageDelta::Arguments { index: 0, text: text.to_string() });
                }
            }
            Format::CallList(scanner) => scanner.push(text, &mut out),
            Format::Blocks(scanner) => scanner.push(text, &mut out),
            Format::JsonCalls(scanner) => scanner.push(text, &mut out),
            Format::Pythonic(scanner) => scanner.push(text, &mut out),
            Format::Xml(scanner) => scanner.push(text, &mut out),
            Format::Marked(scanner) => scanner.push(text, &mut out),
            Format::Harmony(scanner) => scanner.push(text, &mut out),
            Format::Xlam(scanner) => scanner.push(text, &mut out),
        }
        self.emit(out)
    }

    /// What is left once the output is complete: text held back in case it began a call, or a
    /// named call whose arguments never started (the output was cut before its first byte).
    pub fn finish(&mut self) -> Vec<MessageDelta> {
        let mut out = Vec::new();
        match &mut self.format {
            Format::Text | Format::CallList(_) => {}
            Format::Named { name, started } => {
                if !*started {
                    *started = true;
                    out.push(MessageDelta::CallStart { index: 0, id: String::new(), name: name.clone() });
                }
            }
            Format::Blocks(scanner) => scanner.finish(&mut out),
            Format::JsonCalls(scanner) => scanner.finish(&mut out),
            Format::Pythonic(scanner) => scanner.finish(&mut out),
            Format::Xml(scanner) => scanner.finish(&mut out),
            Format::Marked(scanner) => scanner.finish(&mut out),
            Format::Harmony(scanner) => scanner.finish(&mut out),
            Format::Xlam(scanner) => scanner.finish(&mut out),
        }
        self.emit(out)
    }
}

/// Follows JSON strings (and their escapes) so brackets inside them are not counted.
#[derive(Debug, Default, Clone, Copy)]
struct StringState {
    inside: bool,
    escaped: bool,
}

impl StringState {
    /// Takes one character; whether it closed the string.
    fn step(&mut self, c: char) -> bool {
        if !self.inside {
            self.inside = c == '"';
            return false;
        }
        if self.escaped {
            self.escaped = false;
        } else if c == '\\' {
            self.escaped = true;
        } else if c == '"' {
            self.inside = false;
            return true;
        }
        false
    }
}

/// Re-lays one JSON value's text in the layout of Python's `json.dumps` (vLLM's) as it is
/// read: whitespace outside strings dropped, `, ` and `: ` between items.
#[derive(Debug, Default)]
pub(super) struct JsonLayout {
    depth: usize,
    string: StringState,
}

/// What one character did to a [`JsonLayout`].
#[derive(Debug, PartialEq)]
pub(super) enum Laid {
    More,
    /// It closed the value.
    Closed,
    /// It follows a scalar value that ended before it (an enclosing separator or end), and is
    /// not the value's.
    Ended,
}

impl JsonLayout {
    /// Takes the value's next character, writing it, laid out, into `out`.
    pub(super) fn push(&mut self, c: char, out: &mut String) -> Laid {
        if self.string.inside || c == '"' {
            let closed = self.string.step(c);
            out.push(c);
            return if closed && self.depth == 0 { Laid::Closed } else { Laid::More };
        }
        match c {
            '{' | '[' => {
                self.depth += 1;
                out.push(c);
            }
            '}' | ']' if self.depth > 0 => {
                self.depth -= 1;
                out.push(c);
                if self.depth == 0 {
                    return Laid::Closed;
                }
            }
            ',' | '}' | ']' if self.depth == 0 => return Laid::Ended,
            ',' => out.push_str(", "),
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
        Laid::More
    }
}

/// Reads the tool calls in one JSON value as it is written: a call object
/// `{"name": ..., "arguments" | "parameters": ...}` or a list of them. A call starts once its
/// name is complete, and its arguments are sent as they come, in the layout of Python's
/// `json.dumps` (vLLM's). Until a call starts the value's text is kept, so the owner can send a
/// value that holds no call (`{"answer": 4}`, `[1, 2]`) as text.
#[derive(Debug, Default)]
struct CallValueReader {
    /// Open containers outside strings.
    depth: usize,
    /// The depth of call objects: 1 for a lone object, 2 in a list.
    call_depth: usize,
    string: StringState,
    /// The text of a string being read at call level (a key or the name), quotes included.
    literal: Option<String>,
    /// The call-level key whose value is being read.
    key: Option<String>,
    /// After `"arguments":`, before the value's first character.
    awaiting_arguments: bool,
    /// Reading the arguments' value.
    arguments: Option<JsonLayout>,
    /// Inside an object at call level.
    in_object: bool,
    /// The index of the call being read, once its name came.
    index: usize,
    name_sent: bool,
    /// Some call in this value has started.
    started: bool,
    arguments_sent: bool,
    /// Arguments written before the call's name (held until the call starts).
    held: String,
    /// The value's text until its first call starts.
    raw: String,
    /// The value closed, or began with something no JSON value begins with.
    done: bool,
}

impl CallValueReader {
    /// Takes `text`, numbering new calls from `calls` (counted as they start); returns how much
    /// of `text` was read (all of it, unless the value closed before its end).
    fn push(&mut self, text: &str, calls: &mut usize, out: &mut Vec<MessageDelta>) -> usize {
        let mut arguments = String::new();
        for (at, c) in text.char_indices() {
            if self.done {
                self.send_arguments(arguments, out);
                return at;
            }
            if !self.started {
                self.raw.push(c);
            }
            if self.awaiting_arguments && !c.is_whitespace() {
                self.awaiting_arguments = false;
                self.arguments = Some(JsonLayout::default());
            }
            if let Some(layout) = &mut self.arguments {
                match layout.push(c, &mut arguments) {
                    Laid::More => continue,
                    Laid::Closed => {
                        self.end_arguments(&mut arguments, out);
                        continue;
                    }
                    // A scalar ended at the call's next member or its end: that character
                    // belongs to the call object, read below.
                    Laid::Ended => self.end_arguments(&mut arguments, out),
                }
            }
            if self.string.inside || c == '"' {
                let closed = self.string.step(c);
                if let Some(literal) = &mut self.literal {
                    literal.push(c);
                } else if c == '"' && self.depth == self.call_depth && self.string.inside {
                    self.literal = Some("\"".to_string());
                }
                if closed && let Some(literal) = self.literal.take() {
                    let value: String = serde_json::from_str(&literal).unwrap_or_default();
                    self.read_string(value, calls, out);
                }
                continue;
            }
            match c {
                '{' | '[' => {
                    self.depth += 1;
                    if self.depth == 1 {
                        self.call_depth = if c == '{' { 1 } else { 2 };
                    }
                    if self.depth == self.call_depth {
                        self.in_object = c == '{';
                        self.name_sent = false;
                        self.arguments_sent = false;
                        self.held.clear();
                        self.key = None;
                    }
                }
                '}' | ']' if self.depth > 0 => {
                    if self.depth == self.call_depth && c == '}' && self.name_sent && !self.arguments_sent {
                        self.arguments_sent = true;
                        out.push(MessageDelta::Arguments { index: self.index, text: "{}".to_string() });
                    }
                    self.depth -= 1;
                    self.done = self.depth == 0;
                }
                ':' if self.depth == self.call_depth
                    && matches!(self.key.as_deref(), Some("arguments" | "parameters")) =>
                {
                    self.awaiting_arguments = true
                }
                ',' if self.depth == self.call_depth => self.key = None,
                c if self.depth == 0 && !c.is_whitespace() => self.done = true,
                _ => {}
            }
        }
        self.send_arguments(arguments, out);
        text.len()
    }

    fn end_arguments(&mut self, arguments: &mut String, out: &mut Vec<MessageDelta>) {
        self.arguments = None;
        self.key = None;
        self.send_arguments(std::mem::take(arguments), out);
    }

    /// A string at call level: a key, or the value of `name`.
    fn read_string(&mut self, value: String, calls: &mut usize, out: &mut Vec<MessageDelta>) {
        match self.key.take() {
            None => self.key = Some(value),
            Some(key) if key == "name" && !self.name_sent && self.in_object => {
                self.name_sent = true;
                self.started = true;
                self.raw.clear();
                self.index = *calls;
                *calls += 1;
                out.push(MessageDelta::CallStart { index: self.index, id: String::new(), name: value });
                if !self.held.is_empty() {
                    self.arguments_sent = true;
                    out.push(MessageDelta::Arguments { index: self.index, text: std::mem::take(&mut self.held) });
                }
            }
            Some(_) => {}
        }
    }

    fn send_arguments(&mut self, text: String, out: &mut Vec<MessageDelta>) {
        if text.is_empty() {
            return;
        }
        if self.name_sent {
            self.arguments_sent = true;
            out.push(MessageDelta::Arguments { index: self.index, text });
        } else {
            self.held.push_str(&text);
        }
    }
}

/// Reads a `"required"` output, `[{"name": "...", "parameters": {...}}, ...]`.
#[derive(Debug, Default)]
struct CallListScanner {
    reader: CallValueReader,
    calls: usize,
}

impl CallListScanner {
    fn push(&mut self, text: &str, out: &mut Vec<MessageDelta>) {
        self.reader.push(text, &mut self.calls, out);
    }
}

/// Where a family writes its JSON calls in free text: between an open marker and a close
/// marker, one call object, a list of them, or several one after another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    open: &'static str,
    /// `None`: the block is its one JSON value, closed by the value's end (Phi-4-mini).
    close: Option<&'static str>,
}

/// Hermes (Qwen 2.5 / 3, NousResearch): `<tool_call>{"name", "arguments"}</tool_call>`.
pub const HERMES: Block = Block { open: "<tool_call>", close: Some("</tool_call>") };
/// LongCat-Flash: Hermes's calls in `<longcat_tool_call>...</longcat_tool_call>`.
pub const LONGCAT: Block = Block { open: "<longcat_tool_call>", close: Some("</longcat_tool_call>") };
/// Jamba's and Hunyuan-A13B's list, MiniMax's objects one per line: `<tool_calls>...</tool_calls>`.
pub const TOOL_CALLS: Block = Block { open: "<tool_calls>", close: Some("</tool_calls>") };
/// InternLM2: `<|action_start|><|plugin|>{"name", "parameters"}<|action_end|>`.
pub const INTERNLM: Block = Block { open: "<|action_start|><|plugin|>", close: Some("<|action_end|>") };
/// Phi-4-mini: `functools[{"name", "arguments"}, ...]`.
pub const PHI4_MINI: Block = Block { open: "functools", close: None };
/// granite-20b-functioncalling: `<function_call> {"name", "arguments"}`, the marker before each
/// call.
pub const GRANITE_20B_FC: Block = Block { open: "<function_call>", close: None };

/// Salesforce xLAM's blocks around its call list: a JSON code fence, Mistral's marker, or
/// Hermes's tags (a bare list at the output's start is read by [`XlamScanner`]).
pub const XLAM: [Block; 4] = [
    Block { open: "```json", close: Some("```") },
    Block { open: "```", close: Some("```") },
    Block { open: "[TOOL_CALLS]", close: None },
    HERMES,
];

/// Reads block-delimited calls out of free text: text outside blocks is content (the longest
/// end that could begin a block is held back until it cannot); a block's calls are sent as
/// they are written, and a block that holds no call is sent as text once it closes. Where a
/// family has several kinds of block, the first to open is read (the earlier listed where two
/// open at once).
#[derive(Debug)]
struct BlockScanner {
    kinds: &'static [Block],
    /// The kind of the open block.
    markers: Block,
    buffer: String,
    text: TextAroundCalls,
    /// The open block's text so far, the reader of its current value, and whether any of its
    /// values held a call.
    block: Option<OpenBlock>,
    calls: usize,
}

#[derive(Debug, Default)]
struct OpenBlock {
    body: String,
    value: Option<CallValueReader>,
    called: bool,
}

impl BlockScanner {
    fn new(kinds: &'static [Block]) -> Self {
        Self {
            kinds,
            markers: kinds[0],
            buffer: String::new(),
            text: TextAroundCalls::default(),
            block: None,
            calls: 0,
        }
    }

    /// The first block to open in the buffer, and where.
    fn next_open(&self) -> Option<(usize, Block)> {
        self.kinds.iter().filter_map(|k| self.buffer.find(k.open).map(|at| (at, *k))).min_by_key(|(at, _)| *at)
    }

    fn push(&mut self, text: &str, out: &mut Vec<MessageDelta>) {
        self.buffer.push_str(text);
        loop {
            if self.block.is_some() {
                // The block's text up to its close, or up to what could begin the close.
                let close = self.markers.close.and_then(|c| self.buffer.find(c));
                let held = self.markers.close.map_or(0, |c| held_prefix_len(&self.buffer, c));
                let end = close.unwrap_or(self.buffer.len() - held);
                let piece: String = self.buffer.drain(..end).collect();
                let unread = self.read_block(&piece, out);
                if let Some(rest) = unread {
                    // A closeless block ended with its value: what follows is text again.
                    self.buffer.insert_str(0, rest.as_str());
                    self.end_block(false, out);
                    continue;
                }
                // The piece ran up to the close, now at the buffer's start.
                let (Some(_), Some(marker)) = (close, self.markers.close) else { return };
                self.buffer.drain(..marker.len());
                self.end_block(true, out);
            } else if let Some((start, kind)) = self.next_open() {
                self.markers = kind;
                let before: String = self.buffer.drain(..start + kind.open.len()).collect();
                self.send_text(&before[..start], out);
                self.text.drop_held();
                self.block = Some(OpenBlock::default());
            } else {
                let keep = self.kinds.iter().map(|k| held_prefix_len(&self.buffer, k.open)).max().unwrap_or(0);
                let text: String = self.buffer.drain(..self.buffer.len() - keep).collect();
                self.send_text(&text, out);
                return;
            }
        }
    }

    /// Reads `piece` of the open block: its values one after another (separators and
    /// whitespace between them skipped). A closeless block ends with its value; what it did
    /// not read is returned.
    fn read_block(&mut self, piece: &str, out: &mut Vec<MessageDelta>) -> Option<String> {
        let block = self.block.as_mut().expect("a block is open");
        let mut rest = piece;
        while !rest.is_empty() {
            let value = match &mut block.value {
                Some(value) if !value.done => value,
                _ => {
                    let skipped = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ',' || c == ';');
                    block.body.push_str(&rest[..rest.len() - skipped.len()]);
                    rest = skipped;
                    if rest.is_empty() {
                        break;
                    }
                    if block.value.is_some() && self.markers.close.is_none() {
                        return Some(rest.to_string());
                    }
                    block.value.insert(CallValueReader::default())
                }
            };
            let read = value.push(rest, &mut self.calls, out);
            block.body.push_str(&rest[..read]);
            block.called |= value.started;
            rest = &rest[read..];
            if value.done && self.markers.close.is_none() {
                return Some(rest.to_string());
            }
        }
        None
    }

    fn finish(&mut self, out: &mut Vec<MessageDelta>) {
        let rest = std::mem::take(&mut self.buffer);
        if self.block.is_some() {
            // An unclosed block: the output was cut, or the model ended after the JSON.
            if let Some(unread) = self.read_block(&rest, out) {
                self.end_block(false, out);
                self.send_text(&unread, out);
            } else {
                self.end_block(false, out);
            }
        } else {
            self.send_text(&rest, out);
        }
    }

    /// A block that yielded no call is text, as it was written.
    fn end_block(&mut self, closed: bool, out: &mut Vec<MessageDelta>) {
        if let Some(block) = self.block.take()
            && !block.called
        {
            let close = if closed { self.markers.close.unwrap_or("") } else { "" };
            out.push(MessageDelta::Content(format!("{}{}{close}", self.markers.open, block.body)));
        }
    }

    fn send_text(&mut self, text: &str, out: &mut Vec<MessageDelta>) {
        self.text.send(text, self.calls, out);
    }
}

/// Reads xLAM's output: one that starts with a JSON list (`[{"name", "arguments"}, ...]`) is
/// that list of calls; any other is text whose calls are in blocks ([`XLAM`]).
#[derive(Debug, Default)]
struct XlamScanner {
    /// The output's start, until it shows which.
    start: String,
    mode: Option<XlamMode>,
}

#[derive(Debug)]
enum XlamMode {
    List(CallListScanner),
    Blocks(BlockScanner),
}

impl XlamScanner {
    fn push(&mut self, text: &str, out: &mut Vec<MessageDelta>) {
        if self.mode.is_none() {
            self.start.push_str(text);
            let head: String = self.start.chars().filter(|c| !c.is_whitespace()).take(2).collect();
            // `[` alone may begin the list or `[TOOL_CALLS]`: wait for the next character.
            if head.is_empty() || head == "[" {
                return;
            }
            let text = std::mem::take(&mut self.start);
            self.mode = Some(match head.as_str() {
                "[{" => XlamMode::List(CallListScanner::default()),
                _ => XlamMode::Blocks(BlockScanner::new(&XLAM)),
            });
            return self.push(&text, out);
        }
        match &mut self.mode {
            Some(XlamMode::List(list)) => list.push(text, out),
            Some(XlamMode::Blocks(blocks)) => blocks.push(text, out),
            None => {}
        }
    }

    fn finish(&mut self, out: &mut Vec<MessageDelta>) {
        match &mut self.mode {
            Some(XlamMode::List(_)) => {}
            Some(XlamMode::Blocks(blocks)) => blocks.finish(out),
            // The whole output was whitespace or one `[`.
            None => send_content(std::mem::take(&mut self.start), out),
        }
    }
}

/// Text around calls is content, except the whitespace models put between them. Whitespace
/// right after a call is held until text follows it (and goes out with that text) or another
/// call begins (and is dropped), so an output read in pieces gives the content it gives read
/// whole.
#[derive(Debug, Default)]
pub(super) struct TextAroundCalls {
    held: String,
    /// Text other than whitespace came since the last call.
    wrote: bool,
}

impl TextAroundCalls {
    /// Sends `text`, `calls` having been read so far.
    pub(super) fn send(&mut self, text: &str, calls: usize, out: &mut Vec<MessageDelta>) {
        let blank = text.trim().is_empty();
        if calls > 0 && !self.wrote && blank {
            self.held.push_str(text);
            return;
        }
        self.wrote |= !blank;
        send_content(std::mem::take(&mut self.held) + text, out);
    }

    /// A call begins: the whitespace held since the last is dropped.
    pub(super) fn drop_held(&mut self) {
        self.held.clear();
        self.wrote = false;
    }
}

/// Text at the start of `text` that none of `tags` (markers the reader expects next) can begin
/// with, up to the next `<`, and what follows it; `None` where `text` is empty or may still
/// become one of them.
pub(super) fn stray_text<'a>(text: &'a str, tags: &[&str]) -> Option<(&'a str, &'a str)> {
    if text.is_empty() || tags.iter().any(|t| t.starts_with(text) || text.starts_with(t)) {
        return None;
    }
    let end = text.char_indices().skip(1).find(|&(_, c)| c == '<').map_or(text.len(), |(i, _)| i);
    Some(text.split_at(end))
}

/// `text` as content, unless it is empty.
pub(super) fn send_content(text: impl Into<String>, out: &mut Vec<MessageDelta>) {
    let text = text.into();
    if !text.is_empty() {
        out.push(MessageDelta::Content(text));
    }
}

/// Where a model writes its JSON calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JsonCallsStyle {
    /// `<|python_tag|>` (or just an opening `{`), then call objects split by `;`.
    Llama,
    /// `[TOOL_CALLS]`, then a list of call objects (the marker may come again before more).
    Mistral,
    /// `<|tool_call|>` (Granite 3.0) or `<tool_call>` (3.1 on), then a list of call objects.
    Granite,
}

impl JsonCallsStyle {
    /// The markers an output of calls starts with (and that may come again between calls).
    fn markers(self) -> &'static [&'static str] {
        match self {
            Self::Llama => &["<|python_tag|>"],
            Self::Mistral => &["[TOOL_CALLS]"],
            Self::Granite => &["<|tool_call|>", "<tool_call>"],
        }
    }

    /// `text` without the marker it starts with, if it starts with one.
    fn strip_marker(self, text: &str) -> Option<&str> {
        self.markers().iter().find_map(|marker| text.strip_prefix(marker))
    }
}

/// Reads JSON calls that follow a marker: an output that starts with the marker (or, for
/// Llama, with `{`) is a run of JSON values, whose calls are sent as they are written (a value
/// that holds no call is sent as text once it closes); any other output is content, streamed
/// as it comes.
#[derive(Debug)]
struct JsonCallsScanner {
    style: JsonCallsStyle,
    mode: JsonCallsMode,
    /// The undecided start.
    buffer: String,
    /// The value being read.
    value: Option<CallValueReader>,
    /// Mistral's newer call being read, `name[ARGS]{...}`.
    named: Option<NamedCall>,
    calls: usize,
}

/// Mistral's newer calls (tokenizer v11 on: Mistral Small 3.2, Magistral, Devstral):
/// `[TOOL_CALLS]name[ARGS]{...}`, the arguments streamed once the name is complete.
#[derive(Debug, Default)]
struct NamedCall {
    name: String,
    arguments: Option<JsonLayout>,
}

/// What separates a newer Mistral call's name from its arguments.
const ARGS_MARKER: &str = "[ARGS]";
/// Longer than any function name: text that runs this long without `[ARGS]` is not a call.
const MAX_NAME_CHARS: usize = 256;

#[derive(Debug, Default, PartialEq)]
enum JsonCallsMode {
    #[default]
    Undecided,
    Text,
    Calls,
}

impl JsonCallsScanner {
    fn new(style: JsonCallsStyle) -> Self {
        Self { style, mode: JsonCallsMode::Undecided, buffer: String::new(), value: None, named: None, calls: 0 }
    }

    fn push(&mut self, text: &str, out: &mut Vec<MessageDelta>) {
        match self.mode {
            JsonCallsMode::Text => out.push(MessageDelta::Content(text.to_string())),
            JsonCallsMode::Calls => self.read_calls(text, out),
            JsonCallsMode::Undecided => {
                self.buffer.push_str(text);
                let start = self.buffer.trim_start();
                let may_become_marker = |m: &&str| m.starts_with(start) && start.len() < m.len();
                if start.is_empty() || self.style.markers().iter().any(may_become_marker) {
                    return;
                }
                let bare = self.style == JsonCallsStyle::Llama && start.starts_with('{');
                let calls = self.style.strip_marker(start).or_else(|| bare.then_some(start));
                match calls.map(str::to_string) {
                    Some(rest) => {
                        self.mode = JsonCallsMode::Calls;
                        self.buffer.clear();
                        self.read_calls(&rest, out);
                    }
                    None => {
                        self.mode = JsonCallsMode::Text;
                        out.push(MessageDelta::Content(std::mem::take(&mut self.buffer)));
                    }
                }
            }
        }
    }

    fn read_calls(&mut self, text: &str, out: &mut Vec<MessageDelta>) {
        let mut rest = text;
        let mut arguments = String::new();
        while let Some(c) = rest.chars().next() {
            if let Some(value) = &mut self.value {
                rest = &rest[value.push(rest, &mut self.calls, out)..];
                if value.done {
                    self.end_value(out);
                }
                continue;
            }
            if let Some(named) = &mut self.named {
                match &mut named.arguments {
                    None => {
                        named.name.push(c);
                        if let Some(name) = named.name.strip_suffix(ARGS_MARKER) {
                            let name = name.trim().to_string();
                            out.push(MessageDelta::CallStart { index: self.calls, id: String::new(), name });
                            self.calls += 1;
                            named.arguments = Some(JsonLayout::default());
                        } else if named.name.chars().count() > MAX_NAME_CHARS {
                            out.push(MessageDelta::Content(std::mem::take(&mut named.name)));
                            self.named = None;
                        }
                    }
                    Some(layout) => match layout.push(c, &mut arguments) {
                        Laid::More => {}
                        Laid::Closed => self.end_named(&mut arguments, out),
                        Laid::Ended => {
                            self.end_named(&mut arguments, out);
                            continue;
                        }
                    },
                }
                rest = &rest[c.len_utf8()..];
                continue;
            }
            // Between values: the marker again (a special token, so it comes whole),
            // separators, and the spaces around them.
            if let Some(after) = self.style.strip_marker(rest) {
                rest = after;
                continue;
            }
            match c {
                '{' | '[' => {
                    self.value = Some(CallValueReader::default());
                    continue;
                }
                c if self.style == JsonCallsStyle::Mistral && (c.is_alphabetic() || c == '_') => {
                    self.named = Some(NamedCall::default());
                    continue;
                }
                ';' | ',' => {}
                c if c.is_whitespace() => {}
                c => out.push(MessageDelta::Content(c.to_string())),
            }
            rest = &rest[c.len_utf8()..];
        }
        self.send_named_arguments(&mut arguments, out);
    }

    fn send_named_arguments(&self, arguments: &mut String, out: &mut Vec<MessageDelta>) {
        if !arguments.is_empty() {
            out.push(MessageDelta::Arguments { index: self.calls - 1, text: std::mem::take(arguments) });
        }
    }

    /// A newer Mistral call's arguments closed.
    fn end_named(&mut self, arguments: &mut String, out: &mut Vec<MessageDelta>) {
        self.send_named_arguments(arguments, out);
        self.named = None;
    }

    /// A value that yielded no call is text, as it was written.
    fn end_value(&mut self, out: &mut Vec<MessageDelta>) {
        if let Some(value) = self.value.take()
            && !value.started
        {
            out.push(MessageDelta::Content(value.raw));
        }
    }

    /// An undecided start is text; so is a value cut before it yielded a call, and a newer
    /// Mistral call's name that never reached `[ARGS]`.
    fn finish(&mut self, out: &mut Vec<MessageDelta>) {
        let rest = std::mem::take(&mut self.buffer);
        if !rest.is_empty() {
            out.push(MessageDelta::Content(rest));
        }
        self.end_value(out);
        if let Some(NamedCall { name, arguments: None }) = self.named.take() {
            out.push(MessageDelta::Content(name));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::message::{AssistantMessage, MessageReader};

    /// Feeds `text` in pieces of `size` characters and gathers the message.
    fn read_in_pieces(stream: CallStream, text: &str, size: usize) -> AssistantMessage {
        let mut reader = MessageReader::new(None, true, stream);
        let chars: Vec<char> = text.chars().collect();
        let mut message = AssistantMessage::default();
        for piece in chars.chunks(size) {
            for d in reader.push(&piece.iter().collect::<String>()) {
                message.add(d);
            }
        }
        for d in reader.finish() {
            message.add(d);
        }
        message
    }

    trait ReadAll {
        fn read_all(self, text: &str) -> AssistantMessage;
    }

    impl ReadAll for CallStream {
        fn read_all(self, text: &str) -> AssistantMessage {
            MessageReader::new(None, true, self).read_all(text)
        }
    }

    fn calls(message: &AssistantMessage) -> Vec<(&str, &str)> {
        message.tool_calls.iter().map(|(_, n, a)| (n.as_str(), a.as_str())).collect()
    }

    #[test]
    fn a_call_list_yields_each_call_with_its_arguments_text_whatever_the_pieces() {
        let text = r#"[{"name": "get_weather", "parameters": {"city": "Paris, \"FR\"", "days": [1, {"x": "}"}]}}, { "name": "get_time", "parameters": {} }]"#;
        for size in [1, 2, 3, 7, 1000] {
            let message = read_in_pieces(CallStream::call_list(), text, size);
            assert_eq!(
                calls(&message),
                vec![("get_weather", r#"{"city": "Paris, \"FR\"", "days": [1, {"x": "}"}]}"#), ("get_time", "{}")],
                "pieces of {size}"
            );
            assert_eq!(message.to_json()["content"], Value::Null);
        }
    }

    #[test]
    fn a_call_list_streams_the_name_first_and_arguments_as_they_come() {
        let mut stream = CallStream::call_list();
        assert!(stream.push(r#"[{"name": "get_wea"#).is_empty());
        let start = stream.push(r#"ther", "parameters": {"ci"#);
        assert!(matches!(&start[0], MessageDelta::CallStart { index: 0, name, .. } if name == "get_weather"));
        assert_eq!(start[1], MessageDelta::Arguments { index: 0, text: r#"{"ci"#.into() });
        assert_eq!(
            stream.push(r#"ty": "Oslo"}}"#),
            vec![MessageDelta::Arguments { index: 0, text: r#"ty": "Oslo"}"#.into() }]
        );
        assert!(stream.push("]").is_empty());
    }

    #[test]
    fn scalar_arguments_end_at_the_call_objects_next_member_or_end() {
        let message = CallStream::call_list()
            .read_all(r#"[{"name": "f", "parameters": 42}, {"name": "g", "parameters": "a,b"}]"#);
        assert_eq!(calls(&message), vec![("f", "42"), ("g", r#""a,b""#)]);
    }

    #[test]
    fn a_named_call_is_the_whole_output_and_exists_even_when_cut_before_it_began() {
        let message = read_in_pieces(CallStream::named("get_time"), r#"{"zone": "UTC"}"#, 3);
        assert_eq!(calls(&message), vec![("get_time", r#"{"zone": "UTC"}"#)]);
        let message = CallStream::named("get_time").read_all("");
        assert_eq!(calls(&message), vec![("get_time", "")]);
    }

    #[test]
    fn jamba_minimax_internlm_longcat_phi4_and_granite_20b_blocks_read_like_hermes_whatever_the_pieces() {
        let weather = r#"{"city": "Oslo"}"#;
        let cases = [
            // Jamba: a list in the block.
            (
                &[TOOL_CALLS],
                r#"Checking.<tool_calls>[{"name": "get_weather", "arguments": {"city":"Oslo"}}, {"name": "get_time", "arguments": {}}]</tool_calls>"#,
            ),
            // MiniMax: one object a line.
            (
                &[TOOL_CALLS],
                "Checking.<tool_calls>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_calls>",
            ),
            // InternLM2: one call a block, its arguments as `parameters`.
            (
                &[INTERNLM],
                "Checking.<|action_start|><|plugin|>\n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}<|action_end|>\n\
                 <|action_start|><|plugin|>{\"name\": \"get_time\", \"parameters\": {}}<|action_end|>",
            ),
            // LongCat-Flash: Hermes's layout under its own tags.
            (
                &[LONGCAT],
                "Checking.<longcat_tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</longcat_tool_call>\n\
                 <longcat_tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</longcat_tool_call>",
            ),
            // Phi-4-mini: the block is its list.
            (
                &[PHI4_MINI],
                r#"Checking.functools[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}]"#,
            ),
            // granite-20b-functioncalling: the marker before each call, a line apart.
            (
                &[GRANITE_20B_FC],
                "Checking.<function_call> {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n\
                 <function_call> {\"name\": \"get_time\", \"arguments\": {}}",
            ),
        ];
        for (markers, text) in cases {
            for size in [1, 3, 8, 1000] {
                let message = read_in_pieces(CallStream::blocks(markers), text, size);
                assert_eq!(message.content, "Checking.", "{markers:?}, pieces of {size}");
                assert_eq!(
                    calls(&message),
                    vec![("get_weather", weather), ("get_time", "{}")],
                    "{markers:?}, pieces of {size}"
                );
            }
        }
        // Phi-4-mini's block ends with its list: text after it is content again.
        let after =
            CallStream::blocks(&[PHI4_MINI]).read_all(r#"functools[{"name": "get_time", "arguments": {}}] Done."#);
        assert_eq!((calls(&after), after.content.as_str()), (vec![("get_time", "{}")], " Done."));
        let plain = CallStream::blocks(&[PHI4_MINI]).read_all("functools are handy; no call here.");
        assert_eq!((plain.tool_calls.len(), plain.content.as_str()), (0, "functools are handy; no call here."));
    }

    #[test]
    fn xlam_reads_its_list_bare_fenced_marked_or_tagged_whatever_the_pieces() {
        let list = r#"[{"name": "get_weather", "arguments": {"city": "Oslo"}}, {"name": "get_time", "arguments": {}}]"#;
        let cases = [
            (format!("  {list}"), ""),
            (format!("Checking.\n```json\n{list}\n```"), "Checking.\n"),
            (format!("Checking.\n```\n{list}\n```"), "Checking.\n"),
            (format!("Checking.[TOOL_CALLS]{list}"), "Checking."),
            (format!("Checking.<tool_call>{list}</tool_call>"), "Checking."),
        ];
        for (text, content) in &cases {
            for size in [1, 2, 7, 1000] {
                let message = read_in_pieces(CallStream::xlam(), text, size);
                assert_eq!(message.content, *content, "{text:?}, pieces of {size}");
                assert_eq!(
                    calls(&message),
                    vec![("get_weather", r#"{"city": "Oslo"}"#), ("get_time", "{}")],
                    "{text:?}, pieces of {size}"
                );
            }
        }
        // Text is text, code fences that call nothing included, and a lone `[` is kept.
        for text in ["[1] is a citation.", "Use:\n```python\nprint(1)\n```\nDone.", "[", "  "] {
            for size in [1, 3, 1000] {
                let message = read_in_pieces(CallStream::xlam(), text, size);
                assert_eq!((message.content.as_str(), message.tool_calls.len()), (text, 0), "pieces of {size}");
            }
        }
    }

    #[test]
    fn hermes_blocks_become_calls_and_the_text_around_them_content() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        for size in [1, 4, 1000] {
            let message = read_in_pieces(CallStream::hermes(), text, size);
            assert_eq!(message.content, "Let me check.\n", "pieces of {size}");
            assert_eq!(calls(&message), vec![("get_weather", r#"{"city": "Oslo"}"#), ("get_time", "{}")]);
            // Text after the calls keeps the whitespace it opens with, in pieces as whole; the
            // whitespace between calls or at the end is no content.
            let after = read_in_pieces(CallStream::hermes(), &format!("{text}\n Done.\n"), size);
            assert_eq!(after.content, "Let me check.\n\n Done.\n", "pieces of {size}");
        }
        let plain = CallStream::hermes().read_all("No tools needed: a < b and <tool is fine.");
        assert_eq!(plain.content, "No tools needed: a < b and <tool is fine.");
        assert!(plain.tool_calls.is_empty());
        assert_eq!(plain.to_json()["content"], "No tools needed: a < b and <tool is fine.");
    }

    #[test]
    fn parallel_tool_calls_false_keeps_the_first_call_and_the_text() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>\n Done.";
        for size in [1, 4, 1000] {
            let message = read_in_pieces(CallStream::hermes().first_call_only(), text, size);
            assert_eq!(calls(&message), vec![("get_weather", r#"{"city": "Oslo"}"#)], "pieces of {size}");
            assert_eq!(message.content, "Let me check.\n\n Done.", "pieces of {size}");
        }
        let listed = CallStream::llama_json()
            .first_call_only()
            .read_all(r#"{"name": "f", "parameters": {}}; {"name": "g", "parameters": {}}"#);
        assert_eq!(calls(&listed), vec![("f", "{}")]);
    }

    #[test]
    fn hermes_keeps_a_block_that_holds_no_call_as_text_and_reads_an_unclosed_one() {
        let broken = CallStream::hermes().read_all("<tool_call>not json</tool_call>");
        assert_eq!(broken.content, "<tool_call>not json</tool_call>");
        assert!(broken.tool_calls.is_empty());
        let unclosed = CallStream::hermes().read_all("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}");
        assert_eq!(calls(&unclosed), vec![("f", r#"{"a": [1, 2]}"#)]);
        // A finished message holds only calls whose arguments are a JSON object, as vLLM's
        // parsers keep them: a cut or broken one leaves the text as it was written.
        let no_arguments = CallStream::hermes().read_all("<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>");
        assert_eq!(calls(&no_arguments), vec![("get_time", "{}")], "a call without arguments takes none");
        for text in [
            "<tool_call>{\"name\": \"f\", \"argu",
            "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": UTC}}\n</tool_call>",
        ] {
            let kept = CallStream::hermes().read_all(text);
            assert_eq!((kept.content.as_str(), kept.tool_calls.len()), (text, 0), "{text}");
        }
        let nameless = CallStream::hermes().read_all("<tool_call>{\"arguments\": {}, \"na");
        assert_eq!(nameless.content, "<tool_call>{\"arguments\": {}, \"na");
    }

    #[test]
    fn hermes_holds_back_only_what_could_begin_a_block() {
        let mut stream = CallStream::hermes();
        assert_eq!(stream.push("Hi <tool"), vec![MessageDelta::Content("Hi ".into())]);
        assert_eq!(stream.push("s are"), vec![MessageDelta::Content("<tools are".into())]);
    }

    #[test]
    fn llama_json_calls_follow_the_python_tag_or_an_opening_brace_and_split_at_semicolons() {
        let text = r#"<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo; Norway", "n": [1]}}; {"name": "get_time", "arguments": {}}"#;
        for size in [1, 3, 1000] {
            let message = read_in_pieces(CallStream::llama_json(), text, size);
            assert_eq!(
                calls(&message),
                vec![("get_weather", r#"{"city": "Oslo; Norway", "n": [1]}"#), ("get_time", "{}")],
                "pieces of {size}"
            );
            assert_eq!(message.to_json()["content"], Value::Null);
        }
        let bare = CallStream::llama_json().read_all(" {\"name\": \"f\", \"parameters\": {\"a\": 1}}");
        assert_eq!(calls(&bare), vec![("f", r#"{"a": 1}"#)]);
    }

    #[test]
    fn llama_json_leaves_answers_and_objects_without_a_name_as_text() {
        let mut stream = CallStream::llama_json();
        assert!(stream.push(" <|py").is_empty(), "could still be the tag");
        assert_eq!(stream.push("thon is fun"), vec![MessageDelta::Content(" <|python is fun".into())]);
        assert_eq!(stream.push(" {x}"), vec![MessageDelta::Content(" {x}".into())]);
        let object = CallStream::llama_json().read_all(r#"{"answer": 4}"#);
        assert!(object.tool_calls.is_empty());
        assert_eq!(object.content, r#"{"answer": 4}"#);
        let cut = CallStream::llama_json().read_all(r#"{"nam"#);
        assert_eq!(cut.content, r#"{"nam"#);
        // Named but cut before its arguments: no call a client could make, so the text stays.
        let named = CallStream::llama_json().read_all(r#"{"name": "f", "param"#);
        assert_eq!((named.content.as_str(), calls(&named)), (r#"{"name": "f", "param"#, vec![]));
        // Streamed, the call was announced as it came (a stream cannot take it back).
        let mut stream = CallStream::llama_json();
        let streamed = stream.push(r#"{"name": "f", "param"#);
        assert!(matches!(&streamed[..], [MessageDelta::CallStart { name, .. }] if name == "f"), "{streamed:?}");
    }

    #[test]
    fn mistral_calls_follow_the_marker_as_a_list_and_get_nine_character_ids() {
        let text = r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lyon, FR"}}, {"name": "get_time", "arguments": {}}]"#;
        for size in [1, 4, 1000] {
            let message = read_in_pieces(CallStream::mistral().with_ids(CallIds::Mistral), text, size);
            assert_eq!(calls(&message), vec![("get_weather", r#"{"city": "Lyon, FR"}"#), ("get_time", "{}")]);
            for (id, _, _) in &message.tool_calls {
                assert!(id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()), "{id}");
            }
        }
        let again = CallStream::mistral()
            .read_all(r#"[TOOL_CALLS] [{"name": "f", "arguments": {}}][TOOL_CALLS][{"name": "g"}]"#);
        assert_eq!(calls(&again), vec![("f", "{}"), ("g", "{}")]);
        assert!(again.tool_calls[0].0.starts_with("chatcmpl-tool-"), "vLLM's ids unless asked otherwise");
        let answer = CallStream::mistral().read_all(r#"{"name": "not a call without the marker"}"#);
        assert!(answer.tool_calls.is_empty());
        let not_calls = CallStream::mistral().read_all("[TOOL_CALLS][1, 2]");
        assert_eq!((not_calls.content.as_str(), not_calls.tool_calls.len()), ("[1, 2]", 0));
    }

    #[test]
    fn granite_calls_follow_either_marker_as_a_list_arguments_first_or_not() {
        let text = r#"<|tool_call|>[{"arguments": {"city": "Boston"}, "name": "get_weather"}, {"name": "get_time", "arguments": {"tz": "UTC"}}]"#;
        for size in [1, 3, 1000] {
            let message = read_in_pieces(CallStream::granite(), text, size);
            assert_eq!(
                calls(&message),
                vec![("get_weather", r#"{"city": "Boston"}"#), ("get_time", r#"{"tz": "UTC"}"#)],
                "pieces of {size}"
            );
            assert_eq!(message.content, "");
        }
        let newer = CallStream::granite().read_all(r#"<tool_call>[{"name": "f", "arguments": {"a": 1}}]"#);
        assert_eq!(calls(&newer), vec![("f", r#"{"a": 1}"#)]);
        let answer = CallStream::granite().read_all("The weather in <b>Boston</b> is fine.");
        assert_eq!((answer.content.as_str(), answer.tool_calls.len()), ("The weather in <b>Boston</b> is fine.", 0));
    }

    #[test]
    fn arguments_come_in_the_layout_of_json_dumps_with_strings_untouched() {
        let text =
            "<tool_call>{\"name\":\"f\",\"arguments\":{ \"a\" :[1,\"x ,: y\"],\n \"b\":{\"c\":null}}}</tool_call>";
        for size in [1, 5, 1000] {
            let message = read_in_pieces(CallStream::hermes(), text, size);
            assert_eq!(calls(&message), vec![("f", r#"{"a": [1, "x ,: y"], "b": {"c": null}}"#)], "pieces of {size}");
        }
    }

    /// The deltas `pieces` yield, one list per piece.
    fn deltas(mut stream: CallStream, pieces: &[&str]) -> Vec<Vec<MessageDelta>> {
        pieces.iter().map(|p| stream.push(p).into_iter().map(without_id).collect()).collect()
    }

    fn without_id(delta: MessageDelta) -> MessageDelta {
        match delta {
            MessageDelta::CallStart { index, name, .. } => MessageDelta::CallStart { index, id: String::new(), name },
            other => other,
        }
    }

    fn start(index: usize, name: &str) -> MessageDelta {
        MessageDelta::CallStart { index, id: String::new(), name: name.into() }
    }

    fn arguments(index: usize, text: &str) -> MessageDelta {
        MessageDelta::Arguments { index, text: text.into() }
    }

    #[test]
    fn hermes_streams_a_calls_name_then_its_arguments_as_they_are_written() {
        let pieces = [
            "Sure.<tool_call>\n{\"name\": \"get_",
            "weather\", \"arguments\": {\"city\": \"Os",
            "lo\"}}\n</tool_call>\n<tool_call>{\"arguments\": {\"zone\": 1}, ",
            "\"name\": \"get_time\"}</tool_call>",
        ];
        assert_eq!(
            deltas(CallStream::hermes(), &pieces),
            vec![
                vec![MessageDelta::Content("Sure.".into())],
                vec![start(0, "get_weather"), arguments(0, r#"{"city": "Os"#)],
                vec![arguments(0, r#"lo"}"#)],
                vec![start(1, "get_time"), arguments(1, r#"{"zone": 1}"#)],
            ]
        );
    }

    #[test]
    fn llama_and_mistral_calls_stream_as_they_are_written() {
        let llama = deltas(
            CallStream::llama_json(),
            &["<|python_tag|>{\"name\": \"f\", \"parameters\": {\"q\": \"a", "b\"}}; {\"name\": \"g\"}"],
        );
        assert_eq!(
            llama,
            vec![
                vec![start(0, "f"), arguments(0, r#"{"q": "a"#)],
                vec![arguments(0, r#"b"}"#), start(1, "g"), arguments(1, "{}")]
            ]
        );
        let mistral = deltas(
            CallStream::mistral(),
            &["[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"n\": 1", "2}}, {\"name\": \"g\", \"arguments\": {}}]"],
        );
        assert_eq!(
            mistral,
            vec![
                vec![start(0, "f"), arguments(0, r#"{"n": 1"#)],
                vec![arguments(0, "2}"), start(1, "g"), arguments(1, "{}")]
            ]
        );
    }
    #[test]
    fn newer_mistral_calls_name_the_function_then_stream_its_arguments() {
        let weather = r#"[TOOL_CALLS]get_weather[ARGS]{"city":"Lyon, FR", "days": [1,2]}"#;
        for size in [1, 4, 1000] {
            let message = read_in_pieces(CallStream::mistral(), weather, size);
            assert_eq!(
                calls(&message),
                vec![("get_weather", r#"{"city": "Lyon, FR", "days": [1, 2]}"#)],
                "pieces of {size}"
            );
            assert_eq!(message.content, "");
        }
        // The marker is a special token: it comes whole, before each further call.
        let both = CallStream::mistral().read_all(&format!("{weather}[TOOL_CALLS]get_time[ARGS]{{}}"));
        assert_eq!(calls(&both), vec![("get_weather", r#"{"city": "Lyon, FR", "days": [1, 2]}"#), ("get_time", "{}")]);
        let streamed = deltas(CallStream::mistral(), &["[TOOL_CALLS]get_wea", "ther[ARGS]{\"city\": \"Ly", "on\"}"]);
        assert_eq!(
            streamed,
            vec![vec![], vec![start(0, "get_weather"), arguments(0, r#"{"city": "Ly"#)], vec![arguments(0, r#"on"}"#)]]
        );
        let unnamed = CallStream::mistral().read_all("[TOOL_CALLS]sorry, no call");
        assert_eq!((unnamed.content.as_str(), unnamed.tool_calls.len()), ("sorry, no call", 0));
    }

    #[test]
    fn deepseek_calls_are_read_in_the_v3_and_v31_layouts_whatever_the_pieces() {
        let v3 = "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n\
                  {\"city\":\"Paris, FR\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n\
                  ```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let v31 = "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris, FR\"}\
                   <｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        for (layout, text) in [("v3", v3), ("v3.1", v31)] {
            for size in [1, 3, 1000] {
                let message = read_in_pieces(CallStream::deepseek(), text, size);
                assert_eq!(message.content, "Checking.", "{layout} in pieces of {size}");
                assert_eq!(
                    calls(&message),
                    vec![("get_weather", r#"{"city": "Paris, FR"}"#), ("get_time", "{}")],
                    "{layout} in pieces of {size}"
                );
            }
        }
        let streamed = deltas(
            CallStream::deepseek(),
            &[
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Pa",
                "ris\"}<｜tool▁call▁end｜>",
            ],
        );
        assert_eq!(
            streamed,
            vec![vec![start(0, "get_weather"), arguments(0, r#"{"city": "Pa"#)], vec![arguments(0, r#"ris"}"#)]]
        );
        let plain = CallStream::deepseek().read_all("No tools: a <｜ is not a call.");
        assert_eq!((plain.content.as_str(), plain.tool_calls.len()), ("No tools: a <｜ is not a call.", 0));
        let stray = CallStream::deepseek().read_all("<｜tool▁calls▁begin｜>Sorry, no call.");
        assert_eq!((stray.content.as_str(), stray.tool_calls.len()), ("Sorry, no call.", 0), "no text is lost");
    }

    #[test]
    fn kimi_calls_keep_the_models_ids_and_name_the_function_inside_them() {
        let text = "On it.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0\
                    <|tool_call_argument_begin|>{\"city\":\"Paris\"}<|tool_call_end|><|tool_call_begin|>\
                    functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>";
        for size in [1, 5, 1000] {
            let message = read_in_pieces(CallStream::kimi(), text, size);
            assert_eq!(message.content, "On it.", "pieces of {size}");
            assert_eq!(calls(&message), vec![("get_weather", r#"{"city": "Paris"}"#), ("get_time", "{}")]);
            let ids: Vec<&str> = message.tool_calls.iter().map(|(id, _, _)| id.as_str()).collect();
            assert_eq!(ids, ["functions.get_weather:0", "functions.get_time:1"], "Kimi's templates want them back");
        }
    }

    #[test]
    fn pythonic_calls_stream_with_python_literals_turned_into_json() {
        let text = r#"[get_weather(city='Paris, "FR"', days=[1, 2.5], opts={'metric': True, 'x': None}), get_time()]"#;
        for size in [1, 3, 1000] {
            let message = read_in_pieces(CallStream::pythonic(), text, size);
            assert_eq!(
                calls(&message),
                vec![
                    (
                        "get_weather",
                        r#"{"city": "Paris, \"FR\"", "days": [1, 2.5], "opts": {"metric": true, "x": null}}"#
                    ),
                    ("get_time", "{}")
                ],
                "pieces of {size}"
            );
            assert_eq!(message.content, "");
        }
        let streamed = deltas(CallStream::pythonic(), &["[get_time(zone=\"Europe/Os", "lo\", fmt=(1, 'a\\'b'))]"]);
        assert_eq!(
            streamed,
            vec![
                vec![start(0, "get_time"), arguments(0, r#"{"zone": "Europe/Os"#)],
                vec![arguments(0, r#"lo", "fmt": [1, "a'b"]}"#)]
            ]
        );
    }

    #[test]
    fn pythonic_skips_llama4_markers_and_leaves_other_text_alone() {
        let message = CallStream::pythonic().read_all("<|python_start|>[f(a=1)]<|python_end|>");
        assert_eq!((calls(&message), message.content.as_str()), (vec![("f", r#"{"a": 1}"#)], ""));
        for answer in ["[1] See the notes.", "[Note] Sunny.", "It is [sunny](x).", " [f, g]", "[", "<|python"] {
            let message = CallStream::pythonic().read_all(answer);
            assert_eq!((message.content.as_str(), message.tool_calls.len()), (answer, 0), "{answer:?}");
        }
        let broken = CallStream::pythonic().read_all("[f(a=1, 2)] and more");
        assert_eq!(calls(&broken), vec![("f", r#"{"a": 1}"#)], "a call, once started, is kept and closed");
        assert_eq!(broken.content, "2)] and more");
    }

    #[test]
    fn olmo3_reads_a_call_a_line_in_its_tags_whatever_the_pieces() {
        let text =
            "<function_calls>\nget_weather(city=\"Oslo\", metric=true, days=None)\nget_time()\n</function_calls> Done.";
        for size in [1, 2, 5, 1000] {
            let message = read_in_pieces(CallStream::olmo3(), text, size);
            assert_eq!(
                calls(&message),
                vec![("get_weather", r#"{"city": "Oslo", "metric": true, "days": null}"#), ("get_time", "{}")],
                "pieces of {size}"
            );
            assert_eq!(message.content, " Done.", "pieces of {size}");
        }
        // Outside its tags, and in Llama's brackets, it is text.
        for answer in ["Python(the language) is fun.", "[f(a=1)]", "<function", "Sure."] {
            let message = CallStream::olmo3().read_all(answer);
            assert_eq!((message.content.as_str(), message.tool_calls.len()), (answer, 0), "{answer:?}");
        }
    }
}
