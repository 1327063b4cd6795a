//! Any JSON value, byte by byte (RFC 8259): the automaton behind `json_object`.
//!
//! JSON nests without bound, so no finite automaton (no regex) recognises it; this one keeps
//! the open containers as a bit stack in its state, which stays `Copy` and hashable so a
//! guide can cache the tokens allowed from it. Strings must be valid UTF-8 (lead and
//! continuation bytes), numbers are JSON numbers, and whitespace runs are bounded so a model
//! cannot pad forever between tokens.

/// Deepest nesting of objects and arrays.
pub const MAX_JSON_DEPTH: u8 = 32;

/// Most whitespace bytes in a row between JSON tokens (room for a newline and indentation).
pub const MAX_JSON_WHITESPACE: u8 = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Escape {
    None,
    /// After a backslash.
    Backslash,
    /// Hex digits still to come after `\u` (four in all).
    Hex(u8),
    /// UTF-8 continuation bytes still to come.
    Utf8(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Number {
    Minus,
    Zero,
    Integer,
    Dot,
    Fraction,
    Exponent,
    ExponentSign,
    ExponentDigits,
}

impl Number {
    /// Whether a number may end here.
    fn complete(self) -> bool {
        matches!(self, Number::Zero | Number::Integer | Number::Fraction | Number::ExponentDigits)
    }

    fn step(self, byte: u8) -> Option<Number> {
        use Number::*;
        Some(match (self, byte) {
            (Minus, b'0') => Zero,
            (Minus, b'1'..=b'9') => Integer,
            (Integer, b'0'..=b'9') => Integer,
            (Zero | Integer, b'.') => Dot,
            (Dot | Fraction, b'0'..=b'9') => Fraction,
            (Zero | Integer | Fraction, b'e' | b'E') => Exponent,
            (Exponent, b'+' | b'-') => ExponentSign,
            (Exponent | ExponentSign | ExponentDigits, b'0'..=b'9') => ExponentDigits,
            _ => return None,
        })
    }
}

const LITERALS: [&[u8]; 3] = [b"true", b"false", b"null"];

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Mode {
    /// A value is expected.
    Value,
    /// Just after `[`: a value or `]`.
    FirstElement,
    /// Just after `{`: a key or `}`.
    FirstMember,
    /// After a `,` in an object: a key.
    Key,
    /// Inside a string (a key or a value).
    String {
        key: bool,
        escape: Escape,
    },
    /// After a key: `:`.
    Colon,
    /// After a value inside a container: `,` or the container's closing bracket.
    AfterValue,
    Number(Number),
    /// `LITERALS[which][..matched]` read so far.
    Literal {
        which: u8,
        matched: u8,
    },
    /// The top-level value is complete.
    Done,
}

/// Where a JSON text is after some bytes: the open containers (bit `i` of `containers` set:
/// the `i`-th is an array), what comes next, and the current whitespace run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct JsonState {
    containers: u32,
    depth: u8,
    mode: Mode,
    whitespace: u8,
}

/// The JSON automaton; `object_only` restricts the top-level value to an object (OpenAI's
/// `json_object` response format).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonGrammar {
    pub object_only: bool,
}

impl JsonGrammar {
    pub fn start(&self) -> JsonState {
        JsonState { containers: 0, depth: 0, mode: Mode::Value, whitespace: 0 }
    }

    /// Whether the bytes read so far are one whole JSON value (trailing whitespace allowed).
    pub fn accepts(&self, state: JsonState) -> bool {
        match state.mode {
            Mode::Done => true,
            Mode::Number(n) => state.depth == 0 && n.complete(),
            _ => false,
        }
    }

