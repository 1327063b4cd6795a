//! Structured outputs on the default model: whatever the model would have said, a guided
//! output follows its JSON schema, is a JSON object, matches its regex, is one of its
//! choices or is a sentence of its grammar; greedy speculation with the shipped EAGLE-3 head returns exactly the guided plain
//! text, with drafts that keep to the grammar; sampled guided outputs stay valid; bad
//! constraints are request errors. On a tiny target whose vocabulary has `<think>`/`</think>`,
//! a guide after reasoning lets the model think first, with and without speculation.

use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};
use specrs_core::SpeculativeConfig;
use specrs_core::config::SpeculativeMethod;
use specrs_core::sampling::SamplingParams;
use specrs_core::structured::pushdown::PushdownGrammar;
use specrs_core::structured::{GuideCursor, GuideState, StructuredOutputs, TokenVocabulary, structural_tag};
use specrs_engine::chat_template::ChatMessage;
use specrs_engine::{
    EngineHandle, FinalOutput, FinishReason, GenerationRequest, PipelineConfig, Prompt, apply_default_draft,
    build_engine,
};
use specrs_models::ModelDType;
use specrs_models::config::Architecture;
use specrs_models::testing::{self, TinyShape};

fn engine(with_default_draft: bool) -> EngineHandle {
    let mut cfg = PipelineConfig::new("smollm2-135m-instruct");
    cfg.dtype = ModelDType::F32;
    if with_default_draft {
        assert!(apply_default_draft(&mut cfg).unwrap());
    }
    let (engine, info) = build_engine(&cfg).unwrap();
    EngineHandle::spawn(engine, Some(info))
}

fn ask_free(question: &str, params: SamplingParams) -> GenerationRequest {
    GenerationRequest::new(Prompt::Chat(vec![ChatMessage::new("user", question)].into()), params)
}

fn ask(question: &str, constraint: StructuredOutputs, params: SamplingParams) -> GenerationRequest {
    ask_free(question, SamplingParams { structured_outputs: Some(constraint), ..params })
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams { temperature: 0.0, max_tokens: Some(max_tokens), ..SamplingParams::default() }
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0},
            "city": {"type": "string", "maxLength": 20},
            "languages": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}
        },
        "required": ["name", "age", "city"]
    })
}

/// vLLM's documentation example for `grammar`.
const SQL_GRAMMAR: &str = r#"
root ::= select_statement
select_statement ::= "SELECT " column " from " table " where " condition
column ::= "col_1 " | "col_2 "
table ::= "table_1 " | "table_2 "
condition ::= column "= " number
number ::= "1 " | "2 "
"#;

/// A tool call in the `<function=name>{...}</function>` shape of vLLM's structural-tag
/// example: exactly one call (`at_least_one`, `stop_after_first`), its arguments held to the
/// tool's schema.
fn weather_call_tag() -> Value {
    let city =
        json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"]});
    let days = json!({"type": "object", "properties": {"days": {"type": "integer"}}, "required": ["days"]});
    let tag = |name: &str, schema: &Value| {
        json!({"type": "tag", "begin": format!("<function={name}>"),
               "content": {"type": "json_schema", "json_schema": schema}, "end": "</function>"})
    };
    json!({"type": "structural_tag", "format": {
        "type": "triggered_tags", "triggers": ["<function="],
        "tags": [tag("get_weather", &city), tag("get_forecast", &days)],
        "at_least_one": true, "stop_after_first": true,
    }})
}

/// Requests covering every kind of constraint, greedy.
fn guided_requests() -> Vec<GenerationRequest> {
    let json = |schema: Value| StructuredOutputs { json: Some(schema), ..Default::default() };
    vec![
        ask("Describe a fictional software engineer as JSON.", json(person_schema()), greedy(96)),
        ask(
            r#"What is 2 + 2? Reply with a JSON object like {"answer": 0}."#,
            StructuredOutputs { json_object: Some(true), ..Default::default() },
            greedy(160),
        ),
        ask(
            "Is Paris the capital of France?",
            StructuredOutputs {
                choice: Some(vec!["Yes".into(), "No".into(), "Not sure".into()]),
                ..Default::default()
            },
            greedy(8),
        ),
        ask(
            "Give me a US phone number.",
            StructuredOutputs { regex: Some(r"\(\d{3}\) \d{3}-\d{4}".into()), ..Default::default() },
            greedy(24),
        ),
        ask(
            "Generate an SQL query to show the 'username' and 'email' from the 'users' table.",
            StructuredOutputs { grammar: Some(SQL_GRAMMAR.into()), ..Default::default() },
            greedy(40),
        ),
        ask(
            "What is the weather in Paris? Call get_weather.",
            StructuredOutputs { structural_tag: Some(weather_call_tag()), ..Default::default() },
            greedy(48),
        ),
    ]
}

