//! The server lets a reasoning model think before its output constraint holds: with a
//! reasoning parser, a structured output waits for `</think>` (the vocabulary has the
//! markers), a chat response splits the thinking into `reasoning_content` and a Responses API
//! response into a `reasoning` item before its message; without one, the
//! constraint holds from the first token. A tiny bigram target (its greedy next token is the
//! previous one minus one) with `<think>` and `</think>` in its vocabulary stands in for a
//! reasoning model. The server binds 127.0.0.1, each request is bounded by a timeout, and the
//! server stops with the test's runtime.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use serde_json::{Value, json};
use specrs_engine::{EngineHandle, PipelineConfig, build_engine};
use specrs_models::ModelDType;
use specrs_models::config::Architecture;
use specrs_models::testing::{self, TinyShape};
use specrs_server::reasoning::ReasoningParser;
use specrs_server::server::{AppState, router};

const TINY: TinyShape =
    TinyShape { vocab: 48, hidden: 64, layers: 2, heads: 4, kv_heads: 2, head_dim: 16, intermediate: 64 };
const THINK_OPEN: u32 = 19;
const THINK_CLOSE: u32 = 15;

/// The bigram target with a reasoning model's tokenizer (`<think>` and `</think>` in its
/// vocabulary).
fn write_thinker(dir: &Path) {
    let config = testing::target_config(Architecture::Llama, &TINY, false);
    testing::write_checkpoint(dir, &config, &testing::bigram_target(Architecture::Llama, &TINY).unwrap()).unwrap();
    testing::write_thinking_tokenizer(dir, TINY.vocab, THINK_OPEN, THINK_CLOSE).unwrap();
}

/// Serves `model` on 127.0.0.1 until the returned runtime is dropped.
fn serve(model: &Path, reasoning_parser: Option<ReasoningParser>) -> (tokio::runtime::Runtime, SocketAddr) {
    let mut cfg = PipelineConfig::new(model.to_str().unwrap());
    cfg.dtype = ModelDType::F32;
    let (engine, info) = build_engine(&cfg).unwrap();
    let state = Arc::new(AppState {
        handle: Arc::new(EngineHandle::spawn(engine, Some(info))),
        model_names: vec!["thinker".into()],
        api_key: None,
        max_pending: 8,
        in_flight: AtomicUsize::new(0),
        created: 0,
        chat_template: Some("{% for m in messages %}{{ m.content }}{% endfor %}".into()),
        auto_tool_parser: None,
        reasoning_parser,
        exclude_tools_when_tool_choice_none: false,
        trust_request_chat_template: false,
        responses: Default::default(),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    runtime.spawn(async move { axum::serve(listener, router(state)).await });
    (runtime, addr)
}

/// POSTs `body` as JSON and returns the status and the JSON answer (one request, 60 s at most).
fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = post_raw(addr, path, body);
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// POSTs `body` as JSON and returns the status and the answer's body as text.
fn post_raw(addr: SocketAddr, path: &str, body: &Value) -> (u16, String) {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let body = body.to_string();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map_or(String::new(), |(_, b)| b.to_string());
    (status, body)
}

#[test]
fn a_reasoning_parser_lets_the_model_think_before_a_structured_output_holds() {
    let dir = tempfile::tempdir().unwrap();
    write_thinker(dir.path());
    let chat = json!({
        "model": "thinker", "messages": [{"role": "user", "content": "t30 <think>"}],
        "guided_regex": "t3", "temperature": 0, "max_tokens": 16
    });
    let completion = json!({"model": "thinker", "prompt": [30, THINK_OPEN], "guided_regex": "t3", "temperature": 0});

    let (runtime, addr) = serve(dir.path(), Some(ReasoningParser::DeepseekR1));
    // The prompt opened the reasoning: the model counts down to `</think>`, then answers.
    let (status, body) = post(addr, "/v1/completions", &completion);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], "t18 t17 t16 </think> t3");
    let (status, body) = post(addr, "/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{body}");
    let message = &body["choices"][0]["message"];
    assert_eq!(message["reasoning_content"].as_str().map(str::trim), Some("t18 t17 t16"), "{message}");
    assert_eq!(message["content"].as_str().map(str::trim), Some("t3"), "{message}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    drop(runtime);

    // No reasoning parser: the constraint holds from the first token.
    let (runtime, addr) = serve(dir.path(), None);
    let (status, body) = post(addr, "/v1/completions", &completion);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["text"], "t3");
    let (_, body) = post(addr, "/v1/chat/completions", &chat);
    assert_eq!(body["choices"][0]["message"]["content"], "t3");
    drop(runtime);
}

