//! Llama 3.2 / 4's Python-style tool calls (vLLM's `pythonic` parser):
//! `[get_weather(city="Paris"), get_time()]`, keyword arguments as Python literals (strings in
//! either quotes, numbers, `True`/`False`/`None`, lists, tuples, dicts), turned into JSON as
//! they are read. Llama 4 may wrap the list in `<|python_start|>` ... `<|python_end|>`. OLMo 3
//! (`olmo3`) writes the same calls one a line in `<function_calls>` ... `</function_calls>`, with
//! JSON's `true` / `false` / `null` too.
//! The reader is driven through [`super::calls::CallStream::pythonic`], whose tests cover it.

use serde_json::Value;

use super::calls::send_content;
use crate::message::MessageDelta;

/// What Llama 4 writes around its call list.
const PYTHON_START: &str = "<|python_start|>";
const PYTHON_END: &str = "<|python_end|>";
/// What OLMo 3 writes around its calls.
const FUNCTION_CALLS_START: &str = "<function_calls>";
const FUNCTION_CALLS_END: &str = "</function_calls>";

/// Whose layout of calls is read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `[f(a=1), g()]`, in `<|python_start|>` ... `<|python_end|>` or bare (Llama 3.2 / 4).
    #[default]
    List,
    /// `f(a=1)` and `g()` a line each, in `<function_calls>` ... `</function_calls>` (OLMo 3).
    Lines,
}

impl Layout {
    /// The tag that may open the calls, and the one that then closes them.
    fn tags(self) -> (&'static str, &'static str) {
        match self {
            Self::List => (PYTHON_START, PYTHON_END),
            Self::Lines => (FUNCTION_CALLS_START, FUNCTION_CALLS_END),
        }
    }
}

/// Reads Python-style call lists, `[get_weather(city="Paris"), get_time()]` (Llama 3.2 / 4):
/// an output that opens with `[` and a call (`name(`) is read call by call, each call starting
/// at its `(` and its keyword arguments sent as a JSON object as they come (Python literals
/// turned into JSON). Any other output is content, streamed as it comes; so is the rest of an
/// output from where it stops being a call list.
#[derive(Debug, Default)]
pub struct PythonicScanner {
    layout: Layout,
    mode: PythonicMode,
    /// The undecided start, or after the calls what may begin their closing tag.
    held: String,
    calls: usize,
}

#[derive(Debug, Default)]
enum PythonicMode {
    #[default]
    Undecided,
    Text,
    /// Inside the list, `[` read.
    Calls(ListPosition),
    /// After the list's `]`.
    Done,
}

#[derive(Debug)]
enum ListPosition {
    BeforeName,
    Name(String),
    /// Inside a call's parentheses, before a keyword (`first`: no argument sent yet).
    BeforeKey {
        first: bool,
    },
    Key {
        key: String,
        first: bool,
    },
    Value(PythonLiteral),
    AfterCall,
}

/// What a character does to the list reader.
enum Step {
    Stay,
    Move(ListPosition),
    /// The list's `]`.
    Close,
    /// The text stops being a call list.
    Break,
}

/// Whether `text` is, or may still become, the start of a call list: `[`, a name, `(`.
enum ListStart {
    Maybe,
    Not,
    /// It is; the list's text begins at this byte (just after the `[`).
    At(usize),
}

fn list_start(text: &str, layout: Layout) -> ListStart {
    let trimmed = text.trim_start();
    let mut at = text.len() - trimmed.len();
    let rest = &text[at..];
    let (open, _) = layout.tags();
    if let Some(after) = rest.strip_prefix(open) {
        at += open.len() + (after.len() - after.trim_start().len());
    } else if open.starts_with(rest) && rest.starts_with('<') {
        return ListStart::Maybe;
    } else if layout == Layout::Lines {
        // Bare lines are too like prose ("Python(the language) ..."): OLMo 3's calls are read
        // in their tags.
        return ListStart::Not;
    }
    let rest = &text[at..];
    // OLMo 3's calls need no brackets: the first call's name starts them.
    let (inside, skip) = match (rest.strip_prefix('['), layout) {
        (Some(inside), Layout::List) => (inside, 1),
        (_, Layout::Lines) => (rest, 0),
        (None, Layout::List) => return if rest.is_empty() { ListStart::Maybe } else { ListStart::Not },
    };
    let name = inside.trim_start();
    let name_len = name.find(|c: char| !is_name_char(c)).unwrap_or(name.len());
    if name.is_empty() {
        return ListStart::Maybe;
    }
    if name_len == 0 || name.starts_with(|c: char| c.is_ascii_digit()) {
        return ListStart::Not;
    }
    match name[name_len..].chars().next() {
        None => ListStart::Maybe,
        Some('(') => ListStart::At(at + skip),
        Some(_) => ListStart::Not,
    }
}

fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '.'
}

impl PythonicScanner {
    pub fn new(layout: Layout) -> Self {
        Self { layout, ..Self::default() }
    }

    pub fn push(&mut self, text: &str, out: &mut Vec<MessageDelta>) {
        match &self.mode {
            PythonicMode::Text => return send_content(text, out),
            PythonicMode::Undecided => {
                self.held.push_str(text);
                match list_start(&self.held, self.layout) {
                    ListStart::Maybe => {}
                    ListStart::Not => {
                        self.mode = PythonicMode::Text;
                        send_content(std::mem::take(&mut self.held), out);
                    }
                    ListStart::At(at) => {
                        let list = self.held.split_off(at);
                        self.held.clear();
                        self.mode = PythonicMode::Calls(ListPosition::BeforeName);
                        self.read(&list, out);
                    }
                }
                return;
            }
            PythonicMode::Done if !self.held.is_empty() => {
                let text = std::mem::take(&mut self.held) + text;
                return self.read(&text, out);
            }
            PythonicMode::Calls(_) | PythonicMode::Done => {}
        }
        self.read(text, out);
    }

    /// Reads list text; from a character that breaks the list on, the output is content.
    fn read(&mut self, text: &str, out: &mut Vec<MessageDelta>) {
        let mut arguments = String::new();
        for (i, c) in text.char_indices() {
            let index = self.calls.saturating_sub(1);
            let position = match &mut self.mode {
                PythonicMode::Calls(position) => position,
                PythonicMode::Done => {
                    let rest = text[i..].trim_start();
                    let (_, close) = self.layout.tags();
                    send_arguments(index, &mut arguments, out);
                    // What may still become the closing tag waits for the next piece.
                    if !rest.is_empty() && close.starts_with(rest) && rest.len() < close.len() {
                        self.held = rest.to_string();
                        return;
                    }
                    // After the closing tag everything is text, as it comes.
                    match rest.strip_prefix(close) {
                        Some(after) => {
                            self.mode = PythonicMode::Text;
                            send_content(after, out);
                        }
                        None if !rest.is_empty() => {
                            self.mode = PythonicMode::Text;
                            send_content(rest, out);
                        }
                        None => {}
                    }
                    return;
                }
                _ => unreachable!("read runs inside the list"),
            };
            let step = match position {
                ListPosition::BeforeName if c.is_whitespace() => Step::Stay,
                ListPosition::BeforeName if is_name_char(c) && !c.is_ascii_digit() => {
                    Step::Move(ListPosition::Name(c.to_string()))
                }
                ListPosition::Name(name) if is_name_char(c) => {
                    name.push(c);
                    Step::Stay
                }
                ListPosition::Name(name) if c == '(' => {
                    let name = std::mem::take(name);
                    send_arguments(index, &mut arguments, out);
                    out.push(MessageDelta::CallStart { index: self.calls, id: String::new(), name });
                    self.calls += 1;
                    Step::Move(ListPosition::BeforeKey { first: true })
                }
                ListPosition::BeforeKey { .. } | ListPosition::Key { .. } if c.is_whitespace() => Step::Stay,
                ListPosition::BeforeKey { first } if is_name_char(c) && !c.is_ascii_digit() => {
                    Step::Move(ListPosition::Key { key: c.to_string(), first: *first })
                }
                ListPosition::BeforeKey { first } if c == ')' => {
                    arguments.push_str(if *first { "{}" } else { "}" });
                    Step::Move(ListPosition::AfterCall)
                }
                ListPosition::Key { key, .. } if is_name_char(c) => {
                    key.push(c);
                    Step::Stay
                }
                ListPosition::Key { key, first } if c == '=' => {
                    arguments.push_str(if *first { "{" } else { ", " });
                    arguments.push_str(&format!("{}: ", Value::String(std::mem::take(key))));
                    Step::Move(ListPosition::Value(PythonLiteral::default()))
                }
                ListPosition::Value(value) => match value.push(c, &mut arguments) {
                    None => Step::Stay,
                    Some(',') => Step::Move(ListPosition::BeforeKey { first: false }),
                    Some(')') => {
                        arguments.push('}');
                        Step::Move(ListPosition::AfterCall)
                    }
                    Some(_) => Step::Break,
                },
                ListPosition::AfterCall if c.is_whitespace() => Step::Stay,
                ListPosition::AfterCall if c == ',' => Step::Move(ListPosition::BeforeName),
                ListPosition::AfterCall | ListPosition::BeforeName if c == ']' && self.layout == Layout::List => {
                    Step::Close
                }
                // OLMo 3: the next line's call, or the closing tag.
                ListPosition::AfterCall if self.layout == Layout::Lines && is_name_char(c) && !c.is_ascii_digit() => {
                    Step::Move(ListPosition::Name(c.to_string()))
                }
                ListPosition::AfterCall | ListPosition::BeforeName if c == '<' && self.layout == Layout::Lines => {
                    Step::Close
                }
                _ => Step::Break,
            };
            match step {
                Step::Stay => {}
                Step::Move(next) => *position = next,
                // OLMo 3's closing tag is read as what follows the calls.
                Step::Close if c == '<' => {
                    self.mode = PythonicMode::Done;
                    send_arguments(index, &mut arguments, out);
                    return self.read(&text[i..], out);
                }
                Step::Close => self.mode = PythonicMode::Done,
                Step::Break => {
                    // Not a call list after all: the open call's arguments are closed, and the
                    // rest is text.
                    match position {
                        ListPosition::BeforeKey { first: true } | ListPosition::Key { first: true, .. } => {
                            arguments.push_str("{}")
                        }
                        ListPosition::BeforeKey { first: false } | ListPosition::Key { first: false, .. } => {
                            arguments.push('}')
                        }
                        ListPosition::Value(value) => arguments.push_str(if value.wrote { "}" } else { "null}" }),
                        _ => {}
                    }
                    send_arguments(index, &mut arguments, out);
                    self.mode = PythonicMode::Text;
                    send_content(&text[i..], out);
                    return;
                }
            }
        }
        send_arguments(self.calls.saturating_sub(1), &mut arguments, out);
    }