fn check_guided(outputs: &[FinalOutput]) {
    let person: Value = serde_json::from_str(&outputs[0].text)
        .unwrap_or_else(|e| panic!("schema output is not JSON ({e}): {:?}", outputs[0].text));
    assert!(person["name"].is_string() && person["age"].is_u64() && person["city"].is_string(), "{person}");
    assert!(person["name"].as_str().unwrap().chars().count() <= 20);
    assert!(person.as_object().unwrap().keys().all(|k| ["name", "age", "city", "languages"].contains(&k.as_str())));

    let mars: Value = serde_json::from_str(outputs[1].text.trim())
        .unwrap_or_else(|e| panic!("json_object output is not JSON ({e}): {:?}", outputs[1].text));
    assert!(mars.is_object(), "{mars}");

    assert!(["Yes", "No", "Not sure"].contains(&outputs[2].text.as_str()), "{:?}", outputs[2].text);

    let phone = &outputs[3].text;
    let digits: Vec<char> = phone.chars().filter(char::is_ascii_digit).collect();
    assert_eq!((phone.len(), digits.len()), (14, 10), "{phone:?}");
    assert!(phone.starts_with('(') && phone[4..6] == *") " && &phone[9..10] == "-", "{phone:?}");

    let sql = &outputs[4].text;
    assert!(PushdownGrammar::new(SQL_GRAMMAR).unwrap().matches(sql.as_bytes()), "{sql:?}");

    let call = &outputs[5].text;
    let tag = PushdownGrammar::from_rules(structural_tag::rules(&weather_call_tag()).unwrap()).unwrap();
    assert!(tag.matches(call.as_bytes()), "{call:?}");
    let arguments = call.split_once('>').and_then(|(_, rest)| rest.strip_suffix("</function>")).unwrap();
    let arguments: Value = serde_json::from_str(arguments).unwrap_or_else(|e| panic!("{e}: {call:?}"));
    assert!(arguments["city"].is_string() || arguments["days"].is_u64(), "{call:?}");

    for out in outputs {
        assert_eq!(out.finish_reason, FinishReason::Stop, "a complete output ends itself: {:?}", out.text);
    }
}

#[test]
fn guided_outputs_follow_their_constraints_and_speculation_returns_the_same_text() {
    let plain = engine(false);
    let plain_out = plain.generate(guided_requests()).unwrap();
    check_guided(&plain_out);

    let spec = engine(true);
    let spec_out = spec.generate(guided_requests()).unwrap();
    let mut accepted = 0;
    for (a, b) in plain_out.iter().zip(&spec_out) {
        assert_eq!(a.token_ids, b.token_ids, "greedy guided speculation is lossless: {:?}", a.text);
        accepted += b.metrics.num_accepted_tokens;
    }
    assert!(accepted > 0, "the head's drafts are accepted where they keep to the grammar");
    let (free, total) = spec.kv_blocks().unwrap();
    assert_eq!(free, total);
}

#[test]
fn a_request_arrives_with_its_guide_compiled_and_is_not_compiled_again() {
    // The handle compiles a request's constraint before the engine thread sees it (so a slow
    // compile never stalls running sequences); a guide the request already carries is the one
    // used, by the handle and the engine alike. Shown with a guide of other choices than the
    // constraint names: the output keeps to the guide.
    let plain = engine(false);
    let tok = plain.tokenizer();
    let vocabulary = Arc::new(TokenVocabulary::new(tok.token_bytes(), tok.eos_token_ids().to_vec()));
    let carried = StructuredOutputs { choice: Some(vec!["Maybe".into()]), ..Default::default() };
    let named = StructuredOutputs { choice: Some(vec!["Yes".into(), "No".into()]), ..Default::default() };
    let mut request = ask("Is Paris the capital of France?", named.clone(), greedy(8));
    request.params.guide = Some(carried.compile(&vocabulary).unwrap());
    let out = plain.generate(vec![request]).unwrap().remove(0);
    assert_eq!(out.text, "Maybe");
    let compiled_here = plain.generate(vec![ask("Is Paris the capital of France?", named, greedy(8))]).unwrap();
    assert!(["Yes", "No"].contains(&compiled_here[0].text.as_str()), "{:?}", compiled_here[0].text);
}