#[test]
fn glm45_splits_a_thought_the_prompt_opened_and_otherwise_only_one_the_model_opens() {
    let dir = tempfile::tempdir().unwrap();
    write_thinker(dir.path());
    let (runtime, addr) = serve(dir.path(), Some(ReasoningParser::Glm45));
    let chat = |content: &str| json!({"model": "thinker", "messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 6});
    // The rendered prompt ends inside `<think>` (GLM-4.7 thinking): the output continues the
    // thought until the model counts down to `</think>`.
    let (status, body) = post(addr, "/v1/chat/completions", &chat("t30 <think>"));
    assert_eq!(status, 200, "{body}");
    let message = &body["choices"][0]["message"];
    assert_eq!(message["reasoning_content"].as_str().map(str::trim), Some("t18 t17 t16"), "{message}");
    assert_eq!(message["content"].as_str().map(str::trim), Some("t14 t13"), "{message}");
    // Nothing opened in the prompt, and the output does not open with `<think>`: all of it is
    // the answer, though it reaches `<think>` later (DeepSeek-R1's rule would call it thought).
    let (status, body) = post(addr, "/v1/chat/completions", &chat("t25"));
    assert_eq!(status, 200, "{body}");
    let message = &body["choices"][0]["message"];
    assert_eq!(message["reasoning_content"], Value::Null, "{message}");
    assert_eq!(message["content"].as_str().map(str::trim), Some("t24 t23 t22 t21 t20 <think>"), "{message}");
    drop(runtime);
}

/// The `output` items of a response without their ids (which differ between responses).
fn output_without_ids(response: &Value) -> Vec<Value> {
    let mut items = response["output"].as_array().cloned().unwrap_or_default();
    for item in &mut items {
        item.as_object_mut().unwrap().remove("id");
    }
    items
}

#[test]
fn a_response_puts_the_thinking_in_a_reasoning_item_before_its_message_whole_or_streamed() {
    let dir = tempfile::tempdir().unwrap();
    write_thinker(dir.path());
    let (runtime, addr) = serve(dir.path(), Some(ReasoningParser::DeepseekR1));
    let chat = json!({"model": "thinker", "messages": [{"role": "user", "content": "t30 <think>"}], "temperature": 0, "max_tokens": 6});
    let (status, chat) = post(addr, "/v1/chat/completions", &chat);
    assert_eq!(status, 200, "{chat}");
    let message = &chat["choices"][0]["message"];
    let request = json!({"model": "thinker", "input": "t30 <think>", "temperature": 0, "max_output_tokens": 6});
    let (status, whole) = post(addr, "/v1/responses", &request);
    assert_eq!(status, 200, "{whole}");
    let output = &whole["output"];
    assert_eq!(
        (output[0]["type"].as_str(), output[1]["type"].as_str()),
        (Some("reasoning"), Some("message")),
        "{whole}"
    );
    assert_eq!(output[0]["content"][0]["text"], message["reasoning_content"], "the same thinking as chat's");
    assert_eq!(output[1]["content"][0]["text"], message["content"], "the same answer as chat's");
    assert_eq!(
        (whole["status"].as_str(), whole["incomplete_details"]["reason"].as_str()),
        (Some("incomplete"), Some("max_output_tokens"))
    );
    assert_eq!(whole["usage"]["output_tokens"], chat["usage"]["completion_tokens"]);
    // "t18 t17 t16" with the spaces the bigram tokenizer writes: at least one token each.
    assert!(whole["usage"]["output_tokens_details"]["reasoning_tokens"].as_u64().unwrap() >= 3, "{whole}");

    let streamed =
        json!({"model": "thinker", "input": "t30 <think>", "temperature": 0, "max_output_tokens": 6, "stream": true});
    let (status, text) = post_raw(addr, "/v1/responses", &streamed);
    assert_eq!(status, 200, "{text}");
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter(|block| block.contains("data: "))
        .map(|block| {
            let line =
                |prefix: &str| block.lines().find_map(|l| l.strip_prefix(prefix)).unwrap_or_default().to_string();
            (line("event: "), serde_json::from_str(&line("data: ")).unwrap())
        })
        .collect();
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!((data["type"].as_str(), data["sequence_number"].as_u64()), (Some(name.as_str()), Some(i as u64)));
    }
    let names: Vec<&str> = events.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names[..2], ["response.created", "response.in_progress"]);
    assert_eq!(names.last(), Some(&"response.incomplete"));
    assert!(
        names.contains(&"response.reasoning_text.delta") && names.contains(&"response.output_text.delta"),
        "{names:?}"
    );
    let last = &events.last().unwrap().1["response"];
    assert_eq!(output_without_ids(last), output_without_ids(&whole), "a stream ends with the whole response");
    // Stored: GET returns what the stream ended with.
    let id = last["id"].as_str().unwrap();
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10)).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(stream, "GET /v1/responses/{id} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").unwrap();
    let mut got = String::new();
    stream.read_to_string(&mut got).unwrap();
    let stored: Value = serde_json::from_str(got.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_eq!(&stored, last);
    drop(runtime);
}
