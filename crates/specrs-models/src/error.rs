//! Errors raised while loading models. Forward passes use `candle_core::Result`.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum ModelError {
    #[error("tensor '{name}' is missing from {source_desc}")]
    MissingTensor { name: String, source_desc: String },

    #[error("tensor '{name}' in {source_desc} has shape {got:?}, expected {expected:?}")]
    ShapeMismatch { name: String, source_desc: String, expected: Vec<usize>, got: Vec<usize> },

    #[error(
        "tensor '{name}' in {source_desc} is stored as {got}, where spec-rs reads floating-point weights \
         (f32, f16, bf16): the checkpoint is corrupt, or a quantized one without its quantization_config"
    )]
    NotFloat { name: String, source_desc: String, got: String },

    #[error("unknown architecture '{name}'; supported architectures: {supported}")]
    UnknownArchitecture { name: String, supported: String },

    #[error("config key '{key}': {message}")]
    Config { key: String, message: String },

    #[error("{path}: {message}")]
    File { path: String, message: String },

    #[error("{0}")]
    Unsupported(String),

    #[error(transparent)]
    Candle(candle_core::Error),
}

impl From<candle_core::Error> for ModelError {
    fn from(e: candle_core::Error) -> Self {
        Self::Candle(without_backtrace(e))
    }
}

/// The error without the stack trace candle attaches when `RUST_BACKTRACE` is set: users read
/// these messages in Python exceptions and HTTP error bodies, where a trace buries the cause.
pub fn without_backtrace(e: candle_core::Error) -> candle_core::Error {
    use candle_core::Error;
    match e {
        Error::WithBacktrace { inner, .. } => without_backtrace(*inner),
        Error::Context { inner, context } => Error::Context { inner: Box::new(without_backtrace(*inner)), context },
        Error::WithPath { inner, path } => Error::WithPath { inner: Box::new(without_backtrace(*inner)), path },
        other => other,
    }
}

impl ModelError {
    pub fn config(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Config { key: key.into(), message: message.into() }
    }

    pub fn file(path: impl AsRef<std::path::Path>, message: impl Into<String>) -> Self {
        Self::File { path: path.as_ref().display().to_string(), message: message.into() }
    }
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candle_errors_read_without_the_stack_trace_they_carry_under_rust_backtrace() {
        let traced = |inner: candle_core::Error| candle_core::Error::WithBacktrace {
            inner: Box::new(inner),
            backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
        };
        let bare = ModelError::from(traced(candle_core::Error::Msg("shape mismatch in matmul".into())));
        assert_eq!(bare.to_string(), "shape mismatch in matmul");
        // Wrapped in context, the trace inside goes too.
        let wrapped = candle_core::Error::Context {
            inner: Box::new(traced(candle_core::Error::Msg("bad header".into()))),
            context: Box::new("reading model.safetensors"),
        };
        assert_eq!(ModelError::from(wrapped).to_string(), "reading model.safetensors\nbad header");
    }
}