#[test]
fn the_heads_drafts_keep_to_the_grammar_greedy_or_sampled() {
    let spec = engine(true);
    let schema = StructuredOutputs { json: Some(person_schema()), ..Default::default() };
    let tok = spec.tokenizer();
    let vocabulary = Arc::new(TokenVocabulary::new(tok.token_bytes(), tok.eos_token_ids().to_vec()));
    let guide = schema.compile(&vocabulary).unwrap();
    let question = "Describe a fictional software engineer as JSON.";
    let sampled = SamplingParams { temperature: 1.0, seed: Some(3), max_tokens: Some(96), ..Default::default() };
    for params in [greedy(96), sampled] {
        let request = GenerationRequest { trace: true, ..ask(question, schema.clone(), params) };
        let out = spec.generate(vec![request]).unwrap().remove(0);
        let mut drafted = 0;
        for step in &out.trace {
            let output = &out.token_ids[..step.position - out.num_prompt_tokens];
            let mut state = GuideCursor::after(&guide, &[], output).state();
            for &token in &step.drafted {
                state = guide.advance(state, token);
                assert_ne!(state, GuideState::Dead, "draft {token} after {:?}", tok.decode(output, false));
                drafted += 1;
            }
        }
        assert!(drafted > 0);
        assert!(out.metrics.num_accepted_tokens > 0);
    }
}

#[test]
fn sampled_guided_outputs_stay_valid_for_every_seed() {
    let spec = engine(true);
    let schema = StructuredOutputs { json: Some(person_schema()), ..Default::default() };
    let requests = (0..4)
        .map(|seed| {
            let params =
                SamplingParams { temperature: 1.0, seed: Some(seed), max_tokens: Some(128), ..Default::default() };
            ask("Describe a fictional person as JSON.", schema.clone(), params)
        })
        .collect();
    for out in spec.generate(requests).unwrap() {
        if out.finish_reason == FinishReason::Stop {
            let person: Value = serde_json::from_str(&out.text).unwrap_or_else(|e| panic!("{e}: {:?}", out.text));
            assert!(person["age"].is_u64(), "{person}");
        } else {
            // Cut by max_tokens: still a prefix the schema allows.
            assert!(out.text.starts_with("{\"name\""), "{:?}", out.text);
        }
    }
}

#[test]
fn bad_constraints_are_request_errors_naming_the_problem() {
    let plain = engine(false);
    let cases = [
        (StructuredOutputs { regex: Some("(".into()), ..Default::default() }, "not a valid regex"),
        (StructuredOutputs { json: Some(json!({"type": "number", "maximum": 3})), ..Default::default() }, "`maximum`"),
        (StructuredOutputs::default(), "needs one of"),
        (
            StructuredOutputs { grammar: Some("root ::= item\n".into()), ..Default::default() },
            "rule `item` is used at line 1, column 10 (in `root`) but never defined",
        ),
        (
            StructuredOutputs {
                structural_tag: Some(json!({"type": "structural_tag", "format": {"type": "any_tokens"}})),
                ..Default::default()
            },
            "structural_tag at format: the token-level format `any_tokens` is not supported",
        ),
    ];
    for (constraint, expected) in cases {
        let err = plain.generate(vec![ask("Hi", constraint, greedy(4))]).unwrap_err().to_string();
        assert!(err.contains("structured_outputs") && err.contains(expected), "{err}");
    }

    // Synthetic acceptance ignores the logits, so it cannot keep an output to a constraint.
    let mut cfg = PipelineConfig::new("smollm2-135m-instruct");
    cfg.speculative.speculative_method = Some(specrs_core::config::SpeculativeMethod::Ngram);
    cfg.speculative.synthetic_acceptance_rate = Some(0.7);
    let (engine, info) = build_engine(&cfg).unwrap();
    let synthetic = EngineHandle::spawn(engine, Some(info));
    let choice = StructuredOutputs { choice: Some(vec!["a".into()]), ..Default::default() };
    let err = synthetic.generate(vec![ask("Hi", choice, greedy(4))]).unwrap_err().to_string();
    assert!(err.contains("synthetic acceptance"), "{err}");
}