    /// The state after one more byte, or `None` when no JSON text continues this way.
    pub fn step(&self, mut state: JsonState, byte: u8) -> Option<JsonState> {
        if matches!(byte, b' ' | b'\t' | b'\n' | b'\r') && state.allows_whitespace() {
            if let Mode::Number(n) = state.mode {
                state = self.close_number(state, n)?;
            }
            state.whitespace += 1;
            return (state.whitespace <= MAX_JSON_WHITESPACE).then_some(state);
        }
        state.whitespace = 0;
        match state.mode {
            Mode::Value => self.start_value(state, byte),
            Mode::FirstElement if byte == b']' => state.close(true),
            Mode::FirstElement => self.start_value(state, byte),
            Mode::FirstMember if byte == b'}' => state.close(false),
            Mode::FirstMember | Mode::Key if byte == b'"' => {
                Some(state.with(Mode::String { key: true, escape: Escape::None }))
            }
            Mode::FirstMember | Mode::Key => None,
            Mode::String { key, escape } => state.string_byte(key, escape, byte),
            Mode::Colon => (byte == b':').then(|| state.with(Mode::Value)),
            Mode::AfterValue => state.after_value(byte),
            Mode::Number(n) => match n.step(byte) {
                Some(next) => Some(state.with(Mode::Number(next))),
                None => self.close_number(state, n)?.after_value(byte),
            },
            Mode::Literal { which, matched } => {
                let literal = LITERALS[which as usize];
                if literal[matched as usize] != byte {
                    return None;
                }
                if matched as usize + 1 == literal.len() {
                    Some(state.value_complete())
                } else {
                    Some(state.with(Mode::Literal { which, matched: matched + 1 }))
                }
            }
            Mode::Done => None,
        }
    }

    fn start_value(&self, state: JsonState, byte: u8) -> Option<JsonState> {
        if self.object_only && state.depth == 0 && byte != b'{' {
            return None;
        }
        match byte {
            b'{' => state.open(false).map(|s| s.with(Mode::FirstMember)),
            b'[' => state.open(true).map(|s| s.with(Mode::FirstElement)),
            b'"' => Some(state.with(Mode::String { key: false, escape: Escape::None })),
            b'-' => Some(state.with(Mode::Number(Number::Minus))),
            b'0' => Some(state.with(Mode::Number(Number::Zero))),
            b'1'..=b'9' => Some(state.with(Mode::Number(Number::Integer))),
            _ => {
                let which = LITERALS.iter().position(|l| l[0] == byte)? as u8;
                Some(state.with(Mode::Literal { which, matched: 1 }))
            }
        }
    }

    /// A number ends at the first byte that cannot continue it, if it is complete there.
    fn close_number(&self, state: JsonState, number: Number) -> Option<JsonState> {
        number.complete().then(|| state.value_complete())
    }
}

impl JsonState {
    fn with(self, mode: Mode) -> Self {
        Self { mode, ..self }
    }

    fn allows_whitespace(&self) -> bool {
        match self.mode {
            Mode::String { .. } | Mode::Literal { .. } => false,
            // Whitespace ends a number only where a number may end (checked by the caller).
            Mode::Number(n) => n.complete(),
            _ => true,
        }
    }

    fn top_is_array(&self) -> bool {
        self.depth > 0 && self.containers & (1 << (self.depth - 1)) != 0
    }

    fn open(self, array: bool) -> Option<Self> {
        if self.depth >= MAX_JSON_DEPTH {
            return None;
        }
        let bit = 1u32 << self.depth;
        let containers = if array { self.containers | bit } else { self.containers & !bit };
        Some(Self { containers, depth: self.depth + 1, ..self })
    }

    /// Closes the innermost container if it is an array (`array`) or an object.
    fn close(self, array: bool) -> Option<Self> {
        (self.depth > 0 && self.top_is_array() == array)
            .then(|| Self { depth: self.depth - 1, ..self }.value_complete())
    }

    fn value_complete(self) -> Self {
        self.with(if self.depth == 0 { Mode::Done } else { Mode::AfterValue })
    }

    fn after_value(self, byte: u8) -> Option<Self> {
        match byte {
            b',' if self.depth > 0 => Some(self.with(if self.top_is_array() { Mode::Value } else { Mode::Key })),
            b']' => self.close(true),
            b'}' => self.close(false),
            _ => None,
        }
    }

    fn string_byte(self, key: bool, escape: Escape, byte: u8) -> Option<Self> {
        let string = |escape| Some(self.with(Mode::String { key, escape }));
        match escape {
            Escape::None => match byte {
                b'"' if key => Some(self.with(Mode::Colon)),
                b'"' => Some(self.value_complete()),
                b'\\' => string(Escape::Backslash),
                0x00..=0x1F => None,
                0x20..=0x7F => string(Escape::None),
                0xC2..=0xDF => string(Escape::Utf8(1)),
                0xE0..=0xEF => string(Escape::Utf8(2)),
                0xF0..=0xF4 => string(Escape::Utf8(3)),
                _ => None,
            },
            Escape::Utf8(left) => {
                (0x80..=0xBF).contains(&byte).then(|| self.with(Mode::String { key, escape: utf8_left(left - 1) }))
            }
            Escape::Backslash => match byte {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => string(Escape::None),
                b'u' => string(Escape::Hex(4)),
                _ => None,
            },
            Escape::Hex(left) => byte.is_ascii_hexdigit().then(|| {
                let escape = if left == 1 { Escape::None } else { Escape::Hex(left - 1) };
                self.with(Mode::String { key, escape })
            }),
        }
    }
}

