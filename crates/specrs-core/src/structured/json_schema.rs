//! A JSON schema as a regular expression over the JSON texts it allows (outlines' approach).
//!
//! Objects list their properties in the schema's order, required ones always and optional
//! ones where they may appear; other properties are never generated. Separators are fixed,
//! Python's `json.dumps` ones (`, ` and `: `), and only the inside of brackets may be padded
//! with one space (`{"a": 1}` or `{ "a": 1 }`, whichever the model writes): models have a
//! house style there, and a small one forced out of it writes worse values. Past that choice
//! keys and punctuation are forced, which is what lets forced drafts
//! ([`TokenGuide::forced_bytes`](super::guide::TokenGuide::forced_bytes)) take them whole. Keywords that only annotate (titles, descriptions,
//! examples) are ignored; keywords whose constraint a regex here cannot express are refused
//! by name rather than silently dropped, so an output never violates the schema it was asked
//! to follow. A recursive `$ref` is expanded [`MAX_REF_DEPTH`] times inside itself; past that
//! its branch cannot be taken (other `$ref`s nest freely).

use serde_json::{Map, Value};

use super::integer_range::integer_range_regex;
use super::regex_dfa::RegexGrammar;

/// How many times a `$ref` is expanded inside itself (recursive schemas).
pub const MAX_REF_DEPTH: usize = 3;

/// How deep schemas that allow any JSON value (`{}`, `true`, an untyped property) nest.
const ANY_VALUE_DEPTH: usize = 2;

/// After `:` and `,`.
const SPACE: &str = " ";
/// Inside `{}` and `[]`, at both ends.
const PAD: &str = "[ ]?";
const STRING_CHAR: &str = r#"(?:[^"\\\x00-\x1F\x7F]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})"#;
const INTEGER: &str = "-?(?:0|[1-9][0-9]*)";
const NON_NEGATIVE_INTEGER: &str = "(?:0|[1-9][0-9]*)";
const FRACTION_EXPONENT: &str = "(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?";
const BOOLEAN: &str = "(?:true|false)";
const NULL: &str = "null";
/// A regex that matches nothing (an empty class), for branches that cannot be taken.
const NOTHING: &str = "[a&&b]";

/// Keywords that carry no constraint.
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "example",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$defs",
    "definitions",
    "discriminator",
];

/// Why a schema cannot guide generation: the message names the keyword or value at fault and
/// its place in the schema.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("JSON schema at '{path}': {message}")]
pub struct SchemaError {
    pub path: String,
    pub message: String,
}

/// The regex matching exactly the JSON texts (in the layout described above) valid under
/// `schema`.
pub fn schema_to_regex(schema: &Value) -> Result<String, SchemaError> {
    Builder { root: schema, expanding: Vec::new() }.value(schema, "#")
}

/// The regex of any JSON value nested at most `depth` containers deep.
pub fn any_json_value_regex(depth: usize) -> String {
    let scalar = format!("(?:{}|{INTEGER}{FRACTION_EXPONENT}|{BOOLEAN}|{NULL})", string_regex(0, None));
    let mut value = scalar.clone();
    for _ in 0..depth {
        let member = format!("{}: {value}", string_regex(0, None));
        value = format!("(?:{scalar}|{}|{})", object_of(&member), array_of(&value, 0, None));
    }
    value
}

struct Builder<'a> {
    root: &'a Value,
    /// The `$ref` pointers being expanded, outermost first.
    expanding: Vec<String>,
}

fn error(path: &str, message: impl Into<String>) -> SchemaError {
    SchemaError { path: path.to_string(), message: message.into() }
}

/// Bound on the regex a schema becomes (and on any part of it): past it the automaton could
/// not be built within its own limit, and building the text alone could exhaust memory (each
/// optional property repeats the ones after it).
pub const MAX_SCHEMA_REGEX_BYTES: usize = 4 << 20;

fn too_large(path: &str, bytes: usize) -> SchemaError {
    error(
        path,
        format!(
            "the schema's regex would take {bytes} bytes, past the {} MiB limit: fewer optional properties, \
             alternatives or nesting would bring it within",
            MAX_SCHEMA_REGEX_BYTES >> 20
        ),
    )
}

