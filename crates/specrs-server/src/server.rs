//! The OpenAI-compatible HTTP server: `/v1/chat/completions`, `/v1/completions` (streaming or
//! not), `/v1/responses` (in `responses`), `/v1/models`, `/health`, `/metrics`.
//!
//! Requests are validated into engine requests (bad input is a 4xx with OpenAI's error JSON
//! naming the field), admitted up to a bounded number in flight (beyond it: 429 with
//! Retry-After), and streamed as server-sent events ending with `data: [DONE]`. A client that
//! disconnects drops its output stream, which cancels the request and frees its KV blocks.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::stream::{self, Stream, StreamExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use specrs_core::sampling::SamplingParams;
use specrs_core::structured::StructuredOutputs;
use specrs_engine::chat_template::RESERVED_TEMPLATE_VARS;
use specrs_engine::request::OutputStream;
use specrs_engine::{
    ChatEnding, ChatMessage, ChatTemplate, Conversation, EngineHandle, FinalOutput, FinishReason, GenerationRequest,
    Prompt, RequestFailure, RequestOutput, StopReason, TokenLogprob, text_messages,
};

use crate::error::ApiError;
use crate::message::{MessageDelta, MessageReader};
use crate::openai::{
    ChatCompletionRequest, ChatMessageIn, CompletionRequest, PromptSpec, PromptTokensDetails, SamplingFields,
    SpecDecodeUsage, StreamUsage, Usage, running_usage,
};
use crate::reasoning::ReasoningParser;
use crate::responses::ResponseStore;
use crate::tools::{CallStream, ToolCallParser, ToolChoice, ToolRequest};

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 8 << 20;

pub struct AppState {
    pub handle: Arc<EngineHandle>,
    /// Names a request's `model` may use.
    pub model_names: Vec<String>,
    pub api_key: Option<String>,
    pub max_pending: usize,
    pub in_flight: AtomicUsize,
    pub created: u64,
    /// The chat template requests use when they bring none (`--chat-template`); the model's
    /// own when `None`.
    pub chat_template: Option<String>,
    /// How the model writes tool calls, for `tool_choice: "auto"` (`--tool-call-parser` with
    /// `--enable-auto-tool-choice`).
    pub auto_tool_parser: Option<ToolCallParser>,
    /// How reasoning models mark their thinking (`--reasoning-parser`): split into
    /// `reasoning_content`.
    pub reasoning_parser: Option<ReasoningParser>,
    /// Requests with `tool_choice: "none"` render no tools (`--exclude-tools-when-tool-choice-none`).
    pub exclude_tools_when_tool_choice_none: bool,
    /// Requests may send their own `chat_template` (`--trust-request-chat-template`).
    pub trust_request_chat_template: bool,
    /// Responses kept for `previous_response_id` and `GET /v1/responses/{id}`.
    pub responses: ResponseStore,
}

/// Counts a request in flight until dropped.
pub(crate) struct InFlight(Arc<AppState>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/responses", post(crate::responses::create_response))
        .route("/v1/responses/{id}", get(crate::responses::retrieve_response).delete(crate::responses::delete_response))
        .route("/v1/responses/{id}/input_items", get(crate::responses::list_input_items))
        .route("/v1/models", get(models))
        .route("/v1/models/{model}", get(model))
        .route("/tokenize", post(crate::tokenize::tokenize))
        .route("/detokenize", post(crate::tokenize::detokenize))
        .route("/metrics", get(metrics))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/reset_suffix_cache", post(reset_suffix_cache))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key));
    Router::new()
        .route("/health", get(health))
        .route("/version", get(|| async { axum::Json(json!({"version": env!("CARGO_PKG_VERSION")})) }))
        .merge(api)
        .fallback(|| async {
            ApiError::status(
                StatusCode::NOT_FOUND,
                "no such endpoint; see /v1/models, /v1/chat/completions, /v1/completions, /v1/responses, /tokenize, \
                 /detokenize",
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

async fn require_api_key(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            return ApiError::status(
                StatusCode::UNAUTHORIZED,
                "missing or invalid API key: send 'Authorization: Bearer <key>'",
            )
            .into_response();
        }
    }
    next.run(req).await
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.handle.is_alive() {
        true => (StatusCode::OK, axum::Json(json!({"status": "ok"}))).into_response(),
        false => ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped").into_response(),
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let mut text = state.handle.metrics().render_prometheus("specrs");
    text.push_str(&format!(
        "# HELP specrs_num_requests_in_flight Requests admitted by the HTTP server and not yet answered.\n\
         # TYPE specrs_num_requests_in_flight gauge\nspecrs_num_requests_in_flight {}\n",
        state.in_flight.load(Ordering::Relaxed)
    ));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

/// vLLM's `POST /reset_prefix_cache`: forgets every cached prefix, e.g. to benchmark without
/// reuse. Requests running keep the blocks they hold.
async fn reset_prefix_cache(State(state): State<Arc<AppState>>) -> Response {
    let handle = state.handle.clone();
    match tokio::task::spawn_blocking(move || handle.reset_prefix_cache()).await {
        Ok(Ok(blocks)) => axum::Json(json!({"status": "ok", "forgotten_blocks": blocks})).into_response(),
        _ => ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped").into_response(),
    }
}

/// Forgets the finished requests' outputs suffix decoding drafts from, e.g. to benchmark
/// first-time requests after repeated ones. Requests running keep theirs.
async fn reset_suffix_cache(State(state): State<Arc<AppState>>) -> Response {
    let handle = state.handle.clone();
    match tokio::task::spawn_blocking(move || handle.reset_suffix_cache()).await {
        Ok(Ok(outputs)) => axum::Json(json!({"status": "ok", "forgotten_outputs": outputs})).into_response(),
        _ => ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped").into_response(),
    }
}

fn model_object(state: &AppState, id: &str) -> Value {
    json!({"id": id, "object": "model", "created": state.created, "owned_by": "spec-rs",
           "max_model_len": state.handle.info().max_model_len})
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    let data: Vec<Value> = state.model_names.iter().take(1).map(|m| model_object(&state, m)).collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// OpenAI's retrieve-model: the served model under any of its names.
async fn model(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    check_model(&state, &id)?;
    Ok(axum::Json(model_object(&state, &id)).into_response())
}

/// Parses a JSON body into `T`, reporting malformed JSON, wrong types and unknown enum values
/// as 400s that name the field.
pub(crate) fn parse_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    let value = json_object(body)?;
    // The sampling fields are flattened into both request types, and serde loses the path of
    // flattened fields: check them on their own first so their errors name the field.
    deserialize_named::<SamplingFields>(value.clone())?;
    deserialize_named(value)
}

/// [`parse_body`] for request types without flattened fields.
pub(crate) fn parse_plain_body<T: DeserializeOwned>(body: Result<Bytes, BytesRejection>) -> Result<T, ApiError> {
    deserialize_named(json_object(body)?)
}

fn json_object(body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let body = body.map_err(|r| ApiError::status(r.status(), r.body_text()))?;
    let value: Value =
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}"), None))?;
    if !value.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object", None));
    }
    Ok(value)
}

fn deserialize_named<T: DeserializeOwned>(value: Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        let message = match &param {
            Some(p) => format!("invalid value for '{p}': {}", e.inner()),
            None => e.inner().to_string(),
        };
        ApiError::bad_request(message, param.as_deref())
    })
}

