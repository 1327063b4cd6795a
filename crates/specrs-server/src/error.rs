//! API errors as OpenAI-style JSON with the right status.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use specrs_engine::EngineError;

use crate::openai::{ErrorBody, ErrorDetail};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        Self { status: StatusCode::BAD_REQUEST, message: message.into(), param: param.map(str::to_string), code: None }
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn status(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), param: None, code: None }
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_server_error() => "server_error",
            _ => "invalid_request_error",
        }
    }

    /// Names the penalty field the request set when the error is about penalties.
    pub fn for_penalty(mut self, field: &str) -> Self {
        if self.message.contains("penalt") {
            self.param = Some(field.to_string());
        }
        self
    }

    /// Names the request's own output-length field (`max_completion_tokens`,
    /// `max_output_tokens`) where the engine's error speaks of `max_tokens`.
    pub fn for_max_tokens_field(mut self, field: &str) -> Self {
        if field != "max_tokens" && self.param.as_deref() == Some("max_tokens") {
            self.param = Some(field.to_string());
            self.message = self.message.replace("max_tokens", field);
        }
        self
    }

    /// Maps an engine admission error onto the request field it concerns.
    pub fn from_engine(e: EngineError, prompt_field: &str) -> Self {
        match e {
            EngineError::Config(c) => Self::bad_request(c.message, c.field.as_deref()),
            EngineError::Request(m) if m.contains("max_tokens") => {
                let code = m.contains("context").then_some("context_length_exceeded");
                let e = Self::bad_request(m, Some("max_tokens"));
                if let Some(code) = code { e.with_code(code) } else { e }
            }
            EngineError::Request(m) if m.contains("context") && m.contains("prompt") => {
                Self::bad_request(m, Some(prompt_field)).with_code("context_length_exceeded")
            }
            EngineError::Request(m) | EngineError::Tokenizer(m) => Self::bad_request(m, Some(prompt_field)),
            EngineError::Shutdown => Self::status(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down"),
            other => Self::status(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                message: self.message.clone(),
                kind: self.kind(),
                param: self.param.clone(),
                code: self.code,
            },
        };
        let mut resp = (self.status, axum::Json(body)).into_response();
        if matches!(self.status, StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE) {
            resp.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}
