//! vLLM's `POST /tokenize` and `POST /detokenize`: the served model's tokenizer (and chat
//! template) over HTTP, so clients can count and inspect tokens without loading it.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};
use specrs_engine::{ChatEnding, Conversation};

use crate::error::ApiError;
use crate::openai::ChatMessageIn;
use crate::server::{AppState, chat_messages, check_model, check_request_template, parse_plain_body};

/// A text prompt, or a conversation rendered with the chat template (the request's, the
/// server's or the model's), its tools and template variables, as the chat endpoint renders
/// it. Unknown fields are ignored, as on the completion endpoints.
#[derive(Debug, Deserialize)]
struct TokenizeRequest {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<ChatMessageIn>>,
    /// Default: true for a prompt, false for messages (the template writes its own).
    add_special_tokens: Option<bool>,
    #[serde(default = "yes")]
    add_generation_prompt: bool,
    #[serde(default)]
    continue_final_message: bool,
    tools: Option<Vec<Value>>,
    chat_template: Option<String>,
    chat_template_kwargs: Option<Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<u32>,
}

fn yes() -> bool {
    true
}

pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: TokenizeRequest = parse_plain_body(body)?;
    if let Some(model) = &req.model {
        check_model(&state, model)?;
    }
    let tokenizer = state.handle.tokenizer();
    let engine_error = |e: specrs_engine::EngineError| ApiError::bad_request(e.to_string(), None);
    let tokens = match (&req.prompt, &req.messages) {
        (Some(prompt), None) => {
            tokenizer.encode(prompt, req.add_special_tokens.unwrap_or(true)).map_err(engine_error)?
        }
        (None, Some(messages)) => {
            check_request_template(&state, req.chat_template.as_ref())?;
            let ending = ChatEnding::from_flags(req.add_generation_prompt, req.continue_final_message)
                .map_err(|message| ApiError::bad_request(message, Some("continue_final_message")))?;
            let conversation = Conversation {
                messages: chat_messages(messages)?,
                ending,
                tools: req.tools.clone(),
                chat_template: req.chat_template.clone().or_else(|| state.chat_template.clone()),
                chat_template_kwargs: req.chat_template_kwargs.clone().unwrap_or_default(),
            };
            let text = tokenizer
                .render_conversation(&conversation)
                .map_err(|e| ApiError::bad_request(e.to_string(), Some("messages")))?;
            // Unset, the tokens a chat request with these messages feeds the model.
            match req.add_special_tokens {
                None => tokenizer.encode_chat(&text),
                Some(add) => tokenizer.encode(&text, add),
            }
            .map_err(engine_error)?
        }
        _ => return Err(ApiError::bad_request("send exactly one of 'prompt' and 'messages'", None)),
    };
    let info = state.handle.info();
    Ok(axum::Json(json!({"count": tokens.len(), "max_model_len": info.max_model_len, "tokens": tokens}))
        .into_response())
}

pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: DetokenizeRequest = parse_plain_body(body)?;
    if let Some(model) = &req.model {
        check_model(&state, model)?;
    }
    let vocab = state.handle.info().vocab_size;
    if let Some(&bad) = req.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad_request(
            format!("token id {bad} is outside the vocabulary of {vocab} tokens"),
            Some("tokens"),
        ));
    }
    let text = state
        .handle
        .tokenizer()
        .decode(&req.tokens, false)
        .map_err(|e| ApiError::bad_request(e.to_string(), Some("tokens")))?;
    Ok(axum::Json(json!({"prompt": text})).into_response())
}