#[test]
fn forced_text_is_drafted_whole_and_accepted_without_a_drafter_forward() {
    // Plain n-gram speculation has nothing to copy in a fresh answer; the schema's keys and
    // punctuation are forced, and come back as drafts the target accepts.
    let mut cfg = PipelineConfig::new("smollm2-135m-instruct");
    cfg.dtype = ModelDType::F32;
    cfg.speculative.speculative_method = Some(specrs_core::config::SpeculativeMethod::Ngram);
    cfg.speculative.num_speculative_tokens = Some(4);
    let (ngram_engine, info) = build_engine(&cfg).unwrap();
    let spec = EngineHandle::spawn(ngram_engine, Some(info));
    let schema = StructuredOutputs { json: Some(person_schema()), ..Default::default() };
    let request = GenerationRequest {
        trace: true,
        ..ask("Describe a fictional software engineer as JSON.", schema.clone(), greedy(96))
    };
    let out = spec.generate(vec![request]).unwrap().remove(0);
    let plain =
        engine(false).generate(vec![ask("Describe a fictional software engineer as JSON.", schema, greedy(96))]);
    assert_eq!(out.token_ids, plain.unwrap()[0].token_ids, "lossless");
    let tokenizer = spec.tokenizer();
    let drafted: Vec<String> = out.trace.iter().map(|s| tokenizer.decode(&s.drafted, false).unwrap()).collect();
    assert!(drafted.iter().any(|d| d.contains("\"age\":")), "the key between two values is drafted: {drafted:?}");
    assert!(
        out.trace.iter().any(|s| s.num_accepted >= 3),
        "forced runs are accepted several tokens at a time: {:?}",
        out.trace.iter().map(|s| s.num_accepted).collect::<Vec<_>>()
    );

    // The model's own answer as the only choice: its rest is forced, tokenized as the model
    // tokenizes it, so every forced draft is accepted, the end included.
    let question = "Is Paris the capital of France?";
    let free = spec.generate(vec![ask_free(question, greedy(6))]).unwrap().remove(0);
    let only = StructuredOutputs { choice: Some(vec![free.text.clone()]), ..Default::default() };
    let request = GenerationRequest { trace: true, ..ask(question, only, greedy(16)) };
    let out = spec.generate(vec![request]).unwrap().remove(0);
    assert_eq!((out.text.as_str(), out.finish_reason), (free.text.as_str(), FinishReason::Stop));
    assert!(out.trace.iter().all(|s| s.num_accepted == s.drafted.len()), "{:?}", out.trace);
    let last = out.trace.last().expect("a verify step").drafted.last().copied();
    assert!(last.is_some_and(|t| tokenizer.eos_token_ids().contains(&t)), "the end is drafted: {:?}", out.trace);
}

const TINY: TinyShape =
    TinyShape { vocab: 48, hidden: 64, layers: 4, heads: 4, kv_heads: 2, head_dim: 16, intermediate: 64 };
/// In the bigram target's vocabulary: its greedy successor of token `x` is `x - 1`.
const THINK_OPEN: u32 = 19;
const THINK_CLOSE: u32 = 15;

fn thinking_engine(target: &Path, draft: Option<&Path>) -> EngineHandle {
    let mut cfg = PipelineConfig::new(target.to_str().unwrap());
    cfg.dtype = ModelDType::F32;
    cfg.draft_model = draft.map(|d| d.to_str().unwrap().to_string());
    cfg.speculative = SpeculativeConfig {
        speculative_method: draft.map(|_| SpeculativeMethod::Eagle),
        num_speculative_tokens: draft.map(|_| 3),
        ..SpeculativeConfig::default()
    };
    let (engine, info) = build_engine(&cfg).unwrap();
    EngineHandle::spawn(engine, Some(info))
}

