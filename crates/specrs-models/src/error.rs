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
    Candle(#[from] candle_core::Error),
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