    /// An undecided start (or the start of a closing tag never finished) is text; a call cut
    /// short keeps what was sent.
    pub fn finish(&mut self, out: &mut Vec<MessageDelta>) {
        send_content(std::mem::take(&mut self.held), out);
    }
}

fn send_arguments(index: usize, arguments: &mut String, out: &mut Vec<MessageDelta>) {
    if !arguments.is_empty() {
        out.push(MessageDelta::Arguments { index, text: std::mem::take(arguments) });
    }
}

/// Turns one Python literal (strings in either quotes, numbers, `True`/`False`/`None`, lists,
/// tuples, dicts) into JSON text as it is read, in `json.dumps` layout.
#[derive(Debug, Default)]
struct PythonLiteral {
    /// The closers of the open containers.
    open: Vec<char>,
    /// The quote of the string being read, and whether a backslash came just before.
    string: Option<(char, bool)>,
    /// A bare word being read (a number or a constant), written once it ends.
    word: String,
    /// Some JSON was written.
    wrote: bool,
}

impl PythonLiteral {
    /// Takes one character, writing JSON into `json`; returns the character that ended the
    /// literal (a `,` or `)` outside it).
    fn push(&mut self, c: char, json: &mut String) -> Option<char> {
        let before = json.len();
        let ended = self.read(c, json);
        self.wrote |= json.len() > before;
        ended
    }

    fn read(&mut self, c: char, json: &mut String) -> Option<char> {
        if let Some((quote, escaped)) = &mut self.string {
            match c {
                _ if *escaped => {
                    *escaped = false;
                    match c {
                        '\'' => json.push('\''),
                        'n' | 't' | 'r' | 'b' | 'f' | '\\' | '"' | '/' => {
                            json.push('\\');
                            json.push(c);
                        }
                        _ => {
                            json.push_str("\\\\");
                            json.push(c);
                        }
                    }
                }
                '\\' => *escaped = true,
                c if c == *quote => {
                    self.string = None;
                    json.push('"');
                }
                '"' => json.push_str("\\\""),
                '\n' => json.push_str("\\n"),
                c => json.push(c),
            }
            return None;
        }
        match c {
            '\'' | '"' => {
                self.end_word(json);
                self.string = Some((c, false));
                json.push('"');
            }
            '[' | '(' | '{' => {
                self.end_word(json);
                self.open.push(match c {
                    '{' => '}',
                    '(' => ')',
                    _ => ']',
                });
                json.push(if c == '{' { '{' } else { '[' });
            }
            ']' | ')' | '}' if !self.open.is_empty() => {
                self.end_word(json);
                let closer = self.open.pop();
                json.push(if closer == Some('}') { '}' } else { ']' });
            }
            ',' | ')' | ']' | '}' => {
                self.end_word(json);
                if self.open.is_empty() {
                    return Some(c);
                }
                json.push_str(", ");
            }
            ':' => {
                self.end_word(json);
                json.push_str(": ");
            }
            c if c.is_whitespace() => self.end_word(json),
            c => self.word.push(c),
        }
        None
    }

    fn end_word(&mut self, json: &mut String) {
        match std::mem::take(&mut self.word).as_str() {
            "" => {}
            "True" => json.push_str("true"),
            "False" => json.push_str("false"),
            "None" => json.push_str("null"),
            number => json.push_str(number),
        }
    }
}