#[test]
fn a_guide_after_reasoning_lets_the_model_think_first_with_or_without_speculation() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("bigram");
    let config = testing::target_config(Architecture::Llama, &TINY, false);
    testing::write_checkpoint(&target, &config, &testing::bigram_target(Architecture::Llama, &TINY).unwrap()).unwrap();
    testing::write_thinking_tokenizer(&target, TINY.vocab, THINK_OPEN, THINK_CLOSE).unwrap();
    let head = dir.path().join("eagle3");
    let (c, t) = testing::eagle3_oracle(&TINY, [2, 2, 3]).unwrap();
    testing::write_checkpoint(&head, &c, &t).unwrap();

    // The answer must be `t3`; the model, left alone, counts down from its last token.
    let answer = |after_reasoning| StructuredOutputs {
        regex: Some("t3".into()),
        after_reasoning,
        ..StructuredOutputs::default()
    };
    let request = |prompt: Vec<u32>, after_reasoning| {
        let params = SamplingParams { structured_outputs: Some(answer(after_reasoning)), ..greedy(16) };
        GenerationRequest::new(Prompt::Tokens(prompt), params)
    };
    let requests = || {
        vec![
            // The prompt opened the reasoning: the model thinks 18, 17, 16 until `</think>`.
            request(vec![30, THINK_OPEN], true),
            // Nothing open: the model's own next token is `<think>`, which the guide allows.
            request(vec![30, THINK_OPEN + 1], true),
            // The prompt closed the reasoning: the answer comes at once.
            request(vec![THINK_OPEN, 17, THINK_CLOSE], true),
            // A guide without the flag holds from the first token.
            request(vec![30, THINK_OPEN], false),
        ]
    };
    let thought = vec![18, 17, 16, THINK_CLOSE, 3];
    let want = [thought.clone(), [vec![THINK_OPEN], thought].concat(), vec![3], vec![3]];

    let plain = thinking_engine(&target, None);
    let plain_out = plain.generate(requests()).unwrap();
    for (out, want) in plain_out.iter().zip(&want) {
        assert_eq!(out.token_ids[..want.len()], want[..], "{:?}", out.text);
        assert_eq!(out.finish_reason, FinishReason::Stop, "the grammar is complete after `t3`");
    }
    let spec = thinking_engine(&target, Some(&head));
    let spec_out = spec.generate(requests()).unwrap();
    let mut accepted = 0;
    for (a, b) in plain_out.iter().zip(&spec_out) {
        assert_eq!(a.token_ids, b.token_ids, "speculation through the thinking is lossless");
        accepted += b.metrics.num_accepted_tokens;
    }
    assert!(accepted >= 3, "the oracle's drafts are accepted while the model thinks: {accepted}");
}

#[test]
fn masks_that_leave_no_token_are_refused_up_front_or_end_the_request_with_a_request_error() {
    let plain = engine(false);
    let tokenizer = plain.tokenizer().clone();
    let yes = tokenizer.encode("Yes", false).unwrap();
    assert_eq!(yes.len(), 1, "\"Yes\" is one token of SmolLM2's vocabulary");
    let eos = tokenizer.eos_token_ids().to_vec();
    let choice = || StructuredOutputs { choice: Some(vec!["Yes".into()]), ..Default::default() };

    // Dead ends at the first output token are refused before anything runs, naming the fields.
    let refused = [
        // The choice cannot start with EOS.
        (
            ask("Hi", choice(), SamplingParams { allowed_token_ids: Some(eos.clone()), ..greedy(4) }),
            "structured_outputs",
        ),
        // The only allowed token is EOS, which min_tokens holds back.
        (
            ask_free("Hi", SamplingParams { allowed_token_ids: Some(eos.clone()), min_tokens: 2, ..greedy(4) }),
            "min_tokens",
        ),
        // The only allowed token is a bad word.
        (
            ask_free(
                "Hi",
                SamplingParams { allowed_token_ids: Some(yes.clone()), bad_words: vec!["Yes".into()], ..greedy(4) },
            ),
            "bad_words",
        ),
    ];
    for (request, other_field) in refused {
        let err = plain.generate(vec![request]).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("allowed_token_ids") && message.contains(other_field) && message.contains("first"),
            "{message}"
        );
        assert!(
            matches!(err, specrs_engine::EngineError::Config(ref c) if c.field.as_deref() == Some("allowed_token_ids"))
        );
    }

    // "Yes" is allowed and starts the choice; after it the choice needs EOS, which the request
    // does not allow. The request ends there with a request error, after its one token, with
    // and without speculation; a request beside it in the batch runs to its normal end.
    let speculative = engine(true);
    for handle in [&plain, &speculative] {
        let dead_end =
            ask("Is Paris in France?", choice(), SamplingParams { allowed_token_ids: Some(yes.clone()), ..greedy(8) });
        let beside = ask_free("Name a colour.", greedy(6));
        let outs = handle.generate(vec![dead_end, beside]).unwrap();
        assert_eq!(outs[0].finish_reason, FinishReason::Error);
        assert_eq!(outs[0].token_ids, yes, "the allowed token before the dead end stays in the output");
        let failure = outs[0].error.as_ref().expect("a failed request says why");
        assert!(failure.caused_by_request, "the request's own masks caused it: {failure}");
        assert!(
            failure.message.contains("output token 1")
                && failure.message.contains("allowed_token_ids and structured_outputs"),
            "{failure}"
        );
        assert_eq!(outs[1].finish_reason, FinishReason::Length);
        assert_eq!(outs[1].token_ids.len(), 6);
        assert!(outs[1].error.is_none());
    }
}