impl Builder<'_> {
    /// [`Self::unbounded_value`] within [`MAX_SCHEMA_REGEX_BYTES`].
    fn value(&mut self, schema: &Value, path: &str) -> Result<String, SchemaError> {
        let regex = self.unbounded_value(schema, path)?;
        if regex.len() > MAX_SCHEMA_REGEX_BYTES {
            return Err(too_large(path, regex.len()));
        }
        Ok(regex)
    }

    fn unbounded_value(&mut self, schema: &Value, path: &str) -> Result<String, SchemaError> {
        let map = match schema {
            Value::Bool(true) => return Ok(any_json_value_regex(ANY_VALUE_DEPTH)),
            Value::Bool(false) => return Err(error(path, "the schema `false` allows no value")),
            Value::Object(map) => map,
            other => return Err(error(path, format!("a schema must be an object or a boolean, not {other}"))),
        };
        for keyword in ["$ref", "anyOf", "oneOf", "allOf"] {
            if map.contains_key(keyword) {
                refuse_siblings(map, keyword, path)?;
            }
        }
        if let Some(reference) = map.get("$ref") {
            return self.reference(reference, path);
        }
        if let Some(constant) = map.get("const") {
            if map.get("enum").and_then(Value::as_array).is_some_and(|options| !options.contains(constant)) {
                return Err(error(path, "`const` is not among `enum`: no value satisfies both"));
            }
            return self.enumeration(std::slice::from_ref(constant), map, "const", path);
        }
        if let Some(options) = map.get("enum") {
            let options = options.as_array().ok_or_else(|| error(path, "`enum` must be a list of values"))?;
            if options.is_empty() {
                return Err(error(path, "`enum` must list at least one value"));
            }
            return self.enumeration(options, map, "enum", path);
        }
        // `oneOf` is taken as `anyOf`: a value its branches both allow is not refused (as
        // xgrammar and outlines take it).
        for keyword in ["anyOf", "oneOf"] {
            if let Some(branches) = map.get(keyword) {
                return self.branches(branches, &format!("{path}/{keyword}"));
            }
        }
        if let Some(all) = map.get("allOf") {
            return match all.as_array().map(Vec::as_slice) {
                Some([only]) => self.value(only, &format!("{path}/allOf/0")),
                _ => Err(error(path, "`allOf` is supported with exactly one schema")),
            };
        }
        self.check_keywords(map, path)?;
        match map.get("type") {
            Some(Value::String(kind)) => self.typed(kind, map, path),
            Some(Value::Array(kinds)) => {
                let branches = kinds
                    .iter()
                    .map(|k| match k {
                        Value::String(kind) => self.typed(kind, map, path),
                        other => Err(error(path, format!("`type` entries must be strings, not {other}"))),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(alternatives(branches))
            }
            Some(other) => Err(error(path, format!("`type` must be a string or a list, not {other}"))),
            None if map.contains_key("properties") || map.contains_key("additionalProperties") => {
                self.typed("object", map, path)
            }
            None if map.contains_key("items") => self.typed("array", map, path),
            None => Ok(any_json_value_regex(ANY_VALUE_DEPTH)),
        }
    }

    /// The values `options` lists that the schema's other keywords allow (`{"type": "string",
    /// "enum": [...]}`): each one checked against the regex of those keywords.
    fn enumeration(
        &mut self,
        options: &[Value],
        map: &Map<String, Value>,
        keyword: &str,
        path: &str,
    ) -> Result<String, SchemaError> {
        let rest: Map<String, Value> = map
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "enum" | "const") && !ANNOTATIONS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if rest.keys().all(|k| k == "type") {
            let allowed: Vec<String> =
                options.iter().filter(|o| type_allows(map.get("type"), o)).map(literal).collect();
            if allowed.is_empty() {
                return Err(error(path, format!("no `{keyword}` value satisfies the schema's other keywords")));
            }
            return Ok(alternatives(allowed));
        }
        if options.iter().any(|o| o.is_object() || o.is_array()) && rest.keys().any(|k| k != "type") {
            return Err(error(
                path,
                format!("`{keyword}` listing objects or arrays takes no other keyword than `type`"),
            ));
        }
        let others = RegexGrammar::new(&self.value(&Value::Object(rest), path)?)
            .map_err(|e| error(path, format!("the keywords beside `{keyword}`: {e}")))?;
        // Objects and arrays were refused above: these are scalars, whose text the regex reads.
        let allowed: Vec<String> =
            options.iter().filter(|o| others.matches(literal_text(o).as_bytes())).map(literal).collect();
        if allowed.is_empty() {
            return Err(error(path, format!("no `{keyword}` value satisfies the schema's other keywords")));
        }
        Ok(alternatives(allowed))
    }

    fn branches(&mut self, branches: &Value, path: &str) -> Result<String, SchemaError> {
        let list = branches.as_array().filter(|l| !l.is_empty()).ok_or_else(|| error(path, "must list schemas"))?;
        let regexes = list
            .iter()
            .enumerate()
            .map(|(i, s)| self.value(s, &format!("{path}/{i}")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(alternatives(regexes))
    }

    fn reference(&mut self, reference: &Value, path: &str) -> Result<String, SchemaError> {
        let pointer = reference.as_str().and_then(|r| r.strip_prefix('#')).ok_or_else(|| {
            error(path, format!("only local `$ref`s (\"#/$defs/...\") are supported, not {reference}"))
        })?;
        let target = self
            .root
            .pointer(pointer)
            .ok_or_else(|| error(path, format!("`$ref` {reference} points at nothing in the schema")))?;
        // Re-entries over the whole stack (not per pointer): a cycle through several
        // definitions stops after as many turns as one through itself.
        let reentries = self.expanding.iter().enumerate().filter(|(i, p)| self.expanding[..*i].contains(p)).count();
        if reentries + usize::from(self.expanding.iter().any(|p| p == pointer)) >= MAX_REF_DEPTH {
            return Ok(NOTHING.to_string());
        }
        self.expanding.push(pointer.to_string());
        let regex = self.value(target, &format!("#{pointer}"));
        self.expanding.pop();
        regex
    }

    /// Refuses constraints this translation would otherwise ignore.
    fn check_keywords(&self, map: &Map<String, Value>, path: &str) -> Result<(), SchemaError> {
        const UNDERSTOOD: &[&str] = &[
            "type",
            "properties",
            "required",
            "additionalProperties",
            "items",
            "minItems",
            "maxItems",
            "minLength",
            "maxLength",
            "pattern",
            "format",
            "minimum",
            "exclusiveMinimum",
            "maximum",
            "exclusiveMaximum",
        ];
        for (key, value) in map {
            // `uniqueItems: false` constrains nothing.
            let no_constraint = key == "uniqueItems" && *value == Value::Bool(false);
            if !UNDERSTOOD.contains(&key.as_str()) && !ANNOTATIONS.contains(&key.as_str()) && !no_constraint {
                return Err(error(
                    path,
                    format!(
                        "keyword `{key}` is not supported by structured outputs; supported: {}, and $ref, const, \
                         enum, anyOf, oneOf, allOf",
                        UNDERSTOOD.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    fn typed(&mut self, kind: &str, map: &Map<String, Value>, path: &str) -> Result<String, SchemaError> {
        match kind {
            "string" => string_schema(map, path),
            "integer" => match integer_bounds(map, path)? {
                (None, None) => Ok(INTEGER.to_string()),
                (lo, hi) => integer_range_regex(lo, hi)
                    .ok_or_else(|| error(path, "the bounds leave no integer (`minimum` is above `maximum`)")),
            },
            "number" => Ok(match number_floor(map, path)? {
                NumberFloor::None => format!("{INTEGER}{FRACTION_EXPONENT}"),
                NumberFloor::NonNegative => format!("{NON_NEGATIVE_INTEGER}{FRACTION_EXPONENT}"),
                NumberFloor::Positive => POSITIVE_NUMBER.to_string(),
            }),
            "boolean" => Ok(BOOLEAN.to_string()),
            "null" => Ok(NULL.to_string()),
            "array" => {
                let item = match map.get("items") {
                    Some(items) => self.value(items, &format!("{path}/items"))?,
                    None => any_json_value_regex(ANY_VALUE_DEPTH),
                };
                let min = count(map, "minItems", path)?.unwrap_or(0);
                let max = count(map, "maxItems", path)?;
                if max.is_some_and(|m| m < min) {
                    return Err(error(path, "`maxItems` is below `minItems`"));
                }
                Ok(array_of(&item, min, max))
            }
            "object" => self.object(map, path),
            other => Err(error(path, format!("unknown type {other:?}"))),
        }
    }

    fn object(&mut self, map: &Map<String, Value>, path: &str) -> Result<String, SchemaError> {
        let empty = Map::new();
        let properties = match map.get("properties") {
            Some(Value::Object(p)) => p,
            Some(_) => return Err(error(path, "`properties` must be an object")),
            None => &empty,
        };
        let required: Vec<&str> = match map.get("required") {
            Some(Value::Array(r)) => r.iter().filter_map(Value::as_str).collect(),
            Some(_) => return Err(error(path, "`required` must be a list of property names")),
            None => Vec::new(),
        };
        if let Some(missing) = required.iter().find(|r| !properties.contains_key(**r)) {
            return Err(error(path, format!("required property {missing:?} is not among `properties`")));
        }
        if properties.is_empty() {
            // A mapping: any keys, values as `additionalProperties` says.
            let value = match map.get("additionalProperties") {
                Some(Value::Bool(false)) => return Ok(format!("\\{{{PAD}\\}}")),
                Some(schema @ Value::Object(_)) => self.value(schema, &format!("{path}/additionalProperties"))?,
                _ => any_json_value_regex(ANY_VALUE_DEPTH),
            };
            let member = format!("{}: {value}", string_regex(0, None));
            return Ok(object_of(&member));
        }
        let mut members = Vec::with_capacity(properties.len());
        for (name, schema) in properties {
            let value = self.value(schema, &format!("{path}/properties/{name}"))?;
            let key = regex_syntax::escape(&serde_json::to_string(name).expect("strings serialise"));
            members.push((format!("{key}:{SPACE}{value}"), required.contains(&name.as_str())));
        }
        Ok(format!("\\{{{PAD}{}{PAD}\\}}", ordered_members(&members, path)?))
    }
}

/// Members in order, each required one present, each optional one present or not, commas
/// only between present ones. Alternatives by which member comes first: any of the leading
/// optional ones, or the first required one.
fn ordered_members(members: &[(String, bool)], path: &str) -> Result<String, SchemaError> {
    let sep = format!(",{SPACE}");
    // Measured before it is built: each member up to the first required one opens a branch
    // repeating every member after it.
    let tail_bytes: usize = members.iter().map(|(m, _)| m.len() + sep.len() + 8).sum();
    let branches = members.iter().position(|(_, required)| *required).map_or(members.len(), |i| i + 1);
    let bytes = branches.saturating_mul(tail_bytes);
    if bytes > MAX_SCHEMA_REGEX_BYTES {
        return Err(too_large(path, bytes));
    }
    let mut firsts = Vec::new();
    for (i, (member, required)) in members.iter().enumerate() {
        let rest: String = members[i + 1..]
            .iter()
            .map(|(m, r)| if *r { format!("{sep}{m}") } else { format!("(?:{sep}{m})?") })
            .collect();
        firsts.push(format!("{member}{rest}"));
        if *required {
            return Ok(alternatives(firsts));
        }
    }
    // Every member optional: the object may also be empty.
    Ok(format!("(?:{})?", alternatives(firsts)))
}

fn object_of(member: &str) -> String {
    format!("\\{{{PAD}(?:{member}(?:,{SPACE}{member})*)?{PAD}\\}}")
}

fn array_of(item: &str, min: usize, max: Option<usize>) -> String {
    let sep = format!(",{SPACE}");
    let body = match (min, max) {
        (_, Some(0)) => String::new(),
        (0, None) => format!("(?:{item}(?:{sep}{item})*)?"),
        (0, Some(max)) => format!("(?:{item}(?:{sep}{item}){{0,{}}})?", max - 1),
        (min, None) => format!("{item}(?:{sep}{item}){{{},}}", min - 1),
        (min, Some(max)) => format!("{item}(?:{sep}{item}){{{},{}}}", min - 1, max - 1),
    };
    format!("\\[{PAD}{body}{PAD}\\]")
}

fn string_regex(min: usize, max: Option<usize>) -> String {
    match (min, max) {
        (0, None) => format!("\"{STRING_CHAR}*\""),
        (min, None) => format!("\"{STRING_CHAR}{{{min},}}\""),
        (min, Some(max)) => format!("\"{STRING_CHAR}{{{min},{max}}}\""),
    }
}

fn string_schema(map: &Map<String, Value>, path: &str) -> Result<String, SchemaError> {
    let format = match map.get("format") {
        None => None,
        Some(Value::String(name)) => format_regex(name),
        Some(_) => return Err(error(path, "`format` must be a string")),
    };
    // Other formats (OpenAPI's `password`, `byte`, ...) are annotations, as JSON schema
    // treats a format it does not assert.
    let shaped_by = |key: &str| if key == "format" { format.is_some() } else { map.contains_key(key) };
    let shape = ["pattern", "format"].into_iter().find(|k| shaped_by(k));
    if let Some(shape) = shape
        && let Some(other) =
            ["pattern", "format", "minLength", "maxLength"].into_iter().find(|k| *k != shape && shaped_by(k))
    {
        return Err(error(
            path,
            format!(
                "`{shape}` with `{other}` is not supported: one of them shapes the string (a length fits in a \
                 pattern, e.g. `^.{{1,20}}$`)"
            ),
        ));
    }
    if let Some(pattern) = map.get("pattern") {
        let pattern = pattern.as_str().ok_or_else(|| error(path, "`pattern` must be a string"))?;
        // JSON schema patterns search; generation needs the whole string, so anchors go.
        let inner = pattern.strip_prefix('^').unwrap_or(pattern);
        let inner = inner.strip_suffix('$').filter(|s| !s.ends_with('\\')).unwrap_or(inner);
        let hir = regex_syntax::Parser::new()
            .parse(inner)
            .map_err(|e| error(path, format!("`pattern` is not a valid regex: {e}")))?;
        let escaped = json_escaped(&hir).map_err(|message| error(path, message))?;
        return Ok(format!("\"(?:{escaped})\""));
    }
    if let Some(inner) = format {
        return Ok(format!("\"{inner}\""));
    }
    string_with_length(map, path)
}

/// The regex of a string `format` (its JSON text needs no escapes), as RFC 3339 (`date`,
/// `time`, `date-time`: years 0001-9999, month lengths and leap days checked, a time zone
/// required, no leap second), RFC 4122,
/// the HTML5 e-mail rule, RFC 1123 host names, dotted-quad IPv4 and RFC 3986 absolute URIs.
fn format_regex(format: &str) -> Option<String> {
    let hex = |n: usize| format!("[0-9a-fA-F]{{{n}}}");
    let day = |last: &str| format!("(?:0[1-9]|1[0-9]|2[0-8]{last})");
    // Years 0001-9999; those whose February has a 29th: divisible by 4, centuries by 400.
    let year = "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])";
    let leap = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)";
    let date = format!(
        "(?:{year}-(?:(?:0[13578]|1[02])-(?:{}|3[01])|(?:0[469]|11)-(?:{}|30)|02-{})|{leap}-02-29)",
        day("|29"),
        day("|29"),
        day("")
    );
    let time = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])";
    let label = "[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?";
    let octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
    // Characters a URI may hold unescaped; a JSON string holds them as they are.
    let uri_char = "(?:[A-Za-z0-9._~:/?#\\[\\]@!$&'()*+,;=-]|%[0-9A-Fa-f]{2})";
    Some(match format {
        "date" => date,
        "time" => time.to_string(),
        "date-time" => format!("{date}T{time}"),
        "uuid" => format!("{}-{}-{}-{}-{}", hex(8), hex(4), hex(4), hex(4), hex(12)),
        "email" => format!("[a-zA-Z0-9.!#$%&'*+/=?^_`{{|}}~-]+@{label}(?:\\.{label})*"),
        "hostname" => format!("{label}(?:\\.{label})*"),
        "ipv4" => format!("{octet}(?:\\.{octet}){{3}}"),
        "uri" => format!("[a-zA-Z][a-zA-Z0-9+.-]*:{uri_char}*"),
        _ => return None,
    })
}

/// `hir` matching the same decoded strings, written as JSON string contents: `"` and `\`
/// as their escapes, control characters as `\n`-style or `\u00XX` escapes (so the output is
/// valid JSON whose string value matches the pattern).
fn json_escaped(hir: &regex_syntax::hir::Hir) -> Result<String, String> {
    Ok(escape_hir(hir)?.to_string())
}

fn escape_hir(hir: &regex_syntax::hir::Hir) -> Result<regex_syntax::hir::Hir, String> {
    use regex_syntax::hir::{Capture, Class, ClassUnicode, ClassUnicodeRange, Hir, HirKind, Repetition};
    Ok(match hir.kind() {
        HirKind::Empty | HirKind::Look(_) => hir.clone(),
        HirKind::Literal(literal) => {
            let text = std::str::from_utf8(&literal.0).map_err(|_| "`pattern` must match text, not bytes")?;
            Hir::literal(text.chars().map(json_char).collect::<String>().into_bytes())
        }
        HirKind::Class(Class::Bytes(_)) => return Err("`pattern` must match text, not bytes (no `(?-u)`)".into()),
        HirKind::Class(Class::Unicode(class)) => {
            let must_escape = ClassUnicode::new([
                ClassUnicodeRange::new('\0', '\x1f'),
                ClassUnicodeRange::new('"', '"'),
                ClassUnicodeRange::new('\\', '\\'),
                ClassUnicodeRange::new('\x7f', '\x7f'),
            ]);
            let mut escaped = class.clone();
            escaped.intersect(&must_escape);
            if escaped.ranges().is_empty() {
                return Ok(hir.clone());
            }
            let mut plain = class.clone();
            plain.difference(&must_escape);
            let mut branches = vec![Hir::class(Class::Unicode(plain))];
            for range in escaped.ranges() {
                for c in range.start()..=range.end() {
                    branches.push(Hir::literal(json_char(c).into_bytes()));
                }
            }
            Hir::alternation(branches)
        }
        HirKind::Repetition(rep) => Hir::repetition(Repetition { sub: Box::new(escape_hir(&rep.sub)?), ..rep.clone() }),
        HirKind::Capture(cap) => Hir::capture(Capture { sub: Box::new(escape_hir(&cap.sub)?), ..cap.clone() }),
        HirKind::Concat(parts) => Hir::concat(parts.iter().map(escape_hir).collect::<Result<_, _>>()?),
        HirKind::Alternation(parts) => Hir::alternation(parts.iter().map(escape_hir).collect::<Result<_, _>>()?),
    })
}

/// How a JSON string writes `c`.
fn json_char(c: char) -> String {
    match c {
        '"' => "\\\"".into(),
        '\\' => "\\\\".into(),
        '\n' => "\\n".into(),
        '\t' => "\\t".into(),
        '\r' => "\\r".into(),
        '\u{8}' => "\\b".into(),
        '\u{c}' => "\\f".into(),
        c if (c as u32) < 0x20 || c == '\x7f' => format!("\\u{:04x}", c as u32),
        c => c.to_string(),
    }
}

fn string_with_length(map: &Map<String, Value>, path: &str) -> Result<String, SchemaError> {
    let min = count(map, "minLength", path)?.unwrap_or(0);
    let max = count(map, "maxLength", path)?;
    if max.is_some_and(|m| m < min) {
        return Err(error(path, "`maxLength` is below `minLength`"));
    }
    Ok(string_regex(min, max))
}

/// Largest bound an integer's `minimum` / `maximum` may name (exact as a float, and far past
/// what a model writes).
const MAX_INTEGER_BOUND: f64 = 1e15;

/// The closed range of integers `minimum`, `maximum` and their exclusive forms allow (draft
/// 4's boolean `exclusiveMinimum` / `exclusiveMaximum` included); fractional bounds round
/// inwards.
fn integer_bounds(map: &Map<String, Value>, path: &str) -> Result<(Option<i64>, Option<i64>), SchemaError> {
    let number = |keyword: &str| -> Result<Option<f64>, SchemaError> {
        match map.get(keyword) {
            None | Some(Value::Bool(_)) => Ok(None),
            Some(value) => match value.as_f64() {
                Some(n) if n.abs() <= MAX_INTEGER_BOUND => Ok(Some(n)),
                Some(_) => Err(error(path, format!("`{keyword}` is beyond ±10^15, which is not supported"))),
                None => Err(error(path, format!("`{keyword}` must be a number"))),
            },
        }
    };
    let draft4_exclusive = |keyword: &str| map.get(keyword).and_then(Value::as_bool) == Some(true);
    let tighter = |a: Option<f64>, b: Option<f64>, pick: fn(f64, f64) -> f64| match (a, b) {
        (Some(a), Some(b)) => Some(pick(a, b)),
        (a, b) => a.or(b),
    };
    let minimum =
        number("minimum")?.map(|m| if draft4_exclusive("exclusiveMinimum") { m.floor() + 1.0 } else { m.ceil() });
    let maximum =
        number("maximum")?.map(|m| if draft4_exclusive("exclusiveMaximum") { m.ceil() - 1.0 } else { m.floor() });
    let lo = tighter(minimum, number("exclusiveMinimum")?.map(|m| m.floor() + 1.0), f64::max);
    let hi = tighter(maximum, number("exclusiveMaximum")?.map(|m| m.ceil() - 1.0), f64::min);
    Ok((lo.map(|v| v as i64), hi.map(|v| v as i64)))
}

/// The lower bound a number (not an integer) may take: a regex can say "not negative" and
/// "positive", nothing finer.
enum NumberFloor {
    None,
    /// `minimum: 0`.
    NonNegative,
    /// `exclusiveMinimum: 0` (or draft 4's `minimum: 0, exclusiveMinimum: true`).
    Positive,
}

/// A number above zero: a mantissa with a non-zero digit (then any exponent keeps it positive).
const POSITIVE_NUMBER: &str = "(?:[1-9][0-9]*(?:\\.[0-9]+)?|0\\.[0-9]*[1-9][0-9]*)(?:[eE][+-]?[0-9]+)?";

/// The [`NumberFloor`] of `minimum` / `exclusiveMinimum`; other bounds on a number (not an
/// integer) cannot be written as a regex here and are refused.
fn number_floor(map: &Map<String, Value>, path: &str) -> Result<NumberFloor, SchemaError> {
    for keyword in ["maximum", "exclusiveMaximum"] {
        if map.contains_key(keyword) {
            return Err(error(
                path,
                format!("`{keyword}` is supported on integers only; a number takes only `minimum: 0`"),
            ));
        }
    }
    let zero_only = |keyword: &str| {
        error(path, format!("on a number, `{keyword}` is supported only as 0 (integers take any bounds)"))
    };
    let draft4_exclusive = map.get("exclusiveMinimum") == Some(&Value::Bool(true));
    let mut floor = NumberFloor::None;
    match map.get("minimum").map(Value::as_f64) {
        None => {}
        Some(Some(0.0)) if draft4_exclusive => floor = NumberFloor::Positive,
        Some(Some(0.0)) => floor = NumberFloor::NonNegative,
        Some(_) => return Err(zero_only("minimum")),
    }
    match map.get("exclusiveMinimum") {
        None | Some(Value::Bool(false)) => {}
        Some(Value::Bool(true)) if map.contains_key("minimum") => {}
        Some(value) if value.as_f64() == Some(0.0) => floor = NumberFloor::Positive,
        Some(_) => return Err(zero_only("exclusiveMinimum")),
    }
    Ok(floor)
}

fn count(map: &Map<String, Value>, keyword: &str, path: &str) -> Result<Option<usize>, SchemaError> {
    map.get(keyword)
        .map(|v| {
            v.as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| error(path, format!("`{keyword}` must be a non-negative integer")))
        })
        .transpose()
}

/// The compact JSON text of `value`, as a regex.
fn literal(value: &Value) -> String {
    regex_syntax::escape(&literal_text(value))
}

fn literal_text(value: &Value) -> String {
    serde_json::to_string(value).expect("JSON values serialise")
}

/// Whether `value` is of a type `kind` (a `type` keyword, absent: any) names.
fn type_allows(kind: Option<&Value>, value: &Value) -> bool {
    let is = |name: &str| match name {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "number" => value.is_number(),
        "integer" => value.as_f64().is_some_and(|n| n.fract() == 0.0),
        _ => false,
    };
    match kind {
        None => true,
        Some(Value::String(name)) => is(name),
        Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).any(is),
        Some(_) => false,
    }
}

/// `$ref` and the combinators take no constraining keyword beside them: a sibling would apply
/// too (JSON schema's conjunction), which the translation cannot express, and silently
/// dropping it would let outputs break it.
fn refuse_siblings(map: &Map<String, Value>, keyword: &str, path: &str) -> Result<(), SchemaError> {
    let siblings: Vec<&str> =
        map.keys().map(String::as_str).filter(|k| *k != keyword && !ANNOTATIONS.contains(k)).collect();
    if siblings.is_empty() {
        return Ok(());
    }
    Err(error(
        path,
        format!(
            "`{keyword}` with {} beside it is not supported: move {} into the {}",
            siblings.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", "),
            if siblings.len() == 1 { "it" } else { "them" },
            if keyword == "$ref" { "referenced schema" } else { "branches" }
        ),
    ))
}

fn alternatives(branches: impl IntoIterator<Item = String>) -> String {
    let branches: Vec<String> = branches.into_iter().collect();
    format!("(?:{})", branches.join("|"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::structured::regex_dfa::RegexGrammar;

    fn matches(schema: &Value, text: &str) -> bool {
        RegexGrammar::new(&schema_to_regex(schema).unwrap()).unwrap().matches(text.as_bytes())
    }

    #[test]
    fn objects_keep_the_schema_order_and_require_what_is_required() {
        let schema = json!({
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
            "required": ["name", "age"]
        });
        assert!(matches(&schema, r#"{"name": "Ada", "age": 36}"#));
        assert!(matches(&schema, r#"{"name": "Ada", "age": -1, "tags": ["x", "y"]}"#));
        assert!(!matches(&schema, r#"{"name":"Ada","age":36}"#), "json.dumps' separators, spaces included");
        assert!(matches(&schema, r#"{ "name": "Ada", "age": 36, "tags": [ "x" ] }"#), "one space inside brackets");
        assert!(!matches(&schema, r#"{  "name": "Ada", "age": 36}"#), "but no more");
        assert!(!matches(&schema, r#"{"age": 36, "name": "Ada"}"#), "schema order");
        assert!(!matches(&schema, r#"{"name": "Ada"}"#), "age is required");
        assert!(!matches(&schema, r#"{"name": "Ada", "age": 3.5}"#), "an integer");
        assert!(!matches(&schema, r#"{"name": "Ada", "age": 3, "extra": 1}"#), "no other properties");
    }

    #[test]
    fn leading_optional_properties_may_each_be_missing() {
        let schema = json!({"properties": {"a": {"type": "null"}, "b": {"type": "boolean"}, "c": {"const": 1}}});
        for text in [r#"{}"#, r#"{"a": null}"#, r#"{"b": true}"#, r#"{"a": null, "c": 1}"#, r#"{"b": false, "c": 1}"#] {
            assert!(matches(&schema, text), "{text}");
        }
        for text in [r#"{, "b": true}"#, r#"{"c": 1, "a": null}"#, r#"{"a": null,}"#] {
            assert!(!matches(&schema, text), "{text}");
        }
    }

    #[test]
    fn every_generated_text_parses_and_validates_scalars_by_kind() {
        let cases = [
            (json!({"type": "number"}), vec!["0", "-1.5", "2e10", "3.25E-2"], vec!["01", ".5", "1.", "+1"]),
            (json!({"type": "integer", "minimum": 0}), vec!["0", "42"], vec!["-1"]),
            (json!({"type": "integer", "minimum": 1, "maximum": 120}), vec!["1", "99", "120"], vec!["0", "121", "-5"]),
            (
                json!({"type": "integer", "exclusiveMinimum": -3, "exclusiveMaximum": 3}),
                vec!["-2", "2"],
                vec!["-3", "3"],
            ),
            (
                json!({"type": "integer", "minimum": 0.5, "maximum": 10, "exclusiveMaximum": true}),
                vec!["1", "9"],
                vec!["0", "10"],
            ),
            (json!({"type": "integer", "maximum": -10}), vec!["-10", "-1234"], vec!["-9", "0"]),
            (json!({"type": "boolean"}), vec!["true", "false"], vec!["True", "1"]),
            (json!({"enum": ["red", 2, null]}), vec![r#""red""#, "2", "null"], vec![r#""blue""#]),
            (json!({"type": ["string", "null"]}), vec![r#""x""#, "null"], vec!["1"]),
            (json!({"type": "string", "maxLength": 2}), vec![r#""""#, r#""ab""#, r#""\n""#], vec![r#""abc""#]),
            (json!({"type": "string", "pattern": "^[A-Z]{2}[0-9]$"}), vec![r#""AB1""#], vec![r#""ab1""#]),
            (json!({"type": "string", "format": "date"}), vec![r#""2026-12-05""#], vec![r#""2026-13-05""#]),
            (
                json!({"type": "string", "format": "uuid"}),
                vec![r#""123e4567-e89b-12d3-a456-426614174000""#],
                vec![r#""123e4567""#],
            ),
            (
                json!({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}),
                vec!["[1]", "[1, 2]"],
                vec!["[]", "[1,2,3]"],
            ),
            (json!({"anyOf": [{"type": "integer"}, {"type": "string"}]}), vec!["1", r#""1""#], vec!["true"]),
            (
                json!({"type": "object", "additionalProperties": {"type": "integer"}}),
                vec!["{}", r#"{"x": 1, "y": 2}"#],
                vec![r#"{"x": "1"}"#],
            ),
        ];
        for (schema, good, bad) in cases {
            for text in good {
                assert!(matches(&schema, text), "{schema} should allow {text}");
                assert!(serde_json::from_str::<Value>(text).is_ok());
            }
            for text in bad {
                assert!(!matches(&schema, text), "{schema} should refuse {text}");
            }
        }
    }

    /// A pattern constrains the string's value; its JSON text escapes what JSON must, so every
    /// output parses (a `"` a pattern class allowed used to end the string early).
    #[test]
    fn patterned_strings_are_valid_json_whose_value_matches_the_pattern() {
        let schema = json!({"type": "string", "pattern": "^[^0-9]+$"});
        for text in [r#""a b""#, r#""say \"hi\"""#, r#""back\\slash""#, r#""tab\there""#] {
            assert!(matches(&schema, text), "{text}");
            assert!(serde_json::from_str::<String>(text).unwrap().chars().all(|c| !c.is_ascii_digit()));
        }
        // A bare quote, an escape JSON lacks, a raw newline, a digit.
        for text in [r#""a"b""#, r#""a\q""#, "\"line\nbreak\"", r#""a1""#] {
            assert!(!matches(&schema, text), "{text}");
        }
        let quoted = json!({"type": "string", "pattern": "^\"[a-z]+\"$"});
        assert!(matches(&quoted, r#""\"word\"""#));
        assert!(!matches(&quoted, r#"""word"""#));
    }

    #[test]
    fn formats_are_enforced_as_their_rfcs_write_them() {
        let cases = [
            (
                "date",
                vec!["2024-02-29", "2000-02-29", "2023-04-30", "0001-01-01"],
                vec!["2023-02-29", "1900-02-29", "2023-04-31", "0000-01-01"],
            ),
            ("time", vec!["12:30:00Z", "23:59:59.5+05:30"], vec!["12:30:00", "24:00:00Z"]),
            (
                "date-time",
                vec!["2023-01-01T12:30:00Z", "2023-01-01T12:30:00-08:00"],
                vec!["2023-01-01T12:30:00", "2023-01-01 12:30:00Z"],
            ),
            ("email", vec!["a.b+c@example.com", "x@y"], vec!["no-at-sign", "a@@b", "@example.com"]),
            ("hostname", vec!["example.com", "a-b.c"], vec!["-a.com", "a..b"]),
            ("ipv4", vec!["192.168.0.1", "0.0.0.0"], vec!["256.1.1.1", "1.2.3"]),
            ("uri", vec!["https://example.com/a?b=c#d", "urn:isbn:0451450523"], vec!["example.com", "http://a b"]),
        ];
        for (format, good, bad) in cases {
            let schema = json!({"type": "string", "format": format});
            for text in good {
                assert!(matches(&schema, &format!("\"{text}\"")), "{format} should allow {text}");
            }
            for text in bad {
                assert!(!matches(&schema, &format!("\"{text}\"")), "{format} should refuse {text}");
            }
        }
    }

    #[test]
    fn numbers_above_an_exclusive_zero_are_positive() {
        for schema in [
            json!({"type": "number", "exclusiveMinimum": 0}),
            json!({"type": "number", "minimum": 0, "exclusiveMinimum": true}),
        ] {
            for text in ["1", "0.5", "0.001e3", "12.75"] {
                assert!(matches(&schema, text), "{schema}: {text}");
            }
            for text in ["0", "0.0", "0e5", "-1"] {
                assert!(!matches(&schema, text), "{schema}: {text}");
            }
        }
        assert!(matches(&json!({"type": "number", "minimum": 0}), "0"));
    }

    #[test]
    fn enum_values_are_kept_where_the_other_keywords_allow_them() {
        let schema = json!({"type": "string", "enum": ["a", 1, "bb"], "maxLength": 1});
        assert!(matches(&schema, r#""a""#));
        assert!(!matches(&schema, "1") && !matches(&schema, r#""bb""#));
        let objects = json!({"type": "object", "enum": [{"k": 1}, [1]]});
        assert!(matches(&objects, r#"{"k":1}"#) && !matches(&objects, "[1]"));
        assert!(matches(&json!({"type": "integer", "const": 3}), "3"));
        assert!(matches(&json!({"const": "a", "enum": ["a", "b"]}), r#""a""#));
        let e = schema_to_regex(&json!({"const": "c", "enum": ["a", "b"]})).unwrap_err().to_string();
        assert!(e.contains("`const` is not among `enum`"), "{e}");
        assert!(matches(&json!({"type": "array", "uniqueItems": false}), "[1, 1]"));
        // A format no regex here asserts is an annotation (OpenAPI's `password`), lengths apply.
        let password = json!({"type": "string", "format": "password", "maxLength": 3});
        assert!(matches(&password, r#""abc""#) && !matches(&password, r#""abcd""#));
    }

    #[test]
    fn schemas_whose_regex_would_pass_the_size_limit_are_refused_before_it_is_built() {
        // 3000 optional properties: each opens a branch repeating the ones after it (~300 MB).
        let properties: serde_json::Map<String, Value> =
            (0..3000).map(|i| (format!("property_{i}"), json!({"type": "integer"}))).collect();
        let e = schema_to_regex(&json!({"type": "object", "properties": properties})).unwrap_err();
        assert!(e.message.contains("past the 4 MiB limit"), "{e:?}");
        assert_eq!(e.path, "#");
        // Nested within the limit at each level but not in all: named where it passes it.
        let mut schema = json!({"type": "integer"});
        for _ in 0..6 {
            schema = json!({"anyOf": [schema.clone(), schema.clone(), schema.clone(), schema.clone(), schema.clone(), schema.clone(), schema.clone(), schema]});
        }
        assert!(schema_to_regex(&schema).unwrap_err().message.contains("past the 4 MiB limit"));
        let few: serde_json::Map<String, Value> =
            (0..20).map(|i| (format!("p{i}"), json!({"type": "boolean"}))).collect();
        assert!(
            schema_to_regex(&json!({"type": "object", "properties": few})).is_ok(),
            "real schemas stay well within"
        );
    }

    #[test]
    fn refs_resolve_and_recursion_stops_at_the_depth_limit() {
        let schema = json!({
            "$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["value", "next"]}},
            "$ref": "#/$defs/node"
        });
        assert!(matches(&schema, r#"{"value": 1, "next": {"value": 2, "next": null}}"#));
        let deep = r#"{"value": 1, "next": {"value": 2, "next": {"value": 3, "next": {"value": 4, "next": null}}}}"#;
        assert!(!matches(&schema, deep), "a fourth level is past MAX_REF_DEPTH");
        // Distinct `$ref`s nest as deep as the schema does; only recursion is bounded.
        let chain = json!({
            "$defs": {
                "a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},
                "b": {"type": "object", "properties": {"c": {"$ref": "#/$defs/c"}}, "required": ["c"]},
                "c": {"type": "object", "properties": {"d": {"$ref": "#/$defs/d"}}, "required": ["d"]},
                "d": {"type": "object", "properties": {"e": {"type": "integer"}}, "required": ["e"]}
            },
            "$ref": "#/$defs/a"
        });
        assert!(matches(&chain, r#"{"b": {"c": {"d": {"e": 1}}}}"#));
        // A cycle through two definitions stops after as many turns as one through itself.
        let ping_pong = json!({
            "$defs": {
                "ping": {"type": "object", "properties": {"pong": {"anyOf": [{"$ref": "#/$defs/pong"}, {"type": "null"}]}}, "required": ["pong"]},
                "pong": {"type": "object", "properties": {"ping": {"anyOf": [{"$ref": "#/$defs/ping"}, {"type": "null"}]}}, "required": ["ping"]}
            },
            "$ref": "#/$defs/ping"
        });
        assert!(matches(&ping_pong, r#"{"pong": {"ping": {"pong": {"ping": null}}}}"#));
        assert!(!matches(&ping_pong, r#"{"pong": {"ping": {"pong": {"ping": {"pong": null}}}}}"#));
    }

    #[test]
    fn unsupported_or_broken_schemas_are_refused_by_name_and_place() {
        let cases = [
            (json!({"type": "number", "maximum": 10}), "`maximum` is supported on integers only"),
            (json!({"type": "object", "properties": {"a": {"type": "number", "minimum": 5}}}), "#/properties/a"),
            (json!({"type": "integer", "minimum": 5, "maximum": 4}), "leave no integer"),
            (json!({"type": "integer", "minimum": 1e20}), "beyond"),
            (json!({"type": "integer", "maximum": "10"}), "`maximum` must be a number"),
            (json!({"type": "string", "pattern": "("}), "not a valid regex"),
            (json!({"type": "widget"}), "unknown type"),
            (json!({"$ref": "#/$defs/missing"}), "points at nothing"),
            (json!({"$ref": "https://example.com/s.json"}), "only local"),
            (json!({"type": "object", "required": ["a"]}), "\"a\" is not among"),
            (json!({"enum": []}), "at least one"),
            (json!(false), "allows no value"),
            (json!(3), "must be an object"),
            // Keywords beside `$ref` / combinators / a pattern used to be dropped silently.
            (
                json!({"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s", "maxLength": 3}),
                "`$ref` with `maxLength`",
            ),
            (
                json!({"type": "object", "properties": {"a": {"type": "integer"}}, "anyOf": [{"required": ["a"]}]}),
                "`anyOf` with `type`, `properties` beside it",
            ),
            (json!({"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}), "`pattern` with `maxLength`"),
            (json!({"type": "string", "format": "date", "minLength": 3}), "`format` with `minLength`"),
            (json!({"type": "string", "enum": [1, 2]}), "no `enum` value satisfies"),
            (json!({"type": "number", "exclusiveMinimum": 1}), "supported only as 0"),
            (json!({"type": "array", "uniqueItems": true}), "keyword `uniqueItems`"),
        ];
        for (schema, expected) in cases {
            let err = schema_to_regex(&schema).unwrap_err().to_string();
            assert!(err.contains(expected), "{schema}: {err}");
        }
    }
}
