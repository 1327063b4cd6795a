//! The server lets a reasoning model think before its output constraint holds: with a
//! reasoning parser, a structured output waits for `</think>` (the vocabulary has the
//! markers), and a chat response splits the thinking into `reasoning_content`; without one, the
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
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let listener = runtime.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    runtime.spawn(async move { axum::serve(listener, router(state)).await });
    (runtime, addr)
}

/// POSTs `body` as JSON and returns the status and the JSON answer (one request, 60 s at most).
fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, Value) {
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
    let json =
        response.split_once("\r\n\r\n").map_or(Value::Null, |(_, b)| serde_json::from_str(b).unwrap_or(Value::Null));
    (status, json)
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