fn utf8_left(left: u8) -> Escape {
    if left == 0 { Escape::None } else { Escape::Utf8(left) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(grammar: JsonGrammar, text: &str) -> Option<JsonState> {
        text.bytes().try_fold(grammar.start(), |s, b| grammar.step(s, b))
    }

    fn accepts(grammar: JsonGrammar, text: &str) -> bool {
        read(grammar, text).is_some_and(|s| grammar.accepts(s))
    }

    const ANY: JsonGrammar = JsonGrammar { object_only: false };
    const OBJECT: JsonGrammar = JsonGrammar { object_only: true };

    #[test]
    fn accepts_exactly_the_texts_serde_json_parses() {
        let texts = [
            r#"{"a": [1, -2.5e+3, true, null, "x\"\u00e9"], "b": {}}"#,
            "[]",
            "[ ]",
            "0",
            "-0.5",
            "12e3",
            r#""é日本""#,
            "true",
            "{\n  \"k\": [\n    {}\n  ]\n}\n",
            "[[[[1]]]]",
            "01",
            "1.",
            "-",
            "[1,]",
            "{\"a\" 1}",
            "{\"a\":1,}",
            "[1 2]",
            "tru",
            "nul",
            "\"a\u{1}\"",
            "\"\\x\"",
            "\"\\u12g4\"",
            "{}}",
            "[}",
            "{]",
            "1 2",
            "{,}",
            "[,1]",
            "\"unterminated",
            "",
        ];
        for text in texts {
            let parses = serde_json::from_str::<serde_json::Value>(text).is_ok();
            assert_eq!(accepts(ANY, text), parses, "{text:?}");
        }
    }

    #[test]
    fn invalid_utf8_inside_strings_is_refused() {
        let grammar = ANY;
        let state = read(grammar, "\"").unwrap();
        assert!(grammar.step(state, 0xFF).is_none());
        assert!(grammar.step(state, 0x80).is_none(), "a continuation byte cannot start a character");
        let lead = grammar.step(state, 0xC3).unwrap();
        assert!(grammar.step(lead, b'a').is_none());
        assert!(grammar.step(lead, 0xA9).is_some());
    }

    #[test]
    fn object_only_wants_an_object_at_the_top_and_anything_inside() {
        assert!(accepts(OBJECT, r#"{"list": [1, "two", [3]]}"#));
        assert!(accepts(OBJECT, "  {}"));
        for text in ["[]", "1", "\"x\"", "null"] {
            assert!(!accepts(OBJECT, text) && read(OBJECT, text).is_none(), "{text}");
        }
    }

    #[test]
    fn prefixes_of_valid_texts_stay_alive_and_complete_values_end() {
        let text = r#"{"a": [10, {"b": "c"}]}"#;
        for end in 0..text.len() {
            let state = read(ANY, &text[..end]).unwrap_or_else(|| panic!("prefix {:?} refused", &text[..end]));
            assert!(!ANY.accepts(state), "prefix {:?} is not complete", &text[..end]);
        }
        let done = read(ANY, text).unwrap();
        assert!(ANY.accepts(done));
        assert!(ANY.step(done, b',').is_none(), "nothing follows the top-level value");
    }

    #[test]
    fn whitespace_runs_and_nesting_are_bounded() {
        let padded = format!("{{{}}}", " ".repeat(MAX_JSON_WHITESPACE as usize));
        assert!(accepts(ANY, &padded));
        let too_padded = format!("{{{}}}", " ".repeat(MAX_JSON_WHITESPACE as usize + 1));
        assert!(read(ANY, &too_padded).is_none());
        let deep = "[".repeat(MAX_JSON_DEPTH as usize);
        assert!(read(ANY, &deep).is_some());
        assert!(read(ANY, &format!("{deep}[")).is_none());
        let closed = format!("{deep}{}", "]".repeat(MAX_JSON_DEPTH as usize));
        assert!(accepts(ANY, &closed));
    }
}