#[test]
fn a_stop_accepted_mid_step_before_a_dead_end_stops_the_request_as_plain_decoding_does() {
    // Digits only; "5" stops (as a token id, then as a string); nothing may follow a "5" (the
    // bad words "50".."59"). Plain decoding stops at the "5". A drafter that copies the
    // prompt's digits has the "5" accepted mid-step, and the dead end after it used to fail
    // the request and drop the step's accepted tokens.
    let plain = engine(false);
    let tokenizer = plain.tokenizer().clone();
    let id = |text: &str| match tokenizer.encode(text, false).unwrap()[..] {
        [id] => id,
        ref ids => panic!("{text:?} is {} tokens", ids.len()),
    };
    let digits: Vec<u32> = (0..10).map(|d| id(&d.to_string())).collect();
    let masks = SamplingParams {
        allowed_token_ids: Some(digits),
        bad_words: (0..10).map(|d| format!("5{d}")).collect(),
        ..greedy(40)
    };
    let by_id = SamplingParams { stop_token_ids: vec![id("5")], ..masks.clone() };
    let by_string = SamplingParams { stop: vec!["5".into()], ..masks };
    let request = |params: &SamplingParams| {
        ask_free("Repeat exactly: 12345678901234567890123456789012345678901234567890", params.clone())
    };
    let mut ngram_cfg = PipelineConfig::new("smollm2-135m-instruct");
    ngram_cfg.dtype = ModelDType::F32;
    ngram_cfg.speculative = SpeculativeConfig {
        speculative_method: Some(SpeculativeMethod::Ngram),
        num_speculative_tokens: Some(4),
        ..SpeculativeConfig::default()
    };
    let (ngram_engine, info) = build_engine(&ngram_cfg).unwrap();
    let ngram = EngineHandle::spawn(ngram_engine, Some(info));
    let shipped_default = engine(true);
    for params in [&by_id, &by_string] {
        let expected = plain.generate(vec![request(params)]).unwrap().remove(0);
        assert_eq!(expected.finish_reason, FinishReason::Stop, "{:?}", expected.error);
        for handle in [&ngram, &shipped_default] {
            let out = handle.generate(vec![request(params)]).unwrap().remove(0);
            assert_eq!((out.finish_reason, &out.error), (FinishReason::Stop, &None));
            assert_eq!(out.text, expected.text);
            assert_eq!(out.token_ids, expected.token_ids);
        }
    }
    // The path under test was taken: a step accepted the "5" as a draft, with a position after it.
    let traced = ngram.generate(vec![GenerationRequest { trace: true, ..request(&by_id) }]).unwrap().remove(0);
    let five = id("5");
    assert!(
        traced.trace.iter().any(|step| step.drafted[..step.num_accepted].contains(&five)),
        "the stop token was an accepted draft mid-step: {:?}",
        traced.trace
    );
}
