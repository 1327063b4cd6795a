//! JSON written as Python's `json.dumps` writes it. Chat templates print tools and tool
//! arguments with transformers' `tojson` filter, `json.dumps(x, ensure_ascii=False,
//! indent=None, separators=None, sort_keys=False)`, so the prompts models were trained on spell
//! JSON with spaces after separators (`{"a": 1, "b": [1, 2]}`) and floats as Python's `repr`
//! (`1e-05`, `2.0`); a prompt rendered any other way is one the model never saw.

use serde_json::Value;

/// `json.dumps`'s formatting arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DumpOptions {
    /// Escape every non-ASCII character as `\uXXXX`.
    pub ensure_ascii: bool,
    /// One level's indentation: each item on its own line. `None` writes one line.
    pub indent: Option<String>,
    /// `(item, key)` separators; by default `", "` and `": "` (`","` between items once
    /// indented).
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
}

/// `value` as `json.dumps(value, **options)` writes it.
pub fn dumps(value: &Value, options: &DumpOptions) -> String {
    let (item, key) = match (&options.separators, &options.indent) {
        (Some((item, key)), _) => (item.as_str(), key.as_str()),
        (None, Some(_)) => (",", ": "),
        (None, None) => (", ", ": "),
    };
    let mut writer = Writer { out: String::new(), options, item, key };
    writer.value(value, 0);
    writer.out
}

struct Writer<'a> {
    out: String,
    options: &'a DumpOptions,
    item: &'a str,
    key: &'a str,
}

impl Writer<'_> {
    fn value(&mut self, value: &Value, level: usize) {
        match value {
            Value::Null => self.out.push_str("null"),
            Value::Bool(b) => self.out.push_str(if *b { "true" } else { "false" }),
            Value::Number(n) => match n.as_f64().filter(|_| n.is_f64()) {
                Some(f) => self.out.push_str(&float_repr(f)),
                None => self.out.push_str(&n.to_string()),
            },
            Value::String(s) => self.string(s),
            Value::Array(items) if items.is_empty() => self.out.push_str("[]"),
            Value::Array(items) => {
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    self.separate(i, level + 1);
                    self.value(item, level + 1);
                }
                self.newline(level);
                self.out.push(']');
            }
            Value::Object(map) if map.is_empty() => self.out.push_str("{}"),
            Value::Object(map) => {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                if self.options.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                self.out.push('{');
                for (i, (key, value)) in entries.into_iter().enumerate() {
                    self.separate(i, level + 1);
                    self.string(key);
                    self.out.push_str(self.key);
                    self.value(value, level + 1);
                }
                self.newline(level);
                self.out.push('}');
            }
        }
    }

    /// Before the `i`-th entry of a container whose entries sit at `level`.
    fn separate(&mut self, i: usize, level: usize) {
        if i > 0 {
            self.out.push_str(self.item);
        }
        self.newline(level);
    }

    fn newline(&mut self, level: usize) {
        if let Some(indent) = &self.options.indent {
            self.out.push('\n');
            for _ in 0..level {
                self.out.push_str(indent);
            }
        }
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 => self.out.push_str(&format!("\\u{:04x}", c as u32)),
                c if self.options.ensure_ascii && !(' '..='~').contains(&c) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        self.out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// A float as Python's `repr` writes it: the shortest digits that read back to it, positional
/// from 1e-4 up to 1e16 (with `.0` when whole), scientific past that with a signed two-digit
/// exponent; `NaN` and `Infinity` as `json.dumps` writes them.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    // Rust's `{:e}` writes the shortest round-tripping digits: `-1.5e-5`, `1e16`, `0e0`.
    let scientific = format!("{f:e}");
    let (mantissa, exponent) = scientific.split_once('e').expect("`{:e}` writes an exponent");
    let exponent: i32 = exponent.parse().expect("`{:e}` writes an integer exponent");
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits = mantissa.replace('.', "");
    if (-4..16).contains(&exponent) {
        let body = if exponent < 0 {
            format!("0.{}{digits}", "0".repeat((-exponent - 1) as usize))
        } else {
            let whole = exponent as usize + 1;
            if digits.len() <= whole {
                format!("{digits}{}.0", "0".repeat(whole - digits.len()))
            } else {
                format!("{}.{}", &digits[..whole], &digits[whole..])
            }
        };
        return format!("{sign}{body}");
    }
    let fraction = if digits.len() > 1 { format!(".{}", &digits[1..]) } else { String::new() };
    let exponent_sign = if exponent < 0 { '-' } else { '+' };
    format!("{sign}{}{fraction}e{exponent_sign}{:02}", &digits[..1], exponent.abs())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// Each expectation is what CPython 3.11's `json.dumps` writes.
    #[test]
    fn dumps_writes_what_python_writes() {
        let value = json!({"type": "function", "function": {"name": "get_weather", "parameters": {"required": ["city"], "n": [1, 2.5], "e": {}}}});
        assert_eq!(
            dumps(&value, &DumpOptions::default()),
            r#"{"type": "function", "function": {"name": "get_weather", "parameters": {"required": ["city"], "n": [1, 2.5], "e": {}}}}"#
        );
        let indented = DumpOptions { indent: Some("  ".into()), ..DumpOptions::default() };
        assert_eq!(
            dumps(&json!({"a": [1, {"b": null}], "c": []}), &indented),
            "{\n  \"a\": [\n    1,\n    {\n      \"b\": null\n    }\n  ],\n  \"c\": []\n}"
        );
        let compact =
            DumpOptions { separators: Some((",".into(), ":".into())), sort_keys: true, ..DumpOptions::default() };
        assert_eq!(dumps(&json!({"b": 1, "a": [true, false]}), &compact), r#"{"a":[true,false],"b":1}"#);
        let text = json!("é \"q\" \\ \n\t\u{1} \u{7f} 🎉");
        assert_eq!(dumps(&text, &DumpOptions::default()), "\"é \\\"q\\\" \\\\ \\n\\t\\u0001 \u{7f} 🎉\"");
        let ascii = DumpOptions { ensure_ascii: true, ..DumpOptions::default() };
        assert_eq!(dumps(&text, &ascii), r#""\u00e9 \"q\" \\ \n\t\u0001 \u007f \ud83c\udf89""#);
    }

    #[test]
    fn floats_are_written_as_python_repr_writes_them() {
        for (f, python) in [
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1.0, "1.0"),
            (2.5, "2.5"),
            (100.0, "100.0"),
            (0.1, "0.1"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (-1.5e-7, "-1.5e-07"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.2345678901234568e17, "1.2345678901234568e+17"),
            (123.456, "123.456"),
            (1e300, "1e+300"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
        ] {
            assert_eq!(float_repr(f), python, "{f:e}");
        }
    }
}