pub(crate) fn check_model(state: &AppState, model: &str) -> Result<(), ApiError> {
    if state.model_names.iter().any(|m| m == model) {
        Ok(())
    } else {
        Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{model}` does not exist; this server serves `{}`", state.model_names[0]),
            param: Some("model".into()),
            code: Some("model_not_found"),
        })
    }
}

/// Sampling fields shared by both endpoints → engine parameters, rejecting what spec-rs does
/// not do rather than ignoring it.
pub(crate) fn sampling_params(
    f: &SamplingFields,
    max_tokens: Option<usize>,
    max_tokens_field: &str,
    logprobs: Option<usize>,
    state: &AppState,
    tools: Option<&ToolRequest>,
) -> Result<SamplingParams, ApiError> {
    let n = f.n.unwrap_or(1);
    // A request's choices run together on one replica.
    let info = state.handle.info();
    let max_choices = info.max_num_seqs / info.num_replicas.max(1);
    if n > max_choices {
        return Err(ApiError::bad_request(
            format!("n must be at most {max_choices} (the server's max_num_seqs per replica), got {n}"),
            Some("n"),
        ));
    }
    if f.stream_options.is_some() && f.stream != Some(true) {
        return Err(ApiError::bad_request(
            "stream_options can only be set when stream is true; drop stream_options or set stream: true",
            Some("stream_options"),
        ));
    }
    if f.use_beam_search == Some(true) {
        return Err(ApiError::bad_request(
            "beam search is not supported; leave use_beam_search unset and sample (n choices, ranked by their \
             logprobs, come closest)",
            Some("use_beam_search"),
        ));
    }
    match f.best_of {
        Some(best_of) if best_of < n => {
            return Err(ApiError::bad_request(
                format!("best_of ({best_of}) must be at least n ({n})"),
                Some("best_of"),
            ));
        }
        Some(best_of) if best_of > n => {
            return Err(ApiError::bad_request(
                format!(
                    "best_of > n (generating {best_of} and returning the {n} most likely) is not supported; \
                     send n={best_of} and rank the choices by their logprobs"
                ),
                Some("best_of"),
            ));
        }
        _ => {}
    }
    let synthetic = state.handle.info().pipeline.as_ref().is_some_and(|p| p.acceptance_rule == "synthetic");
    // The chat endpoint reads tools into `tools`; anywhere else they have no place.
    if tools.is_none() {
        for (field, present) in [
            ("tools", lists_tools(f.tools.as_ref())),
            ("tool_choice", f.tool_choice.as_ref().is_some_and(|c| !tool_choice_calls_nothing(c, f.tools.as_ref()))),
        ] {
            if present {
                return Err(ApiError::bad_request(
                    format!("{field} (tool calling) works with /v1/chat/completions"),
                    Some(field),
                ));
            }
        }
    }
    let mut constraint = structured_outputs(f)?;
    if let Some(calls) = tools.map(ToolRequest::constraint).transpose()?.flatten() {
        if let Some((_, field)) = &constraint {
            return Err(ApiError::bad_request(
                format!(
                    "give one output constraint, not several: tool_choice (which fixes the output to tool calls) \
                     and {field}"
                ),
                Some(field),
            ));
        }
        constraint = Some((calls, "tool_choice"));
    }
    if let Some((_, field)) = &constraint
        && synthetic
    {
        return Err(ApiError::bad_request(
            format!(
                "{field} needs constrained decoding, which synthetic acceptance (a benchmarking mode that ignores \
                 the logits) cannot serve"
            ),
            Some(field),
        ));
    }
    let logit_bias = logit_bias(f.logit_bias.as_ref())?;
    if f.prompt_logprobs.is_some() && f.stream.unwrap_or(false) {
        return Err(ApiError::bad_request(
            "prompt_logprobs are returned with the whole response; send stream=false",
            Some("prompt_logprobs"),
        ));
    }
    if max_tokens == Some(0) {
        return Err(ApiError::bad_request("max_tokens must be at least 1", Some(max_tokens_field)));
    }
    if let Some(t) = f.temperature
        && !(0.0..=2.0).contains(&t)
    {
        return Err(ApiError::bad_request(
            format!("temperature must be between 0 and 2, got {t}"),
            Some("temperature"),
        ));
    }
    let params = SamplingParams {
        temperature: f.temperature.unwrap_or(1.0),
        top_k: f.top_k.unwrap_or(0),
        top_p: f.top_p.unwrap_or(1.0),
        min_p: f.min_p.unwrap_or(0.0),
        seed: f.seed,
        n,
        repetition_penalty: f.repetition_penalty.unwrap_or(1.0),
        frequency_penalty: f.frequency_penalty.unwrap_or(0.0),
        presence_penalty: f.presence_penalty.unwrap_or(0.0),
        max_tokens,
        // As vLLM's server: a max_tokens past the context is the client's error to know of.
        max_tokens_must_fit: true,
        stop: f.stop.clone().map(|s| s.into_vec()).unwrap_or_default(),
        stop_token_ids: f.stop_token_ids.clone().unwrap_or_default(),
        ignore_eos: f.ignore_eos.unwrap_or(false),
        logprobs,
        prompt_logprobs: f.prompt_logprobs,
        min_tokens: f.min_tokens.unwrap_or(0),
        logit_bias,
        allowed_token_ids: f.allowed_token_ids.clone(),
        include_stop_str_in_output: f.include_stop_str_in_output.unwrap_or(false),
        // A parser that reads the model's own call markers needs them in the text.
        skip_special_tokens: f.skip_special_tokens.unwrap_or(!tools.is_some_and(ToolRequest::keeps_special_tokens)),
        truncate_prompt_tokens: f.truncate_prompt_tokens,
        bad_words: f.bad_words.clone().unwrap_or_default(),
        // Tokenized by the engine at admission.
        bad_word_ids: Vec::new(),
        // Where a reasoning parser runs, the model thinks before the constraint holds.
        structured_outputs: constraint.as_ref().map(|(c, _)| StructuredOutputs {
            // gpt-oss's constrained output is the constrained text (no channels to wait for).
            after_reasoning: state.reasoning_parser.is_some_and(|p| !p.reads_harmony()),
            ..c.clone()
        }),
        // Compiled by the engine at admission.
        guide: None,
    };
    params.validate(state.handle.info().vocab_size).map_err(|e| {
        // A constraint's error names the request field it came from.
        let field = match (e.field.as_deref(), &constraint) {
            (Some("structured_outputs"), Some((_, from))) => from,
            (field, _) => field.unwrap_or("temperature"),
        };
        ApiError::bad_request(e.message, Some(field))
    })?;
    Ok(params)
}

/// The request's output constraint and the field it came from: OpenAI's `response_format`
/// (`json_object`, `json_schema`, and vLLM's `structural_tag`), vLLM's `structured_outputs`, or vLLM's older `guided_*`
/// fields. At most one may be given.
fn structured_outputs(f: &SamplingFields) -> Result<Option<(StructuredOutputs, &'static str)>, ApiError> {
    let mut found: Vec<(StructuredOutputs, &'static str)> = Vec::new();
    if let Some(format) = f.response_format.as_ref().filter(|v| !v.is_null()) {
        let bad = |message: &str| ApiError::bad_request(message.to_string(), Some("response_format"));
        match format.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("json_object") => {
                found.push((StructuredOutputs { json_object: Some(true), ..Default::default() }, "response_format"))
            }
            Some("json_schema") => {
                let schema = format
                    .get("json_schema")
                    .and_then(|s| s.get("schema"))
                    .ok_or_else(|| bad("response_format of type json_schema needs json_schema.schema"))?;
                found.push((StructuredOutputs { json: Some(schema.clone()), ..Default::default() }, "response_format"));
            }
            // xgrammar's `format` or vLLM's earlier `structures` and `triggers`, read whole.
            Some("structural_tag") => found.push((
                StructuredOutputs { structural_tag: Some(format.clone()), ..Default::default() },
                "response_format",
            )),
            Some(other) => {
                return Err(bad(&format!(
                    "response_format type '{other}' is not supported; use 'text', 'json_object', 'json_schema' or \
                     'structural_tag'"
                )));
            }
            None => {
                return Err(bad(
                    "response_format needs a type: 'text', 'json_object', 'json_schema' or 'structural_tag'",
                ));
            }
        }
    }
    if let Some(constraint) = &f.structured_outputs {
        found.push((constraint.clone(), "structured_outputs"));
    }
    let guided = [
        ("guided_json", f.guided_json.clone().map(|json| StructuredOutputs { json: Some(json), ..Default::default() })),
        (
            "guided_regex",
            f.guided_regex.clone().map(|regex| StructuredOutputs { regex: Some(regex), ..Default::default() }),
        ),
        (
            "guided_choice",
            f.guided_choice.clone().map(|choice| StructuredOutputs { choice: Some(choice), ..Default::default() }),
        ),
        (
            "guided_grammar",
            f.guided_grammar.clone().map(|grammar| StructuredOutputs { grammar: Some(grammar), ..Default::default() }),
        ),
    ];
    found.extend(guided.into_iter().filter_map(|(field, c)| c.map(|c| (c, field))));
    match found.len() {
        0 | 1 => Ok(found.pop()),
        _ => {
            let fields: Vec<&str> = found.iter().map(|(_, f)| *f).collect();
            Err(ApiError::bad_request(
                format!("give one output constraint, not several: {}", fields.join(", ")),
                Some(fields[1]),
            ))
        }
    }
}

/// Whether a request offers tools: anything but absent, `null` or an empty list.
fn lists_tools(tools: Option<&Value>) -> bool {
    tools.is_some_and(|t| !t.is_null() && t.as_array().is_none_or(|a| !a.is_empty()))
}

/// Whether `tool_choice` asks for no tool call: `"none"`, or `"auto"` with no tools to call
/// (what clients send by default), which plain generation serves as is.
fn tool_choice_calls_nothing(choice: &Value, tools: Option<&Value>) -> bool {
    match choice.as_str() {
        Some("none") => true,
        Some("auto") => !lists_tools(tools),
        _ => choice.is_null(),
    }
}

/// OpenAI's `logit_bias`: an object from token ids (as strings) to biases in [-100, 100]
/// (the range and the ids are checked with the other sampling rules).
fn logit_bias(value: Option<&Value>) -> Result<std::collections::BTreeMap<u32, f32>, ApiError> {
    let bad = |message: String| ApiError::bad_request(message, Some("logit_bias"));
    match value {
        None | Some(Value::Null) => Ok(Default::default()),
        Some(Value::Object(entries)) => entries
            .iter()
            .map(|(key, bias)| {
                let token =
                    key.parse::<u32>().map_err(|_| bad(format!("logit_bias keys are token ids, got '{key}'")))?;
                let bias = bias.as_f64().ok_or_else(|| bad(format!("logit_bias['{key}'] must be a number")))?;
                Ok((token, bias as f32))
            })
            .collect(),
        Some(_) => Err(bad("logit_bias must be an object mapping token ids to biases".into())),
    }
}

/// The penalty field a request set (for errors about penalties).
pub(crate) fn penalty_field(f: &SamplingFields) -> &'static str {
    if f.frequency_penalty.is_some_and(|v| v != 0.0) {
        "frequency_penalty"
    } else if f.presence_penalty.is_some_and(|v| v != 0.0) {
        "presence_penalty"
    } else {
        "repetition_penalty"
    }
}

/// Counts `n` sequences in flight, or refuses them: a 429 while the server is full, a 400
/// naming `param` for a request larger than the server ever holds (retrying cannot help).
pub(crate) fn admit(state: &Arc<AppState>, n: usize, param: &str) -> Result<Vec<InFlight>, ApiError> {
    let capacity = state.max_pending + state.handle.info().max_num_seqs;
    if n > capacity {
        return Err(ApiError::bad_request(
            format!(
                "the request runs {n} sequences (prompts x n), more than this server holds at once ({capacity}: \
                 --max-num-seqs plus --max-pending); split it into smaller requests"
            ),
            Some(param),
        ));
    }
    let now = state.in_flight.fetch_add(n, Ordering::Relaxed) + n;
    let guards: Vec<InFlight> = (0..n).map(|_| InFlight(state.clone())).collect();
    if now > capacity {
        return Err(ApiError::status(StatusCode::TOO_MANY_REQUESTS, "the server is at capacity; retry shortly"));
    }
    Ok(guards)
}

pub(crate) fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

pub(crate) fn request_id(prefix: &str) -> String {
    format!("{prefix}-{}", unique_suffix())
}

/// Unique within the server's life (the time, then a counter).
pub(crate) fn unique_suffix() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("{:x}{:06x}", now_secs(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// Collects a request's stream into one output per choice (non-streaming responses).
pub(crate) async fn collect(mut stream: OutputStream) -> Result<Vec<FinalOutput>, ApiError> {
    let mut outs = Vec::new();
    while let Some(o) = stream.recv().await {
        let done = o.is_finished();
        outs.push(o);
        if done {
            break;
        }
    }
    if !outs.last().is_some_and(RequestOutput::is_finished) {
        return Err(ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "the engine stopped"));
    }
    let choices = FinalOutput::collect_choices(outs);
    if let Some(failed) = choices.iter().find(|c| c.finish_reason == FinishReason::Error) {
        return Err(match &failed.error {
            Some(failure) if failure.caused_by_request => ApiError::bad_request(failure.message.clone(), None),
            Some(failure) => ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, failure.message.clone()),
            None => ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "generation failed"),
        });
    }
    Ok(choices)
}

/// Token counts and speculative statistics summed over a response's choices (each request's
/// prompt counted once, however many choices it has).
#[derive(Default)]
struct UsageTotals {
    prompt_tokens: usize,
    /// Prompt tokens the prefix cache covered, as choice 0 of each prompt saw it (the choices
    /// after it adopt what choice 0 computed: counting them would count the prompt again).
    cached_tokens: usize,
    completion_tokens: usize,
    spec: specrs_engine::RequestMetrics,
}

impl UsageTotals {
    /// Adds choice `index` of its prompt, with its final metrics.
    fn add_choice(&mut self, index: usize, completion_tokens: usize, m: &specrs_engine::RequestMetrics) {
        self.completion_tokens += completion_tokens;
        if index == 0 {
            self.cached_tokens += m.num_cached_tokens;
        }
        merge_metrics(&mut self.spec, m);
    }

    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens_details: Some(PromptTokensDetails { cached_tokens: self.cached_tokens }),
            ..usage_of(self.prompt_tokens, self.completion_tokens, Some(&self.spec))
        }
    }
}

pub(crate) fn usage_of(prompt: usize, completion: usize, m: Option<&specrs_engine::RequestMetrics>) -> Usage {
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        total_tokens: prompt + completion,
        prompt_tokens_details: None,
        spec_decode: m.filter(|m| m.num_drafts > 0).map(|m| SpecDecodeUsage {
            num_drafts: m.num_drafts,
            num_draft_tokens: m.num_draft_tokens,
            num_accepted_tokens: m.num_accepted_tokens,
            acceptance_length: m.acceptance_length,
            accepted_per_position: m.accepted_per_position.clone(),
        }),
    }
}

fn finish_str(r: Option<FinishReason>) -> Value {
    match r {
        Some(FinishReason::Stop) => json!("stop"),
        Some(FinishReason::Length) => json!("length"),
        Some(FinishReason::Abort) => json!("abort"),
        Some(FinishReason::Error) => json!("error"),
        None => Value::Null,
    }
}

/// vLLM's `stop_reason`: the stop token id or stop string that ended a choice, else null.
fn stop_reason_json(reason: Option<&StopReason>) -> Value {
    reason.map_or(Value::Null, |r| serde_json::to_value(r).unwrap_or(Value::Null))
}

fn token_text(state: &AppState, id: u32) -> String {
    state.handle.tokenizer().decode(&[id], false).unwrap_or_default()
}

pub(crate) fn chat_logprobs(state: &AppState, lps: &[TokenLogprob]) -> Value {
    // `bytes` are the token's own (OpenAI's): a token holding part of a character decodes to
    // U+FFFD, but its bytes joined with its neighbours' spell the character.
    let speller = state.handle.tokenizer().speller();
    let entry = |id: u32, lp: f32| {
        let t = token_text(state, id);
        let bytes = speller.bytes_of(id).unwrap_or_else(|| t.as_bytes().to_vec());
        json!({"token": t, "logprob": lp, "bytes": bytes})
    };
    let content: Vec<Value> = lps
        .iter()
        .map(|l| {
            let mut e = entry(l.token, l.logprob);
            e["top_logprobs"] = Value::Array(l.top.iter().map(|&(id, lp)| entry(id, lp)).collect());
            e
        })
        .collect();
    json!({"content": content})
}

/// OpenAI's completion `logprobs` for tokens from character offset `*offset`, which moves past
/// them (a stream's chunks continue where the last left off, whatever text was held back); an
/// entry without a logprob (an echoed prompt's first token, which nothing predicts) has nulls.
/// `top_logprobs` holds the chosen token too, as OpenAI's (up to `logprobs + 1` entries).
fn completion_logprobs<'a>(
    state: &AppState,
    entries: impl IntoIterator<Item = (u32, Option<&'a TokenLogprob>)>,
    offset: &mut usize,
) -> Value {
    let (mut tokens, mut token_logprobs, mut top, mut text_offset) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (token, lp) in entries {
        let t = token_text(state, token);
        text_offset.push(*offset);
        *offset += t.chars().count();
        token_logprobs.push(lp.map_or(Value::Null, |l| json!(l.logprob)));
        top.push(lp.map_or(Value::Null, |l| {
            let mut by_text: serde_json::Map<String, Value> =
                l.top.iter().map(|&(id, lp)| (token_text(state, id), json!(lp))).collect();
            by_text.entry(t.clone()).or_insert(json!(l.logprob));
            Value::Object(by_text)
        }));
        tokens.push(t);
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": text_offset})
}

/// vLLM's `prompt_logprobs`: per prompt token `null` (the first) or an object from token ids
/// (the prompt's token and the top ones) to `{logprob, rank, decoded_token}`.
fn vllm_prompt_logprobs(state: &AppState, lps: &[Option<TokenLogprob>]) -> Value {
    let entry = |id: u32, logprob: f32, rank: usize| json!({"logprob": logprob, "rank": rank, "decoded_token": token_text(state, id)});
    lps.iter()
        .map(|lp| {
            lp.as_ref().map_or(Value::Null, |l| {
                let mut position = serde_json::Map::new();
                position.insert(l.token.to_string(), entry(l.token, l.logprob, l.rank));
                for (i, &(id, logprob)) in l.top.iter().enumerate() {
                    position.entry(id.to_string()).or_insert_with(|| entry(id, logprob, i + 1));
                }
                Value::Object(position)
            })
        })
        .collect()
}

fn own_logprobs(lps: &[TokenLogprob]) -> impl Iterator<Item = (u32, Option<&TokenLogprob>)> {
    lps.iter().map(|l| (l.token, Some(l)))
}

fn sse_done() -> Event {
    Event::default().data("[DONE]")
}

fn sse_json(v: &Value) -> Event {
    Event::default().data(v.to_string())
}

/// OpenAI's error type for a failed request: the client's doing, or the server's.
pub(crate) fn failure_type(failure: &RequestFailure) -> &'static str {
    if failure.caused_by_request { "invalid_request_error" } else { "server_error" }
}

/// The event a stream sends in place of a failed choice's last chunk (the HTTP status went
/// out with the first): OpenAI's error object, typed by whose failure it was.
fn stream_error(failure: Option<&RequestFailure>) -> Value {
    let (message, kind) = failure.map_or(("generation failed", "server_error"), |f| (&f.message, failure_type(f)));
    json!({"error": {"message": message, "type": kind}})
}

pub(crate) fn chat_messages(messages: &[ChatMessageIn]) -> Result<Vec<ChatMessage>, ApiError> {
    let messages: Vec<ChatMessage> = messages
        .iter()
        .map(|m| ChatMessage {
            role: m.role.clone(),
            content: m.content.clone().unwrap_or(Value::Null),
            tool_calls: m.tool_calls.clone(),
            tool_call_id: m.tool_call_id.clone(),
            name: m.name.clone(),
        })
        .collect();
    text_messages(&messages).map_err(|e| ApiError::bad_request(e.to_string(), Some(&e.param())))
}

async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: ChatCompletionRequest = parse_body(body)?;
    check_model(&state, &req.model)?;
    let messages = chat_messages(&req.messages)?;
    let ending =
        ChatEnding::from_flags(req.add_generation_prompt.unwrap_or(true), req.continue_final_message.unwrap_or(false))
            .map_err(|message| ApiError::bad_request(message, Some("continue_final_message")))?;
    let top = match (req.logprobs.unwrap_or(false), req.top_logprobs) {
        (false, Some(n)) if n > 0 => {
            return Err(ApiError::bad_request("top_logprobs needs logprobs=true", Some("top_logprobs")));
        }
        (true, n) if n.unwrap_or(0) > 20 => {
            return Err(ApiError::bad_request("top_logprobs must be at most 20", Some("top_logprobs")));
        }
        (true, n) => Some(n.unwrap_or(0)),
        (false, _) => None,
    };
    let (max_tokens, max_tokens_field) = match (req.max_completion_tokens, req.max_tokens) {
        (Some(m), _) => (Some(m), "max_completion_tokens"),
        (None, m) => (m, "max_tokens"),
    };
    for (field, given) in [("functions", &req.functions), ("function_call", &req.function_call)] {
        if given.as_ref().is_some_and(|v| !v.is_null()) {
            return Err(ApiError::bad_request(
                format!("{field} is OpenAI's deprecated function calling; send tools and tool_choice instead"),
                Some(field),
            ));
        }
    }
    let tools = ToolRequest::parse(
        req.sampling.tools.as_ref(),
        req.sampling.tool_choice.as_ref(),
        req.parallel_tool_calls,
        state.auto_tool_parser,
    )?;
    let mut params = sampling_params(&req.sampling, max_tokens, max_tokens_field, top, &state, tools.as_ref())?;
    // gpt-oss's harmony markers and Magistral's `[THINK]` / `[/THINK]` are special tokens the
    // reasoning reader needs in the text.
    if req.sampling.skip_special_tokens.is_none()
        && state.reasoning_parser.is_some_and(ReasoningParser::keeps_special_tokens)
    {
        params.skip_special_tokens = false;
    }
    let n = params.n;
    check_template_fields(&state, &req)?;
    let constrained = params.structured_outputs.is_some();
    let include_reasoning = req.include_reasoning.unwrap_or(true);
    let conversation = Conversation {
        messages,
        ending,
        tools: tools
            .as_ref()
            .filter(|t| !(state.exclude_tools_when_tool_choice_none && t.choice == ToolChoice::None))
            .map(|t| t.tools.clone()),
        chat_template: req.chat_template.clone().or_else(|| state.chat_template.clone()),
        chat_template_kwargs: chat_template_kwargs(&req)?,
    };
    let reasoning = reasoning_for(&state, &conversation, constrained);
    let reader = || {
        let calls = tools.as_ref().map_or_else(CallStream::text, ToolRequest::call_stream);
        MessageReader::new(reasoning, include_reasoning, calls)
    };
    let guards = admit(&state, n, "n")?;
    let mut request = GenerationRequest::new(Prompt::Chat(conversation), params);
    request.trace = req.sampling.trace.unwrap_or(false);
    let penalty = penalty_field(&req.sampling);
    let (_, stream) = state.handle.submit_async(request).await.map_err(|e| {
        ApiError::from_engine(e, "messages").for_penalty(penalty).for_max_tokens_field(max_tokens_field)
    })?;
    let id = request_id("chatcmpl");
    let created = now_secs();
    let model = req.model.clone();
    if req.sampling.stream.unwrap_or(false) {
        let usage = StreamUsage::of(req.sampling.stream_options.as_ref());
        let spec = ChatStreamSpec {
            id,
            created,
            model,
            usage,
            logprobs: top.is_some(),
            readers: (0..n).map(|_| reader()).collect(),
            reports_calls: tools.as_ref().is_some_and(ToolRequest::reports_tool_calls),
        };
        let events = chat_stream(state.clone(), stream, spec, guards);
        return Ok(Sse::new(events).keep_alive(KeepAlive::default()).into_response());
    }
    let outs = collect(stream).await?;
    drop(guards);
    let mut totals = UsageTotals { prompt_tokens: outs[0].num_prompt_tokens, ..Default::default() };
    let choices: Vec<Value> = outs
        .iter()
        .map(|out| {
            totals.add_choice(out.index, out.token_ids.len(), &out.metrics);
            let message = reader().read_all(&out.text);
            let called = tools.as_ref().is_some_and(ToolRequest::reports_tool_calls) && !message.tool_calls.is_empty();
            let mut choice = json!({
                "index": out.index,
                "message": message.to_json(),
                "logprobs": if top.is_some() { chat_logprobs(&state, &out.logprobs) } else { Value::Null },
                "finish_reason": chat_finish(Some(out.finish_reason), called),
                "stop_reason": stop_reason_json(out.stop_reason.as_ref()),
            });
            if !out.trace.is_empty() {
                choice["trace"] = serde_json::to_value(&out.trace).unwrap_or(Value::Null);
            }
            choice
        })
        .collect();
    let mut body = json!({
        "id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": choices, "usage": totals.usage(),
    });
    if req.sampling.prompt_logprobs.is_some() {
        body["prompt_logprobs"] = vllm_prompt_logprobs(&state, &outs[0].prompt_logprobs);
    }
    Ok(axum::Json(body).into_response())
}

/// The reasoning parser a chat request's output is read with. GLM's rule depends on whether
/// the template opened the thought (`for_prompt`; a prompt that does not render fails at
/// submission with its own error), and a constrained output is split only where the rule that
/// holds splits it.
pub(crate) fn reasoning_for(
    state: &AppState,
    conversation: &Conversation,
    constrained: bool,
) -> Option<ReasoningParser> {
    let thinks_first = state.handle.tokenizer().thinking_token_ids().is_some();
    state
        .reasoning_parser
        .map(|p| match p.reads_prompt() {
            true => p.for_prompt(&state.handle.tokenizer().render_conversation(conversation).unwrap_or_default()),
            false => p,
        })
        .filter(|p| !constrained || p.splits_constrained_output(thinks_first))
}

/// A request's own chat template is one the server was told to trust, and compiles.
pub(crate) fn check_request_template(state: &AppState, template: Option<&String>) -> Result<(), ApiError> {
    let Some(source) = template else { return Ok(()) };
    if !state.trust_request_chat_template {
        return Err(ApiError::bad_request(
            "this server does not render chat templates sent with requests (a template is code it would run); \
             start it with --trust-request-chat-template to allow them, or with --chat-template to serve one",
            Some("chat_template"),
        ));
    }
    ChatTemplate::new(source.clone()).map_err(|e| ApiError::bad_request(e.to_string(), Some("chat_template")))?;
    Ok(())
}

/// A request's own chat template is trusted and compiles, and its variables leave the
/// renderer's alone (so either mistake is a 400 naming its field, not an error about the
/// messages).
fn check_template_fields(state: &AppState, req: &ChatCompletionRequest) -> Result<(), ApiError> {
    check_request_template(state, req.chat_template.as_ref())?;
    let reserved =
        req.chat_template_kwargs.iter().flat_map(|k| k.keys()).find(|k| RESERVED_TEMPLATE_VARS.contains(&k.as_str()));
    if let Some(key) = reserved {
        return Err(ApiError::bad_request(
            format!("chat_template_kwargs may not set '{key}': the request's own fields set it"),
            Some("chat_template_kwargs"),
        ));
    }
    Ok(())
}

/// The request's template variables, with its `reasoning_effort` as the template's (a value
/// `chat_template_kwargs` sets itself wins).
fn chat_template_kwargs(req: &ChatCompletionRequest) -> Result<serde_json::Map<String, Value>, ApiError> {
    let mut kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
    if let Some(effort) = crate::responses::reasoning_effort(req.reasoning_effort.as_ref(), "reasoning_effort")? {
        kwargs.entry("reasoning_effort").or_insert_with(|| Value::from(effort));
    }
    Ok(kwargs)
}

/// What a chat stream's chunks carry besides the output.
struct ChatStreamSpec {
    id: String,
    created: u64,
    model: String,
    usage: StreamUsage,
    logprobs: bool,
    /// One per choice: its text into reasoning, content and tool-call deltas.
    readers: Vec<MessageReader>,
    /// Whether a choice that called tools finishes with `tool_calls`.
    reports_calls: bool,
}

/// `finish_reason` for a chat choice: `tool_calls` when the model stopped after calling tools
/// the request let it choose.
fn chat_finish(reason: Option<FinishReason>, called_tools: bool) -> Value {
    match reason {
        Some(FinishReason::Stop) if called_tools => json!("tool_calls"),
        other => finish_str(other),
    }
}

fn chat_stream(
    state: Arc<AppState>,
    stream: OutputStream,
    spec: ChatStreamSpec,
    guards: Vec<InFlight>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let ChatStreamSpec { id, created, model, usage, logprobs, mut readers, reports_calls } = spec;
    let n = readers.len();
    let chunk = move |index: usize, delta: Value, finish: Value, lps: Value| {
        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
               "choices": [{"index": index, "delta": delta, "logprobs": lps, "finish_reason": finish}]})
    };
    // Tokens generated so far over every choice (`continuous_usage_stats`).
    let mut generated = 0;
    // Every choice opens with the assistant role, as OpenAI streams them.
    let openings: Vec<Value> = (0..n)
        .map(|index| chunk(index, json!({"role": "assistant", "content": ""}), Value::Null, Value::Null))
        .collect();
    let usage_chunk = openings[0].clone();
    let mut totals = UsageTotals::default();
    let mut called = vec![false; n];
    let body = output_events(stream).map(move |o: RequestOutput| {
        let mut lps = if logprobs && !o.logprobs.is_empty() { chat_logprobs(&state, &o.logprobs) } else { Value::Null };
        generated += o.token_ids.len();
        let with_usage = |mut c: Value| {
            if usage.every_chunk {
                c["usage"] = running_usage(o.num_prompt_tokens, generated);
            }
            c
        };
        let reader = &mut readers[o.index];
        let mut deltas = reader.push(&o.text);
        if o.finish_reason.is_some() {
            deltas.extend(reader.finish());
        }
        called[o.index] |= deltas.iter().any(|d| matches!(d, MessageDelta::CallStart { .. }));
        let mut events = vec![];
        for delta in &deltas {
            // The tokens' logprobs ride the first chunk their text reaches.
            events.push(sse_json(&with_usage(chunk(o.index, delta.to_json(), Value::Null, std::mem::take(&mut lps)))));
        }
        if !lps.is_null() {
            events.push(sse_json(&with_usage(chunk(o.index, json!({}), Value::Null, lps))));
        }
        if let Some(reason) = o.finish_reason {
            if reason == FinishReason::Error {
                events.push(sse_json(&stream_error(o.error.as_ref())));
            } else {
                let finish = chat_finish(Some(reason), reports_calls && called[o.index]);
                let mut last = chunk(o.index, json!({}), finish, Value::Null);
                last["choices"][0]["stop_reason"] = stop_reason_json(o.stop_reason.as_ref());
                events.push(sse_json(&with_usage(last)));
            }
            totals.prompt_tokens = o.num_prompt_tokens;
            if let Some(m) = &o.metrics {
                totals.add_choice(o.index, m.num_generated_tokens, m);
            }
        }
        if o.is_finished() {
            if usage.final_chunk {
                let mut u = usage_chunk.clone();
                u["choices"] = json!([]);
                u["usage"] = serde_json::to_value(totals.usage()).unwrap_or(Value::Null);
                events.push(sse_json(&u));
            }
            events.push(sse_done());
        }
        stream::iter(events.into_iter().map(Ok))
    });
    let _guards = guards;
    stream::iter(openings.into_iter().map(|c| Ok(sse_json(&c)))).chain(body.flatten()).map(move |e| {
        let _ = &_guards;
        e
    })
}

/// The outputs of a request until (and including) the final one.
pub(crate) fn output_events(stream: OutputStream) -> impl Stream<Item = RequestOutput> {
    stream::unfold((stream, false), |(mut s, done)| async move {
        if done {
            return None;
        }
        let o = s.recv().await?;
        let finished = o.is_finished();
        Some((o, (s, finished)))
    })
}

fn completion_prompts(p: &PromptSpec) -> Result<Vec<Prompt>, ApiError> {
    let prompts = match p {
        PromptSpec::Text(t) => vec![Prompt::Text(t.clone())],
        PromptSpec::Texts(ts) => ts.iter().map(|t| Prompt::Text(t.clone())).collect(),
        PromptSpec::Tokens(ids) => vec![Prompt::Tokens(ids.clone())],
        PromptSpec::TokenLists(ls) => ls.iter().map(|ids| Prompt::Tokens(ids.clone())).collect(),
    };
    if prompts.is_empty() {
        return Err(ApiError::bad_request("prompt must not be empty", Some("prompt")));
    }
    Ok(prompts)
}

async fn completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CompletionRequest = parse_body(body)?;
    check_model(&state, &req.model)?;
    let echo = req.echo.unwrap_or(false);
    if req.suffix.is_some() {
        return Err(ApiError::bad_request("suffix is not supported", Some("suffix")));
    }
    if req.logprobs.is_some_and(|n| n > 20) {
        return Err(ApiError::bad_request("logprobs must be at most 20", Some("logprobs")));
    }
    let prompts = completion_prompts(&req.prompt)?;
    // OpenAI's default for completions.
    let mut params =
        sampling_params(&req.sampling, Some(req.max_tokens.unwrap_or(16)), "max_tokens", req.logprobs, &state, None)?;
    // Echo repeats each prompt before its completion, and with logprobs scores the prompt's
    // tokens too.
    let echoed: Vec<Option<String>> =
        prompts.iter().map(|p| echo.then(|| echoed_text(&state, p)).transpose()).collect::<Result<_, _>>()?;
    if echo {
        params.prompt_logprobs = params.prompt_logprobs.max(req.logprobs);
    }
    let n = params.n;
    let guards = admit(&state, prompts.len() * n, "prompt")?;
    let mut streams = Vec::with_capacity(prompts.len());
    for prompt in prompts {
        let mut request = GenerationRequest::new(prompt, params.clone());
        request.trace = req.sampling.trace.unwrap_or(false);
        let (_, s) = state
            .handle
            .submit_async(request)
            .await
            .map_err(|e| ApiError::from_engine(e, "prompt").for_penalty(penalty_field(&req.sampling)))?;
        streams.push(s);
    }
    let id = request_id("cmpl");
    let created = now_secs();
    let model = req.model.clone();
    let logprobs = req.logprobs.is_some();
    if req.sampling.stream.unwrap_or(false) {
        let usage = StreamUsage::of(req.sampling.stream_options.as_ref());
        let echo = StreamEcho::new(echoed, n, logprobs);
        return Ok(Sse::new(completion_stream(state.clone(), streams, id, created, model, n, usage, echo, guards))
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    let mut choices = Vec::new();
    let mut totals = UsageTotals::default();
    for (prompt_index, s) in streams.into_iter().enumerate() {
        let outs = collect(s).await?;
        totals.prompt_tokens += outs[0].num_prompt_tokens;
        // Only choice 0 scores the prompt its choices share.
        let (prompt_ids, prompt_logprobs) = (&outs[0].prompt_token_ids, &outs[0].prompt_logprobs);
        let requested_prompt_logprobs =
            req.sampling.prompt_logprobs.is_some().then(|| vllm_prompt_logprobs(&state, prompt_logprobs));
        for out in &outs {
            totals.add_choice(out.index, out.token_ids.len(), &out.metrics);
            let (text, choice_logprobs) = match &echoed[prompt_index] {
                None => {
                    let lps = logprobs.then(|| completion_logprobs(&state, own_logprobs(&out.logprobs), &mut 0));
                    (out.text.clone(), lps)
                }
                Some(prompt_text) => {
                    let scored = prompt_logprobs.iter().map(Option::as_ref).chain(std::iter::repeat(None));
                    let entries = prompt_ids.iter().copied().zip(scored).chain(own_logprobs(&out.logprobs));
                    (
                        format!("{prompt_text}{}", out.text),
                        logprobs.then(|| completion_logprobs(&state, entries, &mut 0)),
                    )
                }
            };
            // vLLM's numbering: prompt i's choices are i·n .. i·n + n - 1.
            let mut choice = json!({
                "index": prompt_index * n + out.index, "text": text,
                "logprobs": choice_logprobs.unwrap_or(Value::Null),
                "finish_reason": finish_str(Some(out.finish_reason)),
                "stop_reason": stop_reason_json(out.stop_reason.as_ref()),
            });
            if let Some(lps) = &requested_prompt_logprobs {
                choice["prompt_logprobs"] = lps.clone();
            }
            if !out.trace.is_empty() {
                choice["trace"] = serde_json::to_value(&out.trace).unwrap_or(Value::Null);
            }
            choices.push(choice);
        }
    }
    drop(guards);
    Ok(axum::Json(json!({
        "id": id, "object": "text_completion", "created": created, "model": model,
        "choices": choices, "usage": totals.usage(),
    }))
    .into_response())
}

/// The text `echo` repeats: a text prompt as sent, a token prompt decoded (its token ids come
/// back with the output, as the engine read them).
fn echoed_text(state: &AppState, prompt: &Prompt) -> Result<String, ApiError> {
    match prompt {
        Prompt::Text(text) => Ok(text.clone()),
        Prompt::Tokens(ids) => state
            .handle
            .tokenizer()
            .decode(ids, false)
            .map_err(|e| ApiError::bad_request(e.to_string(), Some("prompt"))),
        Prompt::Chat(_) => Err(ApiError::bad_request("echo needs a completion prompt", Some("echo"))),
    }
}

fn merge_metrics(total: &mut specrs_engine::RequestMetrics, m: &specrs_engine::RequestMetrics) {
    total.num_drafts += m.num_drafts;
    total.num_draft_tokens += m.num_draft_tokens;
    total.num_accepted_tokens += m.num_accepted_tokens;
    if total.accepted_per_position.len() < m.accepted_per_position.len() {
        total.accepted_per_position.resize(m.accepted_per_position.len(), 0);
    }
    for (t, v) in total.accepted_per_position.iter_mut().zip(&m.accepted_per_position) {
        *t += v;
    }
    total.acceptance_length =
        if total.num_drafts > 0 { 1.0 + total.num_accepted_tokens as f64 / total.num_drafts as f64 } else { 1.0 };
}

#[allow(clippy::too_many_arguments)]
fn completion_stream(
    state: Arc<AppState>,
    streams: Vec<OutputStream>,
    id: String,
    created: u64,
    model: String,
    n: usize,
    usage: StreamUsage,
    mut echo: StreamEcho,
    guards: Vec<InFlight>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let num_prompts = streams.len();
    let indexed =
        stream::select_all(streams.into_iter().enumerate().map(|(i, s)| output_events(s).map(move |o| (i, o)).boxed()));
    let chunk = {
        let (id, model) = (id.clone(), model.clone());
        move |index: usize, text: String, finish: Option<FinishReason>, lps: Value| {
            json!({"id": id, "object": "text_completion", "created": created, "model": model,
                   "choices": [{"index": index, "text": text, "logprobs": lps, "finish_reason": finish_str(finish)}]})
        }
    };
    // Character offsets of each choice's next logprob entry; vLLM's numbering: prompt p's choices are p·n .. p·n + n - 1.
    let mut offsets = vec![0usize; num_prompts * n];
    let mut remaining = num_prompts;
    let mut totals = UsageTotals::default();
    // The usage so far (`continuous_usage_stats`): each prompt's tokens once it has been
    // heard from, and every token generated for any of them.
    let mut prompt_tokens_seen: Vec<Option<usize>> = vec![None; num_prompts];
    let mut generated = 0;
    let _guards = guards;
    let logprobs = echo.logprobs;
    indexed
        .map(move |(prompt_index, o)| {
            let _ = &_guards;
            let mut events = Vec::new();
            for o in echo.ready(prompt_index, o) {
                let index = prompt_index * n + o.index;
                prompt_tokens_seen[prompt_index] = Some(o.num_prompt_tokens);
                generated += o.token_ids.len();
                let so_far = running_usage(prompt_tokens_seen.iter().flatten().sum(), generated);
                let chunk = |index, text, finish, lps| {
                    let mut c = chunk(index, text, finish, lps);
                    if usage.every_chunk {
                        c["usage"] = so_far.clone();
                    }
                    c
                };
                let (prompt_text, prompt_scores) = echo.prefix(prompt_index, index);
                let lps = if logprobs && (!o.logprobs.is_empty() || !prompt_scores.is_empty()) {
                    let prompt_entries = prompt_scores.iter().map(|(t, l)| (*t, l.as_ref()));
                    completion_logprobs(&state, prompt_entries.chain(own_logprobs(&o.logprobs)), &mut offsets[index])
                } else {
                    Value::Null
                };
                let text = format!("{prompt_text}{}", o.text);
                if !text.is_empty() || !lps.is_null() {
                    events.push(sse_json(&chunk(index, text, None, lps)));
                }
                if let Some(reason) = o.finish_reason {
                    if reason == FinishReason::Error {
                        events.push(sse_json(&stream_error(o.error.as_ref())));
                    } else {
                        let mut last = chunk(index, String::new(), Some(reason), Value::Null);
                        last["choices"][0]["stop_reason"] = stop_reason_json(o.stop_reason.as_ref());
                        events.push(sse_json(&last));
                    }
                    if let Some(m) = &o.metrics {
                        totals.add_choice(o.index, m.num_generated_tokens, m);
                    }
                }
                if o.is_finished() {
                    remaining -= 1;
                    totals.prompt_tokens += o.num_prompt_tokens;
                    if remaining == 0 {
                        if usage.final_chunk {
                            events.push(sse_json(
                                &json!({"id": id, "object": "text_completion", "created": created, "model": model,
                                "choices": [], "usage": totals.usage()}),
                            ));
                        }
                        events.push(sse_done());
                    }
                }
            }
            stream::iter(events.into_iter().map(Ok))
        })
        .flatten()
}

/// A prompt's tokens with their logprobs (none for the first, which nothing predicts).
type ScoredPrompt = Vec<(u32, Option<TokenLogprob>)>;

/// `echo` in a stream, as vLLM sends it: each choice's first chunk starts with its prompt and,
/// with logprobs, the prompt's tokens scored. Only choice 0 scores a prompt (its choices share
/// it), so another choice's outputs wait until choice 0's first output has brought the scores.
struct StreamEcho {
    /// Per prompt: the text echoed (none without `echo`).
    prompts: Vec<Option<String>>,
    logprobs: bool,
    /// Per prompt: its tokens and their logprobs, once choice 0 has brought them.
    scores: Vec<Option<ScoredPrompt>>,
    /// Per choice: its prompt is sent.
    echoed: Vec<bool>,
    /// Per prompt: outputs of other choices that came before the scores.
    waiting: Vec<Vec<RequestOutput>>,
}

impl StreamEcho {
    fn new(prompts: Vec<Option<String>>, n: usize, logprobs: bool) -> Self {
        let p = prompts.len();
        Self { prompts, logprobs, scores: vec![None; p], echoed: vec![false; p * n], waiting: vec![Vec::new(); p] }
    }

    /// The outputs to send, in order, now that prompt `prompt`'s output `o` came.
    fn ready(&mut self, prompt: usize, o: RequestOutput) -> Vec<RequestOutput> {
        if self.prompts[prompt].is_none() || !self.logprobs {
            return vec![o];
        }
        if o.index == 0 && self.scores[prompt].is_none() {
            let scored = o.prompt_logprobs.iter().cloned().chain(std::iter::repeat(None));
            self.scores[prompt] = Some(o.prompt_token_ids.iter().copied().zip(scored).collect());
            let mut ready = vec![o];
            ready.append(&mut self.waiting[prompt]);
            return ready;
        }
        if self.scores[prompt].is_none() {
            self.waiting[prompt].push(o);
            // The request's last output: nothing more will come (choice 0 failed before its
            // first), so the waiting choices go out with their prompts unscored.
            if self.waiting[prompt].last().is_some_and(RequestOutput::is_finished) {
                return std::mem::take(&mut self.waiting[prompt]);
            }
            return Vec::new();
        }
        vec![o]
    }

    /// What goes before choice `choice`'s next text: its prompt and the prompt's scored tokens
    /// the first time, nothing after.
    fn prefix(&mut self, prompt: usize, choice: usize) -> (&str, &[(u32, Option<TokenLogprob>)]) {
        let Some(text) = &self.prompts[prompt] else { return ("", &[]) };
        if std::mem::replace(&mut self.echoed[choice], true) {
            return ("", &[]);
        }
        (text, self.scores[prompt].as_deref().unwrap_or_default())
    }
}

/// Serves until SIGINT/SIGTERM, then stops accepting, gives in-flight requests `grace` to
/// finish, cancels the rest and returns.
pub async fn serve(listener: tokio::net::TcpListener, state: Arc<AppState>, grace: Duration) -> std::io::Result<()> {
    let app = router(state.clone());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown_signal().await;
        let _ = tx.send(());
    });
    let server = tokio::spawn(async move { server.await });
    // After the signal, in-flight responses get `grace`; then the engine cancels the rest,
    // which ends their streams and lets the server finish.
    let _ = rx.await;
    tracing::info!("shutting down: finishing in-flight requests for up to {:.0}s", grace.as_secs_f64());
    let handle = state.handle.clone();
    let deadline = tokio::time::Instant::now() + grace;
    while state.in_flight.load(Ordering::Relaxed) > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    handle.abort_all();
    match tokio::time::timeout(Duration::from_secs(5), server).await {
        Ok(Ok(r)) => r,
        _ => Ok(()),
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(extra: Value) -> ChatCompletionRequest {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn reasoning_effort_reaches_the_template_unless_its_kwargs_set_it() {
        let kwargs = chat_template_kwargs(&chat(json!({"reasoning_effort": "high"}))).unwrap();
        assert_eq!(kwargs.get("reasoning_effort"), Some(&json!("high")));
        let both = json!({"reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low"}});
        assert_eq!(chat_template_kwargs(&chat(both)).unwrap().get("reasoning_effort"), Some(&json!("low")));
        assert!(chat_template_kwargs(&chat(json!({}))).unwrap().is_empty());
        let e = chat_template_kwargs(&chat(json!({"reasoning_effort": "max"}))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("reasoning_effort"));
        assert!(e.message.contains("low, medium, high"), "{}", e.message);
    }
}
